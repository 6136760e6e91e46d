//! Reads: gets from DRAM or the NVMe tier with their checks and promotion, and existence tests.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use strata_proto::{RemovalReason, Tier, VERSION_BYTES, Version};

use super::eviction::{PROMOTION_CLOCK_STEPS, Sweep};
use super::usage::Use;
use super::{Shard, object_bytes};
use crate::backend::Backend;
use crate::dram::DramTier;
use crate::error::EngineError;
use crate::index::{
    Entry, FLAG_DIRTY, FLAG_RECORD_LINKED, FLAG_RECORD_VERSIONED, FLAG_REFERENCED, NONE_U32, NONE_U64, index_hash,
};
use crate::log::{RegionState, Staged, read_range, split_location};
use crate::metrics::add;
use crate::record::{RECORD_HEADER_BYTES, RECORD_LINKS_BYTES, RecordHeader};
use crate::segment::SegmentRange;

/// Bytes a read returns.
pub enum ReadData {
    /// From the DRAM segment, pinned until dropped.
    Dram(DramPin),
    /// Read from the NVMe tier (or copied from the open region): the record, and where the bytes returned
    /// are in it.
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
    /// The version the object was upserted with, if any.
    pub version: Option<Version>,
}

impl ReadHit {
    /// The bytes, as slices in order.
    pub fn slices(&self) -> Vec<&[u8]> {
        match &self.data {
            ReadData::Dram(pin) => vec![pin.bytes()],
            ReadData::Staged(staged, offset, len) => staged.slices(*offset, *len),
            ReadData::Owned(bytes) => vec![&bytes[..]],
        }
    }

    /// Whether the bytes still hash to `data_crc`, the crc they were stored (or read and checked) with. A
    /// shared get whose checked copy differed asks, to tell the client's memory changing under the copy
    /// (these bytes intact) from damage to the node's own.
    pub fn bytes_match_crc(&self) -> bool {
        self.slices().iter().fold(0, |crc, part| strata_proto::crc32c_append(crc, part)) == self.data_crc
    }

    /// The DRAM slot the bytes are pinned in, for a hit from DRAM.
    pub fn dram_slot(&self) -> Option<u32> {
        match &self.data {
            ReadData::Dram(pin) => Some(pin.slot),
            ReadData::Staged(..) | ReadData::Owned(_) => None,
        }
    }

    /// Bytes returned.
    pub fn len(&self) -> usize {
        match &self.data {
            ReadData::Dram(pin) => pin.bytes.len(),
            ReadData::Staged(_, _, len) => *len,
            ReadData::Owned(bytes) => bytes.len(),
        }
    }
}

/// Keeps bytes of a DRAM slot in place while a reader sends them: the slot is not freed or reused until
/// the pin drops, and a pinned range is never written.
pub struct DramPin {
    dram: Rc<RefCell<DramTier>>,
    slot: u32,
    bytes: SegmentRange,
}

impl DramPin {
    /// Pins `slot` of `dram` and holds `bytes`, a range of its object.
    pub(super) fn new(dram: &Rc<RefCell<DramTier>>, slot: u32, bytes: SegmentRange) -> Self {
        dram.borrow_mut().pin(slot);
        Self { dram: Rc::clone(dram), slot, bytes }
    }

    /// The pinned bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `self.dram` owns the segment, so it stays mapped while `self` lives; the slot is pinned, so
        // its range is not freed or reused; a published object is never written, and a progressive put's
        // pin covers only what arrived, which its reservation no longer hands out.
        #[allow(unsafe_code)]
        unsafe {
            self.bytes.as_slice()
        }
    }
}

impl Drop for DramPin {
    fn drop(&mut self) {
        self.dram.borrow_mut().unpin(self.slot);
    }
}

/// Where the value of entry's NVMe record starts: after the header, the key, (linked records) the links
/// and (versioned records) the version.
pub(super) fn record_value_offset(entry: &Entry) -> usize {
    let links = if entry.flags & FLAG_RECORD_LINKED != 0 { RECORD_LINKS_BYTES } else { 0 };
    let version = if entry.flags & FLAG_RECORD_VERSIONED != 0 { VERSION_BYTES } else { 0 };
    RECORD_HEADER_BYTES + usize::from(entry.key_len) + links + version
}

impl<E: Backend> Shard<E> {
    /// Reads `key`'s value, or `range` (offset, length) of it. A key neither stored nor being put
    /// progressively is waited for up to `wait` (zero: answered NOT_FOUND at once).
    pub async fn get(
        self: &Rc<Self>,
        key: &[u8],
        range: Option<(u32, u32)>,
        wait: Duration,
    ) -> Result<ReadHit, EngineError> {
        let hash = index_hash(key);
        let mut waited_for_fill = false;
        let mut waited_for_arrival = wait.is_zero();
        // Bounded: a wait for the key, a wait for its progressive put, and a retry for a record that moved
        // while it was read, each at most once or twice.
        for _attempt in 0..4 {
            let now = self.now_tick();
            let on_tier = match self.look_up(key, hash, range, now)? {
                Lookup::InDram(hit) => return Ok(hit),
                Lookup::OnTier(on_tier) => on_tier,
                Lookup::Absent => {
                    // Not stored: a progressive put of the key may be under way.
                    let fill = self.arrivals.filling.borrow().get(key).cloned();
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
                            return Err(EngineError::NotFound);
                        }
                        _ => return Err(EngineError::NotFound),
                    }
                }
            };
            match self.read_record(on_tier.id, on_tier.entry, key).await? {
                Some(staged) => return Ok(self.tier_hit(key, on_tier, staged, range.is_some(), now).await),
                None => continue,
            }
        }
        Err(EngineError::NotFound)
    }

    /// Answers a read of `key` (index hash `hash`) that needs no device read and no waiting: a DRAM hit,
    /// a miss (no progressive put of it under way), a bad range; `None` for a read that must await (its
    /// record is on the tier, or its bytes are still arriving).
    pub fn get_now(
        self: &Rc<Self>,
        key: &[u8],
        hash: u64,
        range: Option<(u32, u32)>,
    ) -> Option<Result<ReadHit, EngineError>> {
        match self.look_up(key, hash, range, self.now_tick()) {
            Ok(Lookup::InDram(hit)) => Some(Ok(hit)),
            Ok(Lookup::Absent) if !self.arrivals.filling.borrow().contains_key(key) => Some(Err(EngineError::NotFound)),
            Ok(_) => None,
            Err(error) => Some(Err(error)),
        }
    }

    /// Finds `key` in the index: a DRAM hit is pinned and returned whole; an object only on the tier says
    /// where; a range past the value is INVALID.
    fn look_up(
        self: &Rc<Self>,
        key: &[u8],
        hash: u64,
        range: Option<(u32, u32)>,
        now: u32,
    ) -> Result<Lookup, EngineError> {
        let mut index = self.index.borrow_mut();
        let Some(id) = index.find(hash) else { return Ok(Lookup::Absent) };
        let entry = *index.get(id);
        if self.is_stale(&entry) {
            self.drop_stale(&mut index, id, key);
            return Ok(Lookup::Absent);
        }
        let (offset, len) = match range {
            None => (0, entry.value_len),
            Some((offset, len)) if u64::from(offset) + u64::from(len) > u64::from(entry.value_len) => {
                return Err(EngineError::Invalid("a range past the value"));
            }
            Some(range) => range,
        };
        if entry.dram == NONE_U32 {
            if entry.nvme == NONE_U64 {
                return Err(EngineError::NotFound);
            }
            let version = self.version_of(&entry);
            return Ok(Lookup::OnTier(OnTier { id, entry, offset, len, version }));
        }
        let data = {
            let dram = self.dram.borrow();
            if dram.bytes(entry.dram, 0, key.len()) != key {
                return Err(EngineError::NotFound);
            }
            dram.range(entry.dram, key.len() + offset as usize, len as usize)
        };
        let pin = DramPin::new(&self.dram, entry.dram, data);
        let entry_mut = index.get_mut(id);
        entry_mut.flags |= FLAG_REFERENCED;
        entry_mut.last_hit = now;
        add(&self.metrics.dram_hits, 1);
        let data_crc = if range.is_none() { entry.value_crc } else { strata_proto::crc32c(pin.bytes()) };
        add(&self.metrics.bytes_out, u64::from(len));
        let version = self.version_of(&entry);
        Ok(Lookup::InDram(ReadHit { data: ReadData::Dram(pin), data_crc, object_len: entry.value_len, version }))
    }

    /// The hit of a record read from the tier (`staged`, checked), promoted into DRAM when it was hit
    /// within the promote window before.
    async fn tier_hit(self: &Rc<Self>, key: &[u8], on_tier: OnTier, staged: Staged, ranged: bool, now: u32) -> ReadHit {
        let OnTier { id, entry, offset, len, version } = on_tier;
        let value_at = record_value_offset(&entry);
        let data_crc = if ranged { staged.crc(value_at + offset as usize, len as usize) } else { entry.value_crc };
        add(&self.metrics.nvme_hits, 1);
        add(&self.metrics.bytes_out, u64::from(len));
        let promote = {
            let mut index = self.index.borrow_mut();
            let entry_mut = index.get_mut(id);
            let window = Self::ticks(self.config.promote_window);
            let hot = window > 0 && entry_mut.last_hit != 0 && now.saturating_sub(entry_mut.last_hit) <= window;
            entry_mut.last_hit = now;
            hot
        };
        if promote {
            self.promote(id, entry, key, &staged).await;
        }
        ReadHit {
            data: ReadData::Staged(staged, value_at + offset as usize, len as usize),
            data_crc,
            object_len: entry.value_len,
            version,
        }
    }

    /// Reads and checks the NVMe record of `entry`. `Ok(None)`: the record moved while it was read (retry).
    pub(super) async fn read_record(
        self: &Rc<Self>,
        id: u32,
        entry: Entry,
        key: &[u8],
    ) -> Result<Option<Staged>, EngineError> {
        let (region_id, offset) = split_location(entry.nvme);
        let record_len = record_value_offset(&entry) + entry.value_len as usize;
        let (state, seq, wait, device, device_offset, chunk_bytes) = {
            let guard = self.log.borrow();
            let Some(log) = guard.as_ref() else { return Err(EngineError::NotFound) };
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
        let read = {
            // Bounded by the shard's queue depth: a batch's reads go to the device together, up to it.
            let _slot = self.read_slots.acquire_static_permit(1).await.map_err(|_| EngineError::ShuttingDown)?;
            let in_flight = self.config.nvme_queue_depth as u64 - self.read_slots.available();
            self.metrics.nvme_reads_in_flight_peak.fetch_max(in_flight, std::sync::atomic::Ordering::Relaxed);
            read_range(&self.devices, device, device_offset, offset as usize, record_len, chunk_bytes).await
        };
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
                self.note_fence(&error);
                Err(EngineError::device(error))
            }
        }
    }

    /// Checks a record against the key asked for and the entry; a damaged record is dropped from the index
    /// (never served) and reported as `Checksum`.
    pub(super) fn check_record(
        &self,
        id: u32,
        entry: Entry,
        key: &[u8],
        staged: Staged,
    ) -> Result<Staged, EngineError> {
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
            return Err(EngineError::NotFound);
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
        let (region, offset) = split_location(entry.nvme);
        Err(EngineError::Checksum { region, offset })
    }

    /// Drops `key`'s DRAM copy in `slot`, found damaged (its bytes no longer hash to the crc stored with
    /// them, as a shared get's checked copy showed), as a damaged record is: the object is served from its
    /// tier record from now on, or, with none current (not on the tier, or newer in DRAM than there),
    /// forgotten. A miss, never the damaged bytes again. Nothing happens if `slot` no longer holds `key`.
    pub fn drop_damaged_dram(&self, key: &[u8], slot: u32) {
        let mut index = self.index.borrow_mut();
        let mut dram = self.dram.borrow_mut();
        let id = dram.entry_of(slot);
        if id == NONE_U32 {
            return;
        }
        let entry = *index.get(id);
        if entry.dram != slot || entry.hash != index_hash(key) {
            return;
        }
        add(&self.metrics.checksum_failures, 1);
        tracing::error!(shard = self.id, "a DRAM object failed its checksum; dropped");
        dram.retire(slot);
        drop(dram);
        self.account(key, Use::Dram, object_bytes(&entry), false);
        index.get_mut(id).dram = NONE_U32;
        if entry.nvme == NONE_U64 || entry.flags & FLAG_DIRTY != 0 {
            self.forget(&mut index, id, Some(key));
            self.events.borrow_mut().removed(key, RemovalReason::Checksum);
        } else {
            self.events.borrow_mut().tier_changed(key, Tier::Dram, Tier::Nvme);
        }
        drop(index);
        self.update_gauges();
    }

    /// Flips bits of byte `at` of `key`'s value in DRAM (tests of what damage there does).
    #[cfg(test)]
    pub(crate) fn corrupt_dram(&self, key: &[u8], at: usize, bits: u8) {
        let index = self.index.borrow();
        let entry = *index.get(index.find(index_hash(key)).expect("stored"));
        self.dram.borrow_mut().corrupt(entry.dram, key.len() + at, bits);
    }

    /// Copies an NVMe hit into DRAM (L2 → L1 promotion) if there is room after a few clock steps, with no
    /// I/O and no wait: the reply is served from the read buffer either way, and never waits behind a
    /// sweep of DRAM (a small DRAM tier full of leased objects made every tier hit sweep it whole). After a
    /// promotion finds no room, none is tried for the rest of the tick: the next hits would find none too.
    pub(super) async fn promote(self: &Rc<Self>, id: u32, entry: Entry, key: &[u8], staged: &Staged) {
        let len = key.len() as u64 + u64::from(entry.value_len);
        let now = self.now_tick();
        if now < self.promotions_paused_until.get() {
            add(&self.metrics.promotions_skipped, 1);
            return;
        }
        let sweep = Sweep { only_tenant: None, max_steps: Some(PROMOTION_CLOCK_STEPS), write_dirty: false };
        self.make_dram_room_within(len, false, sweep).await;
        let mut index = self.index.borrow_mut();
        let mut dram = self.dram.borrow_mut();
        let current = *index.get(id);
        if current.hash != entry.hash || current.version != entry.version || current.dram != NONE_U32 {
            return;
        }
        let copied = dram.allocate_with(len, |bytes| {
            bytes[..key.len()].copy_from_slice(key);
            let mut at = key.len();
            for part in staged.slices(record_value_offset(&entry), entry.value_len as usize) {
                bytes[at..at + part.len()].copy_from_slice(part);
                at += part.len();
            }
        });
        let Ok(slot) = copied else {
            self.promotions_paused_until.set(now + 1);
            add(&self.metrics.promotions_skipped, 1);
            return;
        };
        dram.publish(slot, id);
        index.get_mut(id).dram = slot;
        self.account(key, Use::Dram, len, true);
        add(&self.metrics.promotions, 1);
        self.events.borrow_mut().tier_changed(key, Tier::Nvme, Tier::Dram);
    }

    /// Whether the index places `key`'s stored version on the NVMe tier (the simulation's view of what a
    /// crash should leave).
    pub(crate) fn has_tier_copy(&self, key: &[u8]) -> bool {
        let index = self.index.borrow();
        index.find(index_hash(key)).is_some_and(|id| index.get(id).nvme != NONE_U64)
    }

    /// Whether `key`'s stored version has a copy in DRAM.
    #[cfg(test)]
    pub(crate) fn in_dram(&self, key: &[u8]) -> bool {
        let index = self.index.borrow();
        index.find(index_hash(key)).is_some_and(|id| index.get(id).dram != NONE_U32)
    }

    /// Where `key`'s value starts on its namespace, if its stored version has a record (tests that damage
    /// it).
    #[cfg(test)]
    pub(crate) fn value_on_device(&self, key: &[u8]) -> Option<u64> {
        let index = self.index.borrow();
        let entry = *index.get(index.find(index_hash(key))?);
        if entry.nvme == NONE_U64 {
            return None;
        }
        let (region, offset) = split_location(entry.nvme);
        let log = self.log.borrow();
        let region = &log.as_ref()?.regions[region as usize];
        Some(region.device_offset + u64::from(offset) + record_value_offset(&entry) as u64)
    }

    /// Whether `key` is stored, and the length of its value: from the index alone (the 64-bit hash), for
    /// DRAM and NVMe objects alike, so that a scheduler's batch of lookups touches no object memory. A hash
    /// collision (see `index.rs`) can make this say yes for a key a get then misses; never the reverse.
    pub fn exists(&self, key: &[u8]) -> Result<u32, EngineError> {
        self.exists_hashed(index_hash(key), false)
    }

    /// [`Shard::exists`], and a read lease on the object (its last hit is now): a prefix match's blocks
    /// are not evicted before the engine that asked loads them (`read_lease`, 5 s by default).
    pub fn exists_leased(&self, key: &[u8]) -> Result<u32, EngineError> {
        self.exists_hashed(index_hash(key), true)
    }

    /// Where `key` is stored: its value's length and the tiers that hold it (`LOCATED_IN_DRAM`,
    /// `LOCATED_ON_NVME`), from the index alone (the 64-bit hash, as [`Shard::exists`]).
    pub fn locate(&self, key: &[u8]) -> Result<(u32, u32), EngineError> {
        let index = self.index.borrow();
        let Some(id) = index.find(index_hash(key)).filter(|&id| !self.is_stale(index.get(id))) else {
            return Err(EngineError::NotFound);
        };
        let entry = index.get(id);
        let mut tiers = 0;
        if entry.dram != NONE_U32 {
            tiers |= strata_proto::LOCATED_IN_DRAM;
        }
        if entry.nvme != NONE_U64 {
            tiers |= strata_proto::LOCATED_ON_NVME;
        }
        Ok((entry.value_len, tiers))
    }

    /// [`Shard::exists`] (with a read lease if `lease`) of the key whose index hash is `hash`: for a batch
    /// that hashed its keys already, to prefetch their lines. A stale upsert is not there.
    pub fn exists_hashed(&self, hash: u64, lease: bool) -> Result<u32, EngineError> {
        let mut index = self.index.borrow_mut();
        let Some(id) = index.find(hash).filter(|&id| !self.is_stale(index.get(id))) else {
            return Err(EngineError::NotFound);
        };
        let entry = index.get_mut(id);
        if lease {
            entry.last_hit = self.now_tick();
        }
        Ok(entry.value_len)
    }
}

/// Where the index says a key is.
enum Lookup {
    /// In DRAM: the hit, pinned.
    InDram(ReadHit),
    /// Only on the NVMe tier.
    OnTier(OnTier),
    /// Not stored.
    Absent,
}

/// An object to read from the NVMe tier: its entry as the index had it, and the range of its value wanted.
#[derive(Clone, Copy)]
struct OnTier {
    id: u32,
    entry: Entry,
    offset: u32,
    len: u32,
    /// The object's version when it was looked up (what the bytes read are a version of).
    version: Option<Version>,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use strata_proto::{Pin, Status, WritePolicy};

    use crate::sim::testing::{TestTier, put, read, value};

    #[test]
    fn a_damaged_record_is_dropped_never_served() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            put(&shard, b"k", &value(1, 8000), WritePolicy::Durable, Pin::None).await.expect("put");
            for index in 0..30u8 {
                put(&shard, &[b'f', index], &value(index, 64 << 10), WritePolicy::WriteThrough, Pin::None)
                    .await
                    .expect("put");
            }
            assert!(!shard.in_dram(b"k"), "only on the tier now");
            let at = shard.value_on_device(b"k").expect("a record");
            tier.world.disks[0].corrupt(at + 4000, 0x10);
            assert_eq!(read(&shard, b"k").await, Err(Status::Checksum));
            assert_eq!(read(&shard, b"k").await, Err(Status::NotFound), "dropped from the index");
        });
    }

    #[test]
    fn a_damaged_dram_copy_is_dropped_the_tier_record_served_and_an_only_copy_forgotten() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            let (on_tier, only_in_dram) = (value(3, 9000), value(4, 9000));
            put(&shard, b"both", &on_tier, WritePolicy::WriteThrough, Pin::None).await.expect("put");
            put(&shard, b"dram", &only_in_dram, WritePolicy::WriteBack, Pin::None).await.expect("put");
            for key in [&b"both"[..], b"dram"] {
                let hit = shard.get(key, None, Duration::ZERO).await.expect("a hit");
                assert!(hit.bytes_match_crc(), "intact before the damage");
                drop(hit);
                shard.corrupt_dram(key, 5000, 0x04);
                let hit = shard.get(key, None, Duration::ZERO).await.expect("a hit");
                assert!(!hit.bytes_match_crc(), "the damage shows");
                let slot = hit.dram_slot().expect("from DRAM");
                // Another key's name does not drop it.
                shard.drop_damaged_dram(b"other", slot);
                assert!(shard.in_dram(key));
                shard.drop_damaged_dram(key, slot);
                assert!(!shard.in_dram(key), "its DRAM copy is gone");
                // The pinned bytes stay valid for the reader holding them, freed when it lets go.
                assert_eq!(hit.len(), 9000);
                drop(hit);
            }
            assert_eq!(read(&shard, b"both").await, Ok(on_tier), "served from its tier record");
            assert_eq!(read(&shard, b"dram").await, Err(Status::NotFound), "its only copy was damaged");
            assert_eq!(shard.metrics.checksum_failures.load(std::sync::atomic::Ordering::Relaxed), 2);
        });
    }

    #[test]
    fn a_range_is_read_from_dram_or_the_tier_with_its_own_crc() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            let bytes = value(9, 20_000);
            put(&shard, b"k", &bytes, WritePolicy::WriteThrough, Pin::None).await.expect("put");
            for on_tier in [false, true] {
                assert_eq!(shard.in_dram(b"k"), !on_tier);
                let hit = shard.get(b"k", Some((1000, 5000)), Duration::ZERO).await.expect("range");
                let read: Vec<u8> = hit.slices().concat();
                assert_eq!(read, bytes[1000..6000], "on the tier: {on_tier}");
                assert_eq!(hit.data_crc, strata_proto::crc32c(&read));
                assert_eq!(hit.object_len, 20_000);
                // A reader's pin holds the bytes in place: let go before making DRAM evict.
                drop(hit);
                for index in 0..30u8 {
                    put(&shard, &[b'f', index], &value(index, 64 << 10), WritePolicy::WriteThrough, Pin::None)
                        .await
                        .expect("put");
                }
            }
            assert_eq!(
                shard.get(b"k", Some((19_000, 2000)), Duration::ZERO).await.err().map(|error| error.status()),
                Some(Status::Invalid)
            );
        });
    }
}
