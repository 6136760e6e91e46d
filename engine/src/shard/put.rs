//! The put pipeline, one for client and forwarded puts: admission (policy, refusals, reservation), then the commit that indexes the object and writes its record.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use strata_proto::{Links, Pin, PutOptions, Tier, WritePolicy};

use super::durable::DurablePoint;
use super::fill::{Arrivals, Fill, FillGuard};
use super::pins::is_pinned;
use super::usage::Use;
use super::{Shard, object_bytes};
use crate::backend::Backend;
use crate::dram::{DramFull, DramTier};
use crate::error::EngineError;
use crate::index::{
    Entry, FLAG_DIRTY, FLAG_LINKED, FLAG_PINNED, FLAG_SOFT_PINNED, FLAG_VERSIONED, Index, NONE_U32, NONE_U64,
    index_hash, replica_flags,
};
use crate::links::{NO_LINK, ObjectLinks, link_hash};
use crate::metrics::{add, set};
use crate::record::{RECORD_LINKED, RECORD_VERSIONED, RecordHeader};
use crate::segment::SegmentRange;
use crate::tenants::tenant_of;

/// DRAM reserved for a put that is receiving its bytes (`[key][value]`); freed if dropped before
/// [`Shard::commit_put`].
pub struct PutReservation {
    pub(super) dram: Rc<RefCell<DramTier>>,
    pub(super) arrivals: Rc<Arrivals>,
    pub(super) slot: Option<u32>,
    /// The object's bytes: this reservation's alone until it is committed.
    pub(super) bytes: SegmentRange,
    /// Once readable while it fills: the fill its readers see, and where its value starts.
    pub(super) readable: Option<(Rc<Fill>, usize)>,
}

impl PutReservation {
    /// Bytes reserved (key and value).
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// `len` bytes from `at` of the object (`[key][value]`), to fill. Once the object is readable while it
    /// fills ([`PutReservation::open_for_reads`]), only bytes its readers cannot see yet are handed out:
    /// asking for any of the value's prefix that arrived is a bug, and panics.
    pub fn bytes_mut(&mut self, at: usize, len: usize) -> &mut [u8] {
        if let Some((fill, value_at)) = &self.readable {
            assert!(at >= value_at + fill.filled.get() as usize, "refilling bytes that readers may be reading");
        }
        let range = self.bytes.sub(at, len);
        // SAFETY: the DRAM tier (held by `self.dram`) keeps the segment mapped; the allocator gave this range
        // to this reservation alone and it is not published, so no reader pins it, except a progressive
        // put's, which read only the prefix that arrived (refused above); `&mut self` makes this the only
        // slice this reservation has handed out while it lives.
        #[allow(unsafe_code)]
        unsafe {
            range.as_mut_slice()
        }
    }

    /// Makes the reserved object of `key` (whose key bytes are in place) readable by GET_RANGE as its value
    /// arrives, before it is committed: readers of a key with no stored version wait for the bytes they
    /// ask for. `None` if another progressive put of the key is filling.
    pub fn open_for_reads(&mut self, key: &[u8], value_len: u32) -> Option<FillGuard> {
        let slot = self.slot?;
        let mut filling = self.arrivals.filling.borrow_mut();
        if filling.contains_key(key) {
            return None;
        }
        let fill = Rc::new(Fill {
            slot,
            value: self.bytes.sub(key.len(), value_len as usize),
            value_len,
            filled: Cell::new(0),
            open: Cell::new(true),
            wakers: RefCell::new(Vec::new()),
        });
        filling.insert(key.to_vec(), Rc::clone(&fill));
        drop(filling);
        self.readable = Some((Rc::clone(&fill), key.len()));
        self.arrivals.key_arrived(key);
        Some(FillGuard { arrivals: Rc::clone(&self.arrivals), key: key.to_vec(), fill })
    }
}

impl Drop for PutReservation {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            // A progressive put readable from this reservation ends here: no reader may pin the slot once
            // it is freed.
            for fill in self.arrivals.filling.borrow().values().filter(|fill| fill.slot == slot) {
                fill.open.set(false);
                fill.wake();
            }
            self.dram.borrow_mut().retire(slot);
        }
    }
}

impl<E: Backend> Shard<E> {
    /// The first stage of every put, whichever way it arrived (a client's frame or a peer shard's
    /// forward): resolves the write policy to the node's default, refuses what must be refused before a
    /// byte is stored ([`Shard::put_refusal`]), and reserves DRAM for `[key][value]`. The caller fills the
    /// reservation and hands it to [`Shard::commit_put`] with the same `options`.
    pub async fn admit_put(
        self: &Rc<Self>,
        key: &[u8],
        value_len: u32,
        options: &mut PutOptions,
    ) -> Result<PutReservation, EngineError> {
        options.policy = Some(options.policy.unwrap_or(self.config.write_policy));
        if let Some(status) = self.put_refusal(key, value_len, options) {
            return Err(status);
        }
        self.reserve_put(key, key.len() as u64 + u64::from(value_len)).await
    }

    /// Why a put of `key` with a `value_len`-byte value and `options` (policy resolved) must be refused
    /// before a byte of it is stored: `Exists` for a put (not an upsert) of a stored key, `Superseded` for
    /// an upsert whose version is not newer than the stored one's, `Quota` for a pin
    /// over the shard's pinned-bytes limit, or a durable put that cannot be made durable here.
    pub(super) fn put_refusal(&self, key: &[u8], value_len: u32, options: &PutOptions) -> Option<EngineError> {
        if self.poisoned.get() {
            // A tier that failed a write takes no more writes, and neither does the shard (fjall's rule): an
            // acknowledgement must never rest on a write that may not have happened.
            return Some(EngineError::Poisoned);
        }
        {
            let index = self.index.borrow();
            let existing = index.find(index_hash(key));
            if !options.upsert && existing.is_some() {
                return Some(EngineError::Exists);
            }
            if let Some(refusal) = self.version_refusal(&index, existing, options.version) {
                return Some(refusal);
            }
        }
        let bytes = key.len() as u64 + u64::from(value_len);
        let (usage, quotas) = self.usage_of(key);
        if options.pin != Pin::None {
            let pins = self.pins.borrow();
            if pins.bytes + bytes > pins.limit || quotas.pinned.is_some_and(|quota| usage.pinned + bytes > quota) {
                return Some(EngineError::Quota("pinned"));
            }
        }
        if quotas.dram.is_some_and(|quota| bytes > quota) {
            return Some(EngineError::Quota("tenant's DRAM"));
        }
        if options.policy == Some(WritePolicy::Durable) {
            if quotas.nvme.is_some_and(|quota| usage.nvme + bytes > quota) {
                return Some(EngineError::Quota("tenant's NVMe"));
            }
            return self.durable_refusal(key.len(), value_len);
        }
        None
    }

    /// Why a durable put of a `key_len` + `value_len` object cannot be made durable here (checked before
    /// anything is stored, so a refused durable put leaves no copy behind): no NVMe tier, a poisoned one, or
    /// an object larger than a region.
    pub(super) fn durable_refusal(&self, key_len: usize, value_len: u32) -> Option<EngineError> {
        let log = self.log.borrow();
        let Some(log) = log.as_ref() else {
            return Some(EngineError::Invalid("a durable put on a node with no NVMe tier"));
        };
        if self.poisoned.get() {
            return Some(EngineError::Poisoned);
        }
        // Sized as if linked and versioned (links are not known here): at worst an object within 32 bytes of
        // the bound is refused.
        let record = RecordHeader {
            region_seq: 0,
            key_hash: 0,
            value_len,
            value_crc: 0,
            key_len: key_len as u16,
            flags: RECORD_LINKED | RECORD_VERSIONED,
            version: 0,
        };
        (record.record_len() > log.max_record_bytes())
            .then_some(EngineError::TooLarge("a durable object is larger than a region"))
    }

    /// Reserves DRAM for an object of `len` bytes (`[key][value]`), evicting first if the tier is above
    /// its high watermark.
    pub(super) async fn reserve_put(self: &Rc<Self>, key: &[u8], len: u64) -> Result<PutReservation, EngineError> {
        // A tenant at its DRAM quota makes room among its own objects first.
        let (usage, quotas) = self.usage_of(key);
        if let Some(quota) = quotas.dram
            && usage.dram + len > quota
        {
            let tenant = tenant_of(key, self.tenants.tenancy.is_tenanted());
            self.make_tenant_room(tenant, usage.dram + len - quota).await;
            if self.usage_of(key).0.dram + len > quota {
                return Err(EngineError::Quota("tenant's DRAM"));
            }
        }
        for attempt in 0..3 {
            self.make_dram_room(len, attempt > 0).await;
            let allocated = self.dram.borrow_mut().allocate(len);
            match allocated {
                Ok((slot, bytes)) => {
                    return Ok(PutReservation {
                        dram: Rc::clone(&self.dram),
                        arrivals: Rc::clone(&self.arrivals),
                        slot: Some(slot),
                        bytes,
                        readable: None,
                    });
                }
                Err(DramFull::TooLarge) => {
                    return Err(EngineError::TooLarge("the object is larger than the DRAM tier"));
                }
                Err(DramFull::NoSpace) => {}
            }
        }
        Err(EngineError::NoSpace("DRAM tier"))
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
    ) -> Result<Option<DurablePoint>, EngineError> {
        let policy = options.policy.unwrap_or(self.config.write_policy);
        let object_links = ObjectLinks {
            parent: links.parent.map_or(NO_LINK, link_hash),
            group: links.group.map_or(NO_LINK, link_hash),
        };
        let hash = index_hash(key);
        if self.poisoned.get() {
            return Err(EngineError::Poisoned);
        }
        let (id, version, superseded_record, removal_to_sync) = {
            let mut index = self.index.borrow_mut();
            let existing = index.find(hash);
            if existing.is_some() && !options.upsert {
                return Err(EngineError::Exists);
            }
            if let Some(refusal) = self.version_refusal(&index, existing, options.version) {
                return Err(refusal);
            }
            // A key removed by a cascade left a tombstone that may not be durable yet: this put is
            // acknowledged only once it is, or a crash could bring the older record back.
            let removal_to_sync = if existing.is_none() { self.unsynced_tombstone(hash) } else { None };
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
            if pin_flags != 0 {
                self.check_pin_room(&index, existing, key, new_bytes)?;
            }
            let Some(slot) = reservation.slot.take() else {
                return Err(EngineError::Invalid("a reservation committed twice"));
            };
            let old_hard_pin = existing.is_some_and(|id| index.get(id).flags & FLAG_PINNED != 0);
            let fresh = Entry {
                hash,
                nvme: NONE_U64,
                dram: slot,
                value_len,
                value_crc,
                version: 1,
                last_hit: 0,
                key_len: key.len() as u16,
                flags: pin_flags | FLAG_DIRTY | replica_flags(options.replicas),
            };
            let id = self.install_version(&mut index, existing, key, fresh);
            self.set_version(&mut index, id, options.version, false);
            self.account(key, Use::Dram, new_bytes, true);
            self.relink(&mut index, id, object_links, old_hard_pin, pin_flags);
            self.events.borrow_mut().stored(key, links.parent, value_len, Tier::Dram);
            self.arrivals.key_arrived(key);
            if pin_flags != 0 {
                self.record_pin(key, hash, new_bytes, options.pin);
            }
            (id, index.get(id).version, superseded_record, removal_to_sync)
        };
        add(&self.metrics.bytes_in, u64::from(value_len));
        self.update_gauges();
        if !self.has_nvme() {
            return if policy == WritePolicy::Durable {
                Err(EngineError::Invalid("a durable put on a node with no NVMe tier"))
            } else {
                Ok(None)
            };
        }
        let point = self.write_per_policy(policy, superseded_record, key, id, hash, version).await?;
        // A durable put's own record, once synced, supersedes the removed one; any other put waits for the
        // removal's tombstone.
        Ok(point.or(removal_to_sync))
    }

    /// A put whose value is in memory (a forwarded put, the simulation): the pipeline of a client's streamed
    /// put — [`Shard::admit_put`], the reservation filled, [`Shard::commit_put`] — then its sync if the
    /// policy asks for one. `value_crc` is the value's crc32c, checked by whoever received it.
    pub async fn put_value(
        self: &Rc<Self>,
        key: &[u8],
        value: &[u8],
        value_crc: u32,
        mut options: PutOptions,
        links: Links<'_>,
    ) -> Result<(), EngineError> {
        let mut reservation = self.admit_put(key, value.len() as u32, &mut options).await?;
        reservation.bytes_mut(0, key.len()).copy_from_slice(key);
        reservation.bytes_mut(key.len(), value.len()).copy_from_slice(value);
        match self.commit_put(key, reservation, value.len() as u32, value_crc, options, links).await? {
            Some(point) => self.sync(point).await,
            None => Ok(()),
        }
    }

    /// Refuses a pinned put (QUOTA) that would take the node's pinned bytes, or its tenant's, past their
    /// limits; the bytes of the version it replaces, if pinned, are given back first.
    fn check_pin_room(
        &self,
        index: &Index,
        existing: Option<u32>,
        key: &[u8],
        new_bytes: u64,
    ) -> Result<(), EngineError> {
        let pins = self.pins.borrow();
        let released = existing.map_or(0, |id| {
            let entry = index.get(id);
            if is_pinned(entry) { object_bytes(entry) } else { 0 }
        });
        if pins.bytes - released.min(pins.bytes) + new_bytes > pins.limit {
            return Err(EngineError::Quota("pinned"));
        }
        let (usage, quotas) = self.usage_of(key);
        if quotas.pinned.is_some_and(|quota| usage.pinned - released.min(usage.pinned) + new_bytes > quota) {
            return Err(EngineError::Quota("tenant's pinned"));
        }
        Ok(())
    }

    /// Indexes `fresh` (its bytes in DRAM slot `fresh.dram`), replacing the `existing` version of `key` if
    /// any: the old version's DRAM copy is retired, its record forgotten, its pins and usage given back.
    /// Returns the entry's id.
    fn install_version(&self, index: &mut Index, existing: Option<u32>, key: &[u8], fresh: Entry) -> u32 {
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
                // The links belong to the version: an upsert names what it names, nothing else (and with no
                // record yet, no FLAG_RECORD_LINKED). Links and the cluster version are set by the caller,
                // which drops the old ones' book entries by their flags.
                *entry = Entry {
                    version: entry.version.wrapping_add(1),
                    last_hit: entry.last_hit,
                    flags: fresh.flags | (old.flags & (FLAG_LINKED | FLAG_VERSIONED)),
                    ..fresh
                };
                id
            }
            None => index.insert(fresh),
        };
        dram.publish(fresh.dram, id);
        id
    }

    /// Gives entry `id` the links of its new version, and moves the hard pin of its group with it.
    fn relink(&self, index: &mut Index, id: u32, object_links: ObjectLinks, old_hard_pin: bool, pin_flags: u16) {
        let was_linked = index.get(id).flags & FLAG_LINKED != 0;
        let old_group =
            if was_linked { self.links.book.borrow().of(id).map_or(NO_LINK, |links| links.group) } else { NO_LINK };
        if old_hard_pin && old_group != NO_LINK {
            self.hard_pin_group(old_group, false);
        }
        if pin_flags & FLAG_PINNED != 0 && object_links.group != NO_LINK {
            self.hard_pin_group(object_links.group, true);
        }
        if was_linked || !object_links.is_none() {
            self.links.book.borrow_mut().link(id, object_links);
            let entry = index.get_mut(id);
            entry.flags = if object_links.is_none() { entry.flags & !FLAG_LINKED } else { entry.flags | FLAG_LINKED };
            self.publish_links();
        }
    }

    /// Counts a pinned put's bytes against the pin limits, and sets (or clears) its soft pin's expiry.
    fn record_pin(&self, key: &[u8], hash: u64, new_bytes: u64, pin: Pin) {
        self.account(key, Use::Pinned, new_bytes, true);
        let mut pins = self.pins.borrow_mut();
        pins.bytes += new_bytes;
        set(&self.metrics.pinned_bytes, pins.bytes);
        if let Pin::Soft { ttl_seconds } = pin {
            let ttl =
                if ttl_seconds == 0 { self.config.soft_pin_ttl } else { Duration::from_secs(u64::from(ttl_seconds)) };
            pins.soft_expiry.insert(hash, self.now_tick().saturating_add(Self::ticks(ttl)));
        } else {
            pins.soft_expiry.remove(&hash);
        }
    }

    /// Writes what the policy asks of a committed put: nothing (write-back), its record (write-through,
    /// acknowledged whatever happens to it; durable, acknowledged once synced), or a tombstone for the
    /// version it superseded on the tier when no newer record of its own is written.
    async fn write_per_policy(
        self: &Rc<Self>,
        policy: WritePolicy,
        superseded_record: Option<u32>,
        key: &[u8],
        id: u32,
        hash: u64,
        version: u32,
    ) -> Result<Option<DurablePoint>, EngineError> {
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
}

#[cfg(test)]
mod tests {
    use strata_proto::{Pin, Status, WritePolicy};

    use crate::sim::testing::{TestTier, put, read, value};

    #[test]
    fn a_poisoned_tier_takes_no_puts_or_removals_and_what_was_acknowledged_holds() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            put(&shard, b"k", &value(1, 100), WritePolicy::Durable, Pin::None).await.expect("put");
            let injected = strata_nvme::BlockErrorKind::Injected;
            shard.poison("a test", &strata_nvme::BlockError::new(strata_nvme::BlockOp::Write, "test", 0, injected));
            // Before: the upsert failed on its tombstone yet stayed in DRAM, and the removal of that
            // DRAM-only version was acknowledged without a tombstone; a crash then brought v1 back.
            assert_eq!(put(&shard, b"k", &value(2, 100), WritePolicy::WriteBack, Pin::None).await, Err(Status::Io));
            assert_eq!(put(&shard, b"new", &value(3, 100), WritePolicy::WriteBack, Pin::None).await, Err(Status::Io));
            assert_eq!(shard.remove(b"k").await.map_err(|error| error.status()), Err(Status::Io));
            assert_eq!(read(&shard, b"k").await, Ok(value(1, 100)), "reads go on");
        });
        tier.crash();
        tier.life(async |shard, _| {
            assert_eq!(read(&shard, b"k").await, Ok(value(1, 100)), "the newest acknowledged version");
            assert_eq!(read(&shard, b"new").await, Err(Status::NotFound));
        });
    }

    #[test]
    fn a_durable_put_survives_a_crash_and_a_write_back_upsert_is_lost_whole() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            put(&shard, b"durable", &value(1, 5000), WritePolicy::Durable, Pin::None).await.expect("put");
            put(&shard, b"upserted", &value(2, 5000), WritePolicy::Durable, Pin::None).await.expect("put");
            // Acknowledged once the old version's tombstone is durable: after a crash, v3 or nothing.
            put(&shard, b"upserted", &value(3, 5000), WritePolicy::WriteBack, Pin::None).await.expect("upsert");
        });
        tier.crash();
        tier.life(async |shard, _| {
            assert_eq!(read(&shard, b"durable").await, Ok(value(1, 5000)));
            assert_eq!(read(&shard, b"upserted").await, Err(Status::NotFound), "never the superseded version");
        });
    }
}
