//! A members' watch follows the entries' rewrites from etcd's watch events alone: a node with a 1 s lease
//! rewrites its entry every third of a second while its key count changes, and a watch that re-reads the
//! members only every minute still sees every rewrite (the view's revision and the member's key count move
//! with them) and keeps its epoch, since placement did not change. etcd's own count of range reads shows
//! that no client re-reads per event: before, each rewrite cost every watch a read of the whole prefix.

mod common;

use std::time::{Duration, Instant};

use common::NodeProcess;
use common::etcd::{Etcd, free_port};
use strata_client::{Client, ClientOptions, MembersWatch};
use strata_cluster::WatchConfig;

/// etcd's `etcd_mvcc_range_total`: range reads it served.
fn ranges(client_port: u16) -> u64 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", client_port)).expect("etcd");
    stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").expect("request");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("metrics");
    let line = text.lines().find(|line| line.starts_with("etcd_mvcc_range_total ")).expect("the range counter");
    line.split_whitespace().nth(1).and_then(|value| value.parse::<f64>().ok()).expect("a number") as u64
}

#[test]
fn entry_rewrites_reach_the_view_through_watch_events() {
    let data = common::fresh_directory("etcd-watch-events");
    let etcd = Etcd::start(&data, free_port(), free_port());
    let port = free_port();
    let (child, _lines, _summary) = common::start_until_ready(|command| {
        command
            .args(["--listen", &format!("127.0.0.1:{port}"), "--metrics", "off"])
            .args(["--cores", "1", "--cpus", "0", "--dram", "64MiB", "--dram-only"])
            .args(["--cluster", &format!("etcd://127.0.0.1:{}", etcd.client_port), "--cluster-name", "events"])
            .args(["--node-id", "a", "--lease-ttl", "1s", "--repair-rate", "0"])
    });
    let _node = NodeProcess(child);
    let config = WatchConfig {
        resync: Duration::from_secs(60),
        ..WatchConfig::new(vec![format!("http://127.0.0.1:{}", etcd.client_port)], "events")
    };
    let watch = MembersWatch::start(config).expect("watch");
    let first = watch.view();
    assert_eq!(first.serving().count(), 1);

    let mut client = Client::connect(format!("127.0.0.1:{port}"), ClientOptions::default()).expect("node");
    let ranges_before = ranges(etcd.client_port);
    let mut stored = 0u64;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        for _ in 0..20 {
            client.put(format!("key-{stored}").as_bytes(), b"value").expect("put");
            stored += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The last refresh (a third of the TTL) and its event, bounded.
    let deadline = Instant::now() + Duration::from_secs(3);
    while watch.view().members[0].keys != stored {
        assert!(
            Instant::now() < deadline,
            "the view says {} keys, the node holds {stored}",
            watch.view().members[0].keys
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let ranges_during = ranges(etcd.client_port) - ranges_before;
    let last = watch.view();
    let rewrites = last.revision - first.revision;
    assert!(rewrites >= 8, "the entry was rewritten {rewrites} times in 4 s under a 1 s lease");
    assert_eq!(last.epoch, first.epoch, "a free-space refresh moves no placement");
    // The node's own watch re-reads every 2 s (about 2 reads in these 4 s); the test's watch never does.
    assert!(
        ranges_during < rewrites as u64,
        "{ranges_during} range reads for {rewrites} rewrites: the watches re-read per event"
    );
}
