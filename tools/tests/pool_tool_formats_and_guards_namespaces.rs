//! `strata-pool create / status / add / remove` over a local file and a remote namespace served by
//! Strata's target: superblocks name the pool, a namespace of another pool is refused without `--force`,
//! and `status` reports what it finds on the devices, not what the description claims.

use std::path::PathBuf;
use std::process::Command;

use strata_nvme::target::{self, NamespaceBackend, NamespaceConfig, SubsystemConfig, TargetConfig};

fn pool(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_strata-pool")).args(args).output().unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into(),
        String::from_utf8_lossy(&output.stderr).into(),
    )
}

#[test]
fn pools_claim_their_namespaces_and_status_reads_the_devices() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("pool-tool-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let nqn = "nqn.2026-12.io.strata:pool-tool";
    let namespaces = vec![
        NamespaceConfig { backend: NamespaceBackend::Memory { bytes: 32 << 20 }, block_bytes: 4096 },
        NamespaceConfig { backend: NamespaceBackend::Memory { bytes: 16 << 20 }, block_bytes: 512 },
    ];
    let subsystem = SubsystemConfig { nqn: nqn.into(), namespaces, allowed_hosts: Vec::new() };
    let server = target::start(TargetConfig::new("127.0.0.1:0".parse().unwrap(), vec![subsystem])).unwrap();
    let port = server.local_addr().port();
    let file = format!("file:{},size=64m", dir.join("ns0.img").display());
    let remote = format!("nvmf:trtype=tcp,traddr=127.0.0.1,trsvcid={port},subnqn={nqn},ns=1");
    let remote2 = format!("nvmf:trtype=tcp,traddr=127.0.0.1,trsvcid={port},subnqn={nqn},ns=2");
    let first = dir.join("first.pool.toml");
    let second = dir.join("second.pool.toml");
    let (first_s, second_s) = (first.to_str().unwrap(), second.to_str().unwrap());

    let (ok, _, stderr) = pool(&["create", "first", "--ns", &file, "--ns", &remote, "--out", first_s]);
    assert!(ok, "{stderr}");
    let description = std::fs::read_to_string(&first).unwrap();
    assert!(description.contains("name = \"first\"") && description.contains(&remote), "{description}");
    let (ok, stdout, stderr) = pool(&["status", first_s, "--output-format=json"]);
    assert!(ok, "{stdout}{stderr}");
    let status: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(status["namespaces"][0]["state"], "ok");
    assert_eq!(status["namespaces"][0]["capacity_bytes"], 64 << 20);
    assert_eq!(status["namespaces"][1]["capacity_bytes"], 32 << 20);
    assert_eq!(status["namespaces"][1]["reachable"], true);

    // Another pool may not take a namespace of the first one unless forced.
    let (ok, _, stderr) = pool(&["create", "second", "--ns", &remote, "--out", second_s]);
    assert!(!ok && stderr.contains("belongs to pool \"first\"") && stderr.contains("--force"), "{stderr}");
    let (ok, _, stderr) = pool(&["create", "second", "--ns", &remote, "--force", "--out", second_s]);
    assert!(ok, "{stderr}");
    let (ok, stdout, _) = pool(&["status", first_s]);
    assert!(!ok, "status fails when a namespace is not healthy");
    assert!(stdout.contains("belongs to pool \"second\""), "{stdout}");

    // add and remove keep the description and the superblocks in step.
    let (ok, _, stderr) = pool(&["add", second_s, "--ns", &remote2]);
    assert!(ok, "{stderr}");
    let (ok, stdout, stderr) = pool(&["status", second_s]);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("2 namespaces"), "{stdout}");
    let (ok, _, stderr) = pool(&["remove", first_s, "--ns", &remote]);
    assert!(ok, "{stderr}");
    let (ok, stdout, _) = pool(&["status", second_s]);
    assert!(ok, "removing it from the first pool left the second pool's superblock alone: {stdout}");
    let (ok, _, stderr) = pool(&["remove", second_s, "--ns", &remote2]);
    assert!(ok, "{stderr}");
    let (ok, _, stderr) =
        pool(&["create", "third", "--ns", &remote2, "--out", dir.join("third.toml").to_str().unwrap()]);
    assert!(ok, "a removed namespace is free again: {stderr}");

    server.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}
