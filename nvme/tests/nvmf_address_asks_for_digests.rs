//! A namespace's address can ask for NVMe/TCP digests itself (`data_digest`, `hdr_digest`, the kernel's
//! option names), so a node's `nvmf:` tier or a bench's `--filename` gets them with no flag of its own.
//!
//! Strata's target serves a RAM namespace behind a TCP relay on loopback that flips one byte of the
//! controller's stream on the I/O queue's connection when the test arms it, inside a 64 KiB read's data.
//! With `data_digest=1` in the address the read fails with the digest mismatch and the next read is
//! whole; without it the flipped byte reaches the caller, which is what shows the flip landed in the data
//! and that the address's setting, not the host's default, caught it.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::Duration;

use glommio::{LocalExecutorBuilder, Placement};
use strata_nvme::target::{self, NamespaceBackend, NamespaceConfig, SubsystemConfig, TargetConfig};
use strata_nvme::{BlockDevice, BlockErrorKind, HostOptions, NvmfAddress, NvmfDevice};

const NQN: &str = "nqn.2026-12.io.strata:digests";
const BLOCK: usize = 64 << 10;
/// How far into the controller's stream, once armed, the relay flips a byte: past a C2HData PDU's header
/// (and its digest and padding), well inside the read's 64 KiB.
const FLIP_AT: usize = 2048;

/// Arms the relay: the next bytes the controller sends on the I/O queue's connection get one flipped.
#[derive(Clone, Default)]
struct Flip {
    armed: Arc<AtomicBool>,
    /// Bytes flipped so far.
    done: Arc<AtomicUsize>,
}

/// A relay in front of `target` whose connections after the first (the admin queue's) carry the I/O
/// queue; returns its address.
fn start_relay(target: SocketAddr, flip: Flip) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for (number, host) in listener.incoming().enumerate() {
            let Ok(host) = host else { return };
            let Ok(controller) = TcpStream::connect(target) else { continue };
            let _ = (host.set_nodelay(true), controller.set_nodelay(true));
            copy(host.try_clone().unwrap(), controller.try_clone().unwrap(), None);
            copy(controller, host, (number > 0).then(|| flip.clone()));
        }
    });
    addr
}

/// Copies `from` to `to` until `from` ends, flipping byte [`FLIP_AT`] of what follows each arming.
fn copy(mut from: TcpStream, mut to: TcpStream, flip: Option<Flip>) {
    thread::spawn(move || {
        let mut bytes = vec![0u8; 64 << 10];
        let mut since_armed = None::<usize>;
        loop {
            let read = match from.read(&mut bytes) {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            if let Some(flip) = &flip {
                if since_armed.is_none() && flip.armed.swap(false, Ordering::SeqCst) {
                    since_armed = Some(0);
                }
                if let Some(seen) = since_armed {
                    if (seen..seen + read).contains(&FLIP_AT) {
                        bytes[FLIP_AT - seen] ^= 0x01;
                        flip.done.fetch_add(1, Ordering::SeqCst);
                        since_armed = None;
                    } else {
                        since_armed = Some(seen + read);
                    }
                }
            }
            if to.write_all(&bytes[..read]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

/// What a read of the block written came back as.
#[derive(Debug)]
enum Outcome {
    /// The bytes read, with how many differ from those written.
    Read { differing: usize },
    /// The read failed, and why.
    Failed(String),
}

/// Writes a block through `address`, then reads it back twice, the relay flipping a byte of the first
/// read's reply.
fn write_then_read_twice_with_a_flip(address: NvmfAddress, flip: Flip) -> (Outcome, Outcome) {
    let (done_out, done_in) = mpsc::channel();
    LocalExecutorBuilder::new(Placement::Unbound)
        .spawn(move || async move {
            let device = NvmfDevice::connect(&address, &HostOptions::default(), 1).await.unwrap();
            let pattern: Vec<u8> = (0..BLOCK).map(|index| (index * 7 + index / 251) as u8).collect();
            let mut block = device.alloc_buffer(BLOCK);
            block.as_mut_slice().copy_from_slice(&pattern);
            device.write(block, 0).await.1.unwrap();
            let mut outcomes = Vec::new();
            for arm in [true, false] {
                flip.armed.store(arm, Ordering::SeqCst);
                let (data, read) = device.read(device.alloc_buffer(BLOCK), 0).await;
                outcomes.push(match read {
                    Ok(()) => {
                        let differing = data.as_slice().iter().zip(&pattern).filter(|(a, b)| a != b).count();
                        Outcome::Read { differing }
                    }
                    Err(error) => match error.kind {
                        BlockErrorKind::Remote(reason) => Outcome::Failed(reason),
                        other => Outcome::Failed(format!("not a remote error: {other:?}")),
                    },
                });
            }
            let second = outcomes.pop().unwrap();
            let _ = done_out.send((outcomes.pop().unwrap(), second));
        })
        .unwrap();
    done_in.recv_timeout(Duration::from_secs(60)).expect("the reads finished")
}

#[test]
fn a_data_digest_asked_for_in_the_address_catches_a_byte_flipped_on_the_wire() {
    let namespace = NamespaceConfig { backend: NamespaceBackend::Memory { bytes: 16 << 20 }, block_bytes: 4096 };
    let subsystem = SubsystemConfig { nqn: NQN.into(), namespaces: vec![namespace], allowed_hosts: Vec::new() };
    let target = target::start(TargetConfig::new("127.0.0.1:0".parse().unwrap(), vec![subsystem])).unwrap();
    for (settings, digest) in [(",data_digest=1", true), ("", false)] {
        let flip = Flip::default();
        let relay = start_relay(target.local_addr(), flip.clone());
        let text = format!("traddr=127.0.0.1,trsvcid={},subnqn={NQN}{settings}", relay.port());
        let address = NvmfAddress::parse(&text).unwrap();
        assert_eq!(address.settings.data_digest, digest.then_some(true), "{text}");
        let (flipped, next) = write_then_read_twice_with_a_flip(address, flip.clone());
        assert_eq!(flip.done.load(Ordering::SeqCst), 1, "the relay flipped one byte ({text})");
        if digest {
            let Outcome::Failed(reason) = &flipped else { panic!("a flipped byte was read as data: {flipped:?}") };
            assert!(reason.contains("data digest mismatch"), "{reason}");
        } else {
            assert!(matches!(flipped, Outcome::Read { differing: 1 }), "{flipped:?}: the flip lands in the data");
        }
        assert!(matches!(next, Outcome::Read { differing: 0 }), "{next:?}: the next read is whole ({text})");
    }
    target.stop();
}
