//! The host under a controller that stops answering: a command that gets no completion within the command
//! timeout breaks its queue, the host reconnects and sends the command again, and a controller that never
//! answers again ends in a typed error within the timeouts, not in a wait for ever.
//!
//! Strata's own target serves a RAM namespace behind a TCP relay on loopback that the test can freeze:
//! a frozen connection still takes the host's bytes but never forwards the controller's, as a hung
//! controller or a broken path would. When the host closes its end, the relay closes the target's.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};
use strata_nvme::target::{self, NamespaceBackend, NamespaceConfig, SubsystemConfig, TargetConfig, TargetHandle};
use strata_nvme::{BlockDevice, BlockErrorKind, HostOptions, NvmfAddress, NvmfDevice};

const NQN: &str = "nqn.2026-12.io.strata:stalls";
/// What a test may take before it counts as a host that waits for ever.
const TEST_BOUND: Duration = Duration::from_secs(60);

fn start_target() -> TargetHandle {
    let namespace = NamespaceConfig { backend: NamespaceBackend::Memory { bytes: 16 << 20 }, block_bytes: 4096 };
    let subsystem = SubsystemConfig { nqn: NQN.into(), namespaces: vec![namespace], allowed_hosts: Vec::new() };
    target::start(TargetConfig::new("127.0.0.1:0".parse().unwrap(), vec![subsystem])).unwrap()
}

/// Freezes a relay's connections; cloned into the host's executor.
#[derive(Clone, Default)]
struct Freeze {
    /// Connections accepted so far.
    accepted: Arc<AtomicUsize>,
    /// Connections numbered below this are frozen.
    below: Arc<AtomicUsize>,
    /// Every connection, from now on too, is frozen.
    all: Arc<AtomicBool>,
}

impl Freeze {
    /// Freezes the connections open now.
    fn open_connections(&self) {
        self.below.store(self.accepted.load(Ordering::SeqCst), Ordering::SeqCst);
    }

    /// Freezes every connection, open now or to come.
    fn everything(&self) {
        self.all.store(true, Ordering::SeqCst);
    }

    fn is_frozen(&self, number: usize) -> bool {
        number < self.below.load(Ordering::SeqCst) || self.all.load(Ordering::SeqCst)
    }
}

/// Starts a relay in front of `target`: its address, and what freezes it.
fn start_relay(target: SocketAddr) -> (SocketAddr, Freeze) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let freeze = Freeze::default();
    let relay = freeze.clone();
    thread::spawn(move || {
        for host in listener.incoming() {
            let Ok(host) = host else { return };
            let number = relay.accepted.fetch_add(1, Ordering::SeqCst);
            let Ok(controller) = TcpStream::connect(target) else { continue };
            // Small PDUs go on at once, as the host and the target send them.
            let _ = (host.set_nodelay(true), controller.set_nodelay(true));
            // The host's bytes always go on; the controller's stop while frozen.
            relay_one_way(host.try_clone().unwrap(), controller.try_clone().unwrap(), || false);
            let relay = relay.clone();
            relay_one_way(controller, host, move || relay.is_frozen(number));
        }
    });
    (addr, freeze)
}

/// Copies `from` to `to` until `from` ends, dropping what arrives while `frozen`; then closes both.
fn relay_one_way(mut from: TcpStream, mut to: TcpStream, frozen: impl Fn() -> bool + Send + 'static) {
    thread::spawn(move || {
        let mut bytes = vec![0u8; 64 << 10];
        loop {
            match from.read(&mut bytes) {
                Ok(0) | Err(_) => break,
                Ok(read) if !frozen() => {
                    if to.write_all(&bytes[..read]).is_err() {
                        break;
                    }
                }
                Ok(_) => {}
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

fn host_options(command_timeout: Duration, controller_loss_timeout: Duration) -> HostOptions {
    HostOptions {
        command_timeout,
        controller_loss_timeout,
        reconnect_delay: Duration::from_millis(50),
        ..HostOptions::default()
    }
}

/// Runs `make`'s future on an executor of its own thread; panics if it takes longer than [`TEST_BOUND`].
fn bounded<T: Send + 'static, F: Future<Output = T> + 'static>(make: impl FnOnce() -> F + Send + 'static) -> T {
    let (done_out, done_in) = mpsc::channel();
    LocalExecutorBuilder::new(Placement::Unbound)
        .spawn(move || async move {
            let _ = done_out.send(make().await);
        })
        .unwrap();
    done_in.recv_timeout(TEST_BOUND).expect("the host waited on a stalled controller without end")
}

#[test]
fn a_command_the_controller_never_answers_is_sent_again_on_a_new_connection() {
    let target = start_target();
    let (relay, freeze) = start_relay(target.local_addr());
    let address = NvmfAddress::tcp(relay, NQN, 1);
    let timeout = Duration::from_millis(400);
    let options = host_options(timeout, Duration::from_secs(10));
    let freezer = freeze.clone();
    let (took, data) = bounded(move || async move {
        let device = NvmfDevice::connect(&address, &options, 1).await.unwrap();
        let mut block = device.alloc_buffer(4096);
        block.as_mut_slice().fill(0x5a);
        device.write(block, 8192).await.1.unwrap();
        // The admin and I/O connections now take the host's bytes and never answer.
        freezer.open_connections();
        let started = Instant::now();
        let (data, read) = device.read(device.alloc_buffer(4096), 8192).await;
        read.expect("the read, sent again on a new connection");
        (started.elapsed(), data.as_slice().to_vec())
    });
    assert!(data.iter().all(|&byte| byte == 0x5a), "the block written before the stall");
    assert!(took >= timeout, "the read came back after {took:?}, before the command timeout: it was never stalled");
    // Not the target's keep-alive expiry (10 s: the host's Keep Alive is stuck behind the frozen answers).
    assert!(took < Duration::from_secs(5), "the command timeout ended the stall, not the target: {took:?}");
    assert!(freeze.accepted.load(Ordering::SeqCst) >= 3, "the host reconnected through the relay");
    target.stop();
}

/// Connects to the relay's controller through `address` with `options`, writes a block, freezes every
/// connection and reads: how long the read took to fail, and its error (a remote one, or the test fails).
fn read_until_the_controller_is_lost(address: NvmfAddress, options: HostOptions, freeze: Freeze) -> (Duration, String) {
    let (took, error) = bounded(move || async move {
        let device = NvmfDevice::connect(&address, &options, 1).await.unwrap();
        device.write(device.alloc_buffer(4096), 0).await.1.unwrap();
        freeze.everything();
        let started = Instant::now();
        let (_, read) = device.read(device.alloc_buffer(4096), 0).await;
        (started.elapsed(), read.expect_err("a read no controller answers"))
    });
    let BlockErrorKind::Remote(reason) = error.kind else { panic!("not a remote error: {error}") };
    (took, reason)
}

#[test]
fn a_controller_that_never_answers_again_ends_in_an_error_within_the_timeouts() {
    let target = start_target();
    let (relay, freeze) = start_relay(target.local_addr());
    let (timeout, loss) = (Duration::from_millis(300), Duration::from_secs(1));
    let (took, reason) =
        read_until_the_controller_is_lost(NvmfAddress::tcp(relay, NQN, 1), host_options(timeout, loss), freeze);
    assert!(reason.contains("controller lost"), "the controller-loss timeout ended it: {reason}");
    // The command's timeout, then reconnects (each ICReq waits at most a command timeout) for the loss
    // timeout.
    assert!(took <= timeout * 3 + loss + Duration::from_secs(2), "bounded by the timeouts, took {took:?}");
    target.stop();
}

#[test]
fn timeouts_written_in_the_address_govern_its_controller() {
    let target = start_target();
    let (relay, freeze) = start_relay(target.local_addr());
    // The host's own options are the defaults (a 30 s command timeout, 60 s of reconnecting); the
    // address's io_timeout, ctrl_loss_tmo and reconnect_delay replace them for this controller.
    let text = format!(
        "traddr=127.0.0.1,trsvcid={},subnqn={NQN},io_timeout=0.3,ctrl_loss_tmo=1,reconnect_delay=0.05",
        relay.port()
    );
    let address = NvmfAddress::parse(&text).unwrap();
    let (took, reason) = read_until_the_controller_is_lost(address, HostOptions::default(), freeze);
    assert!(reason.contains("controller lost"), "the address's controller-loss timeout ended it: {reason}");
    let (timeout, loss) = (Duration::from_millis(300), Duration::from_secs(1));
    assert!(took <= timeout * 3 + loss + Duration::from_secs(2), "the address's timeouts, took {took:?}");
    target.stop();
}
