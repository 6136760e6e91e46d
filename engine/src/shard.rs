//! A shard: everything one core owns for its keys, and the operations on them. Runs on one glommio
//! executor; nothing here is `Send`.
//!
//! The core is the index, the DRAM tier and the region log over the shard's devices (`Shard`'s own
//! fields). Each concern around it is a module of its own, with the state only it reads: the put pipeline
//! (`put`), reads (`reads`), DRAM eviction (`eviction`), the log's writes (`durable`), reclaim (`reclaim`),
//! recovery (`recovery`), removals (`removal`), pins (`pins`, [`PinBook`]), links and cascades (`cascade`,
//! [`LinkState`]), progressive fills and waits (`fill`, [`Arrivals`]), tenant accounting (`usage`,
//! [`TenantBook`]), upsert versions (`versions`, [`VersionBook`]). Nothing here knows of sockets or of
//! the other shards: the server and the forwarder sit above (`server`, `forward`), and what a shard tells
//! its peers leaves through a channel.
//!
//! The shard is generic over its [`Backend`] (devices and clock), so that the seeded simulation (`sim`)
//! runs this same code over memory namespaces that inject faults and a simulated clock.
//!
//! State lives in `RefCell`s that are borrowed only between awaits (never across one), so tasks of the
//! executor interleave freely without locks. One async lock (`log_lock`, a one-permit semaphore) orders the
//! log's slow paths — sealing and opening regions, reclaim, durable syncs — which await device I/O.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use glommio::sync::Semaphore;

use crate::backend::{Backend, Clock, Production};
use crate::config::EngineConfig;
use crate::dram::DramTier;
use crate::events::EventLog;
use crate::index::{Entry, FLAG_LINKED, FLAG_PINNED, Index, NONE_U32, NONE_U64};
use crate::links::{LinkCounts, NO_LINK, parent_name};
use crate::log::RegionLog;
use crate::metrics::{ShardMetrics, add, set};
use crate::tenants::Tenancy;

mod cascade;
mod durable;
mod eviction;
mod fill;
mod pins;
mod put;
mod reads;
mod reclaim;
mod recovery;
mod removal;
mod scan;
mod usage;
mod versions;

pub use cascade::{Cascade, CascadeKind, LinkState};
pub use durable::DurablePoint;
pub use fill::{Arrivals, FillGuard};
pub use pins::PinBook;
pub use put::PutReservation;
pub use reads::{ReadData, ReadHit};
pub use recovery::{RecoveryError, RecoveryReport};
pub use usage::TenantBook;
pub use versions::VersionBook;

use pins::is_pinned;
use usage::Use;

/// Ticks are 10 ms: leases and windows are coarse, and a `u32` of ticks lasts 497 days.
const TICK: Duration = Duration::from_millis(10);
/// How long a read of a progressive put's bytes waits for them to arrive.
pub const FILL_WAIT: Duration = Duration::from_secs(30);

/// One shard of a node, over backend `E` (the node's devices and wall clock unless simulated).
pub struct Shard<E: Backend = Production> {
    /// Its id.
    pub id: u32,
    /// Shards of the node.
    pub shard_count: u32,
    /// Port of shard 0.
    pub base_port: u16,
    /// Settings.
    pub config: Rc<EngineConfig>,
    /// Its counters.
    pub metrics: Arc<ShardMetrics>,
    clock: E::Clock,
    index: RefCell<Index>,
    dram: Rc<RefCell<DramTier>>,
    log: RefCell<Option<RegionLog>>,
    devices: Rc<Vec<E::Device>>,
    log_lock: Rc<Semaphore>,
    /// One permit per NVMe-tier read in flight (`EngineConfig::nvme_queue_depth`).
    read_slots: Rc<Semaphore>,
    /// No promotion is tried before this tick: the last one found no DRAM room within its clock steps.
    promotions_paused_until: Cell<u32>,
    poisoned: Cell<bool>,
    /// Tombstones of keys that left the index (cascades) not known durable yet, by key hash.
    unsynced_tombstones: RefCell<std::collections::HashMap<u64, DurablePoint>>,
    pins: RefCell<PinBook>,
    versions: RefCell<VersionBook>,
    links: LinkState,
    arrivals: Rc<Arrivals>,
    tenants: TenantBook,
    events: Rc<RefCell<EventLog>>,
    me: std::rc::Weak<Self>,
}

/// What a shard is built from.
pub struct ShardParts<E: Backend> {
    /// Its id.
    pub id: u32,
    /// Shards of the node.
    pub shard_count: u32,
    /// Port of shard 0 (what HELLO tells clients).
    pub base_port: u16,
    /// Settings (validated: `EngineConfig::validate`).
    pub config: Rc<EngineConfig>,
    /// Its DRAM tier.
    pub dram: DramTier,
    /// Its own handles on the tier's namespaces (none: DRAM only).
    pub devices: Vec<E::Device>,
    /// Its share of the tier's regions (none: DRAM only).
    pub log: Option<RegionLog>,
    /// Its clock.
    pub clock: E::Clock,
    /// Its counters.
    pub metrics: Arc<ShardMetrics>,
    /// Every shard's count of linked objects, shared by the node's shards.
    pub link_counts: Arc<LinkCounts>,
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

fn object_bytes(entry: &Entry) -> u64 {
    u64::from(entry.key_len) + u64::from(entry.value_len)
}

impl<E: Backend> Shard<E> {
    /// Starts loading one more of the lines that an operation on the key whose hash is `hash` will touch
    /// (the server's put and get paths). Each stage reads only lines that the stage before asked for, an
    /// item earlier: the table slot, the entry it names, the DRAM slot's bookkeeping, the object's first
    /// bytes in the segment (its key, compared on every read).
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

    /// A shard built from `parts`; it serves nothing until [`Shard::recover`] has run.
    pub fn new(parts: ShardParts<E>) -> Rc<Self> {
        let ShardParts { id, shard_count, base_port, config, dram, devices, log, clock, metrics, link_counts } = parts;
        set(&metrics.dram_capacity_bytes, dram.capacity_bytes());
        let pin_limit = (dram.capacity_bytes() as f64 * config.max_pinned_share) as u64;
        let queue_depth = config.nvme_queue_depth.max(1) as u64;
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
            metrics,
            clock,
            index: RefCell::new(Index::new()),
            dram: Rc::new(RefCell::new(dram)),
            log: RefCell::new(log),
            devices: Rc::new(devices),
            log_lock: Rc::new(Semaphore::new(1)),
            read_slots: Rc::new(Semaphore::new(queue_depth)),
            promotions_paused_until: Cell::new(0),
            poisoned: Cell::new(false),
            unsynced_tombstones: RefCell::new(std::collections::HashMap::new()),
            pins: RefCell::new(PinBook { limit: pin_limit, ..PinBook::default() }),
            versions: RefCell::new(VersionBook::default()),
            links: LinkState::new(link_counts),
            arrivals: Rc::new(Arrivals::default()),
            tenants: TenantBook::new(tenancy),
            events,
            me: me.clone(),
        })
    }

    /// The shard's DRAM tier, held by what must outlive a registration of its segment (RDMA).
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub(crate) fn dram_tier(&self) -> Rc<RefCell<DramTier>> {
        Rc::clone(&self.dram)
    }

    /// The node's tenants, as this shard scopes and accounts them.
    pub fn tenancy(&self) -> &Tenancy {
        &self.tenants.tenancy
    }

    /// What subscribers are told (recorded only while someone subscribes).
    pub fn events(&self) -> &Rc<RefCell<EventLog>> {
        &self.events
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
        self.drop_version(&entry);
        if let Some(key) = key
            && entry.nvme != NONE_U64
        {
            self.account(key, Use::Nvme, object_bytes(&entry), false);
        }
        let group = if entry.flags & FLAG_LINKED != 0 {
            let links = self.links.book.borrow_mut().unlink(id);
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
        if !self.links.serving() {
            return entry;
        }
        if !self.links.book.borrow().is_empty() || self.links.peers_hold_links(self.id) {
            // Any object may be somebody's parent; only a node that links nothing skips this.
            self.queue_cascade(Cascade { name: parent_name(entry.hash), kind: CascadeKind::Parent }, true);
            if group != NO_LINK {
                self.queue_cascade(Cascade { name: group, kind: CascadeKind::Group }, true);
            }
        }
        entry
    }

    fn now_tick(&self) -> u32 {
        (self.clock.now().as_millis() / TICK.as_millis()) as u32 + 1
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

    fn update_gauges(&self) {
        let dram = self.dram.borrow();
        set(&self.metrics.dram_objects, dram.resident_objects() as u64);
        set(&self.metrics.dram_bytes, dram.allocated_bytes());
        let index = self.index.borrow();
        set(&self.metrics.index_objects, index.len() as u64);
        if let Some(log) = self.log.borrow().as_ref() {
            set(&self.metrics.nvme_regions_used, log.used_regions() as u64);
        }
        if self.tenants.tenancy.is_tenanted() {
            // The metrics thread reads this copy; if it holds it right now, the next update publishes.
            if let Ok(mut published) = self.metrics.tenants.try_lock() {
                published.clear();
                for (&tenant, usage) in self.tenants.usage.borrow().iter() {
                    let name = self.tenants.tenancy.name_of(tenant).unwrap_or("unknown");
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

    fn poison(&self, what: &str, error: &strata_nvme::BlockError) {
        self.note_fence(error);
        if !self.poisoned.replace(true) {
            tracing::error!(shard = self.id, what, %error, "NVMe tier poisoned: it takes no more writes");
        }
        add(&self.metrics.io_errors, 1);
        set(&self.metrics.nvme_poisoned, 1);
    }

    /// Marks the shard fenced when a target refused its I/O with a reservation conflict: the namespace was
    /// taken over, and the node stops serving (`metrics::fenced`) rather than answer from a tier it lost.
    fn note_fence(&self, error: &strata_nvme::BlockError) {
        if error.is_reservation_conflict()
            && self.metrics.nvme_fenced.swap(1, std::sync::atomic::Ordering::Relaxed) == 0
        {
            tracing::error!(shard = self.id, %error, "fenced off the NVMe tier: another node took it over");
        }
    }
}
