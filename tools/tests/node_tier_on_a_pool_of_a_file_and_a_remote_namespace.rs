//! The node's NVMe tier on a pool made by `strata-pool create`: a local file and a namespace of an NVMe-oF
//! target (Strata's own, on loopback), reached through Strata's NVMe-oF host. Objects evicted from DRAM go
//! to both namespaces' regions and come back bit-exact, across a restart; a namespace of another pool is
//! refused.

use std::path::PathBuf;
use std::time::Duration;

use strata_engine::EngineConfig;
use strata_nvme::target::{self, NamespaceBackend, NamespaceConfig, SubsystemConfig, TargetConfig};
use strata_tools::node::NodeSettings;
use strata_tools::pool::FormatOptions;

fn value_of(index: u64) -> Vec<u8> {
    (0..(64usize << 10)).map(|at| (index as usize * 131 + at * 7 + at / 4096) as u8).collect()
}

fn node_config(pool: &std::path::Path) -> EngineConfig {
    let settings = NodeSettings {
        listen: Some("127.0.0.1:0".parse().expect("addr")),
        cpus: Some(vec![0]),
        dram: Some("8MiB".into()),
        pool: Some(pool.to_path_buf()),
        metrics: Some("off".into()),
        region_size: Some("1MiB".into()),
        hugepages: Some(false),
        ..NodeSettings::default()
    };
    let mut config = settings.engine_config().expect("config");
    config.read_lease = Duration::ZERO;
    config
}

#[test]
fn a_pool_with_a_remote_namespace_holds_the_nvme_tier() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("node-pool-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let nqn = "nqn.2026-12.io.strata:node-pool";
    let namespaces = vec![NamespaceConfig { backend: NamespaceBackend::Memory { bytes: 48 << 20 }, block_bytes: 4096 }];
    let subsystem = SubsystemConfig { nqn: nqn.into(), namespaces, allowed_hosts: Vec::new() };
    let server =
        target::start(TargetConfig::new("127.0.0.1:0".parse().expect("addr"), vec![subsystem])).expect("target");
    let port = server.local_addr().port();
    let file = format!("file:{},size=48m", dir.join("ns0.img").display());
    let remote = format!("nvmf:trtype=tcp,traddr=127.0.0.1,trsvcid={port},subnqn={nqn},ns=1");
    let pool_file = dir.join("kv.pool.toml");
    strata_tools::pool::create("kv", vec![file.clone(), remote], &pool_file, FormatOptions::default())
        .expect("pool created");

    let node = strata_engine::start(node_config(&pool_file)).expect("node on the pool");
    assert_eq!(node.summary().namespaces.len(), 2);
    let mut client = strata_client::Client::connect(node.local_addr(), Default::default()).expect("client");
    // 32 MiB of values through 8 MiB of DRAM: most live only on the two namespaces.
    for index in 0..512u64 {
        client.put(format!("k{index}").as_bytes(), &value_of(index)).expect("put");
    }
    for index in 0..512u64 {
        assert!(client.get(format!("k{index}").as_bytes()).expect("get") == value_of(index), "key {index}");
    }
    let nvme_hits: u64 = node.metrics.iter().map(|m| m.nvme_hits.load(std::sync::atomic::Ordering::Relaxed)).sum();
    assert!(nvme_hits > 256, "{nvme_hits} NVMe hits");
    drop(client);
    node.shutdown().expect("shutdown");

    // Restart on the same pool: the index is rebuilt from both namespaces.
    let node = strata_engine::start(node_config(&pool_file)).expect("restart");
    let recovered: u64 = node.summary().recovery.iter().map(|report| report.records).sum();
    assert!(recovered >= 512, "{recovered} records recovered");
    let mut client = strata_client::Client::connect(node.local_addr(), Default::default()).expect("client");
    for index in (0..512u64).step_by(7) {
        assert!(client.get(format!("k{index}").as_bytes()).expect("recovered") == value_of(index), "key {index}");
    }
    drop(client);
    node.shutdown().expect("shutdown");

    // The file joins another pool (forced); the first pool's description no longer matches it.
    let other = dir.join("other.pool.toml");
    strata_tools::pool::create("other", vec![file], &other, FormatOptions { force: true, ..FormatOptions::default() })
        .expect("forced into another pool");
    let refused = strata_engine::start(node_config(&pool_file)).err().expect("refused");
    assert!(refused.to_string().contains("belongs to pool \"other\""), "{refused}");
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pool_create_refuses_a_file_in_a_missing_directory_unless_asked_to_create_it() {
    let dir = std::env::temp_dir().join(format!("strata-pool-dirs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let missing = dir.join("not-yet");
    let file = format!("file:{},size=8m", missing.join("ns0.img").display());
    let pool_file = dir.join("p.pool.toml");
    let refused = strata_tools::pool::create("p", vec![file.clone()], &pool_file, FormatOptions::default())
        .expect_err("a missing directory is refused");
    let message = refused.to_string();
    assert!(message.contains(&missing.display().to_string()) && message.contains("does not exist"), "{message}");
    assert!(!missing.exists() && !pool_file.exists(), "nothing was created");
    let options = FormatOptions { create_dirs: true, ..FormatOptions::default() };
    strata_tools::pool::create("p", vec![file], &pool_file, options).expect("created when asked");
    assert!(missing.join("ns0.img").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}
