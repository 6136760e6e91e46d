//! A partition: etcd and an NVMe-oF target (Strata's own) in one network namespace, two nodes in two
//! others, all on a bridge in a fourth; every address is one this test gives its own namespaces. Node b
//! is cut off by taking its link down: once its lease expires, a takes its tier over, and every durable
//! put b acknowledged reads back from a. When the link comes back, b finds its tier taken (its entry's
//! put fails its compare, or the target refuses its I/O) and stops serving (exit code 3) rather than
//! register again with what it held.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::NodeProcess;
use common::etcd::{Etcd, free_port};
use strata_client::{Client, ClientOptions, ClusterOptions, PutOptions};
use strata_nvme::target::{self, NamespaceBackend, NamespaceConfig, SubsystemConfig, TargetConfig};
use strata_proto::WritePolicy;

const TTL_SECONDS: u64 = 2;
const NQN: &str = "nqn.2026-12.io.strata:partition";
const KEYS: usize = 200;

/// The namespaces and links, removed when dropped.
struct Network {
    prefix: String,
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("ip runs");
    assert!(status.success(), "ip {}: {status}", args.join(" "));
}

impl Network {
    /// Namespaces `{prefix}-hub` (the bridge), and `{prefix}-{name}` for each of `names`, the i-th with
    /// address 10.77.{subnet}.{i + 1}/24 on a veth pair to the bridge.
    fn new(prefix: &str, subnet: u8, names: &[&str]) -> Network {
        let network = Network { prefix: prefix.to_string() };
        let hub = format!("{prefix}-hub");
        ip(&["netns", "add", &hub]);
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &hub, "link", "set", "br0", "up"]);
        for (at, name) in names.iter().enumerate() {
            let netns = network.netns(name);
            let (inner, outer) = (format!("v{at}"), format!("p{at}"));
            ip(&["netns", "add", &netns]);
            ip(&["-n", &netns, "link", "set", "lo", "up"]);
            ip(&["-n", &netns, "link", "add", &inner, "type", "veth", "peer", "name", &outer, "netns", &hub]);
            ip(&["-n", &hub, "link", "set", &outer, "master", "br0", "up"]);
            ip(&["-n", &netns, "addr", "add", &format!("10.77.{subnet}.{}/24", at + 1), "dev", &inner]);
            ip(&["-n", &netns, "link", "set", &inner, "up"]);
        }
        network
    }

    fn netns(&self, name: &str) -> String {
        format!("{}-{name}", self.prefix)
    }

    /// Takes the link of the `at`-th namespace (`name`) down or up, from inside it.
    fn set_link(&self, name: &str, at: usize, up: bool) {
        ip(&["-n", &self.netns(name), "link", "set", &format!("v{at}"), if up { "up" } else { "down" }]);
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        let listed = Command::new("ip").args(["netns", "list"]).output().map(|out| out.stdout).unwrap_or_default();
        for line in String::from_utf8_lossy(&listed).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if name.starts_with(&format!("{}-", self.prefix)) {
                let _ = Command::new("ip").args(["netns", "del", name]).status();
            }
        }
    }
}

/// Moves the calling thread into network namespace `netns`: what it connects to, binds, and the threads and
/// processes it starts are in that namespace.
fn enter(netns: &str) {
    let file = std::fs::File::open(format!("/var/run/netns/{netns}")).expect("the namespace's file");
    // SAFETY: setns on an open namespace file descriptor, for the calling thread only.
    #[allow(unsafe_code)]
    let result = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
    assert_eq!(result, 0, "setns into {netns}: {}", std::io::Error::last_os_error());
}

fn key(index: usize) -> Vec<u8> {
    format!("cut-{index:04}").into_bytes()
}

fn value(index: usize) -> Vec<u8> {
    (0..(16 << 10) + index * 37).map(|byte| (byte * 7 + index * 13 + byte / 4096) as u8).collect()
}

fn start_node(network: &Network, name: &str, address: &str, etcd: &str, target: &str, nsid: u32) -> NodeProcess {
    let (child, _lines, summary) = common::start_in_netns_until_ready(&network.netns(name), |command| {
        command
            .args(["--listen", &format!("{address}:7600"), "--metrics", "off"])
            .args(["--cores", "1", "--cpus", "0", "--dram", "8MiB", "--region-size", "1MiB"])
            .args(["--write-policy", "durable"])
            .args(["--nvme", &format!("nvmf:trtype=tcp,traddr={target},trsvcid=4420,subnqn={NQN},ns={nsid}")])
            .args(["--cluster", etcd, "--cluster-name", "cut", "--node-id", name])
            .args(["--lease-ttl", &format!("{TTL_SECONDS}s"), "--max-replicas", "1", "--replicas", "1"])
    });
    assert!(summary.contains("ready"), "{summary}");
    NodeProcess(child)
}

/// Waits (at most `limit`) until every key reads back through the cluster, bit-exact.
fn wait_until_readable(options: &ClusterOptions, limit: Duration) -> Duration {
    let keys: Vec<Vec<u8>> = (0..KEYS).map(key).collect();
    common::wait_until_readable(options, &keys, value, limit)
}

#[test]
fn a_node_cut_off_loses_its_tier_to_a_survivor_and_stops_when_it_comes_back() {
    let network = Network::new(&format!("st{}", std::process::id()), 0, &["svc", "a", "b"]);
    let netns = network.netns("svc");
    // The test's own thread works from the services' namespace: etcd, the target and the clients.
    let scenario = std::thread::spawn(move || {
        enter(&netns);
        run(&network);
    });
    scenario.join().expect("the scenario");
}

fn run(network: &Network) {
    let data = common::fresh_directory("etcd-partition");
    let etcd = Etcd::start_on(&data, "10.77.0.1", free_port(), free_port());
    let endpoint = format!("etcd://10.77.0.1:{}", etcd.client_port);
    let namespaces =
        vec![NamespaceConfig { backend: NamespaceBackend::Memory { bytes: 64 << 20 }, block_bytes: 4096 }; 2];
    let subsystem = SubsystemConfig { nqn: NQN.into(), namespaces, allowed_hosts: Vec::new() };
    let target = target::start(TargetConfig::new("10.77.0.1:4420".parse().expect("addr"), vec![subsystem]))
        .expect("NVMe-oF target");
    let _a = start_node(network, "a", "10.77.0.2", &endpoint, "10.77.0.1", 1);
    let mut b = start_node(network, "b", "10.77.0.3", &endpoint, "10.77.0.1", 2);
    let patient = ClientOptions { timeout: Duration::from_secs(1), ..ClientOptions::default() };
    let options = ClusterOptions {
        cluster: "cut".into(),
        replicas: 1,
        min_replicas: 1,
        client: patient,
        ..ClusterOptions::new(&endpoint)
    };
    let started = Instant::now();
    let mut client = loop {
        match Client::connect_cluster(&options) {
            Ok(client) if client.shard_count() == 2 => break client,
            _ => assert!(started.elapsed() < Duration::from_secs(10), "both nodes serving"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let keys: Vec<Vec<u8>> = (0..KEYS).map(key).collect();
    let values: Vec<Vec<u8>> = (0..KEYS).map(value).collect();
    let items: Vec<(&[u8], &[u8])> = keys.iter().zip(&values).map(|(k, v)| (k.as_slice(), v.as_slice())).collect();
    let durable = PutOptions { policy: Some(WritePolicy::Durable), replicas: 1, ..PutOptions::default() };
    for (index, result) in client.batch_put_with(&items, durable).into_iter().enumerate() {
        result.unwrap_or_else(|error| panic!("durable put of key {index}: {error}"));
    }
    let mut on_b = Client::connect("10.77.0.3:7600", ClientOptions::default()).expect("b");
    let held = on_b.batch_exists(&keys.iter().map(Vec::as_slice).collect::<Vec<_>>());
    let held = held.into_iter().filter(|found| matches!(found, Ok(true))).count();
    assert!(held > KEYS / 5, "b holds a share of the keys: {held}");
    drop(on_b);

    // The cut: b's lease expires, a takes the tier over through the target b can no longer reach.
    network.set_link("b", 2, false);
    let took = wait_until_readable(&options, Duration::from_secs(TTL_SECONDS * 10));
    eprintln!("every durable key readable {took:?} after the cut (lease TTL {TTL_SECONDS} s)");

    // The link comes back: b learns its tier was taken and stops, instead of serving what it held.
    network.set_link("b", 2, true);
    let back = Instant::now();
    let status = loop {
        if let Some(status) = b.0.try_wait().expect("wait") {
            break status;
        }
        assert!(back.elapsed() < Duration::from_secs(TTL_SECONDS * 10), "the fenced node did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(3), "a fenced node exits with code 3");
    wait_until_readable(&options, Duration::from_secs(2));
    target.stop();
}
