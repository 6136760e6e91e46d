//! NVMe-oF takeover: when a node whose tier sits on shared namespaces leaves the cluster without handing
//! it over (its lease expired), a survivor claims the tier in etcd, fences the dead node at the targets,
//! recovers the tier's region log and moves every key to its owners under the new placement, then releases
//! the tier (docs/PROTOCOL.md, "NVMe-oF takeover"). No replica is needed for a durable put to survive its
//! node.
//!
//! Each node runs this on a thread of its own. Which survivor claims a tier is decided by rendezvous
//! hashing of the tier's node id over the serving members, so one node tries; the claim itself is an etcd
//! compare-and-swap, so two nodes with different views never both hold it. A starting node registers (as
//! joining) before it claims its own tier, so a tier is claimed only once its owner has been out of the
//! members (its lease expired) for `CLAIM_GRACE` as this node sees it. Should that survivor not claim it,
//! the next in the order does `FALLBACK_STEP` later, and so on.

pub mod fence;
pub mod own;
pub mod recover;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use strata_cluster::{Claim, ClusterConfig, MemberState, MembersWatch, TierRecord, TierRecords, TierState, View};
use strata_engine::EngineConfig;
use strata_engine::reports::{Report, Reports};
use strata_nvme::{DeviceSpec, NvmfAddress};
use strata_proto::placement;

use recover::{Recovered, Recovery};

/// How often the thread looks at its view, and reads the tier records while one waits on something.
const TICK: Duration = Duration::from_millis(100);
/// How often the tier records are read when nothing changes.
const RESCAN: Duration = Duration::from_secs(10);
/// How long after a failed etcd call the records are read again.
const ETCD_RETRY: Duration = Duration::from_secs(1);
/// How long a tier's owner must have been out of this node's view before the tier is claimed: a starting
/// node's entry (joining) is in etcd before its claim, so this only covers the members' watch lagging
/// etcd (its watcher syncs every 100 ms).
const CLAIM_GRACE: Duration = Duration::from_millis(300);
/// How much longer each next survivor in a tier's rendezvous order waits before it claims the tier itself:
/// the first one may be alive yet unable to claim (it cannot reach etcd, or it stopped serving).
const FALLBACK_STEP: Duration = Duration::from_secs(10);

/// What the takeover thread works with.
pub struct TakeoverConfig {
    /// The node's cluster settings.
    pub cluster: ClusterConfig,
    /// The node's engine settings (tenants, limits, write policy, CPU for a recovering tier).
    pub template: EngineConfig,
    /// The cluster's replica count.
    pub replicas: usize,
    /// Bytes per second the copies may take (0: the drain's 256 MiB/s).
    pub rate: u64,
    /// One token per tenant, or one `None` for an open node.
    pub tokens: Vec<Option<Vec<u8>>>,
    /// Where it reports (`/metrics`).
    pub reports: Reports,
}

/// A running takeover thread.
pub struct Takeovers {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Takeovers {
    /// Starts the thread, following the node's members' watch `watch` (the one that feeds its ownership).
    pub fn start(config: TakeoverConfig, watch: Arc<MembersWatch>) -> anyhow::Result<Takeovers> {
        let stop = Arc::new(AtomicBool::new(false));
        let worker =
            Worker { config, watch, stop: Arc::clone(&stop), absent: HashMap::new(), totals: Totals::default() };
        worker.report();
        let thread = std::thread::Builder::new().name("strata-takeover".into()).spawn(move || worker.run())?;
        Ok(Takeovers { stop, thread: Some(thread) })
    }

    /// Stops the thread (after the pass in progress, if a takeover runs).
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What the node's takeovers did, for `/metrics`.
#[derive(Default)]
struct Totals {
    done: AtomicU64,
    failed: AtomicU64,
    keys: AtomicU64,
    last_ms: AtomicU64,
    last_recovery_ms: AtomicU64,
}

struct Worker {
    config: TakeoverConfig,
    watch: Arc<MembersWatch>,
    stop: Arc<AtomicBool>,
    /// Tier owner → (the record's revision, since when this node has seen the owner out of the members).
    absent: HashMap<String, (i64, Instant)>,
    totals: Totals,
}

impl Worker {
    fn run(mut self) {
        let limit = self.config.cluster.lease_ttl.max(Duration::from_secs(2));
        let mut records: Option<TierRecords> = None;
        // (the epoch of the last read, when it ran, whether a tier still waits on something).
        let mut last: Option<(i64, Instant, bool)> = None;
        // After etcd failed, not before: a node cut off from etcd tries once a second, not every tick.
        let mut retry_at = Instant::now();
        while !self.stop.load(Ordering::SeqCst) {
            std::thread::sleep(TICK);
            let view = self.watch.view();
            if !self.serving(&view) || Instant::now() < retry_at {
                continue;
            }
            // The records are read when placement changed (a member left), while a tier waits, and every
            // RESCAN otherwise: not four range reads a second from every node of a quiet cluster.
            let due = last.is_none_or(|(epoch, at, waiting)| waiting || epoch != view.epoch || at.elapsed() >= RESCAN);
            if !due {
                continue;
            }
            if records.is_none() {
                records = TierRecords::connect(&self.config.cluster.endpoints, &self.config.cluster.cluster, limit)
                    .inspect_err(|error| tracing::warn!(%error, "takeover: etcd unreachable"))
                    .ok();
                if records.is_none() {
                    retry_at = Instant::now() + ETCD_RETRY;
                }
            }
            let Some(etcd) = records.as_mut() else { continue };
            match etcd.read() {
                Ok(tiers) => {
                    let waiting = self.look_at(etcd, &view, tiers);
                    last = Some((view.epoch, Instant::now(), waiting));
                }
                Err(error) => {
                    tracing::warn!(%error, "takeover: reading the tier records failed");
                    records = None;
                    retry_at = Instant::now() + ETCD_RETRY;
                }
            }
        }
    }

    fn serving(&self, view: &View) -> bool {
        let me = &self.config.cluster.node_id;
        view.members.iter().any(|member| member.id == *me && member.state == MemberState::Serving)
    }

    /// Takes over each tier this node should: its own unfinished takeovers, and the tiers of owners gone
    /// for as long as this node's place in the tier's rendezvous order asks ([`claim_delay`]). Returns whether a tier still waits (an
    /// owner gone for less than the grace, or a takeover left to finish).
    fn look_at(&mut self, etcd: &mut TierRecords, view: &View, tiers: Vec<(TierRecord, i64)>) -> bool {
        let me = self.config.cluster.node_id.clone();
        let mut absent = HashMap::new();
        let mut waiting = false;
        for (record, revision) in tiers {
            let Some(owner) = record.owner.clone() else { continue };
            if record.state == TierState::Released {
                continue;
            }
            if owner == me {
                if record.state == TierState::TakingOver {
                    let claim = Claim { record, revision, previous_key: 0, erase: false };
                    waiting |= !self.take_over(etcd, claim);
                }
                continue;
            }
            if view.members.iter().any(|member| member.id == owner) {
                continue;
            }
            let since =
                self.absent.get(&owner).filter(|(seen, _)| *seen == revision).map_or_else(Instant::now, |s| s.1);
            absent.insert(owner.clone(), (revision, since));
            let Some(rank) = claim_rank(view, &record.node, &me) else { continue };
            if since.elapsed() < claim_delay(rank) {
                waiting = true;
                continue;
            }
            match etcd.claim_dead(&me, (&record, revision)) {
                Ok(claim) => {
                    tracing::info!(node = %record.node, %owner, epoch = claim.record.epoch, "takeover: claimed");
                    waiting |= !self.take_over(etcd, claim);
                }
                Err(error) => tracing::info!(%error, node = %record.node, "takeover: not claimed"),
            }
        }
        self.absent = absent;
        waiting
    }

    /// Fences the previous holder, recovers the tier, moves its keys and releases it; on failure the
    /// claim stands and the next tick tries again. Whether the tier was released.
    fn take_over(&mut self, etcd: &mut TierRecords, claim: Claim) -> bool {
        let started = Instant::now();
        let node = claim.record.node.clone();
        let released = match self.recover(&claim).and_then(|recovered| {
            etcd.release(&claim)?;
            Ok(recovered)
        }) {
            Ok(recovered) => {
                let elapsed = started.elapsed();
                tracing::info!(
                    %node, records = recovered.records, log_bytes = recovered.log_bytes, moved = recovered.moved.copied,
                    recovery_ms = recovered.recovery.as_millis() as u64, total_ms = elapsed.as_millis() as u64,
                    "takeover: the tier's keys moved to their owners; released"
                );
                self.totals.done.fetch_add(1, Ordering::Relaxed);
                self.totals.keys.fetch_add(recovered.moved.copied, Ordering::Relaxed);
                self.totals.last_ms.store(elapsed.as_millis() as u64, Ordering::Relaxed);
                self.totals.last_recovery_ms.store(recovered.recovery.as_millis() as u64, Ordering::Relaxed);
                true
            }
            Err(error) => {
                tracing::warn!(%node, error = format!("{error:#}"), "takeover failed; trying again");
                self.totals.failed.fetch_add(1, Ordering::Relaxed);
                // Not again at once: a target or an owner that refused now is unlikely to accept in 250 ms.
                for _ in 0..20 {
                    if self.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                false
            }
        };
        self.report();
        released
    }

    fn recover(&self, claim: &Claim) -> anyhow::Result<Recovered> {
        let addresses = addresses(&claim.record)?;
        let host = fence::node_host(&self.config.cluster.cluster, &self.config.cluster.node_id);
        fence::hold(&addresses, &host, claim.record.epoch, claim.previous_key)?;
        let recovery = Recovery {
            template: &self.config.template,
            host: &host,
            replicas: self.config.replicas,
            max_replicas: self.config.cluster.max_replicas,
            rate: if self.config.rate == 0 { 256 << 20 } else { self.config.rate },
            tokens: &self.config.tokens,
            stop: &self.stop,
        };
        // The reservation stays held after the release: releasing it would let the fenced node write again.
        recovery.run(&claim.record, &addresses, &|| (*self.watch.view()).clone())
    }

    fn report(&self) {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let metrics = format!(
            "# HELP strata_takeover_total Dead nodes' NVMe tiers this node took over and released.\n\
             # TYPE strata_takeover_total counter\nstrata_takeover_total {}\n\
             # HELP strata_takeover_failed_total Takeovers that stopped short (tried again).\n\
             # TYPE strata_takeover_failed_total counter\nstrata_takeover_failed_total {}\n\
             # HELP strata_takeover_keys_total Keys moved from taken-over tiers to their owners.\n\
             # TYPE strata_takeover_keys_total counter\nstrata_takeover_keys_total {}\n\
             # HELP strata_takeover_last_seconds The last takeover, from its claim to its release.\n\
             # TYPE strata_takeover_last_seconds gauge\nstrata_takeover_last_seconds {:.3}\n\
             # HELP strata_takeover_last_recovery_seconds The last takeover's region log recovery.\n\
             # TYPE strata_takeover_last_recovery_seconds gauge\nstrata_takeover_last_recovery_seconds {:.3}\n",
            get(&self.totals.done),
            get(&self.totals.failed),
            get(&self.totals.keys),
            get(&self.totals.last_ms) as f64 / 1e3,
            get(&self.totals.last_recovery_ms) as f64 / 1e3,
        );
        self.config.reports.set("takeover", Report { metrics, degraded: None });
    }
}

/// This node's place among the serving members in `node`'s rendezvous order (0: it claims first); none
/// when it is not serving.
fn claim_rank(view: &View, node: &str, me: &str) -> Option<usize> {
    let candidates = view.candidates();
    let serving: Vec<_> = view.serving().collect();
    placement::replicas(node.as_bytes(), &candidates, candidates.len())
        .into_iter()
        .position(|index| serving.get(index).is_some_and(|member| member.id == me))
}

/// How long a tier's owner must have been gone before the survivor of rank `rank` claims its tier.
fn claim_delay(rank: usize) -> Duration {
    CLAIM_GRACE + FALLBACK_STEP * rank.min(1_000) as u32
}

/// The tier's namespaces, each of which must be on NVMe-oF.
fn addresses(record: &TierRecord) -> anyhow::Result<Vec<NvmfAddress>> {
    record
        .namespaces
        .iter()
        .map(|spec| match DeviceSpec::parse(spec, |_| None) {
            Ok(DeviceSpec::Nvmf(address)) => Ok(address),
            Ok(_) => Err(anyhow::anyhow!("{spec}: a taken-over tier's namespaces must be NVMe-oF")),
            Err(error) => Err(anyhow::anyhow!("{spec}: {error}")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rebalance::sim::member;

    #[test]
    fn each_survivor_has_its_own_turn_to_claim_a_tier() {
        let mut members: Vec<_> = ["a", "b", "c", "d"].iter().map(|id| member(id, MemberState::Serving)).collect();
        members.push(member("e", MemberState::Joining));
        let view = View { epoch: 1, revision: 1, members };
        for tier in ["dead-1", "dead-2", "dead-3"] {
            let mut ranks: Vec<usize> =
                ["a", "b", "c", "d"].iter().map(|me| claim_rank(&view, tier, me).expect("serving")).collect();
            let first = ["a", "b", "c", "d"][ranks.iter().position(|&rank| rank == 0).expect("a first")];
            let order = placement::replicas(tier.as_bytes(), &view.candidates(), 1);
            assert_eq!(view.serving().nth(order[0]).map(|member| member.id.as_str()), Some(first));
            ranks.sort_unstable();
            assert_eq!(ranks, [0, 1, 2, 3], "one turn each");
            assert_eq!(claim_rank(&view, tier, "e"), None, "a node not serving never claims");
        }
        assert_eq!(claim_delay(0), CLAIM_GRACE);
        assert!(
            claim_delay(1) > claim_delay(0) + Duration::from_secs(5),
            "the next waits long enough to see the first claim"
        );
    }
}
