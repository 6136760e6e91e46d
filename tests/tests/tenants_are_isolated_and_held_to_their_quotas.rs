//! Tenants: a token picks the tenant, a wrong token is refused and counted, each tenant's keys are its own
//! (reads, existence, removal, events, restarts), and each is held to its DRAM, NVMe and pinned quotas.

mod common;

use std::time::{Duration, Instant};

use common::{Scratch, config, start, total, value_of, with_file};
use strata_client::{Client, ClientError, ClientOptions, Event, Pin, PutOptions, WritePolicy};
use strata_engine::tenants::TenantConfig;

fn tenant(name: &str, dram: Option<u64>, nvme: Option<u64>, pinned: Option<u64>) -> TenantConfig {
    TenantConfig {
        name: name.into(),
        token: format!("token-of-{name}").into_bytes(),
        dram_quota: dram,
        nvme_quota: nvme,
        max_pinned: pinned,
    }
}

fn connect(node: &strata_engine::Node, token: Option<&str>) -> Result<Client, ClientError> {
    let options = ClientOptions { token: token.map(|token| token.as_bytes().to_vec()), ..ClientOptions::default() };
    Client::connect(node.local_addr(), options)
}

fn tenanted_config(path: &std::path::Path) -> strata_engine::EngineConfig {
    let mut node_config = with_file(config(&[0, 1], 32 << 20), path, 128 << 20);
    node_config.tenants = vec![
        tenant("alpha", Some(4 << 20), None, Some(200 << 10)),
        tenant("beta", None, None, None),
        tenant("gamma", None, Some(1 << 20), None),
    ];
    node_config
}

#[test]
fn tenants_see_only_their_own_keys_and_a_wrong_token_is_refused() {
    let scratch = Scratch::new("tenants");
    let path = scratch.file("ns0.img");
    let node = start(tenanted_config(&path));
    assert_eq!(connect(&node, Some("token-of-nobody")).err(), Some(ClientError::Unauthenticated));
    assert_eq!(connect(&node, None).err(), Some(ClientError::Unauthenticated));
    assert!(total(&node, |shard| &shard.auth_failures) >= 2, "refusals are counted");
    let mut alpha = connect(&node, Some("token-of-alpha")).expect("alpha");
    let mut beta = connect(&node, Some("token-of-beta")).expect("beta");
    let alpha_events = alpha.subscribe_events(None).expect("subscribe");

    alpha.put(b"shared-name", b"alpha's block").expect("alpha put");
    assert_eq!(beta.get(b"shared-name"), Err(ClientError::NotFound), "beta cannot read alpha's key");
    assert_eq!(beta.exists(b"shared-name"), Ok(false));
    assert_eq!(beta.prefix_match(&[b"shared-name"]), Ok(0));
    assert_eq!(beta.remove(b"shared-name"), Err(ClientError::NotFound));
    beta.put(b"shared-name", b"beta's block").expect("beta has its own key of that name");
    assert_eq!(alpha.get(b"shared-name").expect("alpha"), b"alpha's block");
    assert_eq!(beta.get(b"shared-name").expect("beta"), b"beta's block");
    assert_eq!(beta.remove_all(), Ok(1), "beta's remove_all removes beta's keys only");
    assert_eq!(alpha.get(b"shared-name").expect("alpha still"), b"alpha's block");
    beta.put(b"beta-only", b"x").expect("put");

    // Alpha's events name its keys as alpha wrote them, and never beta's.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        match alpha_events.next_timeout(Duration::from_millis(300)) {
            Some(event) => seen.push(event.expect("event").event),
            None if !seen.is_empty() => break,
            None => {}
        }
    }
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(matches!(&seen[0], Event::BlockStored { keys, size: 13, .. } if keys == &[b"shared-name".to_vec()]));
    drop(alpha_events);
    drop((alpha, beta));
    node.shutdown().expect("shutdown");

    // Scoping is in the stored keys: it survives a restart.
    let node = start(tenanted_config(&path));
    let mut alpha = connect(&node, Some("token-of-alpha")).expect("alpha");
    let mut beta = connect(&node, Some("token-of-beta")).expect("beta");
    assert_eq!(alpha.get(b"shared-name").expect("alpha after restart"), b"alpha's block");
    assert_eq!(beta.get(b"shared-name"), Err(ClientError::NotFound));
    assert_eq!(beta.get(b"beta-only").expect("beta after restart"), b"x");
    node.shutdown().expect("shutdown");
}

#[test]
fn each_tenant_is_held_to_its_quotas_without_touching_the_others() {
    let scratch = Scratch::new("tenant-quotas");
    let node = start(tenanted_config(&scratch.file("ns0.img")));
    let mut alpha = connect(&node, Some("token-of-alpha")).expect("alpha");
    let mut beta = connect(&node, Some("token-of-beta")).expect("beta");
    let mut gamma = connect(&node, Some("token-of-gamma")).expect("gamma");
    let block = |index: u64| value_of(index, 128 << 10);
    // Beta's blocks first, then alpha writes 16 MiB against its 4 MiB DRAM quota (2 MiB per shard).
    for index in 0..16u64 {
        beta.put(format!("beta/{index}").as_bytes(), &block(index)).expect("beta put");
    }
    for index in 0..128u64 {
        alpha.put(format!("alpha/{index}").as_bytes(), &block(1000 + index)).expect("alpha put within its quota");
    }
    let usage: Vec<_> = node.metrics.iter().flat_map(|shard| shard.tenants.lock().expect("gauges").clone()).collect();
    let alpha_dram: u64 = usage.iter().filter(|gauge| gauge.tenant == "alpha").map(|gauge| gauge.dram_bytes).sum();
    assert!(alpha_dram <= 4 << 20, "alpha holds {alpha_dram} DRAM bytes over its 4 MiB quota");
    assert!(alpha_dram > 2 << 20, "alpha uses its quota ({alpha_dram})");
    // Alpha's evicted blocks are on NVMe, still served; beta's were never evicted for alpha.
    assert_eq!(alpha.get(b"alpha/0").expect("alpha's oldest, from NVMe"), block(1000));
    let beta_dram: u64 = usage.iter().filter(|gauge| gauge.tenant == "beta").map(|gauge| gauge.dram_bytes).sum();
    assert_eq!(beta_dram, 16 * (128 << 10) + 10 * 10 + 6 * 11, "beta's 16 blocks are all still in DRAM");
    // Alpha's pinned bytes are bounded (200 KiB, 100 KiB per shard).
    let hard = PutOptions { pin: Pin::Hard, ..PutOptions::default() };
    alpha.put_with(b"alpha/pin-1", &value_of(1, 50 << 10), hard).expect("a pin within the bound");
    assert_eq!(alpha.put_with(b"alpha/pin-2", &value_of(2, 120 << 10), hard), Err(ClientError::Quota));
    assert_eq!(alpha.get(b"alpha/pin-2"), Err(ClientError::NotFound));
    beta.put_with(b"beta/pin", &value_of(3, 120 << 10), hard).expect("beta has no pin quota");
    // Gamma may keep 1 MiB on NVMe (512 KiB per shard): durable puts past it are refused.
    let durable = PutOptions { policy: Some(WritePolicy::Durable), ..PutOptions::default() };
    let mut refused = 0;
    for index in 0..16u64 {
        match gamma.put_with(format!("gamma/{index}").as_bytes(), &block(index), durable) {
            Ok(()) => {}
            Err(ClientError::Quota) => refused += 1,
            Err(other) => panic!("gamma/{index}: {other:?}"),
        }
    }
    assert!((8..16).contains(&refused), "{refused} of 16 refused");
    node.shutdown().expect("shutdown");
}
