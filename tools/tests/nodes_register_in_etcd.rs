//! Nodes started with `--cluster` register in a real etcd (Debian's etcd-server, started here on loopback
//! ports with a scratch data directory): their entries carry what they are, a killed node's entry goes when
//! its lease expires, a stopped node's at once, and a node that loses etcd keeps serving, says so in
//! `/healthz` and `/metrics`, and registers again when etcd is back.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use common::NodeProcess;
use common::etcd::{Etcd, free_port};
use strata_cluster::MemberState;

const TTL_SECONDS: u64 = 3;

fn start_node(id: &str, listen: u16, metrics: u16, etcd: u16) -> NodeProcess {
    let (child, _lines, summary) = common::start_until_ready(|command| {
        command
            .args(["--listen", &format!("127.0.0.1:{listen}"), "--metrics", &format!("127.0.0.1:{metrics}")])
            .args(["--cores", "1", "--cpus", "0", "--dram", "64MiB", "--dram-only"])
            .args(["--cluster", &format!("etcd://127.0.0.1:{etcd}"), "--cluster-name", "test"])
            .args(["--node-id", id, "--lease-ttl", &format!("{TTL_SECONDS}s"), "--zone", &format!("zone-{id}")])
    });
    assert!(summary.contains(&format!("cluster: {id} in cluster test")), "{summary}");
    NodeProcess(child)
}

/// GET `path` of the node's metrics address: the body.
fn http_get(port: u16, path: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("metrics address");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default()
}

/// Waits (at most `limit`) until `/healthz` contains `text`.
fn wait_for_health(port: u16, text: &str, limit: Duration) -> String {
    let started = Instant::now();
    loop {
        let body = http_get(port, "/healthz");
        if body.contains(text) {
            return body;
        }
        assert!(started.elapsed() < limit, "/healthz still says {body:?}, waited for {text:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn nodes_register_leave_and_outlive_an_etcd_outage() {
    let data = common::fresh_directory("etcd");
    let (client_port, peer_port) = (free_port(), free_port());
    let mut etcd = Etcd::start(&data, client_port, peer_port);
    let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let mut a = start_node("a", ports[0], ports[1], client_port);
    let mut b = start_node("b", ports[2], ports[3], client_port);

    // Each entry says where the node's shard listens, its zone, state, epoch and tiers.
    let (members, _) = etcd.wait_for(&["a", "b"], Duration::from_secs(10));
    let member_a = members.iter().find(|member| member.id == "a").expect("a");
    let member_b = members.iter().find(|member| member.id == "b").expect("b");
    assert_eq!(member_a.shards, [SocketAddr::from(([127, 0, 0, 1], ports[0]))]);
    assert_eq!((member_a.zone.as_str(), member_a.state), ("zone-a", MemberState::Serving));
    assert_eq!(member_a.dram.capacity, 64 << 20);
    assert!(member_a.dram.free <= member_a.dram.capacity && member_a.nvme.capacity == 0);
    assert!(member_a.epoch > 0 && member_b.epoch > 0 && member_a.epoch != member_b.epoch);
    assert_eq!(http_get(ports[1], "/healthz"), "ok\n");
    assert!(http_get(ports[1], "/metrics").contains("strata_cluster_registered 1\n"));

    // kill -9: the entry stays until the lease expires, then goes.
    b.kill();
    let (_, gone_after) = etcd.wait_for(&["a"], Duration::from_secs(TTL_SECONDS + 5));
    assert!(gone_after <= Duration::from_secs(TTL_SECONDS + 2), "b's entry lasted {gone_after:?}");

    // etcd down: a keeps serving, and says so.
    etcd.stop();
    let health = wait_for_health(ports[1], "degraded: cluster: etcd unreachable", Duration::from_secs(TTL_SECONDS * 3));
    assert!(health.contains("serving its keys"), "{health}");
    assert!(http_get(ports[1], "/metrics").contains("strata_cluster_registered 0\n"));
    let mut client = strata_client::Client::connect(format!("127.0.0.1:{}", ports[0]), Default::default())
        .expect("the node still takes clients");
    client.put(b"during-outage", b"served").expect("put while etcd is down");
    assert_eq!(client.get(b"during-outage").expect("get while etcd is down"), b"served");

    // etcd back: a registers again, with the same start epoch.
    etcd = Etcd::start(&data, etcd.client_port, etcd.peer_port);
    wait_for_health(ports[1], "ok", Duration::from_secs(TTL_SECONDS * 4));
    let (members, _) = etcd.wait_for(&["a"], Duration::from_secs(5));
    assert_eq!(members[0].epoch, member_a.epoch);
    let metrics = http_get(ports[1], "/metrics");
    let registrations = metrics
        .lines()
        .find_map(|line| line.strip_prefix("strata_cluster_registrations_total "))
        .and_then(|count| count.parse::<u64>().ok());
    assert!(registrations.is_some_and(|count| count >= 2), "{metrics}");

    // A clean stop revokes the lease: the entry goes at once, well before the TTL.
    let status = Command::new("kill").args(["-TERM", &a.0.id().to_string()]).status().expect("kill");
    assert!(status.success());
    let (_, gone_after) = etcd.wait_for(&[], Duration::from_secs(TTL_SECONDS + 5));
    assert!(gone_after < Duration::from_secs(TTL_SECONDS), "a's entry lasted {gone_after:?} after SIGTERM");
    let _ = a.0.wait();
    let _ = std::fs::remove_dir_all(&data);
}
