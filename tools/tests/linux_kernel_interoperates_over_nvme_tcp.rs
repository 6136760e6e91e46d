//! Interoperability with the Linux kernel's NVMe/TCP, booted in QEMU by `tests/lab/kernel-nvmf`:
//! the kernel initiator discovers, connects to, identifies and fio-verifies Strata's target, and takes and
//! clears a reservation on it with nvme-cli (register, acquire, report, write, clear); Strata's host
//! (`strata-bench --ioengine=nvmf --verify=crc32c`) runs against the kernel's nvmet target, and rides out the
//! guest freezing mid-job: its commands time out, it reconnects and sends them again. Where QEMU cannot
//! run, these tests fail and say why: they never pass without the kernel having spoken to us.

use std::io::{BufRead, BufReader};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

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

/// The kernel's nvmet target serving a 64 MiB namespace in a guest, at 127.0.0.1:`port`.
struct Nvmet {
    guest: Guest,
    port: u16,
    nqn: String,
    /// The guest's lines after it started serving (its kernel log among them).
    lines: mpsc::Receiver<String>,
}

impl Nvmet {
    fn serve() -> Self {
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
        let (lines_out, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if lines_out.send(line).is_err() {
                    break;
                }
            }
        });
        let mut seen = Vec::new();
        loop {
            match lines.recv_timeout(Duration::from_secs(240)) {
                Ok(line) => {
                    eprintln!("{line}");
                    if let Some(nqn) = line.strip_prefix("KLAB: SERVING nqn=") {
                        return Self { guest, port, nqn: nqn.to_string(), lines };
                    }
                    seen.push(line);
                }
                Err(_) => panic!("the kernel nvmet guest never served, so interoperability is UNTESTED here: {seen:?}"),
            }
        }
    }

    /// strata-bench's job against the namespace: 8 random writes in flight over `size`, then every block read
    /// back and checked.
    fn bench(&self, bs: &str, size: &str, extra: &[&str]) -> Command {
        self.bench_through(self.port, bs, size, extra)
    }

    /// [`Nvmet::bench`] through 127.0.0.1:`port`.
    fn bench_through(&self, port: u16, bs: &str, size: &str, extra: &[&str]) -> Command {
        let filename = format!("trtype=tcp,traddr=127.0.0.1,trsvcid={port},subnqn={},ns=1", self.nqn);
        let mut command = Command::new(env!("CARGO_BIN_EXE_strata-bench"));
        command.args([
            "--name=kernel-nvmet",
            &format!("--filename={filename}"),
            "--ioengine=nvmf",
            "--rw=randwrite",
            &format!("--bs={bs}"),
            "--iodepth=8",
            &format!("--size={size}"),
            "--verify=crc32c",
            "--output-format=json",
        ]);
        command.args(extra);
        command
    }

    /// Stops (`STOP`) or resumes (`CONT`) the guest's whole process group.
    fn signal(&self, signal: &str) {
        let status = Command::new("kill").args(["-s", signal, "--", &format!("-{}", self.guest.0.id())]).status();
        assert!(status.is_ok_and(|status| status.success()), "kill -s {signal} the guest");
    }

    /// What the guest printed since it started serving.
    fn log(&self) -> String {
        self.lines.try_iter().collect::<Vec<_>>().join("\n")
    }
}

/// A TCP relay on loopback in front of `target` that counts the connections hosts opened through it.
fn counting_relay(target: SocketAddr) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&connections);
    std::thread::spawn(move || {
        for host in listener.incoming().map_while(Result::ok) {
            counted.fetch_add(1, Ordering::SeqCst);
            // Connecting on a thread of its own: QEMU's user network listens with a backlog of one, so a
            // connect to a stopped guest can wait out SYN retries, which must not hold up the next accept.
            std::thread::spawn(move || {
                let Ok(controller) = TcpStream::connect(target) else { return };
                // Small PDUs go on at once, as the host and the target send them.
                let _ = (host.set_nodelay(true), controller.set_nodelay(true));
                let (mut from_host, mut to_controller) = (host.try_clone().unwrap(), controller.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from_host, &mut to_controller);
                    let _ = to_controller.shutdown(Shutdown::Both);
                });
                let (mut from_controller, mut to_host) = (controller, host);
                let _ = std::io::copy(&mut from_controller, &mut to_host);
                let _ = to_host.shutdown(Shutdown::Both);
            });
        }
    });
    (addr, connections)
}

/// Checks a bench's report: it succeeded, wrote `bytes` and read them all back intact.
fn check_report(what: &str, output: &std::process::Output, bytes: u64, nvmet: &Nvmet) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{what}: strata-bench failed against nvmet:\n{stdout}\n{}\nthe guest's kernel log:\n{}",
        String::from_utf8_lossy(&output.stderr),
        nvmet.log()
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let job = &report["jobs"][0];
    assert_eq!(job["write"]["io_bytes"], bytes, "{what}: {stdout}");
    assert_eq!(job["error"], 0, "{what}: {stdout}");
    assert_eq!(job["verify"]["mismatches"], 0, "{what}: {stdout}");
    report
}

#[test]
fn our_host_verifies_data_on_the_linux_nvmet_target() {
    let _one = ONE_GUEST.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let nvmet = Nvmet::serve();
    // 4 KiB writes travel in the capsule; 64 KiB ones follow nvmet's R2Ts. Both are read back and verified.
    for bs in ["4k", "64k"] {
        let output = nvmet.bench(bs, "16m", &[]).output().unwrap();
        check_report(&format!("bs={bs}"), &output, 16 << 20, &nvmet);
    }
}

#[test]
fn our_host_rides_out_a_frozen_nvmet_guest() {
    let _one = ONE_GUEST.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let nvmet = Nvmet::serve();
    let timeout = Duration::from_secs(2);
    let (relay, connections) = counting_relay(SocketAddr::from(([127, 0, 0, 1], nvmet.port)));
    let mut bench = nvmet
        .bench_through(relay.port(), "4k", "64m", &[&format!("--nvmf_command_timeout={}ms", timeout.as_millis())])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Mid-job (64 MiB of 4 KiB writes take seconds in the emulated guest), the guest stops answering for
    // longer than the command timeout: the commands in flight time out, the host reconnects once the guest
    // runs again and sends them again. The job is under way once its admin and I/O queues are connected.
    let connected = Instant::now() + Duration::from_secs(60);
    while connections.load(Ordering::SeqCst) < 2 && Instant::now() < connected {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(500));
    nvmet.signal("STOP");
    std::thread::sleep(timeout * 3);
    nvmet.signal("CONT");
    let deadline = Instant::now() + Duration::from_secs(240);
    while bench.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = bench.kill();
            panic!("strata-bench never finished after the guest resumed:\n{}", nvmet.log());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let output = bench.wait_with_output().unwrap();
    let report = check_report("a frozen guest", &output, 64 << 20, &nvmet);
    let job = &report["jobs"][0];
    let slowest = ["write", "read"].iter().filter_map(|op| job[op]["clat_ns"]["max"].as_u64()).max().unwrap_or(0);
    assert!(
        slowest >= timeout.as_nanos() as u64,
        "no I/O waited the command timeout ({slowest} ns at most): the guest froze after the job, so the \
         recovery is untested"
    );
    // Without the command timeout the writes would simply finish once the guest ran again, on their
    // first connections (an admin queue and an I/O queue).
    let carried = connections.load(Ordering::SeqCst);
    assert!(carried > 2, "the host reconnected after its commands timed out: {carried} connections");
}
