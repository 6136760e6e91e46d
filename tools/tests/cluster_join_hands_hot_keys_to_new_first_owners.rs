//! A join under the default ownership reach (`--max-replicas 3`, one replica per put): the old owner of a
//! key whose first node is now the newcomer stays an owner (a spare), and hands its hot keys to the
//! newcomer, so readers, who go to the first node, find them. Removals reach every node, so a spare's copy
//! of a removed key is removed too and no later pass hands it back. Real nodes, real etcd on loopback.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::etcd::{Etcd, free_port};
use strata_client::{Client, ClientError, ClientOptions, ClusterOptions, MembersWatch};
use strata_cluster::WatchConfig;

const KEYS: usize = 300;

fn key(index: usize) -> Vec<u8> {
    format!("joined-{index:04}").into_bytes()
}

fn value(index: usize) -> Vec<u8> {
    (0..1024 + index).map(|at| (at * 7 + index) as u8).collect()
}

/// Waits (at most 30 s) until every key not in `removed` reads back with its value through `client`;
/// a read never returns other bytes, and a removed key never comes back.
fn wait_until_all_read(client: &mut Client, removed: &[usize]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut missing = Vec::new();
        for index in 0..KEYS {
            match client.get(&key(index)) {
                Ok(bytes) => {
                    assert!(!removed.contains(&index), "removed key {index} came back");
                    assert!(bytes == value(index), "key {index}: other bytes");
                }
                Err(ClientError::NotFound) if removed.contains(&index) => {}
                Err(error) => missing.push((index, error)),
            }
        }
        if missing.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "{} keys still missing, e.g. {:?}", missing.len(), &missing[..1]);
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_joins_hot_keys_reach_their_new_first_owner_and_removed_keys_stay_removed() {
    let data = common::fresh_directory("etcd-join");
    let etcd = Etcd::start(&data, free_port(), free_port());
    let endpoint = format!("etcd://127.0.0.1:{}", etcd.client_port);
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut nodes = vec![common::start_cluster_node("a", ports[0], etcd.client_port, &[])];
    let watch = Arc::new(
        MembersWatch::start(WatchConfig::new(vec![format!("http://127.0.0.1:{}", etcd.client_port)], "test"))
            .expect("the members' watch starts"),
    );
    common::wait_for_view(&watch, &["a"], Duration::from_secs(10));
    let options = ClusterOptions { cluster: "test".into(), ..ClusterOptions::new(&endpoint) };
    let mut client = Client::connect_watched(Arc::clone(&watch), &options).expect("cluster client");
    for index in 0..KEYS {
        client.put(&key(index), &value(index)).expect("put on a");
    }
    let mut removed: Vec<usize> = (0..KEYS).step_by(30).collect();
    for &index in &removed {
        client.remove(&key(index)).expect("removed");
    }

    // b joins: about half the keys have b first now; a keeps them (it owns them still) and hands them over.
    nodes.push(common::start_cluster_node("b", ports[1], etcd.client_port, &[]));
    common::wait_for_view(&watch, &["a", "b"], Duration::from_secs(10));
    wait_until_all_read(&mut client, &removed);

    // Keys held on both a and b now are removed from both, and c's join hands none of them back.
    let more: Vec<usize> = (7..KEYS).step_by(30).collect();
    for &index in &more {
        client.remove(&key(index)).expect("removed");
    }
    removed.extend(more);
    nodes.push(common::start_cluster_node("c", ports[2], etcd.client_port, &[]));
    common::wait_for_view(&watch, &["a", "b", "c"], Duration::from_secs(10));
    wait_until_all_read(&mut client, &removed);
    // The passes of c's epoch are over once c holds its share; one more look at the removed keys after.
    std::thread::sleep(Duration::from_secs(2));
    wait_until_all_read(&mut client, &removed);
    for port in &ports {
        let mut direct = Client::connect(format!("127.0.0.1:{port}"), ClientOptions::default()).expect("direct");
        for &index in &removed {
            assert_eq!(direct.exists(&key(index)), Ok(false), "removed key {index} is held on :{port}");
        }
    }
    drop(nodes);
}
