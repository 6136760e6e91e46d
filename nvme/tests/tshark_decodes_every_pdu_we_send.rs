//! Wireshark's NVMe/TCP dissector as an independent decoder: a whole session between Strata's host and
//! target (connect, identify, 4 KiB and 1 MiB writes and reads, R2T-driven H2CData, header and data
//! digests on) is captured on loopback, and tshark must recognise every PDU, find every digest good,
//! and decode the fields to what was sent. tshark decodes but does not validate, so the test checks the
//! values itself. (The README's test command installs tshark.)

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};
use strata_nvme::target::{self, NamespaceBackend, NamespaceConfig, SubsystemConfig, TargetConfig};
use strata_nvme::tcp::Digests;
use strata_nvme::{BlockDevice, HostOptions, NvmfAddress, NvmfDevice};

const H2C_CHUNK: u32 = 256 << 10;

#[test]
fn tshark_recognises_every_pdu_and_every_digest_of_a_session() {
    let capture = std::env::temp_dir().join(format!("strata-nvme-tcp-{}.pcapng", std::process::id()));
    let nqn = "nqn.2026-12.io.strata:tshark";
    let namespace = NamespaceConfig { backend: NamespaceBackend::Memory { bytes: 16 << 20 }, block_bytes: 4096 };
    let subsystem = SubsystemConfig { nqn: nqn.into(), namespaces: vec![namespace], allowed_hosts: Vec::new() };
    let config = TargetConfig {
        max_h2c_data_bytes: H2C_CHUNK,
        ..TargetConfig::new("127.0.0.1:0".parse().unwrap(), vec![subsystem])
    };
    let target = target::start(config).unwrap();
    let port = target.local_addr().port();

    let mut tshark = Command::new("tshark")
        .args(["-i", "lo", "-B", "64", "-f", &format!("tcp port {port}"), "-w"])
        .arg(&capture)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tshark must be installed (Debian package tshark; the README's test command installs it)");
    // tshark says "Capturing on" once the capture runs; give it that long, bounded.
    let started = Instant::now();
    while !capture.exists() && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));

    let address = NvmfAddress::tcp(target.local_addr(), nqn, 1);
    LocalExecutorBuilder::new(Placement::Unbound)
        .spawn(move || async move {
            let options = HostOptions {
                digests: Digests { header: true, data: true },
                keep_alive_ms: 0,
                ..HostOptions::default()
            };
            let device = NvmfDevice::connect(&address, &options, 1).await.unwrap();
            for (len, offset, fill) in [(4096usize, 0u64, 0x11u8), (1 << 20, 1 << 20, 0x22)] {
                let mut buffer = device.alloc_buffer(len);
                buffer.as_mut_slice().fill(fill);
                device.write(buffer, offset).await.1.unwrap();
                let (buffer, result) = device.read(device.alloc_buffer(len), offset).await;
                result.unwrap();
                assert!(buffer.as_slice().iter().all(|&byte| byte == fill));
            }
        })
        .unwrap()
        .join()
        .unwrap();
    target.stop();
    // tshark writes what it captured behind the traffic; on a loaded machine well behind. Stop it only once
    // its file has stopped growing for a while (bounded), or the last PDUs are missing from the capture.
    wait_until_stable(&capture, Duration::from_millis(700), Duration::from_secs(20));
    let _ = Command::new("kill").args(["-INT", &tshark.id().to_string()]).status();
    let _ = tshark.wait();

    let decoded = Command::new("tshark")
        .arg("-r")
        .arg(&capture)
        .args(["-d", &format!("tcp.port=={port},nvme-tcp")])
        // A loaded machine drops loopback packets too (the backlog queue overflows), and TCP retransmits
        // them after later segments: without this, tshark skips the PDU that the retransmission completes.
        .args(["-o", "tcp.reassemble_out_of_order:TRUE"])
        .args(["-o", "nvme-tcp.check_hdgst:TRUE", "-o", "nvme-tcp.check_ddgst:TRUE"])
        .args(["-T", "fields", "-E", "separator=;", "-E", "occurrence=a", "-E", "aggregator=,"])
        .args(["-e", "nvme-tcp.type", "-e", "nvme-tcp.hdgst.status", "-e", "nvme-tcp.ddgst.status"])
        .args(["-e", "nvme-tcp.data.offset", "-e", "nvme-tcp.data.length", "-e", "nvme-tcp.r2t.length"])
        .args(["-e", "nvme-tcp.icreq.digest", "-e", "_ws.malformed", "-e", "_ws.expert.severity"])
        .output()
        .expect("tshark -r");
    let _ = std::fs::remove_file(&capture);
    assert!(decoded.status.success(), "{}", String::from_utf8_lossy(&decoded.stderr));
    let text = String::from_utf8_lossy(&decoded.stdout);
    let column = |index: usize| -> Vec<String> {
        text.lines()
            .flat_map(|line| {
                line.split(';').nth(index).unwrap_or("").split(',').map(str::to_string).collect::<Vec<_>>()
            })
            .filter(|value| !value.is_empty())
            .collect()
    };
    let types: Vec<u32> = column(0).iter().map(|value| value.parse().unwrap()).collect();
    let count = |pdu_type: u32| types.iter().filter(|&&seen| seen == pdu_type).count();
    // Two connections (admin, I/O): an ICReq and ICResp each.
    assert_eq!((count(0), count(1)), (2, 2), "IC exchange: {types:?}\n{text}");
    // SQ flow control is off, so every C2HData ends its command with the SUCCESS flag and no CapsuleResp.
    assert!(count(4) >= 12 && count(4) == count(5) + count(7), "every other capsule answered: {types:?}");
    assert_eq!(count(9), 1, "one R2T, for the 1 MiB write (4 KiB goes in the capsule): {types:?}");
    assert_eq!(count(6), (1 << 20) / H2C_CHUNK as usize, "the 1 MiB write in MAXH2CDATA pieces: {types:?}");
    assert_eq!(count(7), 4, "C2HData: Identify Controller, Identify Namespace, two reads: {types:?}");
    assert!(types.iter().all(|pdu_type| [0, 1, 4, 5, 6, 7, 9].contains(pdu_type)), "{types:?}");

    let header_digests = column(1);
    let digested = types.iter().filter(|&&pdu_type| pdu_type >= 4).count();
    assert_eq!(header_digests.len(), digested, "every PDU after the IC exchange carries a header digest\n{text}");
    assert!(header_digests.iter().all(|status| status == "1"), "header digest status (1 = good): {header_digests:?}");
    let data_digests = column(2);
    assert!(data_digests.len() >= count(6) + count(7), "data digests: {data_digests:?}");
    assert!(data_digests.iter().all(|status| status == "1"), "data digest status (1 = good): {data_digests:?}");

    let r2t_lengths = column(5);
    assert_eq!(r2t_lengths, vec![(1u32 << 20).to_string()]);
    let offsets: Vec<u32> = column(3).iter().map(|value| value.parse().unwrap()).collect();
    let lengths: Vec<u32> = column(4).iter().map(|value| value.parse().unwrap()).collect();
    let h2c: Vec<(u32, u32)> =
        offsets.iter().copied().zip(lengths.iter().copied()).filter(|&(_, len)| len == H2C_CHUNK).collect();
    assert_eq!(h2c, (0..4).map(|index| (index * H2C_CHUNK, H2C_CHUNK)).collect::<Vec<_>>(), "H2CData offsets");
    assert!(lengths.contains(&(1 << 20)) && lengths.contains(&4096), "C2HData lengths: {lengths:?}");
    assert_eq!(column(6), vec!["3".to_string(), "3".to_string()], "ICReq asks for both digests");
    assert!(column(7).is_empty(), "tshark found malformed PDUs:\n{text}");
    let severities = column(8);
    assert!(!severities.iter().any(|severity| severity == "8388608"), "tshark reported errors: {severities:?}\n{text}");
}

/// Waits until `path`'s size has not changed for `quiet`, at most `limit` in all.
fn wait_until_stable(path: &std::path::Path, quiet: Duration, limit: Duration) {
    let started = Instant::now();
    let size = || std::fs::metadata(path).map(|metadata| metadata.len()).unwrap_or(0);
    let (mut last, mut since) = (size(), Instant::now());
    while since.elapsed() < quiet && started.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(50));
        let now = size();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
}
