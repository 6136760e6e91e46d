//! `strata-node` under `chrt -f` (SCHED_FIFO): with a file-backed NVMe tier it used to spin forever at
//! start-up on a single CPU (glommio's device probe waits on an io_uring worker thread that inherits the
//! real-time policy and never gets the core); it now refuses at once and says why. A DRAM-only node has no
//! such worker and still starts and serves under the real-time policy.
//!
//! Needs `chrt` (util-linux) and the right to set SCHED_FIFO (root or CAP_SYS_NICE), as CI has.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A one-shard node on CPU 0 listening on `port`, run under `chrt -f 10 taskset -c 0` (one CPU: the case
/// that hung), with `tier` as its NVMe tier arguments.
fn real_time_node(port: u16, tier: &[&str]) -> Command {
    let listen = format!("127.0.0.1:{port}");
    let mut command = Command::new("chrt");
    command
        .args(["-f", "10", "taskset", "-c", "0", env!("CARGO_BIN_EXE_strata-node")])
        .args(["--listen", &listen, "--metrics", "off", "--cores", "1", "--cpus", "0", "--dram", "64MiB"])
        .args(tier);
    command
}

#[test]
fn a_file_tier_under_sched_fifo_is_refused_with_the_reason() {
    let directory = common::fresh_directory("real-time");
    let nvme = format!("file:{},size=256MiB", directory.join("ns0.img").display());
    let mut child = real_time_node(7761, &["--nvme", &nvme])
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chrt runs");
    // Bounded: the old behaviour never exits, so a node still running after 30 s fails the test.
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("strata-node under SCHED_FIFO with a file tier did not exit within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("Operation not permitted"),
        "chrt could not set SCHED_FIFO: this test needs root or CAP_SYS_NICE\n{stderr}"
    );
    assert!(!output.status.success(), "the node started under SCHED_FIFO with a file tier:\n{stderr}");
    assert!(stderr.contains("runs under SCHED_FIFO with a file-backed NVMe tier"), "{stderr}");
    assert!(stderr.contains("SCHED_OTHER"), "the error names the fix: {stderr}");
    let _ = std::fs::remove_dir_all(&directory);
}

#[test]
fn a_dram_only_node_starts_and_serves_under_sched_fifo() {
    let (child, _lines, summary) = common::start_until_ready(|command| {
        *command = real_time_node(7762, &["--dram-only"]);
        command
    });
    let _node = common::NodeProcess(child);
    assert!(summary.contains("NVMe tier: none"), "{summary}");
    let mut client = strata_client::Client::connect("127.0.0.1:7762", Default::default()).expect("client");
    client.put(b"real-time", b"served").expect("the DRAM-only node serves under SCHED_FIFO");
    assert_eq!(client.get(b"real-time").expect("get under SCHED_FIFO"), b"served");
}
