//! A node's claim of its own NVMe tier at start: where every namespace of the tier is on NVMe-oF, a
//! survivor can take the tier over when the node dies, so the node records it in etcd
//! (`strata_cluster::claim_own`) and holds its reservation before it recovers a byte of it.

use std::time::Duration;

use anyhow::Context;
use strata_cluster::{ClusterConfig, TierHold, TierRecord, TierRecords, TierState, tier_key};
use strata_engine::EngineConfig;
use strata_nvme::{DeviceSpec, NvmfAddress};

use super::fence;

/// Sets the node's host identity for its remote namespaces and, where the whole tier is on NVMe-oF,
/// claims it: returns what the registration compares (none for a tier with a local namespace, which no
/// other node can reach). A released tier (its keys moved away in a takeover) is erased, not recovered.
pub fn claim_own_tier(cluster: &ClusterConfig, config: &mut EngineConfig) -> anyhow::Result<Option<TierHold>> {
    let addresses = remote_namespaces(&config.nvme);
    if addresses.is_empty() {
        return Ok(None);
    }
    let host = fence::node_host(&cluster.cluster, &cluster.node_id);
    config.nvme_host = Some(fence::engine_host(&host));
    if addresses.len() != config.nvme.len() {
        tracing::warn!("the NVMe tier mixes local and NVMe-oF namespaces: no other node can take it over");
        return Ok(None);
    }
    let mine = TierRecord {
        node: cluster.node_id.clone(),
        namespaces: addresses.iter().map(|address| format!("nvmf:{address}")).collect(),
        shards: config.cpus.len() as u32,
        region_bytes: config.region_bytes,
        owner: None,
        epoch: 0,
        state: TierState::Owned,
    };
    let limit = cluster.lease_ttl.max(Duration::from_secs(2));
    let mut records = TierRecords::connect(&cluster.endpoints, &cluster.cluster, limit)?;
    let claim = records.claim_own(mine).context("claiming the node's NVMe tier")?;
    fence::hold(&addresses, &host, claim.record.epoch, claim.previous_key)
        .context("taking the NVMe tier's reservations")?;
    if claim.erase {
        tracing::info!("the NVMe tier was taken over and released: erasing it");
        config.format = true;
    }
    Ok(Some(TierHold { key: tier_key(&cluster.cluster, &cluster.node_id), revision: claim.revision }))
}

/// The NVMe-oF namespaces among `specs`.
pub fn remote_namespaces(specs: &[DeviceSpec]) -> Vec<NvmfAddress> {
    specs
        .iter()
        .filter_map(|spec| match spec {
            DeviceSpec::Nvmf(address) => Some(address.clone()),
            _ => None,
        })
        .collect()
}
