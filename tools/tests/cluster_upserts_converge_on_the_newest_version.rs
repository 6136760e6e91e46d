//! Replicated upserts carry versions (real nodes, real etcd on loopback). One writer's upsert that reaches
//! a replica late, after another writer's newer one, is refused there (`Superseded`) and changes nothing,
//! so replicas agree whatever order upserts reach them in. Two cluster clients upserting the same keys at
//! once leave both replicas of every key with the same bytes at the same version. When a third node
//! joins, the keys that move to it are copied with their versions, so it too refuses what is older than
//! what it received, and a replica that missed an upsert gets the newer one from the next pass. Every
//! replica keeps the replica count the put asked for, for its repairs. A node
//! stopped past its lease while a key it holds is upserted elsewhere answers a miss for that key when it
//! comes back, never the version it held.

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::NodeProcess;
use common::etcd::{Etcd, free_port};
use strata_client::{
    Client, ClientError, ClientOptions, ClusterOptions, MembersWatch, PutOptions, Version, VersionedValue,
};
use strata_cluster::WatchConfig;
use strata_proto::placement;

const KEYS: usize = 200;
const ROUNDS: usize = 6;

fn start_node(id: &str, listen: u16, etcd: u16) -> NodeProcess {
    common::start_cluster_node(id, listen, etcd, &["--replicas", "2", "--max-replicas", "2"])
}

fn key(index: usize) -> Vec<u8> {
    format!("upserted-{index:04}").into_bytes()
}

/// Writer `writer`'s value of key `index` in round `round`: its bytes say who wrote it and when.
fn value(writer: usize, round: usize, index: usize) -> Vec<u8> {
    let tag = format!("writer {writer} round {round} key {index};");
    tag.as_bytes().iter().copied().cycle().take(2048 + index).collect()
}

/// Every key's bytes and version as the node on `port` holds it (a client of that node alone).
fn held_by(port: u16, keys: &[&[u8]]) -> Vec<Result<VersionedValue, ClientError>> {
    let mut node = Client::connect(format!("127.0.0.1:{port}"), ClientOptions::default()).expect("node client");
    node.batch_get_versioned(keys)
}

#[test]
fn replicas_keep_the_newest_upsert_whatever_order_it_arrives_in() {
    let data = common::fresh_directory("etcd-upserts");
    let etcd = Etcd::start(&data, free_port(), free_port());
    let endpoint = format!("etcd://127.0.0.1:{}", etcd.client_port);
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut nodes = vec![start_node("a", ports[0], etcd.client_port), start_node("b", ports[1], etcd.client_port)];
    let watch = Arc::new(
        MembersWatch::start(WatchConfig::new(vec![format!("http://127.0.0.1:{}", etcd.client_port)], "test"))
            .expect("the members' watch starts"),
    );
    common::wait_for_view(&watch, &["a", "b"], Duration::from_secs(10));
    let options = ClusterOptions {
        cluster: "test".into(),
        replicas: 2,
        client: ClientOptions { timeout: Duration::from_secs(5), ..ClientOptions::default() },
        ..ClusterOptions::new(&endpoint)
    };

    // An upsert that reaches replica b late, after a newer one of another writer: b keeps the newer.
    let (mut first, mut second) = (
        Client::connect_watched(Arc::clone(&watch), &options).expect("cluster client"),
        Client::connect_watched(Arc::clone(&watch), &options).expect("cluster client"),
    );
    let late_key: &[u8] = b"arrives-late";
    first.upsert(late_key, b"earlier").expect("first upsert");
    let earlier = held_by(ports[0], &[late_key])[0].clone().expect("a holds it");
    second.upsert(late_key, b"newer").expect("second upsert");
    let newer = held_by(ports[1], &[late_key])[0].clone().expect("b holds it");
    assert_eq!(newer.0, b"newer");
    assert!(newer.1 > earlier.1, "the later upsert has the newer version: {newer:?} after {earlier:?}");
    let mut b = Client::connect(format!("127.0.0.1:{}", ports[1]), ClientOptions::default()).expect("b");
    let replayed = PutOptions { upsert: true, version: earlier.1, ..PutOptions::default() };
    assert_eq!(b.put_with(late_key, &earlier.0, replayed), Err(ClientError::Superseded));
    assert_eq!(held_by(ports[1], &[late_key])[0], Ok(newer.clone()), "b still holds the newer upsert");
    assert_eq!(held_by(ports[0], &[late_key])[0], Ok(newer), "as a does");

    // Two writers upsert every key in the same order at the same time, round after round.
    let start = Arc::new(Barrier::new(2));
    let writers: Vec<_> = (0..2)
        .map(|writer| {
            let (watch, options, start) = (Arc::clone(&watch), options.clone(), Arc::clone(&start));
            std::thread::spawn(move || {
                let mut client = Client::connect_watched(watch, &options).expect("cluster client");
                let mut superseded = 0usize;
                for round in 0..ROUNDS {
                    start.wait();
                    for index in 0..KEYS {
                        match client.upsert(&key(index), &value(writer, round, index)) {
                            Ok(()) => {}
                            Err(ClientError::Superseded) => superseded += 1,
                            Err(error) => panic!("writer {writer}: upsert of key {index} failed: {error}"),
                        }
                    }
                }
                superseded
            })
        })
        .collect();
    let superseded: Vec<usize> = writers.into_iter().map(|writer| writer.join().expect("writer")).collect();

    let keys: Vec<Vec<u8>> = (0..KEYS).map(key).collect();
    let key_refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let (on_a, on_b) = (held_by(ports[0], &key_refs), held_by(ports[1], &key_refs));
    let last_round = [value(0, ROUNDS - 1, 0), value(1, ROUNDS - 1, 0)];
    let mut versions = Vec::with_capacity(KEYS);
    for index in 0..KEYS {
        let (a, b) = (on_a[index].as_ref().expect("a holds it"), on_b[index].as_ref().expect("b holds it"));
        assert_eq!(a, b, "key {index}: the replicas differ (superseded answers: {superseded:?})");
        let version = a.1.expect("an upsert of a cluster client carries a version");
        let last = [value(0, ROUNDS - 1, index), value(1, ROUNDS - 1, index)];
        assert!(last.contains(&a.0), "key {index}: not a last round's value (first key's: {last_round:?})");
        versions.push(version);
    }

    // Each replica keeps the count the client put with (two), which its repairs re-create.
    let mut a = Client::connect(format!("127.0.0.1:{}", ports[0]), ClientOptions::default()).expect("a");
    let page = a.scan_shard(0, 0, 1024).expect("a page of a's keys");
    assert_eq!(page.entries.len(), KEYS + 1);
    assert!(page.entries.iter().all(|entry| entry.replicas == 2), "every key says two replicas");

    // An upsert older than what the replicas hold changes nothing.
    let mut client = Client::connect_watched(Arc::clone(&watch), &options).expect("cluster client");
    let older = Version { sequence: versions[0].sequence - 1, ..versions[0] };
    let stale = PutOptions { upsert: true, version: Some(older), ..PutOptions::default() };
    assert_eq!(client.put_with(&keys[0], b"stale", stale), Err(ClientError::Superseded));
    assert_eq!(held_by(ports[0], &key_refs[..1])[0], on_a[0], "a kept the newer version");
    assert_eq!(held_by(ports[1], &key_refs[..1])[0], on_b[0], "b kept the newer version");

    // Replicas that missed an upsert: keys on a and b, each upserted once more on a alone.
    let missed: Vec<Vec<u8>> = (0..20).map(|index| format!("missed-{index}").into_bytes()).collect();
    let missed_refs: Vec<&[u8]> = missed.iter().map(Vec::as_slice).collect();
    let mut a = Client::connect(format!("127.0.0.1:{}", ports[0]), ClientOptions::default()).expect("a");
    for key in &missed {
        client.upsert(key, b"first").expect("an upsert on a and b");
        let held = held_by(ports[0], &[key])[0].clone().expect("a holds it").1.expect("versioned");
        let newer = Version { sequence: held.sequence + 1, ..held };
        let options = PutOptions { upsert: true, version: Some(newer), ..PutOptions::default() };
        a.put_with(key, b"second", options).expect("a newer upsert on a alone");
    }
    assert!(held_by(ports[1], &missed_refs).iter().all(|held| held.as_ref().is_ok_and(|(bytes, _)| bytes == b"first")));

    // A third node: the keys it now holds a replica of are copied to it with their versions.
    nodes.push(start_node("c", ports[2], etcd.client_port));
    let view = common::wait_for_view(&watch, &["a", "b", "c"], Duration::from_secs(10));
    let ids: Vec<String> = view.serving().map(|member| member.id.clone()).collect();
    let moved: Vec<usize> = (0..KEYS)
        .filter(|&index| {
            let replicas = placement::replicas(&keys[index], &view.candidates(), 2);
            replicas.iter().any(|&node| ids[node] == "c")
        })
        .collect();
    assert!(!moved.is_empty(), "some keys have a replica on c");
    let moved_keys: Vec<&[u8]> = moved.iter().map(|&index| key_refs[index]).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let on_c = loop {
        let on_c = held_by(ports[2], &moved_keys);
        if on_c.iter().all(Result::is_ok) || Instant::now() > deadline {
            break on_c;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    for (at, &index) in moved.iter().enumerate() {
        let (bytes, version) = on_c[at].as_ref().unwrap_or_else(|error| panic!("key {index} not copied to c: {error}"));
        assert_eq!((bytes, *version), (&on_a[index].as_ref().expect("a").0, Some(versions[index])), "key {index}");
    }
    // The passes of the new epoch compare versions, not only presence: every replica of a missed key ends
    // with the newer upsert.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stale: Vec<String> = missed
            .iter()
            .filter(|key| {
                placement::replicas(key, &view.candidates(), 2).iter().any(|&node| {
                    let port = ports[["a", "b", "c"].iter().position(|id| *id == ids[node]).expect("a node")];
                    !matches!(&held_by(port, &[key])[0], Ok((bytes, _)) if bytes == b"second")
                })
            })
            .map(|key| String::from_utf8_lossy(key).into_owned())
            .collect();
        if stale.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "replicas still without the newer upsert: {stale:?}");
        std::thread::sleep(Duration::from_millis(200));
    }

    let first = moved[0];
    let older = Version { sequence: versions[first].sequence - 1, ..versions[first] };
    let mut c = Client::connect(format!("127.0.0.1:{}", ports[2]), ClientOptions::default()).expect("c");
    let stale = PutOptions { upsert: true, version: Some(older), ..PutOptions::default() };
    assert_eq!(c.put_with(&keys[first], b"stale", stale), Err(ClientError::Superseded), "c refuses the older one");

    // b stopped past its lease misses an upsert; back in the cluster, it never serves the version it held.
    let held_by_b = (0..KEYS)
        .map(|index| format!("upserted-while-away-{index}").into_bytes())
        .find(|key| {
            let order = placement::replicas(key, &view.candidates(), 2);
            order.iter().any(|&node| ids[node] == "b")
        })
        .expect("a key with a replica on b");
    client.upsert(&held_by_b, b"before").expect("upsert before b stops");
    let b_pid = nodes[1].0.id().to_string();
    let signal = |name: &str| {
        let status = std::process::Command::new("kill").args([name, &b_pid]).status().expect("kill runs");
        assert!(status.success(), "kill {name} {b_pid}");
    };
    signal("-STOP");
    common::wait_for_view(&watch, &["a", "c"], Duration::from_secs(10));
    client.upsert(&held_by_b, b"after").expect("upsert while b is away");
    signal("-CONT");
    common::wait_for_view(&watch, &["a", "b", "c"], Duration::from_secs(10));
    let on_b = held_by(ports[1], &[&held_by_b])[0].clone();
    assert!(
        matches!(&on_b, Err(ClientError::NotFound)) || matches!(&on_b, Ok((bytes, _)) if bytes == b"after"),
        "b answers a miss or the newer upsert, never the one it held: {on_b:?}"
    );
    match client.get(&held_by_b) {
        Ok(bytes) => assert_eq!(bytes, b"after"),
        Err(error) => assert_eq!(error, ClientError::NotFound),
    }
    drop(nodes);
}
