//! Interoperability with the Linux kernel's NVMe/TCP, booted in QEMU by `tests/lab/kernel-nvmf`:
//! the kernel initiator discovers, connects to, identifies and fio-verifies Strata's target, and takes and
//! clears a reservation on it with nvme-cli (register, acquire, report, write, clear); Strata's host
//! (`strata-bench --ioengine=nvmf --verify=crc32c`) runs against the kernel's nvmet target. Where QEMU cannot
//! run, these tests fail and say why: they never pass without the kernel having spoken to us.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use strata_nvme::target::{self, NamespaceBackend, NamespaceConfig, SubsystemConfig, TargetConfig};

/// One guest at a time: each emulated kernel takes a whole core of this 2-core machine.
static ONE_GUEST: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn harness() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/lab/kernel-nvmf")
}

/// Ends a harness run and its QEMU (its whole process group).
struct Guest(Child);

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", self.0.id())]).status();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn the_linux_initiator_discovers_identifies_and_verifies_our_target() {
    let _one = ONE_GUEST.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let nqn = "nqn.2026-12.io.strata:kernel-interop";
    let namespace = NamespaceConfig { backend: NamespaceBackend::Memory { bytes: 64 << 20 }, block_bytes: 4096 };
    let subsystem = SubsystemConfig { nqn: nqn.into(), namespaces: vec![namespace], allowed_hosts: Vec::new() };
    let target = target::start(TargetConfig::new("127.0.0.1:0".parse().unwrap(), vec![subsystem])).unwrap();
    let port = target.local_addr().port().to_string();
    let output = Command::new(harness()).args(["initiator", &port, nqn, "10"]).output().expect("running the harness");
    target.stop();
    let text = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = text.lines().collect();
    let has = |needle: &str| lines.iter().any(|line| line.contains(needle));
    assert!(
        has("KLAB: booted"),
        "QEMU did not boot the kernel guest, so interoperability is UNTESTED here:\n{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(has(&format!("KLAB: discover subnqn:  {nqn}")), "nvme discover did not list the subsystem:\n{text}");
    assert!(has("KLAB: discover subtype: current discovery subsystem"), "{text}");
    assert!(has("KLAB: connected"), "nvme connect failed:\n{text}");
    assert!(has(&format!("KLAB: id-ctrl subnqn    : {nqn}")), "{text}");
    assert!(has("KLAB: id-ctrl mn        : Strata NVMe/TCP target"), "{text}");
    assert!(has("KLAB: id-ns nsze    : 0x4000"), "64 MiB in 4 KiB blocks:\n{text}");
    assert!(has("KLAB: fio verify passed errors=0"), "the kernel's fio crc32c verify job failed:\n{text}");
    // Reservations from nvme-cli through the kernel: the report names the kernel host's key and the type it
    // acquired, the holder writes, and a clear leaves no registrant.
    let field = |prefix: &str, name: &str, values: &[&str]| {
        lines.iter().any(|line| {
            line.strip_prefix(prefix).is_some_and(|rest| {
                let mut parts = rest.splitn(2, ':');
                parts.next().is_some_and(|key| key.trim() == name)
                    && parts.next().is_some_and(|value| values.contains(&value.trim()))
            })
        })
    };
    assert!(field("KLAB: resv-report ", "rtype", &["4"]), "Exclusive Access - Registrants Only held:\n{text}");
    assert!(field("KLAB: resv-report ", "regctl", &["1"]), "one registrant:\n{text}");
    // nvme-cli 2.4 prints the key in hex without "0x"; other versions in decimal or with it.
    assert!(field("KLAB: resv-report ", "rkey", &["1234", "0x1234", "4660"]), "the kernel host's key:\n{text}");
    assert!(field("KLAB: resv-report ", "rcsts", &["1", "0x1"]), "the registrant holds it:\n{text}");
    assert!(has("KLAB: resv holder wrote"), "the holder's write:\n{text}");
    assert!(field("KLAB: resv-after-clear ", "regctl", &["0"]), "no registrant after a clear:\n{text}");
    assert!(has("KLAB: END rc=0"), "{text}");
}

#[test]
fn our_host_verifies_data_on_the_linux_nvmet_target() {
    let _one = ONE_GUEST.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let port = free_port();
    let mut child = Command::new(harness())
        .args(["target", &port.to_string()])
        // QEMU's serial console reads stdin; in its own process group, a terminal would stop it (SIGTTIN).
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()
        .expect("running the harness");
    let stdout = child.stdout.take().unwrap();
    let guest = Guest(child);
    let (lines_out, lines_in) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_out.send(line).is_err() {
                break;
            }
        }
    });
    let mut nqn = None;
    let mut seen = Vec::new();
    while nqn.is_none() {
        match lines_in.recv_timeout(Duration::from_secs(240)) {
            Ok(line) => {
                eprintln!("{line}");
                nqn = line.strip_prefix("KLAB: SERVING nqn=").map(str::to_string);
                seen.push(line);
            }
            Err(_) => panic!("the kernel nvmet guest never served, so interoperability is UNTESTED here: {seen:?}"),
        }
    }
    let nqn = nqn.unwrap();
    let filename = format!("trtype=tcp,traddr=127.0.0.1,trsvcid={port},subnqn={nqn},ns=1");
    // 4 KiB writes travel in the capsule; 64 KiB ones follow nvmet's R2Ts. Both are read back and verified.
    for bs in ["4k", "64k"] {
        let output = Command::new(env!("CARGO_BIN_EXE_strata-bench"))
            .args([
                "--name=kernel-nvmet",
                &format!("--filename={filename}"),
                "--ioengine=nvmf",
                "--rw=randwrite",
                &format!("--bs={bs}"),
                "--iodepth=8",
                "--size=16m",
                "--verify=crc32c",
                "--output-format=json",
            ])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "bs={bs}: strata-bench failed against nvmet:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(report["jobs"][0]["write"]["io_bytes"], 16 << 20, "bs={bs}: {stdout}");
        assert_eq!(report["jobs"][0]["error"], 0, "bs={bs}: {stdout}");
    }
    drop(guest);
}
