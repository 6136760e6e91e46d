//! `strata-node … >/dev/full 2>/dev/full`: what it prints and logs cannot be written, and it must keep
//! serving and stop cleanly anyway (logging never brings the node down).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

fn full() -> std::fs::File {
    std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full")
}

#[test]
fn a_node_whose_stdout_and_stderr_are_full_serves_and_stops_cleanly() {
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata-node"))
        .args(["--dram-only", "--dram", "64MiB", "--cores", "1", "--metrics", "off", "--log", "debug"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .stdout(full())
        .stderr(full())
        .spawn()
        .expect("strata-node starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut client = loop {
        if let Ok(client) = strata_client::Client::connect(("127.0.0.1", port), Default::default()) {
            break client;
        }
        if let Some(status) = child.try_wait().expect("wait") {
            panic!("strata-node exited before serving: {status:?}");
        }
        assert!(Instant::now() < deadline, "strata-node did not listen within 60 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    client.put(b"k", b"v").expect("put");
    assert_eq!(client.get(b"k").expect("get"), b"v");
    drop(client);
    // SAFETY: kill(2) on our child's pid.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let status = child.wait().expect("exit");
    assert!(status.success(), "strata-node exited {status:?}");
}
