//! NVMe-oF takeover with one replica: two nodes whose NVMe tiers are namespaces of one NVMe-oF target
//! (Strata's own, on loopback) register in a real etcd; durable puts go to one node each.
//! - **kill -9.** Once the dead node's lease expires, the survivor claims its tier in etcd, fences it at
//!   the target, recovers its region log and moves every key to its owner: every acknowledged durable put
//!   reads back bit-exact from the cluster, with no replica, and the tier is released.
//! - **Restart.** The dead node starts again on its released tier: it claims it and erases it.
//! - **Fencing.** The node is stopped (SIGSTOP) past its lease and its tier taken over again; resumed, its
//!   durable put fails (the target refuses it: reservation conflict) and it stops serving (exit code 3)
//!   instead of registering again.
//! - **Durably moved.** The survivor's own puts default to write-back, yet after its kill -9 and restart
//!   every key the takeovers moved to it reads back: takeover copies are durable puts.

mod common;

use std::time::{Duration, Instant};

use common::NodeProcess;
use common::etcd::{Etcd, free_port};
use strata_client::{Client, ClientOptions, ClusterOptions, MembersWatch, PutOptions};
use strata_cluster::{TierRecord, TierRecords, TierState, WatchConfig};
use strata_nvme::target::{self, NamespaceBackend, NamespaceConfig, SubsystemConfig, TargetConfig};
use strata_proto::WritePolicy;

const TTL_SECONDS: u64 = 2;
const CLUSTER: &str = "takeover";
const NQN: &str = "nqn.2026-12.io.strata:takeover";

struct Node {
    port: u16,
    process: NodeProcess,
    output: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

/// A node on namespace `nsid` whose puts default to `policy`.
fn start_node(id: &str, policy: &str, etcd: u16, target: u16, nsid: u32) -> Node {
    let port = free_port();
    let (child, output, summary) = common::start_until_ready(|command| {
        command
            .args(["--listen", &format!("127.0.0.1:{port}"), "--metrics", "off"])
            .args(["--cores", "1", "--cpus", "0", "--dram", "8MiB", "--region-size", "1MiB"])
            .args(["--write-policy", policy])
            .args(["--nvme", &format!("nvmf:trtype=tcp,traddr=127.0.0.1,trsvcid={target},subnqn={NQN},ns={nsid}")])
            .args(["--cluster", &format!("etcd://127.0.0.1:{etcd}"), "--cluster-name", CLUSTER])
            .args(["--node-id", id, "--lease-ttl", &format!("{TTL_SECONDS}s")])
            .args(["--max-replicas", "1", "--replicas", "1"])
    });
    assert!(summary.contains("ready"), "{summary}");
    Node { port, process: NodeProcess(child), output }
}

fn key(round: usize, index: usize) -> Vec<u8> {
    format!("tier-{round}-{index:04}").into_bytes()
}

/// 12 to 40 KiB: 300 of them overflow the nodes' 8 MiB of DRAM, so most live only on the tier.
fn value(round: usize, index: usize) -> Vec<u8> {
    let len = (12 << 10) + (index * 997) % (28 << 10);
    (0..len).map(|byte| (byte * 31 + index * 7 + round * 3 + byte / 4096) as u8).collect()
}

/// Puts `count` keys of `round` durably through the cluster client, one replica each.
fn put_round(options: &ClusterOptions, round: usize, count: usize) {
    let mut client = Client::connect_cluster(options).expect("cluster client");
    let keys: Vec<Vec<u8>> = (0..count).map(|index| key(round, index)).collect();
    let values: Vec<Vec<u8>> = (0..count).map(|index| value(round, index)).collect();
    let items: Vec<(&[u8], &[u8])> = keys.iter().zip(&values).map(|(k, v)| (k.as_slice(), v.as_slice())).collect();
    let put = PutOptions { policy: Some(WritePolicy::Durable), replicas: 1, ..PutOptions::default() };
    for (index, result) in client.batch_put_with(&items, put).into_iter().enumerate() {
        result.unwrap_or_else(|error| panic!("durable put of key {index} acknowledged: {error}"));
    }
}

/// Waits (at most `limit`) until every key of `round` reads back from the cluster, bit-exact.
fn wait_until_readable(options: &ClusterOptions, round: usize, count: usize, limit: Duration) -> Duration {
    let keys: Vec<Vec<u8>> = (0..count).map(|index| key(round, index)).collect();
    common::wait_until_readable(options, &keys, |index| value(round, index), limit)
}

/// Waits (at most `limit`) until node `id`'s tier record satisfies `done`.
fn wait_for_record(etcd: u16, id: &str, done: impl Fn(&TierRecord) -> bool, limit: Duration) -> TierRecord {
    let started = Instant::now();
    let mut records =
        TierRecords::connect(&[format!("http://127.0.0.1:{etcd}")], CLUSTER, Duration::from_secs(5)).expect("etcd");
    loop {
        let found = records.read().expect("read").into_iter().map(|(record, _)| record).find(|r| r.node == id);
        if let Some(record) = found.filter(&done) {
            return record;
        }
        assert!(started.elapsed() < limit, "node {id}'s tier record did not change as awaited");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_for_serving(watch: &MembersWatch, ids: &[&str], limit: Duration) {
    let started = Instant::now();
    loop {
        let serving: Vec<String> = watch.view().serving().map(|member| member.id.clone()).collect();
        if serving == ids {
            return;
        }
        assert!(started.elapsed() < limit, "serving {serving:?}, waited for {ids:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_survivor_takes_a_dead_nodes_tier_over_and_fences_it() {
    let data = common::fresh_directory("etcd-takeover");
    let etcd = Etcd::start(&data, free_port(), free_port());
    let namespaces =
        vec![NamespaceConfig { backend: NamespaceBackend::Memory { bytes: 96 << 20 }, block_bytes: 4096 }; 2];
    let subsystem = SubsystemConfig { nqn: NQN.into(), namespaces, allowed_hosts: Vec::new() };
    let target = target::start(TargetConfig::new("127.0.0.1:0".parse().expect("addr"), vec![subsystem]))
        .expect("NVMe-oF target");
    let target_port = target.local_addr().port();
    let endpoint = format!("http://127.0.0.1:{}", etcd.client_port);
    // a's own puts default to write-back: what a takeover moves to it must be durable all the same.
    let mut a = start_node("a", "write-back", etcd.client_port, target_port, 1);
    let mut b = start_node("b", "durable", etcd.client_port, target_port, 2);
    let watch = MembersWatch::start(WatchConfig::new(vec![endpoint], CLUSTER)).expect("watch");
    wait_for_serving(&watch, &["a", "b"], Duration::from_secs(10));
    // A stopped node does not answer: reads give it up after a second, not the default ten.
    let patient = ClientOptions { timeout: Duration::from_secs(1), ..ClientOptions::default() };
    let options = ClusterOptions {
        cluster: CLUSTER.into(),
        replicas: 1,
        min_replicas: 1,
        client: patient,
        ..ClusterOptions::new(&format!("etcd://127.0.0.1:{}", etcd.client_port))
    };
    let owned = wait_for_record(etcd.client_port, "b", |r| r.owner.as_deref() == Some("b"), Duration::from_secs(1));
    assert_eq!((owned.state, owned.epoch), (TierState::Owned, 1));

    // kill -9: every durable put b acknowledged reads back from a, through the cluster.
    put_round(&options, 0, 300);
    let mut on_b = Client::connect(format!("127.0.0.1:{}", b.port), ClientOptions::default()).expect("b");
    let keys: Vec<Vec<u8>> = (0..300).map(|index| key(0, index)).collect();
    let held = on_b.batch_exists(&keys.iter().map(Vec::as_slice).collect::<Vec<_>>());
    let held = held.into_iter().filter(|found| matches!(found, Ok(true))).count();
    assert!(held > 60, "b holds a share of the keys: {held}");
    drop(on_b);
    b.process.kill();
    let limit = Duration::from_secs(TTL_SECONDS * 10);
    let took = wait_until_readable(&options, 0, 300, limit);
    let released = wait_for_record(etcd.client_port, "b", |r| r.state == TierState::Released, limit);
    assert_eq!((released.owner, released.epoch), (None, 2), "a claimed it at epoch 2, then released it");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_strata-pool"))
        .args(["cluster", "status", "--cluster", &format!("etcd://127.0.0.1:{}", etcd.client_port)])
        .args(["--cluster-name", CLUSTER, "--output-format=json"])
        .output()
        .expect("strata-pool cluster status");
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).expect("JSON");
    let tiers = status["tiers"].as_array().expect("tiers");
    let states: Vec<(&str, &str)> =
        tiers.iter().map(|tier| (tier["node"].as_str().unwrap_or(""), tier["state"].as_str().unwrap_or(""))).collect();
    assert_eq!(states, [("a", "owned"), ("b", "released")], "cluster status shows who holds each tier");
    eprintln!("every durable key readable {took:?} after the kill (lease TTL {TTL_SECONDS} s)");

    // Restart on the released tier: b claims it (epoch 3) and erases it; it holds none of round 0.
    let mut b = start_node("b", "durable", etcd.client_port, target_port, 2);
    wait_for_serving(&watch, &["a", "b"], Duration::from_secs(10));
    let again = wait_for_record(etcd.client_port, "b", |r| r.state == TierState::Owned, Duration::from_secs(1));
    assert_eq!((again.owner.as_deref(), again.epoch), (Some("b"), 3));
    put_round(&options, 1, 200);

    // SIGSTOP past the lease: a takes the tier over again; resumed, b's write is refused and b stops.
    let mut stale = Client::connect(format!("127.0.0.1:{}", b.port), ClientOptions::default()).expect("b");
    let pid = b.process.0.id().to_string();
    assert!(std::process::Command::new("kill").args(["-STOP", &pid]).status().expect("kill").success());
    wait_until_readable(&options, 1, 200, limit);
    wait_for_record(etcd.client_port, "b", |r| r.state == TierState::Released && r.epoch == 4, limit);
    assert!(std::process::Command::new("kill").args(["-CONT", &pid]).status().expect("kill").success());
    let durable = PutOptions { policy: Some(WritePolicy::Durable), ..PutOptions::default() };
    let refused = stale.put_with(b"after-the-fence", &value(9, 9), durable);
    assert!(refused.is_err(), "a fenced node's durable write must fail");
    eprintln!("the fenced node's durable put: {refused:?}");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = b.process.0.try_wait().expect("wait") {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the fenced node did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(3), "a fenced node exits with code 3");
    let said: Vec<String> = b.output.by_ref().map_while(Result::ok).collect();
    assert!(said.iter().any(|line| line.contains("fenced")), "{said:?}");
    wait_until_readable(&options, 1, 200, Duration::from_secs(1));
    wait_until_readable(&options, 0, 300, Duration::from_secs(1));

    // kill -9 of a too: the keys the takeovers moved to it were stored durably, and come back with it.
    a.process.kill();
    let _a = start_node("a", "write-back", etcd.client_port, target_port, 1);
    wait_for_serving(&watch, &["a"], Duration::from_secs(10));
    wait_until_readable(&options, 0, 300, Duration::from_secs(5));
    wait_until_readable(&options, 1, 200, Duration::from_secs(5));
    target.stop();
}

/// The claims on a tier record are compare-and-swap: one of two claimers of a dead node's tier wins, a
/// node cannot start on a tier another holds, and a released tier is erased by the next claim.
#[test]
fn claims_on_a_tier_are_compare_and_swap() {
    let data = common::fresh_directory("etcd-claims");
    let etcd = Etcd::start(&data, free_port(), free_port());
    let endpoints = [format!("http://127.0.0.1:{}", etcd.client_port)];
    let mut records = TierRecords::connect(&endpoints, "claims", Duration::from_secs(5)).expect("etcd");
    let mine = TierRecord {
        node: "b".into(),
        namespaces: vec!["nvmf:trtype=tcp,traddr=127.0.0.1,trsvcid=4420,subnqn=nqn.x:y,ns=1".into()],
        shards: 1,
        region_bytes: 1 << 20,
        owner: None,
        epoch: 0,
        state: TierState::Owned,
    };
    let first = records.claim_own(mine.clone()).expect("a new tier");
    assert_eq!((first.record.epoch, first.previous_key, first.erase), (1, 0, false));
    let restart = records.claim_own(mine.clone()).expect("its own tier again");
    assert_eq!((restart.record.epoch, restart.previous_key, restart.erase), (2, 1, false));

    let found = records.read().expect("read").into_iter().find(|(record, _)| record.node == "b").expect("b's tier");
    let won = records.claim_dead("a", (&found.0, found.1)).expect("a claims b's tier");
    assert_eq!((won.record.owner.as_deref(), won.record.epoch, won.previous_key), (Some("a"), 3, 2));
    let lost = records.claim_dead("c", (&found.0, found.1));
    assert!(matches!(lost, Err(strata_cluster::ClaimError::Lost(_))), "{lost:?}");
    let held = records.claim_own(mine.clone());
    assert!(matches!(held, Err(strata_cluster::ClaimError::HeldByAnother { .. })), "{held:?}");
    assert!(held.unwrap_err().to_string().contains("held by node \"a\""));

    records.release(&won).expect("released");
    assert!(records.release(&won).is_err(), "a release is a compare-and-swap too");
    let back = records.claim_own(mine).expect("the released tier");
    assert_eq!(
        (back.record.epoch, back.previous_key, back.erase),
        (4, 3, true),
        "b preempts the key of the node that released it"
    );
}
