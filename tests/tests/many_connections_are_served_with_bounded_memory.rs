//! 256 concurrent connections are served at once, every reply correct, and the node's memory stays
//! bounded: per-connection buffers are fixed, values land in the DRAM segment.

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::{client, config, key_of, start, total, value_of};

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).and_then(|kb| kb.parse::<u64>().ok()).expect("kB") * 1024
}

#[test]
fn two_hundred_fifty_six_connections_at_once() {
    const CONNECTIONS: usize = 256;
    let node = start(config(&[0, 1], 64 << 20));
    let rss_before = rss_bytes();
    let addr = node.local_addr();
    let barrier = Arc::new(Barrier::new(CONNECTIONS + 1));
    let threads: Vec<_> = (0..CONNECTIONS)
        .map(|thread| {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let mut client =
                    strata_client::Client::connect(addr, strata_client::ClientOptions::default()).expect("connect");
                barrier.wait();
                let deadline = Instant::now() + Duration::from_secs(30);
                for round in 0..20u64 {
                    assert!(Instant::now() < deadline, "bounded by time");
                    let index = thread as u64 * 1000 + round;
                    client.put(&key_of(index), &value_of(index, 8 << 10)).expect("put");
                    assert!(client.get(&key_of(index)).expect("get") == value_of(index, 8 << 10));
                }
                barrier.wait();
            })
        })
        .collect();
    barrier.wait();
    let open = total(&node, |m| &m.connections);
    assert!(open >= CONNECTIONS as u64 * 2, "{open} connections open (one per shard per client)");
    barrier.wait();
    for thread in threads {
        thread.join().expect("client thread");
    }
    let growth = rss_bytes().saturating_sub(rss_before);
    // 512 connections × (64 KiB in + 64 KiB out) = 64 MiB at most, plus the 40 MiB of values stored and
    // the clients' own buffers (in this process too).
    assert!(growth < 256 << 20, "memory grew by {} MiB", growth >> 20);
    let mut check = client(&node);
    assert!(check.get(&key_of(255_019)).expect("last") == value_of(255_019, 8 << 10));
    node.shutdown().expect("shutdown");
}
