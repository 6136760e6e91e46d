//! A cluster client routes by placement alone and survives a node's kill -9: three nodes register in a real
//! etcd (loopback), a client connected through etcd puts with two replicas, each key lands on exactly the
//! two nodes that weighted rendezvous placement names, and while one node is killed under a steady get and
//! put load, no get of a key with a live replica fails and every acknowledged put reads back. With etcd
//! down the client keeps routing by its last view; when the killed node comes back (empty, a new run), a
//! third of the keys (1/N ± 20 %) move to it and read as misses, never as other bytes. `strata-pool cluster
//! status` shows the members and the keys each holds, and a subscription through the cluster client tags
//! each event with the node it happened on.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::NodeProcess;
use common::etcd::{Etcd, free_port};
use strata_client::{
    AsyncClient, Client, ClientError, ClientOptions, ClusterOptions, Event, EventStream, MembersWatch, PutOptions,
};
use strata_cluster::{View, WatchConfig};
use strata_proto::placement;

/// The nodes' lease (`common::start_cluster_node`).
const TTL_SECONDS: u64 = 2;
const KEYS: usize = 600;

fn start_node(id: &str, listen: u16, etcd: u16) -> NodeProcess {
    // Repair and rebalance off: this test is the clients' (cluster_repairs_rebalances_and_drains is the
    // nodes'), and a join's moved keys must read as misses here, not be migrated.
    let zone = format!("zone-{id}");
    common::start_cluster_node(id, listen, etcd, &["--zone", &zone, "--max-replicas", "2", "--repair-rate", "0"])
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

/// `strata-pool cluster status` lists the three nodes, serving, with the keys each holds (`held`) once their
/// entries are refreshed (every third of the lease's TTL).
fn check_status(etcd: &str, held: &HashMap<String, usize>) {
    let status = |format: &str| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_strata-pool"))
            .args(["cluster", "status", "--cluster", etcd, "--cluster-name", "test", format])
            .output()
            .expect("strata-pool runs");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).expect("UTF-8")
    };
    let started = Instant::now();
    loop {
        let json: serde_json::Value = serde_json::from_str(&status("--output-format=json")).expect("JSON");
        let members = json["members"].as_array().expect("members");
        let keys: HashMap<String, usize> = members
            .iter()
            .map(|member| {
                (member["id"].as_str().unwrap_or("").to_string(), member["keys"].as_u64().unwrap_or(0) as usize)
            })
            .collect();
        assert!(members.iter().all(|member| member["state"] == "serving"), "{json}");
        if keys == *held {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(TTL_SECONDS * 5), "status says {keys:?}, nodes hold {held:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let table = status("--output-format=normal");
    assert!(table.starts_with("cluster test: 3 members, 3 serving"), "{table}");
    for (id, count) in held {
        let line = table.lines().find(|line| line.starts_with(&format!("{id} "))).expect("a line per member");
        assert!(line.ends_with(&format!(" {count}")), "{line}");
    }
}

/// The cluster's events name the node each put was stored on: every key's two replicas, once each.
fn check_events(events: &EventStream, keys: &[Vec<u8>], holders: &[Vec<String>]) {
    let index_of: HashMap<&[u8], usize> = keys.iter().enumerate().map(|(index, key)| (key.as_slice(), index)).collect();
    let mut stored_on: Vec<Vec<String>> = vec![Vec::new(); keys.len()];
    let mut count = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while count < 2 * keys.len() && Instant::now() < deadline {
        let Some(event) = events.next_timeout(Duration::from_millis(100)) else { continue };
        let event = event.expect("the event streams stay up");
        if let Event::BlockStored { keys: stored, .. } = event.event {
            for key in stored {
                stored_on[index_of[key.as_slice()]].push(event.node.to_string());
                count += 1;
            }
        }
    }
    for (index, nodes) in stored_on.iter_mut().enumerate() {
        nodes.sort();
        assert_eq!(*nodes, holders[index], "the events of key {index} name its replicas");
    }
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
    let view = common::wait_for_view(&watch, &ids, Duration::from_secs(10));
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
    let events = client.subscribe_events(None).expect("a subscription to every node");
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
    check_status(&endpoint, &held);
    check_events(&events, &keys, &holders);

    // A client given one node's address learns the cluster from it (MEMBERS) and routes like the others.
    let mut learnt = Client::connect_learning(&[format!("127.0.0.1:{}", ports[2])], &options).expect("learnt");
    assert_eq!(learnt.shard_count(), 3, "the three nodes, learnt from c");
    let document = learnt.members().expect("MEMBERS").expect("c is in a cluster");
    assert_eq!((document.cluster.as_str(), document.members.len()), ("test", 3));
    for (index, got) in learnt.batch_get(&key_refs).into_iter().enumerate() {
        assert_eq!(got.expect("a get through the learnt view"), values[index], "key {index}");
    }
    // The async client of a cluster: the same client on its own I/O thread.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let asynchronous = AsyncClient::connect_cluster(options.clone()).await.expect("an async cluster client");
        assert_eq!(asynchronous.get(keys[7].clone()).await.expect("an async get"), values[7]);
    });

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
    let two_nodes = common::wait_for_view(&watch, &["a", "c"], Duration::from_secs(1));
    assert_eq!(client.cluster_epoch(), Some(two_nodes.epoch));
    eprintln!("{gets} gets, {} puts acknowledged around the kill", acknowledged.len());

    // Every acknowledged put reads back, and every first put too: each had a replica on a or c.
    let stored: Vec<usize> = (0..KEYS).chain(acknowledged.iter().copied()).collect();
    for &index in &stored {
        match client.get(&key(index)) {
            Ok(got) => assert_eq!(got, value(index), "key {index}"),
            Err(ClientError::NotFound) => {
                // Where it should be and where it is, so that a failure says which step lost it.
                let held_by = |port: u16| {
                    let mut direct = Client::connect(("127.0.0.1", port), ClientOptions::default()).expect("direct");
                    direct.exists(&key(index)).map_err(|error| error.to_string())
                };
                panic!(
                    "acknowledged key {index} is lost: replicas {:?} among three nodes, {:?} among two; \
                     a holds it: {:?}, c holds it: {:?}",
                    replica_ids(&view, &key(index), 2),
                    replica_ids(&two_nodes, &key(index), 2),
                    held_by(ports[0]),
                    held_by(ports[2]),
                )
            }
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
    common::wait_for_view(&watch, &ids, Duration::from_secs(TTL_SECONDS * 5));
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

    // A client still routing by the two-node view: a node that no longer owns a key answers MOVED rather
    // than store it where no reader will look, so a put lands only on its owners under the new view.
    let three_nodes = watch.view();
    let stale = ClusterOptions { down_for: Duration::from_millis(100), ..options.clone() };
    let mut stale = Client::connect_watched(Arc::new(MembersWatch::fixed((*two_nodes).clone())), &stale)
        .expect("a client of the old view");
    assert_eq!(stale.cluster_epoch(), Some(two_nodes.epoch));
    let mut direct: HashMap<String, Client> = three_nodes
        .serving()
        .map(|member| (member.id.clone(), Client::connect(member.shards[0], ClientOptions::default()).expect("direct")))
        .collect();
    let (mut partly, mut wholly) = (0, 0);
    for index in 0..60 {
        let key = format!("late-{index}").into_bytes();
        let owners = replica_ids(&three_nodes, &key, 2);
        let stored = stale.batch_put_replicas(&[(&key, b"late")], PutOptions::default()).remove(0);
        if owners.contains(&"b".to_string()) {
            assert_eq!(stored, Ok(1), "late-{index}: only the owner of a and c stored it");
            partly += 1;
        } else {
            assert_eq!(stored, Ok(2), "late-{index}: a and c both own it");
            wholly += 1;
        }
        for (id, node) in direct.iter_mut().filter(|(id, _)| *id != "b") {
            let held = node.exists(&key).expect("exists");
            assert_eq!(held, owners.contains(id), "late-{index} on {id}");
        }
    }
    assert!(partly > 0 && wholly > 0, "both kinds of key were tried: {partly} and {wholly}");
    // Its reads of keys stored under the new view find them or miss, never fail or read other bytes.
    let mut found = 0;
    for index in 0..60 {
        let key = format!("fresh-{index}").into_bytes();
        client.put(&key, &value(KEYS + index)).expect("a put under the new view");
        match stale.get(&key) {
            Ok(got) => {
                assert_eq!(got, value(KEYS + index), "fresh-{index}");
                found += 1;
            }
            Err(ClientError::NotFound) => {}
            Err(error) => panic!("fresh-{index} from the old view: {error}"),
        }
    }
    assert!(found > 0, "the old view still finds the keys whose owners it knows");
}
