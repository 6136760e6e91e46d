//! Recovering a dead node's tier and moving its keys: an engine of its own over the tier's namespaces
//! rebuilds the index from the region log (the node's own start-up recovery), and drain passes of the
//! rebalancer (`crate::rebalance`) copy every key to its owners under the current view and remove it from
//! the tier. The keys are then served by their owners; the tier holds nothing more.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use strata_client::{Client, ClientOptions};
use strata_cluster::{TierRecord, View};
use strata_engine::EngineConfig;
use strata_engine::config::EventCpus;
use strata_nvme::{DeviceSpec, HostOptions, NvmfAddress};
use strata_proto::WritePolicy;

use crate::rebalance::pass::{PassContext, PassReport, run_pass_parallel};
use crate::rebalance::store::Nodes;
use crate::rebalance::throttle::Throttle;

/// DRAM per shard of a recovering tier: reads of the tier need none, so the engine's minimum and a margin.
const DRAM_PER_SHARD: u64 = 16 << 20;
/// Drain passes before the takeover gives up for now (and tries again later, the tier still held).
const PASSES: usize = 5;
/// Pages carried out at once: each page's read from the tier and its durable put on the owner wait on
/// I/O, so several in flight keep both the tier's target and the owners busy.
const WORKERS: usize = 4;

/// What moving a tier's keys did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Records the region log's recovery found.
    pub records: u64,
    /// Bytes of region log the recovery scanned (its regions in use).
    pub log_bytes: u64,
    /// How long the recovery took (the engine's start).
    pub recovery: Duration,
    /// The drain passes' sums.
    pub moved: PassReport,
}

/// How the node that takes a tier over runs it.
pub struct Recovery<'a> {
    /// The node's own engine settings: tenants, limits, write policy and its first CPU are reused.
    pub template: &'a EngineConfig,
    /// The node's host identity at the targets (it holds the tier's reservations).
    pub host: &'a HostOptions,
    /// The cluster's replica count.
    pub replicas: usize,
    /// Ownership's reach (`--max-replicas`).
    pub max_replicas: usize,
    /// Bytes per second the copies may take.
    pub rate: u64,
    /// One token per tenant, or one `None` for an open node.
    pub tokens: &'a [Option<Vec<u8>>],
    /// Set when the node stops.
    pub stop: &'a AtomicBool,
}

impl Recovery<'_> {
    /// Recovers `record`'s tier, on `namespaces` (its specs, parsed), and moves every key to its owners
    /// under the view `view()` gives; `Err` when a key is left behind (the tier stays held, to be tried
    /// again).
    pub fn run(
        &self,
        record: &TierRecord,
        namespaces: &[NvmfAddress],
        view: &(dyn Fn() -> View + Sync),
    ) -> anyhow::Result<Recovered> {
        let started = Instant::now();
        let config = self.engine_config(record, namespaces)?;
        let node = strata_engine::start(config).context("recovering the tier's region log")?;
        let mut recovered = Recovered { recovery: started.elapsed(), ..Recovered::default() };
        for report in &node.summary().recovery {
            recovered.records += report.records;
            recovered.log_bytes += report.regions as u64 * record.region_bytes;
        }
        let mut complete = false;
        for _ in 0..PASSES {
            let report = self.pass(record, &view(), view, node.local_addr());
            recovered.moved.add(&report);
            recovered.moved.left = report.left;
            if report.left == 0 && report.scanned == report.removed {
                complete = true;
                break;
            }
        }
        node.shutdown().map_err(|error| anyhow!("stopping the recovered tier: {error}"))?;
        match complete {
            true => Ok(recovered),
            false => {
                Err(anyhow!("{} keys of the tier found no owner to take them; trying again", recovered.moved.left))
            }
        }
    }

    /// The engine over the dead node's tier: as many shards as it was formatted for, on this node's first
    /// CPU, loopback only (only this node's passes talk to it), no metrics.
    fn engine_config(&self, record: &TierRecord, namespaces: &[NvmfAddress]) -> anyhow::Result<EngineConfig> {
        let nvme = namespaces.iter().cloned().map(DeviceSpec::Nvmf).collect();
        let cpu = self.template.cpus.first().copied().unwrap_or(0);
        let shards = record.shards.max(1) as usize;
        Ok(EngineConfig {
            listen: "127.0.0.1:0".parse()?,
            cpus: vec![cpu; shards],
            dram_bytes: DRAM_PER_SHARD * shards as u64,
            hugepages: false,
            nvme,
            nvme_host: Some(super::fence::engine_host(self.host)),
            region_bytes: record.region_bytes,
            write_policy: self.template.write_policy,
            tenants: self.template.tenants.clone(),
            limits: self.template.limits,
            metrics: None,
            event_cpus: EventCpus::Inline,
            ..EngineConfig::default()
        })
    }

    /// One drain pass over the recovered tier, once per tenant.
    fn pass(
        &self,
        record: &TierRecord,
        view: &View,
        latest: &(dyn Fn() -> View + Sync),
        local: std::net::SocketAddr,
    ) -> PassReport {
        let context = PassContext {
            view,
            me: &record.node,
            replicas: self.replicas,
            max_replicas: self.max_replicas,
            draining: true,
            stop: self.stop,
            latest_epoch: &|| latest().epoch,
            copy_policy: Some(WritePolicy::Durable),
        };
        let mut total = PassReport::default();
        for token in self.tokens {
            let options =
                ClientOptions { token: token.clone(), timeout: Duration::from_secs(10), ..Default::default() };
            let workers = (0..WORKERS)
                .map(|_| {
                    let throttle = Throttle::new(self.rate / WORKERS as u64);
                    Client::connect(local, options.clone()).map(|tier| (tier, Nodes::new(options.clone()), throttle))
                })
                .collect::<Result<Vec<_>, _>>();
            let outcome = workers.and_then(|workers| {
                let mut scanner = Client::connect(local, options.clone())?;
                run_pass_parallel(&context, &mut scanner, workers)
            });
            match outcome {
                Ok(report) => total.add(&report),
                Err(error) => {
                    tracing::warn!(%error, node = %record.node, "takeover pass failed");
                    total.left += 1;
                }
            }
        }
        total
    }
}
