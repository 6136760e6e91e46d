//! A shard: everything one core owns for its keys — the index, the DRAM tier, the region log and its
//! device queues — and the operations on them. Runs on one glommio executor; nothing here is `Send`.
//!
//! State lives in `RefCell`s that are borrowed only between awaits (never across one), so tasks of the
//! executor interleave freely without locks. One async lock (`log_lock`, a one-permit semaphore) orders the
//! log's slow paths — sealing and opening regions, reclaim, durable syncs — which await device I/O.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use glommio::sync::Semaphore;
use strata_nvme::{AnyDevice, BlockDevice};
use strata_proto::{Links, Pin, PutOptions, RemovalReason, Status, Tier, WritePolicy};

use crate::config::EngineConfig;
use crate::dram::{DramFull, DramTier};
use crate::events::EventLog;
use crate::forward::{Cascade, CascadeKind};
use crate::index::{
    Entry, FLAG_DIRTY, FLAG_LINKED, FLAG_PINNED, FLAG_RECORD_LINKED, FLAG_REFERENCED, FLAG_SOFT_PINNED, Index,
    NONE_U32, NONE_U64, index_hash,
};
use crate::links::{LinkBook, NO_LINK, ObjectLinks, link_hash, parent_name};
use crate::log::{
    RegionLog, RegionState, Staged, location, read_range, split_location, write_partial, write_region, written_len,
};
use crate::metrics::{ShardMetrics, add, set};
use crate::record::{
    RECORD_HEADER_BYTES, RECORD_LINKED, RECORD_LINKS_BYTES, RECORD_PINNED, RECORD_TOMBSTONE, RecordHeader,
};
use crate::scan::{Scanned, scan_region};
use crate::tenants::{Tenancy, tenant_of};

mod recovery;

pub use recovery::RecoveryReport;

/// Ticks are 10 ms: leases and windows are coarse, and a `u32` of ticks lasts 497 days.
const TICK: Duration = Duration::from_millis(10);
/// Regions reclaimed at most per rotation, so one put never waits for a long reclaim.
const MAX_RECLAIMS_PER_ROTATION: usize = 4;
/// How long a read of a progressive put's bytes waits for them to arrive.
pub const FILL_WAIT: Duration = Duration::from_secs(30);

/// One shard of a node.
pub struct Shard {
    /// Its id.
    pub id: u32,
    /// Shards of the node.
    pub shard_count: u32,
    /// Port of shard 0.
    pub base_port: u16,
    /// Settings.
    pub config: Rc<EngineConfig>,
    index: RefCell<Index>,
    dram: RefCell<DramTier>,
    log: RefCell<Option<RegionLog>>,
    devices: Rc<Vec<AnyDevice>>,
    log_lock: Rc<Semaphore>,
    /// Its counters.
    pub metrics: Arc<ShardMetrics>,
    started: Instant,
    poisoned: Cell<bool>,
    /// Channels to the other shards, set once at start-up.
    pub forwarder: std::cell::OnceCell<crate::forward::Forwarder>,
    pins: RefCell<PinBook>,
    /// What subscribers are told (recorded only while someone subscribes).
    pub events: Rc<RefCell<EventLog>>,
    /// The node's threads that write event frames off the shards' cores.
    pub event_senders: Arc<crate::event_sender::EventSenders>,
    /// The node's tenants.
    pub tenancy: Tenancy,
    usage: RefCell<std::collections::HashMap<u32, TenantUsage>>,
    links: RefCell<LinkBook>,
    /// Departures whose children and group members have yet to leave (here and on the peers).
    cascades: RefCell<std::collections::VecDeque<(Cascade, bool)>>,
    cascading: Cell<bool>,
    me: std::rc::Weak<Shard>,
    /// Progressive puts receiving their parts, by key: readable as far as they arrived.
    filling: RefCell<std::collections::HashMap<Vec<u8>, Rc<Fill>>>,
    /// Hard-pinned members of each group, here (group hash → count).
    hard_pinned_groups: RefCell<std::collections::HashMap<u64, u32>>,
    /// Groups with a hard-pinned member on a peer (group hash → peers that said so): their members here
    /// are not evicted either, so the group stays whole.
    hard_pinned_elsewhere: RefCell<std::collections::HashMap<u64, u32>>,
    /// Readers waiting for keys not stored yet (reads with `ITEM_WAIT`), by key; woken when a put of the key
    /// commits or a progressive put of it starts.
    awaited: RefCell<std::collections::HashMap<Vec<u8>, Rc<Arrival>>>,
    /// The open client connections, for the stall sweeper (`server::sweep_stalled_connections`).
    pub connection_watches: RefCell<Vec<std::rc::Weak<crate::server::ConnectionWatch>>>,
}

/// One stage of [`Shard::prefetch`], in the order an operation needs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefetch {
    /// The index table's slot where the key's probe begins.
    IndexSlot,
    /// The entry that slot names.
    Entry,
    /// The DRAM tier's bookkeeping of the entry's slot (a put that replaces the object retires it).
    DramSlot,
    /// The first line of the object's bytes in the segment (a read compares its key).
    DramBytes,
}

/// A progressive put's object while its parts arrive: its DRAM reservation, how much of its value is in
/// (and checked against its part's crc), and the readers waiting for more.
pub struct Fill {
    slot: u32,
    value_offset: u64,
    value_len: u32,
    filled: Cell<u32>,
    open: Cell<bool>,
    wakers: RefCell<Vec<std::task::Waker>>,
}

impl Fill {
    fn wake(&self) {
        for waker in self.wakers.borrow_mut().drain(..) {
            waker.wake();
        }
    }

    /// Resolves once `need` bytes are in or the put ended.
    fn reached(&self, need: u32) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |context| {
            if self.filled.get() >= need || !self.open.get() {
                std::task::Poll::Ready(())
            } else {
                self.wakers.borrow_mut().push(context.waker().clone());
                std::task::Poll::Pending
            }
        })
    }
}

/// Readers waiting for one key to arrive.
#[derive(Default)]
struct Arrival {
    arrived: Cell<bool>,
    wakers: RefCell<Vec<std::task::Waker>>,
}

/// The receiving end of a progressive put: says how far the value arrived, and takes the object out of the
/// filling table when dropped (the put committed, failed, or its connection went away).
pub struct FillGuard {
    shard: Rc<Shard>,
    key: Vec<u8>,
    fill: Rc<Fill>,
}

impl FillGuard {
    /// The value's first `filled` bytes are in and checked.
    pub fn advance(&self, filled: u32) {
        self.fill.filled.set(filled.min(self.fill.value_len));
        self.fill.wake();
    }
}

impl Drop for FillGuard {
    fn drop(&mut self) {
        let mut filling = self.shard.filling.borrow_mut();
        if filling.get(&self.key).is_some_and(|fill| Rc::ptr_eq(fill, &self.fill)) {
            filling.remove(&self.key);
        }
        self.fill.open.set(false);
        self.fill.wake();
    }
}

/// Bytes (keys and values) a tenant's objects take on this shard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantUsage {
    /// In the DRAM tier.
    pub dram: u64,
    /// On the NVMe tier.
    pub nvme: u64,
    /// Pinned (hard or soft).
    pub pinned: u64,
}

/// A tier whose usage changes.
#[derive(Clone, Copy)]
enum Use {
    Dram,
    Nvme,
    Pinned,
}

/// What the shard knows of its pinned objects. The index entry says *whether* an object is pinned (a flag);
/// soft pins' expiry ticks live here, because only a few objects are pinned and the entry has no room to
/// spare for them (see the index's budget).
#[derive(Default)]
struct PinBook {
    /// Entry hash → tick at which the soft pin lapses.
    soft_expiry: std::collections::HashMap<u64, u32>,
    /// Bytes (key + value) of pinned objects, hard and soft.
    bytes: u64,
    /// The most `bytes` may reach.
    limit: u64,
}

fn object_bytes(entry: &Entry) -> u64 {
    u64::from(entry.key_len) + u64::from(entry.value_len)
}

/// Where the value of entry's NVMe record starts: after the header, the key and (linked records) the links.
fn record_value_offset(entry: &Entry) -> usize {
    let links = if entry.flags & FLAG_RECORD_LINKED != 0 { RECORD_LINKS_BYTES } else { 0 };
    RECORD_HEADER_BYTES + usize::from(entry.key_len) + links
}

fn is_pinned(entry: &Entry) -> bool {
    entry.flags & (FLAG_PINNED | FLAG_SOFT_PINNED) != 0
}

/// Bytes a read returns.
pub enum ReadData {
    /// From the DRAM segment, pinned until dropped.
    Dram(DramPin, u64, usize),
    /// Read from the NVMe tier (or copied from the open region).
    Staged(Staged, usize, usize),
    /// Received from the owning shard (forwarded requests).
    Owned(Vec<u8>),
}

/// A successful read.
pub struct ReadHit {
    /// The bytes.
    pub data: ReadData,
    /// crc32c of those bytes.
    pub data_crc: u32,
    /// Length of the whole value.
    pub object_len: u32,
}

impl ReadHit {
    /// The bytes, as slices in order.
    pub fn slices(&self) -> Vec<&[u8]> {
        match &self.data {
            ReadData::Dram(pin, offset, len) => vec![pin.shard.dram.borrow().segment().bytes(*offset, *len)],
            ReadData::Staged(staged, offset, len) => staged.slices(*offset, *len),
            ReadData::Owned(bytes) => vec![&bytes[..]],
        }
    }

    /// Bytes returned.
    pub fn len(&self) -> usize {
        match &self.data {
            ReadData::Dram(_, _, len) | ReadData::Staged(_, _, len) => *len,
            ReadData::Owned(bytes) => bytes.len(),
        }
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Keeps a DRAM slot's bytes in place while a reader sends them.
pub struct DramPin {
    shard: Rc<Shard>,
    slot: u32,
}

impl Drop for DramPin {
    fn drop(&mut self) {
        self.shard.dram.borrow_mut().unpin(self.slot);
    }
}

/// DRAM reserved for a put that is receiving its bytes; freed if dropped before [`Shard::commit_put`].
pub struct PutReservation {
    shard: Rc<Shard>,
    slot: Option<u32>,
    offset: u64,
}

impl PutReservation {
    /// The bytes to fill (`[key][value]`).
    pub fn bytes_mut(&self, len: usize) -> &mut [u8] {
        self.shard.dram.borrow().segment().bytes_mut(self.offset, len)
    }

    /// Makes the reserved object of `key` (whose key bytes are in place) readable by GET_RANGE as its value
    /// arrives, before it is committed: readers of a key with no stored version wait for the bytes they
    /// ask for. `None` if another progressive put of the key is filling.
    pub fn open_for_reads(&self, key: &[u8], value_len: u32) -> Option<FillGuard> {
        let slot = self.slot?;
        let mut filling = self.shard.filling.borrow_mut();
        if filling.contains_key(key) {
            return None;
        }
        let fill = Rc::new(Fill {
            slot,
            value_offset: self.offset + key.len() as u64,
            value_len,
            filled: Cell::new(0),
            open: Cell::new(true),
            wakers: RefCell::new(Vec::new()),
        });
        filling.insert(key.to_vec(), Rc::clone(&fill));
        drop(filling);
        self.shard.key_arrived(key);
        Some(FillGuard { shard: Rc::clone(&self.shard), key: key.to_vec(), fill })
    }
}

impl Drop for PutReservation {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            // A progressive put readable from this reservation ends here: no reader may pin the slot once
            // it is freed.
            for fill in self.shard.filling.borrow().values().filter(|fill| fill.slot == slot) {
                fill.open.set(false);
                fill.wake();
            }
            self.shard.dram.borrow_mut().retire(slot);
        }
    }
}

/// Where a durable put's record ends, to sync up to.
#[derive(Clone, Copy, Debug)]
pub struct DurablePoint {
    region: u32,
    seq: u64,
    end: usize,
}

impl DurablePoint {
    /// The region generation it is in (points of one generation are synced by one write).
    pub fn region_key(&self) -> (u32, u64) {
        (self.region, self.seq)
    }
}

impl Shard {
    /// Starts loading one more of the lines that an operation on the key whose hash is `hash` will touch
    /// (`server::prefetch_next_puts`, `server::handle_get`). Each stage reads only lines that the stage
    /// before asked for, an item earlier: the table slot, the entry it names, the DRAM slot's bookkeeping,
    /// the object's first bytes in the segment (its key, compared on every read).
    pub fn prefetch(&self, hash: u64, stage: Prefetch) {
        let index = self.index.borrow();
        match stage {
            Prefetch::IndexSlot => index.prefetch_slot(hash),
            Prefetch::Entry => index.prefetch_entry(hash),
            Prefetch::DramSlot | Prefetch::DramBytes => {
                let Some(id) = index.find(hash) else { return };
                let slot = index.get(id).dram;
                if slot != NONE_U32 {
                    self.dram.borrow().prefetch(slot, stage == Prefetch::DramBytes);
                }
            }
        }
    }

    /// A shard over `devices` (its own handles on the node's namespaces) and its log state (none: DRAM only).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u32,
        shard_count: u32,
        base_port: u16,
        config: Rc<EngineConfig>,
        dram: DramTier,
        devices: Rc<Vec<AnyDevice>>,
        log: Option<RegionLog>,
        metrics: Arc<ShardMetrics>,
        event_senders: Arc<crate::event_sender::EventSenders>,
    ) -> Rc<Self> {
        set(&metrics.dram_capacity_bytes, dram.capacity_bytes());
        let pin_limit = (dram.capacity_bytes() as f64 * config.max_pinned_share) as u64;
        let events = Rc::new(RefCell::new(EventLog::new(config.event_log_bytes)));
        // Validated by `EngineConfig::validate`; an error here leaves the node open, which validate forbids.
        let tenancy = Tenancy::new(&config.tenants, shard_count).unwrap_or_default();
        if let Some(log) = &log {
            set(&metrics.nvme_regions, log.regions.len() as u64);
            set(&metrics.nvme_region_bytes, log.region_bytes);
        }
        Rc::new_cyclic(|me| Self {
            id,
            shard_count,
            base_port,
            config,
            index: RefCell::new(Index::new()),
            dram: RefCell::new(dram),
            log: RefCell::new(log),
            devices,
            log_lock: Rc::new(Semaphore::new(1)),
            metrics,
            started: Instant::now(),
            poisoned: Cell::new(false),
            forwarder: std::cell::OnceCell::new(),
            pins: RefCell::new(PinBook { limit: pin_limit, ..PinBook::default() }),
            events,
            event_senders,
            tenancy,
            connection_watches: RefCell::new(Vec::new()),
            awaited: RefCell::new(std::collections::HashMap::new()),
            hard_pinned_groups: RefCell::new(std::collections::HashMap::new()),
            hard_pinned_elsewhere: RefCell::new(std::collections::HashMap::new()),
            usage: RefCell::new(std::collections::HashMap::new()),
            links: RefCell::new(LinkBook::default()),
            cascades: RefCell::new(std::collections::VecDeque::new()),
            cascading: Cell::new(false),
            me: me.clone(),
            filling: RefCell::new(std::collections::HashMap::new()),
        })
    }

    /// Drops entry `id` (whose key is `key`, when known) from the index, from the pin book if it was
    /// pinned, and from its tenant's NVMe usage if it still had a record. Every removal goes through here
    /// so that the counts stay exact; the caller has retired (and accounted) its DRAM copy. Only a region
    /// that cannot be read back leaves keys unknown: their tenant's counts then stay high until a restart.
    ///
    /// The object's children and the rest of its group leave after it (see [`Shard::cascade`]).
    fn forget(&self, index: &mut Index, id: u32, key: Option<&[u8]>) -> Entry {
        let entry = index.remove(id);
        self.unpin_entry(&entry, key);
        if let Some(key) = key
            && entry.nvme != NONE_U64
        {
            self.account(key, Use::Nvme, object_bytes(&entry), false);
        }
        let group = if entry.flags & FLAG_LINKED != 0 {
            let links = self.links.borrow_mut().unlink(id);
            self.publish_links();
            links.map_or(NO_LINK, |links| links.group)
        } else {
            NO_LINK
        };
        if entry.flags & FLAG_PINNED != 0 && group != NO_LINK {
            self.hard_pin_group(group, false);
        }
        // Only a serving shard cascades: during recovery a tombstone replays a removal whose cascade was
        // logged too, and a later record may legitimately name the removed parent again.
        let Some(forwarder) = self.forwarder.get() else { return entry };
        if !self.links.borrow().is_empty() || forwarder.peers_hold_links() {
            // Any object may be somebody's parent; only a node that links nothing skips this.
            self.queue_cascade(Cascade { name: parent_name(entry.hash), kind: CascadeKind::Parent }, true);
            if group != NO_LINK {
                self.queue_cascade(Cascade { name: group, kind: CascadeKind::Group }, true);
            }
        }
        entry
    }

    /// Tells the peers how many linked objects this shard holds (after recovery, and at every change).
    pub(crate) fn publish_links(&self) {
        if let Some(forwarder) = self.forwarder.get() {
            forwarder.publish_links(self.id, self.links.borrow().len());
        }
    }

    /// Queues a departure for the cascade task (started if idle); `tell_peers`: also send it to the peers
    /// holding links (not for one a peer sent: it told every peer itself).
    fn queue_cascade(&self, cascade: Cascade, tell_peers: bool) {
        self.cascades.borrow_mut().push_back((cascade, tell_peers));
        if !self.cascading.replace(true)
            && let Some(shard) = self.me.upgrade()
        {
            // glommio may start polling a spawned task at once, and the caller holds the index: the task
            // yields first, so it starts only once the caller is done.
            glommio::spawn_local(async move {
                futures_lite::future::yield_now().await;
                shard.cascade().await
            })
            .detach();
        }
    }

    /// Departures (and hard pins of group members) announced by a peer.
    pub fn accept_cascades(&self, batch: &[Cascade]) {
        let has_links = !self.links.borrow().is_empty();
        for &cascade in batch {
            match cascade.kind {
                CascadeKind::GroupPinned => {
                    count_up_or_down(&mut self.hard_pinned_elsewhere.borrow_mut(), cascade.name, true);
                }
                CascadeKind::GroupUnpinned => {
                    count_up_or_down(&mut self.hard_pinned_elsewhere.borrow_mut(), cascade.name, false);
                }
                CascadeKind::Parent | CascadeKind::Group if has_links => self.queue_cascade(cascade, false),
                CascadeKind::Parent | CascadeKind::Group => {}
            }
        }
    }

    /// A hard-pinned member of `group` arrived here (`pinned`) or left: the peers hear when the shard starts
    /// or stops holding one, so that none of them evicts a member of a group pinned here.
    fn hard_pin_group(&self, group: u64, pinned: bool) {
        let changed = count_up_or_down(&mut self.hard_pinned_groups.borrow_mut(), group, pinned);
        // Before serving (recovery) the peers are told once, by `announce_hard_pinned_groups`.
        if changed && self.forwarder.get().is_some() {
            let kind = if pinned { CascadeKind::GroupPinned } else { CascadeKind::GroupUnpinned };
            self.queue_cascade(Cascade { name: group, kind }, true);
        }
    }

    /// After recovery: counts the restored hard-pinned members of each group and tells the peers of the
    /// groups pinned here.
    pub(crate) fn announce_hard_pinned_groups(&self) {
        let counts: std::collections::HashMap<u64, u32> = {
            let book = self.links.borrow();
            let index = self.index.borrow();
            book.groups()
                .into_iter()
                .filter_map(|group| {
                    let pinned =
                        book.members_of(group).into_iter().filter(|&id| index.get(id).flags & FLAG_PINNED != 0).count()
                            as u32;
                    (pinned > 0).then_some((group, pinned))
                })
                .collect()
        };
        for &group in counts.keys() {
            self.queue_cascade(Cascade { name: group, kind: CascadeKind::GroupPinned }, true);
        }
        *self.hard_pinned_groups.borrow_mut() = counts;
    }

    /// The cascade task: for each queued departure, removes this shard's objects that name it (children of
    /// a parent that left, members of a group that lost one) — each of which is a departure in turn — and
    /// tells the peers that hold links, in batches. Hard-pinned objects stay (removed only explicitly).
    async fn cascade(self: Rc<Self>) {
        let mut for_peers = Vec::new();
        loop {
            let next = self.cascades.borrow_mut().pop_front();
            let Some((cascade, tell_peers)) = next else {
                if !for_peers.is_empty() {
                    if let Some(forwarder) = self.forwarder.get() {
                        forwarder.send_cascades(&for_peers).await;
                    }
                    for_peers.clear();
                    // Sending awaited: departures may have been queued meanwhile.
                    continue;
                }
                // No await since the queue was found empty, so nothing was queued in between.
                self.cascading.set(false);
                return;
            };
            if tell_peers {
                for_peers.push(cascade);
            }
            if cascade.kind.is_pin_change() {
                // Nothing leaves: it only had to reach the peers.
                continue;
            }
            let ids = {
                let links = self.links.borrow();
                match cascade.kind {
                    CascadeKind::Parent => links.children_of(cascade.name),
                    _ => links.members_of(cascade.name),
                }
            };
            for id in ids {
                let names_it = |links: ObjectLinks| match cascade.kind {
                    CascadeKind::Parent => links.parent == cascade.name,
                    _ => links.group == cascade.name,
                };
                // Checked again after every await: the object may have left or been relinked meanwhile.
                let Some(entry) = self.linked_entry(id, names_it) else { continue };
                if entry.flags & FLAG_PINNED != 0 {
                    continue;
                }
                let Some(key) = self.stored_key(entry).await else { continue };
                if self.linked_entry(id, names_it).is_none_or(|now| now.hash != entry.hash) {
                    continue;
                }
                if cascade.kind == CascadeKind::Group {
                    // Its group is leaving already: its own departure need not announce the group again.
                    self.links.borrow_mut().unlink(id);
                    self.publish_links();
                }
                if self.remove_as(&key, RemovalReason::Cascaded).await.is_ok() {
                    add(&self.metrics.cascade_removals, 1);
                }
            }
            if for_peers.len() >= 256
                && let Some(forwarder) = self.forwarder.get()
            {
                forwarder.send_cascades(&for_peers).await;
                for_peers.clear();
            }
        }
    }

    /// Entry `id`, if it is linked and its links satisfy `names_it`.
    fn linked_entry(&self, id: u32, names_it: impl Fn(ObjectLinks) -> bool) -> Option<Entry> {
        let links = self.links.borrow().of(id)?;
        if !names_it(links) {
            return None;
        }
        let index = self.index.borrow();
        let entry = *index.get(id);
        (entry.flags & FLAG_LINKED != 0 && index.find(entry.hash) == Some(id)).then_some(entry)
    }

    /// Whether another member of entry `id`'s group on this shard is pinned, so the group must stay
    /// ("evicted all together or not at all").
    fn group_stays(&self, index: &mut Index, id: u32, now: u32) -> bool {
        if index.get(id).flags & FLAG_LINKED == 0 {
            return false;
        }
        let (group, members) = {
            let book = self.links.borrow();
            match book.of(id) {
                Some(links) if links.group != NO_LINK => (links.group, book.members_of(links.group)),
                _ => return false,
            }
        };
        if self.hard_pinned_elsewhere.borrow().contains_key(&group) {
            // A peer holds a hard-pinned member: this one leaving would take the group apart.
            return true;
        }
        members.into_iter().filter(|&member| member != id).any(|member| {
            let entry = *index.get(member);
            entry.flags & FLAG_PINNED != 0
                || (entry.flags & FLAG_SOFT_PINNED != 0 && self.soft_pin_live(entry.hash, now))
        })
    }

    /// Adds (or with `charge` false, takes back) `bytes` of `key`'s tenant's usage of `tier`.
    fn account(&self, key: &[u8], tier: Use, bytes: u64, charge: bool) {
        // An open node has no quotas and exports no per-tenant usage: nothing to count (a few percent of
        // a small put's CPU otherwise).
        if !self.tenancy.is_tenanted() {
            return;
        }
        self.account_tenant(tenant_of(key, true), tier, bytes, charge);
    }

    /// Counts `bytes` of `tier` to (or, not `charge`, off) `tenant`'s usage.
    fn account_tenant(&self, tenant: u32, tier: Use, bytes: u64, charge: bool) {
        let mut usage = self.usage.borrow_mut();
        let entry = usage.entry(tenant).or_default();
        let field = match tier {
            Use::Dram => &mut entry.dram,
            Use::Nvme => &mut entry.nvme,
            Use::Pinned => &mut entry.pinned,
        };
        *field = if charge { *field + bytes } else { field.saturating_sub(bytes) };
    }

    /// Bytes each tenant's objects take on this shard (metrics).
    pub fn tenant_usage(&self) -> Vec<(u32, TenantUsage)> {
        self.usage.borrow().iter().map(|(&tenant, &usage)| (tenant, usage)).collect()
    }

    fn usage_of(&self, key: &[u8]) -> (TenantUsage, crate::tenants::Quotas) {
        if !self.tenancy.is_tenanted() {
            return (TenantUsage::default(), crate::tenants::Quotas::default());
        }
        let tenant = tenant_of(key, true);
        (self.usage.borrow().get(&tenant).copied().unwrap_or_default(), self.tenancy.quotas_of(tenant))
    }

    fn unpin_entry(&self, entry: &Entry, key: Option<&[u8]>) {
        if is_pinned(entry) {
            if let Some(key) = key {
                self.account(key, Use::Pinned, object_bytes(entry), false);
            }
            let mut pins = self.pins.borrow_mut();
            pins.bytes = pins.bytes.saturating_sub(object_bytes(entry));
            pins.soft_expiry.remove(&entry.hash);
            set(&self.metrics.pinned_bytes, pins.bytes);
        }
    }

    /// Whether the pin of `entry` holds at `now`: hard pins always, soft pins until their TTL lapses
    /// (a lapsed soft pin is dropped here).
    fn pin_holds(&self, index: &mut Index, id: u32, key: &[u8], now: u32) -> bool {
        let entry = *index.get(id);
        if entry.flags & FLAG_PINNED != 0 {
            return true;
        }
        if entry.flags & FLAG_SOFT_PINNED == 0 {
            return false;
        }
        if self.soft_pin_live(entry.hash, now) {
            return true;
        }
        self.unpin_entry(&entry, Some(key));
        index.get_mut(id).flags &= !FLAG_SOFT_PINNED;
        false
    }

    /// Whether the soft pin of the object with index hash `hash` still holds at `now`.
    fn soft_pin_live(&self, hash: u64, now: u32) -> bool {
        self.pins.borrow().soft_expiry.get(&hash).is_some_and(|&expiry| now < expiry)
    }

    fn now_tick(&self) -> u32 {
        (self.started.elapsed().as_millis() / TICK.as_millis()) as u32 + 1
    }

    /// Whether a read lease holds the object in place.
    fn leased(&self, entry: &Entry, now: u32) -> bool {
        entry.last_hit != 0 && now < entry.last_hit.saturating_add(Self::ticks(self.config.read_lease))
    }

    fn ticks(duration: Duration) -> u32 {
        (duration.as_millis() / TICK.as_millis()).min(u128::from(u32::MAX / 2)) as u32
    }

    /// The format id of the tier (what seeds its record checksums); 0 without a tier.
    fn format_id(&self) -> u64 {
        self.log.borrow().as_ref().map_or(0, |log| log.format_id)
    }

    /// Whether the shard has an NVMe tier.
    pub fn has_nvme(&self) -> bool {
        self.log.borrow().is_some()
    }

    /// Objects indexed.
    pub fn object_count(&self) -> usize {
        self.index.borrow().len()
    }

    /// Bytes of the index and of the DRAM tier's per-object table.
    pub fn metadata_bytes(&self) -> (usize, usize) {
        (self.index.borrow().memory_bytes(), self.dram.borrow().metadata_bytes())
    }

    fn update_gauges(&self) {
        let dram = self.dram.borrow();
        set(&self.metrics.dram_objects, dram.resident_objects() as u64);
        set(&self.metrics.dram_bytes, dram.allocated_bytes());
        let index = self.index.borrow();
        set(&self.metrics.index_objects, index.len() as u64);
        if let Some(log) = self.log.borrow().as_ref() {
            set(&self.metrics.nvme_regions_used, log.used_regions() as u64);
        }
        if self.tenancy.is_tenanted() {
            // The metrics thread reads this copy; if it holds it right now, the next update publishes.
            if let Ok(mut published) = self.metrics.tenants.try_lock() {
                published.clear();
                for (&tenant, usage) in self.usage.borrow().iter() {
                    let name = self.tenancy.name_of(tenant).unwrap_or("unknown");
                    published.push(crate::metrics::TenantGauge {
                        tenant: name.to_string(),
                        dram_bytes: usage.dram,
                        nvme_bytes: usage.nvme,
                        pinned_bytes: usage.pinned,
                    });
                }
            }
        }
    }

    fn poison(&self, what: &str, error: &dyn std::fmt::Display) {
        if !self.poisoned.replace(true) {
            tracing::error!(shard = self.id, what, %error, "NVMe tier poisoned: it takes no more writes");
        }
        add(&self.metrics.io_errors, 1);
        set(&self.metrics.nvme_poisoned, 1);
    }

    // ---- puts ----------------------------------------------------------------------------------------

    /// The first stage of every put, whichever way it arrived (a client's frame or a peer shard's
    /// forward): resolves the write policy to the node's default, refuses what must be refused before a
    /// byte is stored ([`Shard::put_refusal`]), and reserves DRAM for `[key][value]`. The caller fills the
    /// reservation and hands it to [`Shard::commit_put`] with the same `options`.
    pub async fn admit_put(
        self: &Rc<Self>,
        key: &[u8],
        value_len: u32,
        options: &mut PutOptions,
    ) -> Result<PutReservation, Status> {
        options.policy = Some(options.policy.unwrap_or(self.config.write_policy));
        if let Some(status) = self.put_refusal(key, value_len, options) {
            return Err(status);
        }
        self.reserve_put(key, key.len() as u64 + u64::from(value_len)).await
    }

    /// Why a put of `key` with a `value_len`-byte value and `options` (policy resolved) must be refused
    /// before a byte of it is stored: `Exists` for a put (not an upsert) of a stored key, `Quota` for a pin
    /// over the shard's pinned-bytes limit, or a durable put that cannot be made durable here.
    fn put_refusal(&self, key: &[u8], value_len: u32, options: &PutOptions) -> Option<Status> {
        if !options.upsert && self.index.borrow().find(index_hash(key)).is_some() {
            return Some(Status::Exists);
        }
        let bytes = key.len() as u64 + u64::from(value_len);
        let (usage, quotas) = self.usage_of(key);
        if options.pin != Pin::None {
            let pins = self.pins.borrow();
            if pins.bytes + bytes > pins.limit || quotas.pinned.is_some_and(|quota| usage.pinned + bytes > quota) {
                return Some(Status::Quota);
            }
        }
        if quotas.dram.is_some_and(|quota| bytes > quota) {
            return Some(Status::Quota);
        }
        if options.policy == Some(WritePolicy::Durable) {
            if quotas.nvme.is_some_and(|quota| usage.nvme + bytes > quota) {
                return Some(Status::Quota);
            }
            return self.durable_refusal(key.len(), value_len);
        }
        None
    }

    /// Why a durable put of a `key_len` + `value_len` object cannot be made durable here (checked before
    /// anything is stored, so a refused durable put leaves no copy behind): no NVMe tier, a poisoned one, or
    /// an object larger than a region.
    fn durable_refusal(&self, key_len: usize, value_len: u32) -> Option<Status> {
        let log = self.log.borrow();
        let Some(log) = log.as_ref() else { return Some(Status::Invalid) };
        if self.poisoned.get() {
            return Some(Status::Io);
        }
        // Sized as if linked (links are not known here): at worst an object within 16 bytes of the bound is
        // refused.
        let record = RecordHeader {
            region_seq: 0,
            key_hash: 0,
            value_len,
            value_crc: 0,
            key_len: key_len as u16,
            flags: RECORD_LINKED,
            version: 0,
        };
        (record.record_len() > log.max_record_bytes()).then_some(Status::TooLarge)
    }

    /// Reserves DRAM for an object of `len` bytes (`[key][value]`), evicting first if the tier is above
    /// its high watermark.
    async fn reserve_put(self: &Rc<Self>, key: &[u8], len: u64) -> Result<PutReservation, Status> {
        // A tenant at its DRAM quota makes room among its own objects first.
        let (usage, quotas) = self.usage_of(key);
        if let Some(quota) = quotas.dram
            && usage.dram + len > quota
        {
            let tenant = tenant_of(key, self.tenancy.is_tenanted());
            self.make_tenant_room(tenant, usage.dram + len - quota).await;
            if self.usage_of(key).0.dram + len > quota {
                return Err(Status::Quota);
            }
        }
        for attempt in 0..3 {
            self.make_dram_room(len, attempt > 0).await;
            let allocated = self.dram.borrow_mut().allocate(len);
            match allocated {
                Ok((slot, offset)) => return Ok(PutReservation { shard: Rc::clone(self), slot: Some(slot), offset }),
                Err(DramFull::TooLarge) => return Err(Status::TooLarge),
                Err(DramFull::NoSpace) => {}
            }
        }
        Err(Status::NoSpace)
    }

    /// Publishes a filled reservation as the newest version of `key` and applies the write policy. A
    /// durable put returns where its record ends; the caller syncs once for a whole batch
    /// ([`Shard::sync`]). The refusals of [`Shard::put_refusal`] are checked again here, because another
    /// put of the key may have committed while this one's bytes arrived.
    pub async fn commit_put(
        self: &Rc<Self>,
        key: &[u8],
        mut reservation: PutReservation,
        value_len: u32,
        value_crc: u32,
        options: PutOptions,
        links: Links<'_>,
    ) -> Result<Option<DurablePoint>, Status> {
        let policy = options.policy.unwrap_or(self.config.write_policy);
        let object_links = ObjectLinks {
            parent: links.parent.map_or(NO_LINK, link_hash),
            group: links.group.map_or(NO_LINK, link_hash),
        };
        let hash = index_hash(key);
        let (id, version, superseded_record) = {
            let mut index = self.index.borrow_mut();
            let existing = index.find(hash);
            if existing.is_some() && !options.upsert {
                return Err(Status::Exists);
            }
            // The version replaced has a record on the tier that a restart would find: this put is
            // acknowledged only once something newer (its own record, or a tombstone) is durable.
            let superseded_record =
                existing.map(|id| *index.get(id)).filter(|old| old.nvme != NONE_U64).map(|old| old.version);
            let pin_flags = match options.pin {
                Pin::None => existing.map_or(0, |id| index.get(id).flags & (FLAG_PINNED | FLAG_SOFT_PINNED)),
                Pin::Soft { .. } => FLAG_SOFT_PINNED,
                Pin::Hard => FLAG_PINNED,
            };
            let new_bytes = key.len() as u64 + u64::from(value_len);
            {
                let pins = self.pins.borrow();
                let released = existing.map_or(0, |id| {
                    let entry = index.get(id);
                    if is_pinned(entry) { object_bytes(entry) } else { 0 }
                });
                if pin_flags != 0 && pins.bytes - released.min(pins.bytes) + new_bytes > pins.limit {
                    return Err(Status::Quota);
                }
                let (usage, quotas) = self.usage_of(key);
                if pin_flags != 0
                    && quotas.pinned.is_some_and(|quota| usage.pinned - released.min(usage.pinned) + new_bytes > quota)
                {
                    return Err(Status::Quota);
                }
            }
            let Some(slot) = reservation.slot.take() else { return Err(Status::Invalid) };
            let old_hard_pin = existing.is_some_and(|id| index.get(id).flags & FLAG_PINNED != 0);
            let mut dram = self.dram.borrow_mut();
            let id = match existing {
                Some(id) => {
                    let old = *index.get(id);
                    self.unpin_entry(&old, Some(key));
                    if old.dram != NONE_U32 {
                        self.account(key, Use::Dram, object_bytes(&old), false);
                    }
                    if old.nvme != NONE_U64 {
                        self.account(key, Use::Nvme, object_bytes(&old), false);
                    }
                    let entry = index.get_mut(id);
                    if entry.dram != NONE_U32 {
                        dram.retire(entry.dram);
                    }
                    entry.nvme = NONE_U64;
                    entry.dram = slot;
                    entry.value_len = value_len;
                    entry.value_crc = value_crc;
                    entry.key_len = key.len() as u16;
                    entry.version = entry.version.wrapping_add(1);
                    // The links belong to the version: an upsert names what it names, nothing else.
                    entry.flags = pin_flags | FLAG_DIRTY | (old.flags & FLAG_LINKED);
                    // (No record yet, so no FLAG_RECORD_LINKED.)
                    id
                }
                None => index.insert(Entry {
                    hash,
                    nvme: NONE_U64,
                    dram: slot,
                    value_len,
                    value_crc,
                    version: 1,
                    last_hit: 0,
                    key_len: key.len() as u16,
                    flags: pin_flags | FLAG_DIRTY,
                }),
            };
            dram.publish(slot, id);
            self.account(key, Use::Dram, new_bytes, true);
            let was_linked = index.get(id).flags & FLAG_LINKED != 0;
            let old_group =
                if was_linked { self.links.borrow().of(id).map_or(NO_LINK, |links| links.group) } else { NO_LINK };
            if old_hard_pin && old_group != NO_LINK {
                self.hard_pin_group(old_group, false);
            }
            if pin_flags & FLAG_PINNED != 0 && object_links.group != NO_LINK {
                self.hard_pin_group(object_links.group, true);
            }
            if was_linked || !object_links.is_none() {
                self.links.borrow_mut().link(id, object_links);
                let entry = index.get_mut(id);
                entry.flags =
                    if object_links.is_none() { entry.flags & !FLAG_LINKED } else { entry.flags | FLAG_LINKED };
                self.publish_links();
            }
            self.events.borrow_mut().stored(key, links.parent, value_len, Tier::Dram);
            self.key_arrived(key);
            if pin_flags != 0 {
                self.account(key, Use::Pinned, new_bytes, true);
                let mut pins = self.pins.borrow_mut();
                pins.bytes += new_bytes;
                set(&self.metrics.pinned_bytes, pins.bytes);
                if let Pin::Soft { ttl_seconds } = options.pin {
                    let ttl = if ttl_seconds == 0 {
                        self.config.soft_pin_ttl
                    } else {
                        Duration::from_secs(u64::from(ttl_seconds))
                    };
                    pins.soft_expiry.insert(hash, self.now_tick().saturating_add(Self::ticks(ttl)));
                } else {
                    pins.soft_expiry.remove(&hash);
                }
            }
            (id, index.get(id).version, superseded_record)
        };
        add(&self.metrics.bytes_in, u64::from(value_len));
        self.update_gauges();
        if !self.has_nvme() {
            return if policy == WritePolicy::Durable { Err(Status::Invalid) } else { Ok(None) };
        }
        match (policy, superseded_record) {
            (WritePolicy::WriteBack, None) => Ok(None),
            (WritePolicy::WriteBack, Some(old_version)) => {
                self.append_tombstone(key, hash, old_version).await.map(Some)
            }
            // Acknowledged from DRAM whatever happens to the NVMe copy: a failure is counted, and the object
            // stays dirty in DRAM.
            (WritePolicy::WriteThrough, None) => {
                let _ = self.persist(id, hash, version).await;
                Ok(None)
            }
            (WritePolicy::WriteThrough, Some(old_version)) => match self.persist(id, hash, version).await {
                Ok(at) => self.durable_point(at, self.index.borrow().get(id)).map(Some),
                Err(_) => self.append_tombstone(key, hash, old_version).await.map(Some),
            },
            (WritePolicy::Durable, _) => {
                let at = self.persist(id, hash, version).await?;
                self.durable_point(at, self.index.borrow().get(id)).map(Some)
            }
        }
    }

    /// Where the record of `entry` at location `at` ends: what a sync must cover to make it durable.
    fn durable_point(&self, at: u64, entry: &Entry) -> Result<DurablePoint, Status> {
        let log = self.log.borrow();
        let Some(log) = log.as_ref() else { return Err(Status::Io) };
        Ok(point_after(log, at, record_value_offset(entry) + entry.value_len as usize))
    }

    /// Appends a tombstone for version `version` of `key` (hash `hash`) to the open region, rotating if it
    /// is full; returns where it ends, for a sync.
    async fn append_tombstone(self: &Rc<Self>, key: &[u8], hash: u64, version: u32) -> Result<DurablePoint, Status> {
        let header = RecordHeader {
            region_seq: 0,
            key_hash: hash,
            value_len: 0,
            value_crc: 0,
            key_len: key.len() as u16,
            flags: RECORD_TOMBSTONE,
            version,
        };
        // A fresh region always has room for a tombstone, so the second try succeeds unless rotation failed.
        for _ in 0..2 {
            if self.poisoned.get() {
                return Err(Status::Io);
            }
            let full = {
                let mut log = self.log.borrow_mut();
                let Some(log) = log.as_mut() else { return Err(Status::Invalid) };
                if let Some(at) = log.try_append(header, key, &[]) {
                    return Ok(point_after(log, at, header.record_len()));
                }
                log.open.as_ref().map(|open| open.id)
            };
            self.rotate(full).await?;
        }
        Err(Status::NoSpace)
    }

    /// Appends the DRAM copy of entry `id` to the log (if it is still version `version` and dirty).
    async fn persist(self: &Rc<Self>, id: u32, hash: u64, version: u32) -> Result<u64, Status> {
        loop {
            let full_region = {
                let mut index = self.index.borrow_mut();
                let entry = *index.get(id);
                if entry.hash != hash || entry.version != version || entry.dram == NONE_U32 {
                    // Replaced or evicted meanwhile: nothing of this version is left to write.
                    return Err(Status::NotFound);
                }
                if entry.flags & FLAG_DIRTY == 0 {
                    return Ok(entry.nvme);
                }
                if self.poisoned.get() {
                    return Err(Status::Io);
                }
                let mut log = self.log.borrow_mut();
                let Some(log) = log.as_mut() else { return Err(Status::Invalid) };
                // Links survive a restart: the record carries them after the key.
                let links = (entry.flags & FLAG_LINKED != 0)
                    .then(|| self.links.borrow().of(id))
                    .flatten()
                    .map(|links| RecordHeader::encode_links(links.parent, links.group));
                let header = RecordHeader {
                    region_seq: 0,
                    key_hash: hash,
                    value_len: entry.value_len,
                    value_crc: entry.value_crc,
                    key_len: entry.key_len,
                    // Hard pins survive a restart; soft pins are a hint with a TTL and do not.
                    flags: if entry.flags & FLAG_PINNED != 0 { RECORD_PINNED } else { 0 }
                        | if links.is_some() { RECORD_LINKED } else { 0 },
                    version,
                };
                if header.record_len() > log.max_record_bytes() {
                    return Err(Status::TooLarge);
                }
                let dram = self.dram.borrow();
                let key_len = usize::from(entry.key_len);
                let bytes = dram.segment().bytes(dram.offset(entry.dram), key_len + entry.value_len as usize);
                let (usage, quotas) = self.usage_of(&bytes[..key_len]);
                if quotas.nvme.is_some_and(|quota| usage.nvme + object_bytes(&entry) > quota) {
                    // Over the tenant's NVMe quota: the object stays in DRAM only (and is dropped when
                    // evicted from it).
                    return Err(Status::Quota);
                }
                let covered = match links {
                    Some(links) => std::borrow::Cow::Owned([&bytes[..key_len], &links[..]].concat()),
                    None => std::borrow::Cow::Borrowed(&bytes[..key_len]),
                };
                match log.try_append(header, &covered, &[&bytes[key_len..]]) {
                    Some(at) => {
                        self.account(&bytes[..key_len], Use::Nvme, object_bytes(&entry), true);
                        let entry = index.get_mut(id);
                        entry.nvme = at;
                        entry.flags &= !FLAG_DIRTY;
                        if links.is_some() {
                            entry.flags |= FLAG_RECORD_LINKED;
                        } else {
                            entry.flags &= !FLAG_RECORD_LINKED;
                        }
                        add(&self.metrics.records_appended, 1);
                        add(&self.metrics.record_bytes_appended, header.record_len() as u64);
                        return Ok(at);
                    }
                    None => log.open.as_ref().map(|open| open.id),
                }
            };
            self.rotate(full_region).await?;
        }
    }

    /// Makes the log durable up to `point` (group commit: one write and flush covers every record appended
    /// before it).
    pub async fn sync(self: &Rc<Self>, point: DurablePoint) -> Result<(), Status> {
        let _permit = self.log_lock.acquire_static_permit(1).await.map_err(|_| Status::ShuttingDown)?;
        enum Step {
            Done(Result<(), Status>),
            Wait(Option<Rc<Semaphore>>),
            Write { device: usize, device_offset: u64, bytes: Vec<u8>, from: usize, used: usize, chunk_bytes: usize },
        }
        loop {
            let step = {
                let mut guard = self.log.borrow_mut();
                match guard.as_mut() {
                    None => Step::Done(Err(Status::Invalid)),
                    Some(log) => {
                        let block_bytes = log.block_bytes;
                        let chunk_bytes = log.chunk_bytes;
                        let region = &log.regions[point.region as usize];
                        let settled = if self.poisoned.get() { Err(Status::Io) } else { Ok(()) };
                        match region.state {
                            // Another generation: sealed and since reclaimed, so durable when it was sealed.
                            _ if region.seq != point.seq => Step::Done(settled),
                            RegionState::Sealed | RegionState::Free => Step::Done(settled),
                            RegionState::Sealing => Step::Wait(region.sealed.clone()),
                            RegionState::Open => {
                                let (device, device_offset) = (region.device, region.device_offset);
                                match log.open.as_mut() {
                                    None => Step::Done(Err(Status::Io)),
                                    Some(open) if open.durable >= point.end => Step::Done(Ok(())),
                                    Some(open) => {
                                        let from = open.durable / block_bytes * block_bytes;
                                        let to = written_len(open.used, block_bytes, log.region_bytes as usize);
                                        let bytes = open.buffer.read_at(from, to - from);
                                        Step::Write { device, device_offset, bytes, from, used: open.used, chunk_bytes }
                                    }
                                }
                            }
                        }
                    }
                }
            };
            match step {
                Step::Done(result) => return result,
                Step::Wait(done) => {
                    if let Some(done) = done {
                        let _ = done.acquire(1).await;
                    }
                }
                Step::Write { device, device_offset, bytes, from, used, chunk_bytes } => {
                    let written = write_partial(&self.devices, device, device_offset, bytes, from, chunk_bytes).await;
                    add(&self.metrics.durable_syncs, 1);
                    if let Err(error) = written {
                        self.poison("a durable write", &error);
                        return Err(Status::Io);
                    }
                    if let Some(open) = self.log.borrow_mut().as_mut().and_then(|log| log.open.as_mut())
                        && open.id == point.region
                    {
                        open.durable = open.durable.max(used);
                    }
                }
            }
        }
    }

    /// Seals the open region `full` (unless another task already did) and opens the next, reclaiming as
    /// the watermarks say.
    async fn rotate(self: &Rc<Self>, full: Option<u32>) -> Result<(), Status> {
        let _permit = self.log_lock.acquire_static_permit(1).await.map_err(|_| Status::ShuttingDown)?;
        {
            let log = self.log.borrow();
            let Some(log) = log.as_ref() else { return Err(Status::Invalid) };
            if log.open.as_ref().map(|open| open.id) != full {
                return Ok(());
            }
        }
        self.seal_open();
        // A spare buffer: wait for the oldest sealing write if every buffer is in flight.
        loop {
            let wait = {
                let log = self.log.borrow();
                let Some(log) = log.as_ref() else { return Err(Status::Invalid) };
                if !log.spare.is_empty() {
                    break;
                }
                log.sealed.iter().find_map(|&id| log.regions[id as usize].sealed.clone())
            };
            match wait {
                Some(done) => {
                    let _ = done.acquire(1).await;
                }
                None => return Err(Status::Io),
            }
        }
        if self.log.borrow().as_ref().is_some_and(|log| log.free.is_empty()) {
            self.reclaim_oldest(false).await?;
        }
        if !self.log.borrow_mut().as_mut().is_some_and(RegionLog::open_next) {
            return Err(Status::NoSpace);
        }
        for _ in 0..MAX_RECLAIMS_PER_ROTATION {
            let over = {
                let log = self.log.borrow();
                let Some(log) = log.as_ref() else { break };
                let total = log.regions.len() as f64;
                let used = log.used_regions() as f64;
                used > self.config.high_watermark * total
                    || (used > self.config.low_watermark * total && log.free.len() < 2)
            };
            if !over {
                break;
            }
            self.reclaim_oldest(true).await?;
        }
        self.update_gauges();
        Ok(())
    }

    /// Takes the open region out and writes it in the background.
    fn seal_open(self: &Rc<Self>) {
        let sealing = {
            let mut log = self.log.borrow_mut();
            let Some(log) = log.as_mut() else { return };
            log.append_seal();
            let Some(open) = log.open.take() else { return };
            let done = Rc::new(Semaphore::new(0));
            let geometry = (log.block_bytes, log.region_bytes as usize);
            let region = &mut log.regions[open.id as usize];
            region.state = RegionState::Sealing;
            region.sealed = Some(Rc::clone(&done));
            let job = (open.id, region.device, region.device_offset, open.buffer, open.used, geometry, done);
            log.sealed.push_back(open.id);
            job
        };
        let (id, device, device_offset, buffer, used, (block_bytes, region_bytes), done) = sealing;
        let shard = Rc::clone(self);
        let devices = Rc::clone(&self.devices);
        glommio::spawn_local(async move {
            let (buffer, result) =
                write_region(devices, device, device_offset, buffer, used, block_bytes, region_bytes).await;
            {
                let mut log = shard.log.borrow_mut();
                if let Some(log) = log.as_mut() {
                    let region = &mut log.regions[id as usize];
                    region.state = RegionState::Sealed;
                    region.sealed = None;
                    log.spare.push(buffer);
                }
            }
            if let Err(error) = result {
                shard.poison("writing a region", &error);
            }
            done.close();
        })
        .detach();
    }

    /// Reclaims the oldest sealed region: reinserts its recently hit (and pinned or leased) records into the
    /// open region when `reinsert`, drops the others from the index, zeroes its header, frees it.
    async fn reclaim_oldest(self: &Rc<Self>, reinsert: bool) -> Result<(), Status> {
        let (id, wait) = {
            let log = self.log.borrow();
            let Some(log) = log.as_ref() else { return Err(Status::Invalid) };
            let Some(&id) = log.sealed.front() else { return Err(Status::NoSpace) };
            (id, log.regions[id as usize].sealed.clone())
        };
        if let Some(done) = wait {
            let _ = done.acquire(1).await;
        }
        let (device, device_offset, seq, region_bytes, chunk_bytes, block_bytes) = {
            let log = self.log.borrow();
            let Some(log) = log.as_ref() else { return Err(Status::Invalid) };
            let region = &log.regions[id as usize];
            (
                region.device,
                region.device_offset,
                region.seq,
                log.region_bytes as usize,
                log.chunk_bytes,
                log.block_bytes,
            )
        };
        let staged = read_range(&self.devices, device, device_offset, 0, region_bytes, chunk_bytes).await;
        let now = self.now_tick();
        let recent = Self::ticks(self.config.reinsert_window);
        {
            let mut index = self.index.borrow_mut();
            let mut log_ref = self.log.borrow_mut();
            let Some(log) = log_ref.as_mut() else { return Err(Status::Invalid) };
            let format_id = log.format_id;
            let mut damaged = false;
            match &staged {
                Ok(staged) => {
                    for item in scan_region(staged, seq, format_id) {
                        let (at, header, covered) = match item {
                            Scanned::Record { at, header, covered } => (at, header, covered),
                            Scanned::Seal { .. } => continue,
                            Scanned::Damaged { .. } | Scanned::Lost { .. } => {
                                damaged = true;
                                continue;
                            }
                        };
                        let key = &covered[..usize::from(header.key_len)];
                        let here = location(id, at as u32);
                        let Some(entry_id) = index.find(index_hash(key)) else { continue };
                        let entry = *index.get(entry_id);
                        if entry.nvme != here {
                            continue;
                        }
                        let keep = is_pinned(&entry)
                            || self.leased(&entry, now)
                            || (entry.last_hit != 0 && now.saturating_sub(entry.last_hit) <= recent)
                            || self.group_stays(&mut index, entry_id, now);
                        let value_at = at + header.value_offset();
                        let moved = if reinsert && keep && header.flags & RECORD_TOMBSTONE == 0 {
                            let value = staged.slices(value_at, header.value_len as usize);
                            log.try_append(header, &covered, &value)
                        } else {
                            None
                        };
                        let entry = index.get_mut(entry_id);
                        match moved {
                            Some(new_location) => {
                                entry.nvme = new_location;
                                add(&self.metrics.reinsertions, 1);
                            }
                            None => {
                                entry.nvme = NONE_U64;
                                let dropped = *entry;
                                add(&self.metrics.nvme_evictions, 1);
                                self.account(key, Use::Nvme, object_bytes(&dropped), false);
                                if dropped.dram == NONE_U32 {
                                    self.forget(&mut index, entry_id, Some(key));
                                    self.events.borrow_mut().removed(key, RemovalReason::Evicted);
                                }
                            }
                        }
                    }
                }
                Err(error) => {
                    tracing::error!(shard = self.id, region = id, %error, "region unreadable for reclaim: its objects are dropped");
                    add(&self.metrics.io_errors, 1);
                    damaged = true;
                }
            }
            if damaged {
                // Objects whose records the scan could not read are lost: drop what still points at the region.
                let ids: Vec<u32> = index.ids().collect();
                let mut lost = 0u32;
                for entry_id in ids {
                    let entry = *index.get(entry_id);
                    if entry.nvme != NONE_U64 && split_location(entry.nvme).0 == id {
                        index.get_mut(entry_id).nvme = NONE_U64;
                        if entry.dram == NONE_U32 {
                            self.forget(&mut index, entry_id, None);
                            lost += 1;
                        }
                    }
                }
                // Their keys were in the region that cannot be read: subscribers are told to resync.
                self.events.borrow_mut().lost(lost);
            }
            let region = &mut log.regions[id as usize];
            region.state = RegionState::Free;
            region.seq = 0;
            log.sealed.pop_front();
        }
        // Zero the header, durably, before reuse, so that a crash cannot bring this generation back.
        let device_handle = &self.devices[device];
        let mut zero = device_handle.alloc_buffer(block_bytes);
        zero.as_mut_slice().fill(0);
        let zeroed = match device_handle.write(zero, device_offset).await.1 {
            Ok(()) => device_handle.flush().await,
            Err(error) => Err(error),
        };
        if let Err(error) = zeroed {
            self.poison("zeroing a reclaimed region's header", &error);
        }
        if let Some(log) = self.log.borrow_mut().as_mut() {
            log.free.push_back(id);
        }
        add(&self.metrics.reclaims, 1);
        Ok(())
    }

    /// Evicts from DRAM (CLOCK, sparing pinned, leased and recently referenced objects) when allocating
    /// `need` bytes would pass the high watermark, down to the low one. Dirty objects are written to the
    /// log first. `hard`: also when under the high watermark (the allocator found no piece that fits).
    async fn make_dram_room(self: &Rc<Self>, need: u64, hard: bool) {
        let (capacity, allocated) = {
            let dram = self.dram.borrow();
            (dram.capacity_bytes() as f64, dram.allocated_bytes() as f64)
        };
        if !hard && allocated + need as f64 <= self.config.high_watermark * capacity {
            return;
        }
        let target = if hard {
            (allocated - need as f64).max(0.0).min(self.config.low_watermark * capacity)
        } else {
            self.config.low_watermark * capacity - need as f64
        };
        self.evict_dram(None, move |shard| shard.dram.borrow().allocated_bytes() as f64 > target).await;
    }

    /// Evicts `tenant`'s own objects from DRAM until it has `need` bytes fewer there (a put over its DRAM
    /// quota makes room among its own objects, never another tenant's).
    async fn make_tenant_room(self: &Rc<Self>, tenant: u32, need: u64) {
        let start = self.usage.borrow().get(&tenant).map_or(0, |usage| usage.dram);
        let target = start.saturating_sub(need);
        self.evict_dram(Some(tenant), move |shard| {
            shard.usage.borrow().get(&tenant).map_or(0, |usage| usage.dram) > target
        })
        .await;
    }

    /// The DRAM clock: evicts (objects of `only_tenant`, or any) while `over` says the tier is over its
    /// target, within a bounded number of steps.
    async fn evict_dram(self: &Rc<Self>, only_tenant: Option<u32>, over: impl Fn(&Self) -> bool) {
        let clock_len = self.dram.borrow().clock_len();
        let mut budget = clock_len * 3 + 8;
        let mut visited = 0usize;
        let now = self.now_tick();
        while budget > 0 && over(self) {
            budget -= 1;
            visited += 1;
            let Some(slot) = self.dram.borrow_mut().next_candidate() else { break };
            let (entry_id, entry) = {
                let dram = self.dram.borrow();
                let entry_id = dram.entry_of(slot);
                (entry_id, *self.index.borrow().get(entry_id))
            };
            // Soft pins are spared for the first two turns of the clock (the second clears the referenced
            // bits); after that nothing unpinned is left to take, so they go too.
            let soft_pins_hold = visited <= clock_len * 2;
            let pinned = {
                let mut index = self.index.borrow_mut();
                let dram = self.dram.borrow();
                let key = dram.segment().bytes(dram.offset(slot), usize::from(entry.key_len));
                if only_tenant.is_some_and(|tenant| tenant_of(key, self.tenancy.is_tenanted()) != tenant) {
                    // Another tenant's object: not this eviction's to take.
                    drop(dram);
                    self.dram.borrow_mut().requeue(slot);
                    continue;
                }
                self.pin_holds(&mut index, entry_id, key, now) && (entry.flags & FLAG_PINNED != 0 || soft_pins_hold)
            };
            let spare = pinned || self.leased(&entry, now) || self.dram.borrow().is_pinned(slot);
            if spare || entry.flags & FLAG_REFERENCED != 0 {
                self.index.borrow_mut().get_mut(entry_id).flags &= !FLAG_REFERENCED;
                self.dram.borrow_mut().requeue(slot);
                continue;
            }
            if entry.flags & FLAG_DIRTY != 0
                && self.has_nvme()
                && self.persist(entry_id, entry.hash, entry.version).await.is_ok()
            {
                add(&self.metrics.dram_writebacks, 1);
            }
            // Re-check after the await: the object may have been replaced, removed or hit meanwhile.
            let mut index = self.index.borrow_mut();
            let mut dram = self.dram.borrow_mut();
            let current = *index.get(entry_id);
            if current.hash != entry.hash || current.dram != slot || dram.entry_of(slot) != entry_id {
                continue;
            }
            if current.nvme == NONE_U64 && self.group_stays(&mut index, entry_id, now) {
                // Dropping it would break a group another member pins: the whole group stays.
                dram.requeue(slot);
                continue;
            }
            let key = dram.segment().bytes(dram.offset(slot), usize::from(current.key_len)).to_vec();
            {
                let mut events = self.events.borrow_mut();
                if current.nvme == NONE_U64 {
                    events.removed(&key, RemovalReason::Evicted);
                } else {
                    events.tier_changed(&key, Tier::Dram, Tier::Nvme);
                }
            }
            self.account(&key, Use::Dram, object_bytes(&current), false);
            dram.retire(slot);
            index.get_mut(entry_id).dram = NONE_U32;
            add(&self.metrics.dram_evictions, 1);
            if current.nvme == NONE_U64 {
                // Not on NVMe (no tier, too large for a region, or the write failed): gone from the cache.
                self.forget(&mut index, entry_id, Some(&key));
            }
        }
        self.update_gauges();
    }

    // ---- reads ---------------------------------------------------------------------------------------

    /// Reads `key`'s value, or `range` (offset, length) of it. A key neither stored nor being put
    /// progressively is waited for up to `wait` (zero: answered NOT_FOUND at once).
    pub async fn get(
        self: &Rc<Self>,
        key: &[u8],
        range: Option<(u32, u32)>,
        wait: Duration,
    ) -> Result<ReadHit, Status> {
        let hash = index_hash(key);
        let mut waited_for_fill = false;
        let mut waited_for_arrival = wait.is_zero();
        // Bounded: a wait for the key, a wait for its progressive put, and a retry for a record that moved
        // while it was read, each at most once or twice.
        for _attempt in 0..4 {
            let now = self.now_tick();
            let nvme = {
                let mut index = self.index.borrow_mut();
                match index.find(hash) {
                    None => None,
                    Some(id) => {
                        let entry = *index.get(id);
                        let (offset, len) = match range {
                            None => (0, entry.value_len),
                            Some((offset, len)) => {
                                if u64::from(offset) + u64::from(len) > u64::from(entry.value_len) {
                                    return Err(Status::Invalid);
                                }
                                (offset, len)
                            }
                        };
                        if entry.dram != NONE_U32 {
                            let mut dram = self.dram.borrow_mut();
                            let base = dram.offset(entry.dram);
                            if dram.segment().bytes(base, key.len()) != key {
                                return Err(Status::NotFound);
                            }
                            dram.pin(entry.dram);
                            let entry_mut = index.get_mut(id);
                            entry_mut.flags |= FLAG_REFERENCED;
                            entry_mut.last_hit = now;
                            add(&self.metrics.dram_hits, 1);
                            let data_offset = base + key.len() as u64 + u64::from(offset);
                            let data_crc = if range.is_none() {
                                entry.value_crc
                            } else {
                                crc32c::crc32c(dram.segment().bytes(data_offset, len as usize))
                            };
                            add(&self.metrics.bytes_out, u64::from(len));
                            let pin = DramPin { shard: Rc::clone(self), slot: entry.dram };
                            return Ok(ReadHit {
                                data: ReadData::Dram(pin, data_offset, len as usize),
                                data_crc,
                                object_len: entry.value_len,
                            });
                        }
                        if entry.nvme == NONE_U64 {
                            return Err(Status::NotFound);
                        }
                        Some((id, entry, offset, len))
                    }
                }
            };
            let Some((id, entry, offset, len)) = nvme else {
                // Not stored: a progressive put of the key may be under way.
                let fill = self.filling.borrow().get(key).cloned();
                match fill {
                    Some(fill) if !waited_for_fill => {
                        waited_for_fill = true;
                        if let Some(hit) = self.read_fill(&fill, range).await? {
                            return Ok(hit);
                        }
                        // The put ended: look again (it committed, or the key is not there).
                        continue;
                    }
                    None if !waited_for_arrival => {
                        waited_for_arrival = true;
                        if self.wait_for_arrival(key, wait).await {
                            continue;
                        }
                        return Err(Status::NotFound);
                    }
                    _ => return Err(Status::NotFound),
                }
            };
            match self.read_record(id, entry, key).await {
                Ok(Some(staged)) => {
                    let value_at = record_value_offset(&entry);
                    let data_crc = if range.is_none() {
                        entry.value_crc
                    } else {
                        staged.crc(value_at + offset as usize, len as usize)
                    };
                    add(&self.metrics.nvme_hits, 1);
                    add(&self.metrics.bytes_out, u64::from(len));
                    let promote = {
                        let mut index = self.index.borrow_mut();
                        let entry_mut = index.get_mut(id);
                        let window = Self::ticks(self.config.promote_window);
                        let hot =
                            window > 0 && entry_mut.last_hit != 0 && now.saturating_sub(entry_mut.last_hit) <= window;
                        entry_mut.last_hit = now;
                        hot
                    };
                    if promote {
                        self.promote(id, entry, key, &staged).await;
                    }
                    return Ok(ReadHit {
                        data: ReadData::Staged(staged, value_at + offset as usize, len as usize),
                        data_crc,
                        object_len: entry.value_len,
                    });
                }
                Ok(None) => continue,
                Err(status) => return Err(status),
            }
        }
        Err(Status::NotFound)
    }

    /// Reads and checks the NVMe record of `entry`. `Ok(None)`: the record moved while it was read (retry).
    async fn read_record(self: &Rc<Self>, id: u32, entry: Entry, key: &[u8]) -> Result<Option<Staged>, Status> {
        let (region_id, offset) = split_location(entry.nvme);
        let record_len = record_value_offset(&entry) + entry.value_len as usize;
        let (state, seq, wait, device, device_offset, chunk_bytes) = {
            let guard = self.log.borrow();
            let Some(log) = guard.as_ref() else { return Err(Status::NotFound) };
            let region = &log.regions[region_id as usize];
            if region.state == RegionState::Open
                && let Some(open) = log.open.as_ref()
            {
                let bytes = open.buffer.read_at(offset as usize, record_len);
                drop(guard);
                return self.check_record(id, entry, key, Staged::from_vec(bytes)).map(Some);
            }
            (region.state, region.seq, region.sealed.clone(), region.device, region.device_offset, log.chunk_bytes)
        };
        if state == RegionState::Sealing
            && let Some(done) = wait
        {
            let _ = done.acquire(1).await;
        }
        let read = read_range(&self.devices, device, device_offset, offset as usize, record_len, chunk_bytes).await;
        let still_there = {
            let log = self.log.borrow();
            let index = self.index.borrow();
            let current = index.get(id);
            log.as_ref().is_some_and(|log| log.regions[region_id as usize].seq == seq)
                && current.hash == entry.hash
                && current.nvme == entry.nvme
        };
        if !still_there {
            return Ok(None);
        }
        match read {
            Ok(staged) => self.check_record(id, entry, key, staged).map(Some),
            Err(error) => {
                tracing::error!(shard = self.id, %error, "NVMe-tier read failed");
                add(&self.metrics.io_errors, 1);
                Err(Status::Io)
            }
        }
    }

    /// Checks a record against the key asked for and the entry; a damaged record is dropped from the index
    /// (never served) and reported as `Checksum`.
    fn check_record(&self, id: u32, entry: Entry, key: &[u8], staged: Staged) -> Result<Staged, Status> {
        let value_at = record_value_offset(&entry);
        let head = staged.copy(0, value_at);
        let stored_key = head.get(RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + key.len());
        let format_id = self.format_id();
        let valid = match RecordHeader::decode(&head, format_id) {
            Ok(header) => {
                stored_key == Some(key)
                    && header.value_offset() == value_at
                    && header.value_len == entry.value_len
                    && header.value_crc == entry.value_crc
                    && staged.crc(value_at, entry.value_len as usize) == entry.value_crc
            }
            Err(_) => false,
        };
        if valid {
            return Ok(staged);
        }
        if stored_key != Some(key) && RecordHeader::decode(&head, format_id).is_ok() {
            // Another key with the same index hash: a miss, not damage.
            return Err(Status::NotFound);
        }
        add(&self.metrics.checksum_failures, 1);
        let mut index = self.index.borrow_mut();
        let current = *index.get(id);
        if current.hash == entry.hash && current.nvme == entry.nvme {
            index.get_mut(id).nvme = NONE_U64;
            self.account(key, Use::Nvme, object_bytes(&current), false);
            if current.dram == NONE_U32 {
                self.forget(&mut index, id, Some(key));
                self.events.borrow_mut().removed(key, RemovalReason::Checksum);
            }
        }
        Err(Status::Checksum)
    }

    /// Copies an NVMe hit into DRAM (L2 → L1 promotion) if there is room without waiting.
    async fn promote(self: &Rc<Self>, id: u32, entry: Entry, key: &[u8], staged: &Staged) {
        let len = key.len() as u64 + u64::from(entry.value_len);
        self.make_dram_room(len, false).await;
        let mut index = self.index.borrow_mut();
        let mut dram = self.dram.borrow_mut();
        let current = *index.get(id);
        if current.hash != entry.hash || current.version != entry.version || current.dram != NONE_U32 {
            return;
        }
        let Ok((slot, offset)) = dram.allocate(len) else { return };
        let bytes = dram.segment().bytes_mut(offset, len as usize);
        bytes[..key.len()].copy_from_slice(key);
        let mut at = key.len();
        for part in staged.slices(record_value_offset(&entry), entry.value_len as usize) {
            bytes[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        dram.publish(slot, id);
        index.get_mut(id).dram = slot;
        self.account(key, Use::Dram, len, true);
        add(&self.metrics.promotions, 1);
        self.events.borrow_mut().tier_changed(key, Tier::Nvme, Tier::Dram);
    }

    /// Wakes the readers waiting for `key` (a put of it committed, or a progressive put of it started).
    fn key_arrived(&self, key: &[u8]) {
        if self.awaited.borrow().is_empty() {
            return;
        }
        let Some(arrival) = self.awaited.borrow_mut().remove(key) else { return };
        arrival.arrived.set(true);
        for waker in arrival.wakers.take() {
            waker.wake();
        }
    }

    /// Waits up to `wait` for `key` to arrive; whether it did.
    async fn wait_for_arrival(&self, key: &[u8], wait: Duration) -> bool {
        let arrival = Rc::clone(self.awaited.borrow_mut().entry(key.to_vec()).or_default());
        let arrived = futures_lite::future::or(
            std::future::poll_fn(|context| {
                if arrival.arrived.get() {
                    std::task::Poll::Ready(true)
                } else {
                    arrival.wakers.borrow_mut().push(context.waker().clone());
                    std::task::Poll::Pending
                }
            }),
            async {
                glommio::timer::sleep(wait).await;
                false
            },
        )
        .await;
        if !arrived {
            // The last reader to give up takes the entry out, so waits that end leave nothing behind.
            let mut awaited = self.awaited.borrow_mut();
            if awaited.get(key).is_some_and(|entry| Rc::ptr_eq(entry, &arrival) && Rc::strong_count(&arrival) == 2) {
                awaited.remove(key);
            }
        }
        arrived
    }

    /// Reads `range` of a progressive put's object once those bytes are in (a whole-value read waits for the
    /// put to end); `None` if the put ended first (the caller looks the key up again).
    async fn read_fill(self: &Rc<Self>, fill: &Rc<Fill>, range: Option<(u32, u32)>) -> Result<Option<ReadHit>, Status> {
        let (offset, len) = range.unwrap_or((0, fill.value_len));
        if u64::from(offset) + u64::from(len) > u64::from(fill.value_len) {
            return Err(Status::Invalid);
        }
        // A whole value is served from the index once committed (with its crc); a range as soon as it is in.
        let need = if range.is_none() { u32::MAX } else { offset + len };
        let arrived = futures_lite::future::or(
            async {
                fill.reached(need).await;
                true
            },
            async {
                glommio::timer::sleep(FILL_WAIT).await;
                false
            },
        )
        .await;
        if !arrived {
            return Err(Status::NotFound);
        }
        if !fill.open.get() || fill.filled.get() < need {
            return Ok(None);
        }
        let mut dram = self.dram.borrow_mut();
        dram.pin(fill.slot);
        let data_offset = fill.value_offset + u64::from(offset);
        let data_crc = crc32c::crc32c(dram.segment().bytes(data_offset, len as usize));
        add(&self.metrics.dram_hits, 1);
        add(&self.metrics.bytes_out, u64::from(len));
        let pin = DramPin { shard: Rc::clone(self), slot: fill.slot };
        Ok(Some(ReadHit { data: ReadData::Dram(pin, data_offset, len as usize), data_crc, object_len: fill.value_len }))
    }

    /// Whether `key` is stored, and the length of its value: from the index alone (the 64-bit hash), for
    /// DRAM and NVMe objects alike, so that a scheduler's batch of lookups touches no object memory. A hash
    /// collision (see `index.rs`) can make this say yes for a key a get then misses; never the reverse.
    pub fn exists(&self, key: &[u8]) -> Result<u32, Status> {
        self.exists_hashed(index_hash(key), false)
    }

    /// [`Shard::exists`], and a read lease on the object (its last hit is now): a prefix match's blocks
    /// are not evicted before the engine that asked loads them (`read_lease`, 5 s by default).
    pub fn exists_leased(&self, key: &[u8]) -> Result<u32, Status> {
        self.exists_hashed(index_hash(key), true)
    }

    /// [`Shard::exists`] (with a read lease if `lease`) of the key whose index hash is `hash`: for a batch
    /// that hashed its keys already, to prefetch their lines.
    pub fn exists_hashed(&self, hash: u64, lease: bool) -> Result<u32, Status> {
        let mut index = self.index.borrow_mut();
        let Some(id) = index.find(hash) else { return Err(Status::NotFound) };
        let entry = index.get_mut(id);
        if lease {
            entry.last_hit = self.now_tick();
        }
        Ok(entry.value_len)
    }

    /// Removes `key`; a tombstone in the log keeps it removed across a restart.
    pub async fn remove(self: &Rc<Self>, key: &[u8]) -> Result<(), Status> {
        self.remove_as(key, RemovalReason::Removed).await
    }

    /// Removes `key` for `reason` (a client's remove, or a cascade), with a tombstone when a record of it
    /// is on the tier. A client's removal is acknowledged only once its tombstone is durable, so that a
    /// restart cannot bring the key back; a cascade's is not waited for (nobody was told it happened).
    async fn remove_as(self: &Rc<Self>, key: &[u8], reason: RemovalReason) -> Result<(), Status> {
        let hash = index_hash(key);
        let entry = {
            let mut index = self.index.borrow_mut();
            let Some(id) = index.find(hash) else { return Err(Status::NotFound) };
            let entry = *index.get(id);
            let mut dram = self.dram.borrow_mut();
            if entry.dram != NONE_U32 {
                if dram.segment().bytes(dram.offset(entry.dram), key.len()) != key {
                    return Err(Status::NotFound);
                }
                dram.retire(entry.dram);
                self.account(key, Use::Dram, object_bytes(&entry), false);
            }
            drop(dram);
            self.forget(&mut index, id, Some(key));
            self.events.borrow_mut().removed(key, reason);
            entry
        };
        self.update_gauges();
        if entry.nvme == NONE_U64 || !self.has_nvme() {
            return Ok(());
        }
        let point = self.append_tombstone(key, hash, entry.version).await;
        if reason != RemovalReason::Removed {
            return Ok(());
        }
        self.sync(point?).await
    }

    /// The key of entry `entry`: from its DRAM copy, else from its record's header on the NVMe tier (whose
    /// crc covers the key). `None` if neither can be read.
    async fn stored_key(self: &Rc<Self>, entry: Entry) -> Option<Vec<u8>> {
        let key_len = usize::from(entry.key_len);
        if entry.dram != NONE_U32 {
            let dram = self.dram.borrow();
            return Some(dram.segment().bytes(dram.offset(entry.dram), key_len).to_vec());
        }
        if entry.nvme == NONE_U64 {
            return None;
        }
        let (region_id, offset) = split_location(entry.nvme);
        let head_len = record_value_offset(&entry);
        let key_of = |head: &[u8]| head[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + key_len].to_vec();
        let (device, device_offset, chunk_bytes, wait) = {
            let guard = self.log.borrow();
            let log = guard.as_ref()?;
            let region = &log.regions[region_id as usize];
            if region.state == RegionState::Open
                && let Some(open) = log.open.as_ref()
            {
                let head = open.buffer.read_at(offset as usize, head_len);
                return RecordHeader::decode(&head, log.format_id).ok().map(|_| key_of(&head));
            }
            (region.device, region.device_offset, log.chunk_bytes, region.sealed.clone())
        };
        let format_id = self.format_id();
        if let Some(done) = wait {
            let _ = done.acquire(1).await;
        }
        let staged =
            read_range(&self.devices, device, device_offset, offset as usize, head_len, chunk_bytes).await.ok()?;
        let head = staged.copy(0, head_len);
        RecordHeader::decode(&head, format_id).ok().map(|_| key_of(&head))
    }

    /// Removes every key of this shard that starts with `scope` (a tenant's prefix) and, without it,
    /// matches `pattern` anywhere (every such key for `None`); returns how many. Keys are not in the index (only their hashes), so each is read from its object — from DRAM,
    /// or a small read of its record on NVMe: an administrative operation, linear in the shard's objects.
    pub async fn remove_matching(self: &Rc<Self>, scope: &[u8], pattern: Option<&regex::bytes::Regex>) -> u32 {
        let snapshot: Vec<(u32, Entry)> = {
            let index = self.index.borrow();
            index.ids().map(|id| (id, *index.get(id))).collect()
        };
        let mut removed = 0u32;
        for (id, entry) in snapshot {
            let still_there = self.index.borrow().find(entry.hash) == Some(id);
            if !still_there {
                continue;
            }
            let Some(key) = self.stored_key(entry).await else { continue };
            // Only the caller's tenant's keys, matched without the tenant's prefix.
            let Some(user_key) = key.strip_prefix(scope) else { continue };
            if pattern.is_none_or(|pattern| pattern.is_match(user_key)) && self.remove(&key).await.is_ok() {
                removed += 1;
            }
        }
        removed
    }

    // ---- start-up and shutdown -----------------------------------------------------------------------

    /// Clean shutdown: writes dirty (write-back) objects, seals the open region and waits for every region
    /// write to complete.
    pub async fn flush_for_shutdown(self: &Rc<Self>) {
        if !self.has_nvme() {
            return;
        }
        let dirty: Vec<(u32, u64, u32)> = {
            let index = self.index.borrow();
            index
                .ids()
                .map(|id| (id, *index.get(id)))
                .filter(|(_, entry)| entry.flags & FLAG_DIRTY != 0 && entry.dram != NONE_U32)
                .map(|(id, entry)| (id, entry.hash, entry.version))
                .collect()
        };
        for (id, hash, version) in dirty {
            if self.persist(id, hash, version).await.is_err() && self.poisoned.get() {
                break;
            }
        }
        if let Ok(_permit) = self.log_lock.acquire_static_permit(1).await {
            self.seal_open();
        }
        loop {
            let wait = self
                .log
                .borrow()
                .as_ref()
                .and_then(|log| log.sealed.iter().find_map(|&id| log.regions[id as usize].sealed.clone()));
            match wait {
                Some(done) => {
                    let _ = done.acquire(1).await;
                }
                None => break,
            }
        }
    }
}

/// The durable point just past `len` bytes of record at location `at` of `log`.
fn point_after(log: &RegionLog, at: u64, len: usize) -> DurablePoint {
    let (region, offset) = split_location(at);
    DurablePoint { region, seq: log.regions[region as usize].seq, end: offset as usize + len }
}

/// Counts `key` up or down in `counts`, where a key at zero is absent (a count never goes below zero);
/// returns whether the key went from zero to one or from one to zero.
fn count_up_or_down(counts: &mut std::collections::HashMap<u64, u32>, key: u64, up: bool) -> bool {
    let count = counts.entry(key).or_default();
    let before = *count;
    *count = if up { before + 1 } else { before.saturating_sub(1) };
    let after = *count;
    if after == 0 {
        counts.remove(&key);
    }
    (before == 0) != (after == 0)
}
