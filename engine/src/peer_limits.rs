//! What a peer may hold, in bytes and in time: connections, bytes of frames still arriving, and how slowly
//! a frame may move.
//!
//! A connection costs its buffers, and a frame in progress holds what it was given before its bytes are in:
//! a put's DRAM reservation, or the buffer of a value on its way to another shard. A peer that sends (or
//! reads) slowly, or many peers at once, could otherwise hold all of it for as long as they like. So:
//! - connections are counted against a limit per node and per tenant; one past it is refused with `Quota`;
//! - the bytes of values that are still arriving are claimed against a cap per node and per tenant; an
//!   item past it is refused with `Quota` (its bytes are skipped, the connection goes on);
//! - a frame blocked on its peer must move, after a grace period, at least a minimum rate; one that does
//!   not is closed (judged by [`RateJudge`] in the shard's sweeper, from the kernel's byte counters).
//!
//! The counters are node-wide atomics shared by the shards: a claim is one atomic add when it is taken and
//! one when it is released, and only for a value whose bytes are not already buffered (a small put that
//! arrived whole holds nothing while it waits, so it takes no claim).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::metrics::ShardMetrics;

/// The limits, as configured. `None` means the default described on the field.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerLimits {
    /// A frame may wait on its peer this long before the minimum rate applies.
    pub frame_grace: Duration,
    /// Bytes per second a frame blocked on its peer must move, on average, after its grace; 0: no minimum.
    pub min_transfer_rate: u64,
    /// Bytes of values still arriving, over all connections of the node; none: half the DRAM tier.
    pub partial_frame_bytes: Option<u64>,
    /// The same for each tenant; none: half the node's.
    pub tenant_partial_frame_bytes: Option<u64>,
    /// Open client connections of the node.
    pub max_connections: u64,
    /// Open connections of each tenant; none: half the node's.
    pub tenant_max_connections: Option<u64>,
}

impl Default for PeerLimits {
    fn default() -> Self {
        Self {
            frame_grace: Duration::from_secs(10),
            min_transfer_rate: 1 << 20,
            partial_frame_bytes: None,
            tenant_partial_frame_bytes: None,
            max_connections: 4096,
            tenant_max_connections: None,
        }
    }
}

/// One pool of claims: what is held and the most that may be.
struct Pool {
    held: AtomicU64,
    cap: u64,
}

impl Pool {
    fn new(cap: u64) -> Self {
        Self { held: AtomicU64::new(0), cap }
    }

    fn take(&self, amount: u64) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(amount).filter(|total| *total <= self.cap)
            })
            .is_ok()
    }

    fn give(&self, amount: u64) {
        self.held.fetch_sub(amount, Ordering::AcqRel);
    }
}

/// A node's and each tenant's pools of connections and partial-frame bytes.
struct Pools {
    connections: Pool,
    partial_bytes: Pool,
}

/// The node-wide counters, shared by its shards.
pub struct PeerBudget {
    node: Pools,
    tenants: HashMap<u32, Pools>,
}

impl PeerBudget {
    /// The budget of a node with `dram_bytes` of DRAM and these tenants (ids); an open node has none.
    pub fn new(limits: &PeerLimits, dram_bytes: u64, tenants: impl IntoIterator<Item = u32>) -> Arc<Self> {
        let partial = limits.partial_frame_bytes.unwrap_or(dram_bytes / 2);
        let tenant_partial = limits.tenant_partial_frame_bytes.unwrap_or(partial / 2);
        let tenant_connections = limits.tenant_max_connections.unwrap_or(limits.max_connections / 2);
        let pools = |connections, bytes| Pools { connections: Pool::new(connections), partial_bytes: Pool::new(bytes) };
        Arc::new(Self {
            node: pools(limits.max_connections, partial),
            tenants: tenants.into_iter().map(|id| (id, pools(tenant_connections, tenant_partial))).collect(),
        })
    }

    /// A slot for a new connection, or `None` when the node has its limit.
    pub fn connect(self: &Arc<Self>) -> Option<ConnectionSlot> {
        self.node.connections.take(1).then(|| ConnectionSlot { budget: Arc::clone(self), tenant: None })
    }

    /// Claims `bytes` of partial frames for `tenant`, counted in `metrics`; `None` past either cap.
    pub fn claim(self: &Arc<Self>, tenant: u32, bytes: u64, metrics: &Arc<ShardMetrics>) -> Option<PartialClaim> {
        if !self.node.partial_bytes.take(bytes) {
            return None;
        }
        if let Some(pools) = self.tenants.get(&tenant)
            && !pools.partial_bytes.take(bytes)
        {
            self.node.partial_bytes.give(bytes);
            return None;
        }
        metrics.partial_frame_bytes.fetch_add(bytes, Ordering::Relaxed);
        Some(PartialClaim { budget: Arc::clone(self), tenant, bytes, metrics: Arc::clone(metrics) })
    }
}

/// A connection counted against the node's limit, and its tenant's once it names one.
pub struct ConnectionSlot {
    budget: Arc<PeerBudget>,
    tenant: Option<u32>,
}

impl ConnectionSlot {
    /// Counts the connection against `tenant` (leaving the tenant it had); `false` when that tenant has its
    /// limit (the connection then counts against no tenant).
    pub fn join_tenant(&mut self, tenant: u32) -> bool {
        self.leave_tenant();
        let Some(pools) = self.budget.tenants.get(&tenant) else { return true };
        let joined = pools.connections.take(1);
        if joined {
            self.tenant = Some(tenant);
        }
        joined
    }

    fn leave_tenant(&mut self) {
        if let Some(pools) = self.tenant.take().and_then(|tenant| self.budget.tenants.get(&tenant)) {
            pools.connections.give(1);
        }
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.leave_tenant();
        self.budget.node.connections.give(1);
    }
}

/// Bytes of a frame still arriving, held against the caps until dropped.
pub struct PartialClaim {
    budget: Arc<PeerBudget>,
    tenant: u32,
    bytes: u64,
    metrics: Arc<ShardMetrics>,
}

impl Drop for PartialClaim {
    fn drop(&mut self) {
        self.budget.node.partial_bytes.give(self.bytes);
        if let Some(pools) = self.budget.tenants.get(&self.tenant) {
            pools.partial_bytes.give(self.bytes);
        }
        self.metrics.partial_frame_bytes.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Judges, one sweep at a time, whether the frame a connection is in moves at the minimum rate.
///
/// Time counts only while the handler waits on the peer (the node's own work, such as a device read, is not
/// the peer's fault); bytes are the kernel's counts of bytes received from and acknowledged by the peer,
/// whichever way the frame moves data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateJudge {
    frame: u64,
    waited: Duration,
    first_seen: Option<u64>,
}

impl RateJudge {
    /// One sweep: the connection is in frame number `frame`, waiting on its peer for about `period`, and
    /// its byte counters stand at `moved`. `true` when the frame is too slow and should be closed.
    pub fn too_slow(&mut self, frame: u64, moved: u64, period: Duration, limits: &PeerLimits) -> bool {
        if frame != self.frame || self.first_seen.is_none() {
            *self = RateJudge { frame, waited: Duration::ZERO, first_seen: Some(moved) };
            return false;
        }
        self.waited += period;
        let Some(rated) = self.waited.checked_sub(limits.frame_grace) else { return false };
        if limits.min_transfer_rate == 0 || rated.is_zero() {
            return false;
        }
        let since = moved.saturating_sub(self.first_seen.unwrap_or(moved));
        (since as f64) < limits.min_transfer_rate as f64 * rated.as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> PeerLimits {
        PeerLimits {
            frame_grace: Duration::from_secs(1),
            min_transfer_rate: 1000,
            partial_frame_bytes: Some(100),
            tenant_partial_frame_bytes: Some(60),
            max_connections: 3,
            tenant_max_connections: Some(2),
        }
    }

    #[test]
    fn claims_stay_under_the_node_and_tenant_caps_and_are_given_back() {
        let budget = PeerBudget::new(&limits(), 1 << 30, [7, 8]);
        let metrics = Arc::new(ShardMetrics::default());
        let first = budget.claim(7, 50, &metrics).expect("fits both");
        assert!(budget.claim(7, 20, &metrics).is_none(), "tenant 7 would hold 70 of its 60");
        let second = budget.claim(8, 40, &metrics).expect("tenant 8 has room, the node 90 of 100");
        assert!(budget.claim(0, 20, &metrics).is_none(), "the node would hold 110 of its 100");
        assert_eq!(metrics.partial_frame_bytes.load(Ordering::Relaxed), 90);
        drop(first);
        assert!(budget.claim(7, 60, &metrics).is_some(), "given back on drop");
        drop(second);
        assert_eq!(metrics.partial_frame_bytes.load(Ordering::Relaxed), 0);
        assert_eq!(budget.node.partial_bytes.held.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn connections_are_counted_per_node_and_per_tenant() {
        let budget = PeerBudget::new(&limits(), 1 << 30, [7]);
        let mut a = budget.connect().expect("1 of 3");
        let mut b = budget.connect().expect("2 of 3");
        let mut c = budget.connect().expect("3 of 3");
        assert!(budget.connect().is_none(), "the node has its 3");
        assert!(a.join_tenant(7) && b.join_tenant(7));
        assert!(!c.join_tenant(7), "tenant 7 has its 2");
        assert!(c.join_tenant(0), "an unknown (open) tenant has no limit of its own");
        assert!(a.join_tenant(7), "joining again does not count twice");
        drop(b);
        assert!(c.join_tenant(7), "b's place is free");
        drop(a);
        assert!(budget.connect().is_some(), "a's place is free");
    }

    #[test]
    fn defaults_scale_with_the_dram_tier() {
        let budget = PeerBudget::new(&PeerLimits::default(), 64 << 20, [1]);
        assert_eq!(budget.node.partial_bytes.cap, 32 << 20);
        assert_eq!(budget.tenants[&1].partial_bytes.cap, 16 << 20);
        assert_eq!(budget.tenants[&1].connections.cap, 2048);
    }

    #[test]
    fn a_frame_slower_than_the_minimum_after_its_grace_is_too_slow() {
        let limits = limits();
        let tick = Duration::from_millis(250);
        let mut judge = RateJudge::default();
        assert!(!judge.too_slow(1, 0, tick, &limits), "first sight sets the baseline");
        // One byte a sweep: fine within the grace (1 s), too slow after it.
        let verdicts: Vec<bool> = (1..=6).map(|sweep| judge.too_slow(1, sweep, tick, &limits)).collect();
        assert_eq!(verdicts, [false, false, false, false, true, true]);
        // A new frame starts afresh.
        assert!(!judge.too_slow(2, 6, tick, &limits));
        // At the minimum rate it never is.
        let mut moved = 6;
        for _ in 0..40 {
            moved += 250;
            assert!(!judge.too_slow(2, moved, tick, &limits));
        }
        let mut unlimited = RateJudge::default();
        let none = PeerLimits { min_transfer_rate: 0, ..limits };
        assert!((0..40).all(|_| !unlimited.too_slow(1, 0, tick, &none)));
    }
}
