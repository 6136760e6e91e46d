//! A simulated node: its namespaces (memory behind a volatile write cache, which outlive every life of the
//! node), and one life of it — every shard built over fault-injecting handles on those namespaces and the
//! simulated clock, recovered, and relaying cascades to each other as the node's forwarder does.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use glommio::channels::local_channel::{self, LocalReceiver};
use strata_nvme::{FaultConfig, FaultDevice, VolatileDisk};

use super::Simulated;
use super::clock::SimClock;
use crate::config::EngineConfig;
use crate::dram::DramTier;
use crate::events::Subscription;
use crate::links::LinkCounts;
use crate::metrics::ShardMetrics;
use crate::node::ShardStartError;
use crate::shard::{Cascade, RecoveryReport, Shard, ShardParts};
use crate::tier::{FreshIds, NamespaceSlot, prepare_namespace, region_log};

/// What outlives every life of the node: its namespaces, its clock and its settings.
pub struct World {
    /// The node's settings (shards: `config.cpus.len()`).
    pub config: Rc<EngineConfig>,
    /// The namespaces of the NVMe tier.
    pub disks: Vec<VolatileDisk>,
    /// The clock.
    pub clock: SimClock,
    /// Faults injected into every handle (each handle's seed is derived from this one's).
    pub faults: FaultConfig,
    /// The format id the tier is given when it is formatted.
    pub format_id: u64,
}

/// One life of the node: its shards, and a subscription to each one's events.
pub struct Life {
    /// The shards, by id.
    pub shards: Rc<Vec<Rc<Shard<Simulated>>>>,
    /// What each shard's recovery found.
    pub reports: Vec<RecoveryReport>,
    /// Each shard's event subscription and the cursor read up to.
    pub subscriptions: Vec<(Subscription, Cell<u64>)>,
}

impl World {
    /// Starts life `life` of the node: prepares the tier (formats it the first time), builds and recovers
    /// every shard, and lets them serve. Must run on a glommio executor.
    pub async fn start(&self, life: u64) -> Result<Life, ShardStartError> {
        let mut pool_uuid = [0u8; 16];
        pool_uuid[..8].copy_from_slice(&self.format_id.to_le_bytes());
        pool_uuid[8..].copy_from_slice(&(!self.format_id).to_le_bytes());
        let fresh = FreshIds { pool_uuid, format_id: self.format_id };
        let mut tier = Vec::new();
        for (index, disk) in self.disks.iter().enumerate() {
            let slot = NamespaceSlot { name: "sim", index: index as u32, count: self.disks.len() as u32 };
            let device = FaultDevice::new(disk.handle(), self.faults_for(life, u64::MAX, index));
            tier.push(prepare_namespace(&device, slot, &self.config, fresh).await?);
        }
        let shard_count = self.config.cpus.len() as u32;
        let link_counts = Arc::new(LinkCounts::new(shard_count));
        let dram_per_shard = self.config.dram_bytes / u64::from(shard_count);
        let mut shards = Vec::new();
        let mut reports = Vec::new();
        let mut subscriptions = Vec::new();
        for id in 0..shard_count {
            let devices: Vec<_> = (0..self.disks.len())
                .map(|index| FaultDevice::new(self.disks[index].handle(), self.faults_for(life, u64::from(id), index)))
                .collect();
            let log = region_log(&devices, &tier, id, &self.config)?;
            let shard = Shard::new(ShardParts {
                id,
                shard_count,
                base_port: 0,
                config: Rc::clone(&self.config),
                dram: DramTier::new(dram_per_shard, false)?,
                devices,
                log,
                clock: self.clock.clone(),
                metrics: Arc::new(ShardMetrics::default()),
                link_counts: Arc::clone(&link_counts),
            });
            // Subscribed before recovery: a region recovery reclaims to open one reports what it evicted.
            let (subscription, cursor) = Subscription::new(shard.events());
            subscriptions.push((subscription, Cell::new(cursor)));
            reports.push(shard.recover().await?);
            shards.push(shard);
        }
        let shards = Rc::new(shards);
        for shard in shards.iter() {
            let (to_peers, from_shard) = local_channel::new_bounded(16);
            glommio::spawn_local(relay(Rc::downgrade(&shards), shard.id, Arc::clone(&link_counts), from_shard))
                .detach();
            shard.start_serving(to_peers);
        }
        Ok(Life { shards, reports, subscriptions })
    }

    /// The faults of the handle of `shard` (`u64::MAX`: the tier's preparation) on namespace `index` in
    /// life `life`: the world's, with a seed of their own.
    fn faults_for(&self, life: u64, shard: u64, index: usize) -> FaultConfig {
        let seed = self.faults.seed
            ^ life.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ shard.rotate_left(17)
            ^ ((index as u64) << 48);
        FaultConfig { seed, ..self.faults.clone() }
    }
}

/// Delivers what shard `from` tells its peers, as the node's forwarder does: departures to the shards that
/// hold links, pin changes to all. It holds the shards weakly: a shard holds the channel's other end, and a
/// life's shards must drop with it.
async fn relay(
    shards: std::rc::Weak<Vec<Rc<Shard<Simulated>>>>,
    from: u32,
    link_counts: Arc<LinkCounts>,
    batches: LocalReceiver<Vec<Cascade>>,
) {
    while let Some(batch) = batches.recv().await {
        let Some(shards) = shards.upgrade() else { return };
        let everyone = batch.iter().any(|cascade| cascade.kind.is_pin_change());
        for peer in shards.iter().filter(|peer| peer.id != from) {
            if everyone || link_counts.of(peer.id) > 0 {
                peer.accept_cascades(&batch);
            }
        }
    }
}
