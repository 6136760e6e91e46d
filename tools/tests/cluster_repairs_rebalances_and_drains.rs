//! A cluster keeps its keys where placement says, by itself: three nodes with `--replicas 2` register in a
//! real etcd (loopback), and a client puts keys with two replicas.
//! - **Repair.** One node is killed with kill -9: once its lease expires, the survivors re-create the
//!   replicas it held, so every key is on both of them again, bit-exact.
//! - **Rebalance.** A fourth node joins: the keys whose replicas now include it are migrated to it (they are
//!   hot: in DRAM), and their old owner gives its copy up, so every key is held by exactly its two replicas.
//! - **Drain.** SIGUSR1 to a node: it leaves placement, moves every key to the replicas of the nodes that
//!   remain, says it drained, and exits cleanly; every key then reads back from the cluster, bit-exact.

mod common;

use std::time::{Duration, Instant};

use common::NodeProcess;
use common::etcd::{Etcd, free_port};
use strata_client::{Client, ClientOptions, ClusterOptions, MembersWatch, PutOptions};
use strata_cluster::{View, WatchConfig};
use strata_proto::placement;

const TTL_SECONDS: u64 = 2;
const KEYS: usize = 300;

struct Node {
    id: &'static str,
    port: u16,
    process: NodeProcess,
    output: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

fn start_node(id: &'static str, etcd: u16) -> Node {
    let port = free_port();
    let (child, output, summary) = common::start_until_ready(|command| {
        command
            .args(["--listen", &format!("127.0.0.1:{port}"), "--metrics", &format!("127.0.0.1:{}", free_port())])
            .args(["--cores", "1", "--cpus", "0", "--dram", "64MiB", "--dram-only"])
            .args(["--cluster", &format!("etcd://127.0.0.1:{etcd}"), "--cluster-name", "heal"])
            .args(["--node-id", id, "--lease-ttl", &format!("{TTL_SECONDS}s")])
            .args(["--max-replicas", "2", "--replicas", "2", "--repair-rate", "64MiB"])
    });
    assert!(summary.contains("SIGUSR1 drains it"), "{summary}");
    Node { id, port, process: NodeProcess(child), output }
}

fn key(index: usize) -> Vec<u8> {
    format!("heal-{index:04}").into_bytes()
}

fn value(index: usize) -> Vec<u8> {
    let len = 2048 + index % 97;
    (0..len).map(|byte| (byte * 13 + index * 5) as u8).collect()
}

/// Which of `nodes` hold each key (one EXISTS batch per node).
fn holders(nodes: &[&Node]) -> Vec<Vec<&'static str>> {
    let keys: Vec<Vec<u8>> = (0..KEYS).map(key).collect();
    let key_refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let mut held = vec![Vec::new(); KEYS];
    for node in nodes {
        let mut client =
            Client::connect(format!("127.0.0.1:{}", node.port), ClientOptions::default()).expect("connect a node");
        for (index, found) in client.batch_exists(&key_refs).into_iter().enumerate() {
            if found.expect("exists") {
                held[index].push(node.id);
            }
        }
    }
    for ids in &mut held {
        ids.sort();
    }
    held
}

/// Each key's two replicas under `view`, sorted.
fn replica_sets(view: &View) -> Vec<Vec<&'static str>> {
    let candidates = view.candidates();
    let ids: Vec<&'static str> = view.serving().map(|member| &*Box::leak(member.id.clone().into_boxed_str())).collect();
    (0..KEYS)
        .map(|index| {
            let mut set: Vec<&'static str> =
                placement::replicas(&key(index), &candidates, 2).into_iter().map(|at| ids[at]).collect();
            set.sort();
            set
        })
        .collect()
}

/// Waits (at most `limit`) until every key is held by exactly `expected[key]` among `nodes`.
fn wait_for_holders(nodes: &[&Node], expected: &[Vec<&'static str>], what: &str, limit: Duration) {
    let started = Instant::now();
    loop {
        let held = holders(nodes);
        let wrong: Vec<usize> = (0..KEYS).filter(|&index| held[index] != expected[index]).collect();
        if wrong.is_empty() {
            return;
        }
        let first = wrong[0];
        assert!(
            started.elapsed() < limit,
            "{what}: {} keys not where they belong, e.g. key {first} on {:?}, wanted on {:?}",
            wrong.len(),
            held[first],
            expected[first]
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every key reads back bit-exact from each of `nodes` that should hold it.
fn check_values(nodes: &[&Node], expected: &[Vec<&'static str>]) {
    for node in nodes {
        let mut client =
            Client::connect(format!("127.0.0.1:{}", node.port), ClientOptions::default()).expect("connect");
        for index in (0..KEYS).filter(|&index| expected[index].contains(&node.id)) {
            assert_eq!(client.get(&key(index)).expect("get"), value(index), "key {index} on {}", node.id);
        }
    }
}

#[test]
fn lost_replicas_are_repaired_joins_rebalance_and_a_drain_moves_every_key() {
    let data = common::fresh_directory("etcd-heal");
    let etcd = Etcd::start(&data, free_port(), free_port());
    let endpoint = format!("http://127.0.0.1:{}", etcd.client_port);
    let mut nodes: Vec<Node> = ["a", "b", "c"].into_iter().map(|id| start_node(id, etcd.client_port)).collect();
    let watch = MembersWatch::start(WatchConfig::new(vec![endpoint.clone()], "heal")).expect("watch");
    let three = common::wait_for_view(&watch, &["a", "b", "c"], Duration::from_secs(10));

    let options = ClusterOptions {
        cluster: "heal".into(),
        replicas: 2,
        min_replicas: 2,
        ..ClusterOptions::new(&format!("etcd://127.0.0.1:{}", etcd.client_port))
    };
    let mut client = Client::connect_cluster(&options).expect("cluster client");
    let keys: Vec<Vec<u8>> = (0..KEYS).map(key).collect();
    let values: Vec<Vec<u8>> = (0..KEYS).map(value).collect();
    let items: Vec<(&[u8], &[u8])> = keys.iter().zip(&values).map(|(k, v)| (k.as_slice(), v.as_slice())).collect();
    let stored = client.batch_put_with(&items, PutOptions { replicas: 2, ..PutOptions::default() });
    assert!(stored.iter().all(Result::is_ok), "{:?}", stored.iter().find(|result| result.is_err()));
    let all: Vec<&Node> = nodes.iter().collect();
    assert_eq!(holders(&all), replica_sets(&three), "each key on its two replicas");

    // Repair: c dies; a and b are the only two nodes left, so each must hold every key.
    let mut dead = nodes.remove(2);
    dead.process.kill();
    let two = common::wait_for_view(&watch, &["a", "b"], Duration::from_secs(TTL_SECONDS * 5));
    let survivors: Vec<&Node> = nodes.iter().collect();
    wait_for_holders(&survivors, &replica_sets(&two), "repair after kill -9", Duration::from_secs(20));
    check_values(&survivors, &replica_sets(&two));

    // Rebalance: d joins; keys whose replicas include d move to it, their old owner gives them up.
    nodes.push(start_node("d", etcd.client_port));
    let with_d = common::wait_for_view(&watch, &["a", "b", "d"], Duration::from_secs(10));
    let expected = replica_sets(&with_d);
    let moved = expected.iter().filter(|set| set.contains(&"d")).count();
    assert!(moved > KEYS / 3, "about 2/3 of the keys have d among their two replicas: {moved}");
    let live: Vec<&Node> = nodes.iter().collect();
    wait_for_holders(&live, &expected, "rebalance after a join", Duration::from_secs(20));
    check_values(&live, &expected);

    // Drain: SIGUSR1 to a; b and d hold every key after, and a exits cleanly.
    let mut draining = nodes.remove(0);
    let pid = draining.process.0.id().to_string();
    assert!(std::process::Command::new("kill").args(["-USR1", &pid]).status().expect("kill").success());
    let two = common::wait_for_view(&watch, &["b", "d"], Duration::from_secs(10));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = draining.process.0.try_wait().expect("wait") {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the draining node did not exit");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "a drained node exits cleanly: {status:?}");
    let said: Vec<String> = draining.output.by_ref().map_while(Result::ok).collect();
    assert!(said.iter().any(|line| line.contains("drained:")), "{said:?}");
    let remaining: Vec<&Node> = nodes.iter().collect();
    wait_for_holders(&remaining, &replica_sets(&two), "drain", Duration::from_secs(5));
    check_values(&remaining, &replica_sets(&two));
    let mut client = Client::connect_cluster(&options).expect("cluster client");
    let read = client.batch_get(&keys.iter().map(Vec::as_slice).collect::<Vec<_>>());
    for (index, result) in read.into_iter().enumerate() {
        assert_eq!(result.expect("every key reads back after the drain"), values[index], "key {index}");
    }
}
