//! README's main command: `strata-node` with no arguments runs the embedded default (1 GiB DRAM, a 4 GiB
//! file tier under ./strata-data, 127.0.0.1:7600, metrics on 127.0.0.1:9600), serves a client, answers
//! /healthz and /metrics, and stops cleanly on SIGTERM, keeping what it was given across a restart.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

fn http_get(path: &str) -> String {
    let mut stream = std::net::TcpStream::connect("127.0.0.1:9600").expect("metrics port");
    stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    write!(stream, "GET {path} HTTP/1.0\r\n\r\n").expect("request");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("reply");
    reply
}

fn run_default(directory: &std::path::Path, work: impl FnOnce()) -> String {
    let (mut child, lines, mut output) = common::start_until_ready(|command| command.current_dir(directory));
    work();
    // SAFETY: kill(2) on our child's pid.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    for line in lines {
        output += &line.expect("line");
        output.push('\n');
    }
    let status = child.wait().expect("exit");
    assert!(status.success(), "exit {status:?}:\n{output}");
    output
}

#[test]
fn the_embedded_default_serves_and_stops_cleanly() {
    let directory = common::fresh_directory("default");
    let first = run_default(&directory, || {
        let mut client = strata_client::Client::connect("127.0.0.1:7600", Default::default()).expect("client");
        client.put(b"hello", b"world").expect("put");
        assert_eq!(client.get(b"hello").expect("get"), b"world");
        assert!(http_get("/healthz").contains("200 OK"));
        let metrics = http_get("/metrics");
        assert!(metrics.contains("strata_op_items_total{op=\"put\"} 1"), "{metrics}");
        assert!(metrics.contains("strata_tier_capacity_bytes{tier=\"dram\"}"));
    });
    assert!(first.contains("DRAM tier: 1024 MiB"), "{first}");
    assert!(first.contains("strata-data/ns0.img, 4096 MiB"), "{first}");
    assert!(first.contains("listening on 127.0.0.1:7600"), "{first}");
    assert!(first.contains("stopped"), "{first}");
    assert_eq!(std::fs::metadata(directory.join("strata-data/ns0.img")).expect("tier file").len(), 4 << 30);
    // The clean shutdown wrote the open region: the next start serves the object from NVMe.
    let second = run_default(&directory, || {
        let mut client = strata_client::Client::connect("127.0.0.1:7600", Default::default()).expect("client");
        assert_eq!(client.get(b"hello").expect("recovered"), b"world");
    });
    assert!(second.contains("recovered 1 records"), "{second}");
    let _ = std::fs::remove_dir_all(&directory);
}
