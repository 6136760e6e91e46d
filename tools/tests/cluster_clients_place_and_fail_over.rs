//! A cluster client routes by placement alone and survives a node's kill -9: three nodes register in a real
//! etcd (loopback), a client connected through etcd puts with two replicas, each key lands on exactly the
//! two nodes that weighted rendezvous placement names, and while one node is killed under a steady get and
//! put load, no get of a key with a live replica fails and every acknowledged put reads back. With etcd
//! down the client keeps routing by its last view; when the killed node comes back (empty, a new run), a
//! third of the keys (1/N ± 20 %) move to it and read as misses, never as other bytes.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::NodeProcess;
use common::etcd::{Etcd, free_port};
use strata_client::{Client, ClientError, ClientOptions, ClusterOptions, MembersWatch, PutOptions};
use strata_cluster::{View, WatchConfig};
use strata_proto::placement;

const TTL_SECONDS: u64 = 2;
const KEYS: usize = 600;

fn start_node(id: &str, listen: u16, etcd: u16) -> NodeProcess {
    let (child, _lines, summary) = common::start_until_ready(|command| {
        command
            .args(["--listen", &format!("127.0.0.1:{listen}"), "--metrics", &format!("127.0.0.1:{}", free_port())])
            .args(["--cores", "1", "--cpus", "0", "--dram", "64MiB", "--dram-only"])
            .args(["--cluster", &format!("etcd://127.0.0.1:{etcd}"), "--cluster-name", "test"])
            .args(["--node-id", id, "--lease-ttl", &format!("{TTL_SECONDS}s"), "--zone", &format!("zone-{id}")])
    });
    assert!(summary.contains(&format!("cluster: {id} in cluster test")), "{summary}");
    NodeProcess(child)
}

/// Waits (at most `limit`) until the watch's view serves exactly `ids`.
fn wait_for_view(watch: &MembersWatch, ids: &[&str], limit: Duration) -> Arc<View> {
    let started = Instant::now();
    loop {
        let view = watch.view();
        let serving: Vec<&str> = view.serving().map(|member| member.id.as_str()).collect();
        if serving == ids {
            return view;
        }
        assert!(started.elapsed() < limit, "serving {serving:?}, waited for {ids:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn key(index: usize) -> Vec<u8> {
    format!("block-{index:05}").into_bytes()
}

/// 4 KiB and more for the first keys; 512 bytes and more for those put under load, which stay well within
/// the nodes' DRAM (a node evicts nothing in this test).
fn value(index: usize) -> Vec<u8> {
    let len = if index < KEYS { 4096 } else { 512 } + index % 64;
    (0..len).map(|byte| (byte * 31 + index * 7) as u8).collect()
}

/// The ids of `key`'s replicas, as any client computes them from the view.
fn replica_ids(view: &View, key: &[u8], count: usize) -> Vec<String> {
    let candidates = view.candidates();
    let ids: Vec<String> = view.serving().map(|member| member.id.clone()).collect();
    placement::replicas(key, &candidates, count).into_iter().map(|index| ids[index].clone()).collect()
}

#[test]
fn keys_land_on_their_replicas_and_survive_a_kill() {
    let data = common::fresh_directory("etcd-cluster");
    let etcd = Etcd::start(&data, free_port(), free_port());
    let endpoint = format!("etcd://127.0.0.1:{}", etcd.client_port);
    let ids = ["a", "b", "c"];
    let ports: Vec<u16> = ids.iter().map(|_| free_port()).collect();
    let mut nodes: Vec<NodeProcess> =
        ids.iter().zip(&ports).map(|(id, &port)| start_node(id, port, etcd.client_port)).collect();

    let watch = Arc::new(
        MembersWatch::start(WatchConfig::new(vec![format!("http://127.0.0.1:{}", etcd.client_port)], "test"))
            .expect("the members' watch starts"),
    );
    let view = wait_for_view(&watch, &ids, Duration::from_secs(10));
    let options = ClusterOptions {
        cluster: "test".into(),
        replicas: 2,
        client: ClientOptions { timeout: Duration::from_secs(5), ..ClientOptions::default() },
        ..ClusterOptions::new(&endpoint)
    };
    let mut client = Client::connect_watched(Arc::clone(&watch), &options).expect("cluster client");
    assert_eq!(client.shard_count(), 3, "one shard per node, all three nodes");
    assert_eq!(client.cluster_epoch(), Some(view.epoch));

    // Two replicas per put, each on the nodes placement names.
    let keys: Vec<Vec<u8>> = (0..KEYS).map(key).collect();
    let values: Vec<Vec<u8>> = (0..KEYS).map(value).collect();
    let items: Vec<(&[u8], &[u8])> = keys.iter().zip(&values).map(|(k, v)| (k.as_slice(), v.as_slice())).collect();
    for result in client.batch_put_replicas(&items, PutOptions::default()) {
        assert_eq!(result, Ok(2), "both replicas stored the put");
    }
    let key_refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let mut held: HashMap<String, usize> = HashMap::new();
    let mut holders: Vec<Vec<String>> = vec![Vec::new(); KEYS];
    for (id, &port) in ids.iter().zip(&ports) {
        let mut direct = Client::connect(("127.0.0.1", port), ClientOptions::default()).expect("direct client");
        for (index, exists) in direct.batch_exists(&key_refs).into_iter().enumerate() {
            if exists.expect("exists") {
                holders[index].push(id.to_string());
                *held.entry(id.to_string()).or_default() += 1;
            }
        }
    }
    for (index, holders) in holders.iter().enumerate() {
        let mut expected = replica_ids(&view, &keys[index], 2);
        expected.sort();
        assert_eq!(*holders, expected, "key {index} is on its two replicas and nowhere else");
    }
    for id in ids {
        // Equal weights: each node holds about 2/3 of the keys.
        let share = held[id] as f64 / KEYS as f64;
        assert!((0.5..0.83).contains(&share), "node {id} holds {share:.2} of the keys");
    }
    for (index, got) in client.batch_get(&key_refs).into_iter().enumerate() {
        assert_eq!(got.expect("get"), values[index], "key {index}");
    }

    // Kill b under a steady load of gets (of the keys above) and puts (of new keys), bounded by count and
    // time; the load runs until b's lease expired and the client routes without it.
    let started = Instant::now();
    let mut killed_at = None;
    let mut acknowledged: Vec<usize> = Vec::new();
    let mut gets = 0usize;
    let mut failed_puts = 0usize;
    for round in 0..100_000 {
        if round == 200 {
            nodes[1].kill();
            killed_at = Some(Instant::now());
        }
        let index = (round * 7919) % KEYS;
        match client.get(&keys[index]) {
            Ok(got) => assert_eq!(got, values[index], "key {index} in round {round}"),
            Err(error) => panic!("get of key {index} (replicas {:?}) in round {round}: {error}", holders[index]),
        }
        gets += 1;
        let fresh = KEYS + round;
        match client.put(&key(fresh), &value(fresh)) {
            Ok(()) => acknowledged.push(fresh),
            Err(_) => failed_puts += 1,
        }
        let after_kill = killed_at.map_or(Duration::ZERO, |at| at.elapsed());
        if after_kill > Duration::from_secs(TTL_SECONDS * 3) && client.shard_count() == 2 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the load ran a minute");
    }
    assert!(killed_at.is_some(), "the load reached the kill");
    assert_eq!(client.shard_count(), 2, "b left the view after its lease expired");
    assert_eq!(failed_puts, 0, "a put stores on its live replica while the other is down");
    let view = wait_for_view(&watch, &["a", "c"], Duration::from_secs(1));
    assert_eq!(client.cluster_epoch(), Some(view.epoch));
    eprintln!("{gets} gets, {} puts acknowledged around the kill", acknowledged.len());

    // Every acknowledged put reads back, and every first put too: each had a replica on a or c.
    let stored: Vec<usize> = (0..KEYS).chain(acknowledged.iter().copied()).collect();
    for &index in &stored {
        match client.get(&key(index)) {
            Ok(got) => assert_eq!(got, value(index), "key {index}"),
            Err(ClientError::NotFound) => panic!("acknowledged key {index} is lost"),
            Err(error) => panic!("key {index}: {error}"),
        }
    }

    // etcd down: the client routes by the last view, and the nodes keep serving.
    let (client_port, peer_port) = (etcd.client_port, etcd.peer_port);
    drop(etcd);
    std::thread::sleep(Duration::from_secs(TTL_SECONDS));
    for &index in stored.iter().step_by(10) {
        assert_eq!(client.get(&key(index)).expect("a get while etcd is down"), value(index), "key {index}");
    }
    client.put(b"during-the-outage", b"stored").expect("a put while etcd is down");
    assert_eq!(client.shard_count(), 2, "the last view stands");
    let etcd = Etcd::start(&data, client_port, peer_port);

    // b comes back, empty, as a new run: about a third of the keys now have it first, and read as misses;
    // every other key reads its own bytes.
    nodes[1] = start_node("b", free_port(), etcd.client_port);
    wait_for_view(&watch, &ids, Duration::from_secs(TTL_SECONDS * 5));
    let mut missed = 0usize;
    for &index in &stored {
        match client.get(&key(index)) {
            Ok(got) => assert_eq!(got, value(index), "key {index} after the join"),
            Err(ClientError::NotFound) => missed += 1,
            Err(error) => panic!("key {index} after the join: {error}"),
        }
    }
    let moved = missed as f64 / stored.len() as f64;
    assert!((moved - 1.0 / 3.0).abs() < 0.2 / 3.0, "the join moved {moved:.3} of the keys, not 1/3 ± 20 %");
    eprintln!("the join moved {missed} of {} keys", stored.len());
}
