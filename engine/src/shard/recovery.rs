//! Start-up recovery: the shard's index rebuilt from its regions, in log order (regions by generation,
//! records by offset), a later record of a key replacing an earlier one and a tombstone removing it.
//!
//! Damage never brings back what was replaced or removed. A damaged record whose fixed header is intact
//! names its key: that key is dropped, since the lost record may have been its newest version or its
//! tombstone. Bytes that name no key (a damaged fixed header, an unreadable or damaged region) may have
//! held a newer record of any key recovered so far: all of those are dropped. Records after the damage
//! are still recovered. The argument, and why the end of an unfinished write is not damage, is in
//! `docs/NVME_FORMAT.md`.

use std::collections::HashMap;
use std::rc::Rc;

use strata_nvme::{BlockDevice, BlockError};

use super::{Shard, Use, is_pinned, object_bytes};
use crate::backend::Backend;
use crate::index::{
    Entry, FLAG_LINKED, FLAG_PINNED, FLAG_RECORD_LINKED, FLAG_RECORD_VERSIONED, Index, NONE_U32, index_hash,
};
use crate::links::ObjectLinks;
use crate::log::{RegionLog, RegionState, Staged, location, read_range};
use crate::metrics::{add, set};
use crate::record::{
    END_MARK_BYTES, RECORD_HEADER_BYTES, RECORD_PINNED, RECORD_REPLICAS_MASK, RECORD_TOMBSTONE, REGION_HEADER_BYTES,
    RecordHeader, RegionHeader,
};
use crate::scan::{Scanned, scan_region};
use crate::tenants::tenant_of;

/// What start-up recovery found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Regions with this shard's data.
    pub regions: usize,
    /// Objects restored (what the shard serves after recovery).
    pub records: u64,
    /// Records lost to damage: damaged records, and spans of bytes that name no key (each held at least
    /// one record).
    pub lost_records: u64,
    /// Bytes of those records and spans.
    pub lost_bytes: u64,
    /// Regions whose header is damaged, or that could not be read.
    pub lost_regions: u64,
    /// Keys dropped because a newer record of theirs may have been among those lost.
    pub dropped_keys: u64,
    /// Regions whose records end where an unfinished write stopped (the node did not stop cleanly).
    pub unfinished_regions: u64,
}

/// Why a shard could not recover its tier: a write recovery must make failed.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    /// Sealing a region where an unfinished write stopped failed.
    #[error("sealing region {region} where an unfinished write stopped: {source}")]
    Seal {
        /// The region (the shard's numbering).
        region: u32,
        /// The device's error.
        #[source]
        source: BlockError,
    },
    /// A region's records end too close to its end to seal it (a format no build writes).
    #[error("no room to seal region {region} at byte {at}")]
    NoRoomToSeal {
        /// The region.
        region: u32,
        /// Where its records end.
        at: usize,
    },
    /// Emptying the shard's regions, after a loss that dropped every key, failed.
    #[error("emptying region {region} after a loss: {source}")]
    Retire {
        /// The region.
        region: u32,
        /// The device's error.
        #[source]
        source: BlockError,
    },
    /// No region was free to open, and reclaiming one failed.
    #[error("reclaiming a region to open one: {0}")]
    Reclaim(crate::error::EngineError),
}

/// Times recovery reads a region before it counts it lost.
const READ_ATTEMPTS: u32 = 3;

/// What a region slot's header says.
enum Slot {
    /// Never written, reclaimed, or another format's.
    Free,
    /// Generation `seq` of this shard.
    Live(u64),
    /// Damaged, or unreadable.
    Lost,
}

/// Where the shard's regions are and how they are cut.
struct Geometry {
    regions: Vec<(usize, u64)>,
    block_bytes: usize,
    region_bytes: usize,
    chunk_bytes: usize,
    format_id: u64,
}

impl<E: Backend> Shard<E> {
    /// Rebuilds the index from this shard's regions (see the module doc), repairs the end of an unfinished
    /// write, and reopens the log. When it must drop every key (it cannot name what it lost), it also empties
    /// the shard's regions on the device.
    pub async fn recover(self: &Rc<Self>) -> Result<RecoveryReport, RecoveryError> {
        let Some(geometry) = self.log_geometry() else { return Ok(RecoveryReport::default()) };
        let mut report = RecoveryReport::default();
        let (mut live, mut lost) = (Vec::new(), 0u64);
        for id in 0..geometry.regions.len() as u32 {
            match self.read_slot(&geometry, id).await {
                Slot::Free => {}
                Slot::Live(seq) => live.push((seq, id)),
                Slot::Lost => lost += 1,
            }
        }
        live.sort_unstable();
        report.regions = live.len();
        // The regions a crash may have caught mid-write: the open one and those being sealed.
        let newest = live.last().map_or(0, |&(seq, _)| seq);
        let in_flight_from = newest.saturating_sub(self.config.region_buffers as u64 - 1);
        let mut replay = Replay { shard: self, tenants: HashMap::new(), hasher_changed: false, named_losses: 0 };
        let mut readable = Vec::with_capacity(live.len());
        for &(seq, id) in &live {
            let in_flight = seq >= in_flight_from;
            match self.replay_region(&geometry, id, seq, in_flight, &mut replay, &mut report).await? {
                true => readable.push((seq, id)),
                false => lost += 1,
            }
        }
        report.lost_regions = lost;
        // A lost region's generation is unknown: it may have held a newer record of any key. And were the
        // index hash not the one the records were written with, a damaged record's key hash names nothing.
        // Either way every key is dropped, and the shard's regions are emptied on the device: were they
        // replayed at the next start (a region readable again), what was dropped would come back over what
        // was written since.
        if report.lost_regions > 0 || (replay.hasher_changed && replay.named_losses > 0) {
            report.dropped_keys += replay.drop_all();
            self.retire_regions(&geometry, 0..geometry.regions.len() as u32).await?;
            readable.clear();
        }
        report.records = self.index.borrow().len() as u64;
        self.reopen_log(&readable).await?;
        self.count_recovery(&report);
        if report.lost_records + report.lost_regions > 0 {
            tracing::warn!(
                shard = self.id,
                lost_records = report.lost_records,
                lost_bytes = report.lost_bytes,
                lost_regions = report.lost_regions,
                dropped_keys = report.dropped_keys,
                "recovery found damage"
            );
        }
        Ok(report)
    }

    /// Replays region `id` (generation `seq`; `in_flight`: among those a crash may have caught mid-write)
    /// into the index, and seals it where an unfinished write stopped. `Ok(false)`: it could not be read.
    async fn replay_region(
        &self,
        geometry: &Geometry,
        id: u32,
        seq: u64,
        in_flight: bool,
        replay: &mut Replay<'_, E>,
        report: &mut RecoveryReport,
    ) -> Result<bool, RecoveryError> {
        let staged = match self.read_region(geometry, id, geometry.region_bytes).await {
            Ok(staged) => staged,
            Err(error) => {
                tracing::error!(shard = self.id, region = id, %error, "region unreadable at recovery");
                return Ok(false);
            }
        };
        let (mut unfinished_at, mut sealed, mut tail_lost, mut end) = (None, false, false, REGION_HEADER_BYTES);
        for item in scan_region(&staged, seq, geometry.format_id) {
            end = item_end(&item);
            match item {
                Scanned::Record { at, header, covered } => replay.apply(id, at, header, &covered),
                Scanned::Seal { .. } => sealed = true,
                Scanned::Damaged { header, .. } => {
                    report.lost_records += 1;
                    report.lost_bytes += header.record_len() as u64;
                    report.dropped_keys += replay.drop_key(header.key_hash);
                }
                Scanned::Lost { from, trailing: true, .. } if in_flight => unfinished_at = Some(from),
                Scanned::Lost { from, to, trailing } => {
                    tail_lost |= trailing;
                    report.lost_records += 1;
                    report.lost_bytes += (to - from) as u64;
                    report.dropped_keys += replay.drop_all();
                }
            }
        }
        if sealed || tail_lost {
            return Ok(true);
        }
        if !in_flight && unfinished_at.is_none() {
            // Written whole before the newest regions, yet its seal is gone: its tail was lost.
            report.lost_records += 1;
            report.dropped_keys += replay.drop_all();
            return Ok(true);
        }
        report.unfinished_regions += 1;
        self.write_seal(geometry, id, seq, &staged, unfinished_at.unwrap_or(end)).await?;
        Ok(true)
    }

    /// Zeroes, durably, the headers of `regions`: they hold nothing from now on.
    async fn retire_regions(
        &self,
        geometry: &Geometry,
        regions: impl Iterator<Item = u32>,
    ) -> Result<(), RecoveryError> {
        for region in regions {
            let (device, device_offset) = geometry.regions[region as usize];
            let device_handle = &self.devices[device];
            let mut zero = device_handle.alloc_buffer(geometry.block_bytes);
            zero.as_mut_slice().fill(0);
            let zeroed = match device_handle.write(zero, device_offset).await.1 {
                Ok(()) => device_handle.flush().await,
                Err(error) => Err(error),
            };
            zeroed.map_err(|source| RecoveryError::Retire { region, source })?;
        }
        Ok(())
    }

    /// Reads the first `len` bytes of region `id`, trying again after a failure: a region recovery cannot
    /// read costs the shard every key (see [`Shard::recover`]).
    async fn read_region(&self, geometry: &Geometry, id: u32, len: usize) -> Result<Staged, BlockError> {
        let (device, device_offset) = geometry.regions[id as usize];
        let mut attempt = 0;
        loop {
            match read_range(&self.devices, device, device_offset, 0, len, geometry.chunk_bytes).await {
                Err(error) if attempt < READ_ATTEMPTS - 1 => {
                    tracing::warn!(shard = self.id, region = id, %error, "region read failed at recovery; trying again");
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    fn log_geometry(&self) -> Option<Geometry> {
        let log = self.log.borrow();
        let log = log.as_ref()?;
        Some(Geometry {
            regions: log.regions.iter().map(|region| (region.device, region.device_offset)).collect(),
            block_bytes: log.block_bytes,
            region_bytes: log.region_bytes as usize,
            chunk_bytes: log.chunk_bytes,
            format_id: log.format_id,
        })
    }

    /// Reads region `id`'s header. A slot whose header is all zeros is free (formatted, or reclaimed);
    /// one whose header is neither zeros nor intact is damaged.
    async fn read_slot(&self, geometry: &Geometry, id: u32) -> Slot {
        let head = match self.read_region(geometry, id, geometry.block_bytes).await {
            Ok(head) => head.copy(0, REGION_HEADER_BYTES),
            Err(error) => {
                tracing::error!(shard = self.id, region = id, %error, "region header unreadable at recovery");
                return Slot::Lost;
            }
        };
        match RegionHeader::decode(&head) {
            Ok(header) if header.format_id != geometry.format_id => Slot::Free,
            Ok(header) if header.shard == self.id && header.region_id == id => Slot::Live(header.region_seq),
            Ok(_) => Slot::Lost,
            Err(_) if head.iter().all(|&byte| byte == 0) => Slot::Free,
            Err(error) => {
                tracing::error!(shard = self.id, region = id, %error, "region header damaged at recovery");
                Slot::Lost
            }
        }
    }

    /// Seals region `id` at `from`, where an unfinished write stopped: the region then ends there on the
    /// device too, so that a later recovery, when the region is no longer among the newest, does not take
    /// the missing seal for damage.
    async fn write_seal(
        &self,
        geometry: &Geometry,
        id: u32,
        seq: u64,
        staged: &Staged,
        from: usize,
    ) -> Result<(), RecoveryError> {
        let (device, device_offset) = geometry.regions[id as usize];
        let seal_end = from + RECORD_HEADER_BYTES;
        if seal_end > geometry.region_bytes {
            return Err(RecoveryError::NoRoomToSeal { region: id, at: from });
        }
        let first = from / geometry.block_bytes * geometry.block_bytes;
        let end = (seal_end + END_MARK_BYTES).next_multiple_of(geometry.block_bytes).min(geometry.region_bytes);
        let mut bytes = staged.copy(first, end - first);
        bytes[from - first..seal_end - first].copy_from_slice(&RecordHeader::seal(seq).encode(&[], geometry.format_id));
        let mark_end = (seal_end + END_MARK_BYTES).min(end) - first;
        bytes[seal_end - first..mark_end].fill(0);
        crate::log::write_partial(&self.devices, device, device_offset, bytes, first, geometry.chunk_bytes)
            .await
            .map_err(|source| RecoveryError::Seal { region: id, source })
    }

    /// Hands the log its regions back: the live ones sealed in generation order, the others free; opens
    /// the next region (reclaiming the oldest if none is free).
    async fn reopen_log(self: &Rc<Self>, live: &[(u64, u32)]) -> Result<(), RecoveryError> {
        {
            let mut log = self.log.borrow_mut();
            if let Some(log) = log.as_mut() {
                log.free.clear();
                log.sealed.clear();
                for &(seq, id) in live {
                    let region = &mut log.regions[id as usize];
                    region.seq = seq;
                    region.state = RegionState::Sealed;
                    log.sealed.push_back(id);
                }
                for id in 0..log.regions.len() as u32 {
                    if log.regions[id as usize].state == RegionState::Free {
                        log.free.push_back(id);
                    }
                }
                log.next_seq = live.last().map_or(1, |&(seq, _)| seq + 1);
                if !log.free.is_empty() {
                    log.open_next();
                }
            }
        }
        if self.log.borrow().as_ref().is_some_and(|log| log.open.is_none()) {
            self.reclaim_oldest(false).await.map_err(RecoveryError::Reclaim)?;
            self.log.borrow_mut().as_mut().map(RegionLog::open_next);
        }
        Ok(())
    }

    fn count_recovery(&self, report: &RecoveryReport) {
        add(&self.metrics.recovered_records, report.records);
        add(&self.metrics.recovery_lost_records, report.lost_records);
        add(&self.metrics.recovery_lost_bytes, report.lost_bytes);
        add(&self.metrics.recovery_lost_regions, report.lost_regions);
        add(&self.metrics.recovery_dropped_keys, report.dropped_keys);
        self.update_gauges();
    }
}

/// Where the bytes of a scanned item end.
fn item_end(item: &Scanned) -> usize {
    match item {
        Scanned::Record { at, header, .. } | Scanned::Damaged { at, header } => at + header.record_len(),
        Scanned::Seal { at } => at + RECORD_HEADER_BYTES,
        Scanned::Lost { to, .. } => *to,
    }
}

/// The index being rebuilt, record by record.
struct Replay<'a, E: Backend> {
    shard: &'a Shard<E>,
    /// Each recovered object's tenant (a tenanted node only), for the accounting of a dropped one whose
    /// key is not at hand.
    tenants: HashMap<u64, u32>,
    /// An intact record's key hash was not the index hash of its key: this build hashes keys otherwise.
    hasher_changed: bool,
    /// Damaged records dropped by their key hash.
    named_losses: u64,
}

impl<E: Backend> Replay<'_, E> {
    /// Applies an intact record at `at` of region `region`.
    fn apply(&mut self, region: u32, at: usize, header: RecordHeader, covered: &[u8]) {
        let shard = self.shard;
        let key = &covered[..usize::from(header.key_len)];
        let hash = index_hash(key);
        self.hasher_changed |= hash != header.key_hash;
        let mut index = shard.index.borrow_mut();
        let existing = index.find(hash);
        if header.flags & RECORD_TOMBSTONE != 0 {
            if let Some(existing) = existing {
                shard.forget(&mut index, existing, Some(key));
            }
            self.tenants.remove(&hash);
            return;
        }
        let links = header.links(covered);
        let link_flags = if links.is_some() { FLAG_LINKED | FLAG_RECORD_LINKED } else { 0 };
        let cluster_version = header.cluster_version(covered);
        let version_flags = if cluster_version.is_some() { FLAG_RECORD_VERSIONED } else { 0 };
        let entry = Entry {
            hash,
            nvme: location(region, at as u32),
            dram: NONE_U32,
            value_len: header.value_len,
            value_crc: header.value_crc,
            version: header.version,
            last_hit: 0,
            key_len: header.key_len,
            // The replica count sits in the same bits of both.
            flags: link_flags
                | version_flags
                | (header.flags & RECORD_REPLICAS_MASK)
                | if header.flags & RECORD_PINNED != 0 { FLAG_PINNED } else { 0 },
        };
        let id = match existing {
            Some(existing) => {
                let old = *index.get(existing);
                shard.unpin_entry(&old, Some(key));
                shard.drop_version(&old);
                shard.account(key, Use::Nvme, object_bytes(&old), false);
                *index.get_mut(existing) = entry;
                existing
            }
            None => index.insert(entry),
        };
        // A later version names what it names, and has the version it has: the books follow the newest
        // record.
        shard.set_version(&mut index, id, cluster_version, true);
        let object_links = links.map_or(ObjectLinks::default(), |(parent, group)| ObjectLinks { parent, group });
        shard.links.book.borrow_mut().link(id, object_links);
        shard.account(key, Use::Nvme, object_bytes(&entry), true);
        if is_pinned(&entry) {
            // Restored pins count against the limit even past it: they were admitted before.
            shard.account(key, Use::Pinned, object_bytes(&entry), true);
            let mut pins = shard.pins.borrow_mut();
            pins.bytes += object_bytes(&entry);
            set(&shard.metrics.pinned_bytes, pins.bytes);
        }
        if shard.tenants.tenancy.is_tenanted() {
            self.tenants.insert(hash, tenant_of(key, true));
        }
    }

    /// Drops the object whose key hash is `hash`, if recovered so far; returns how many were dropped.
    fn drop_key(&mut self, hash: u64) -> u64 {
        self.named_losses += 1;
        let mut index = self.shard.index.borrow_mut();
        match index.find(hash) {
            Some(id) => {
                self.drop_object(&mut index, id);
                1
            }
            None => 0,
        }
    }

    /// Drops every object recovered so far; returns how many.
    fn drop_all(&mut self) -> u64 {
        let mut index = self.shard.index.borrow_mut();
        let ids: Vec<u32> = index.ids().collect();
        for &id in &ids {
            self.drop_object(&mut index, id);
        }
        ids.len() as u64
    }

    fn drop_object(&mut self, index: &mut Index, id: u32) {
        let shard = self.shard;
        let entry = *index.get(id);
        if let Some(tenant) = self.tenants.remove(&entry.hash) {
            shard.account_tenant(tenant, Use::Nvme, object_bytes(&entry), false);
            if is_pinned(&entry) {
                shard.account_tenant(tenant, Use::Pinned, object_bytes(&entry), false);
            }
        }
        shard.forget(index, id, None);
    }
}

#[cfg(test)]
mod tests {
    use strata_nvme::FaultConfig;
    use strata_proto::{Pin, Status, WritePolicy};

    use crate::sim::testing::{TestTier, put, read, value};

    #[test]
    fn a_region_unreadable_at_one_start_brings_nothing_back_at_the_next() {
        let mut tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            put(&shard, b"k", &value(5, 1000), WritePolicy::Durable, Pin::None).await.expect("put");
            shard.flush_for_shutdown().await;
        });
        // The first region (it holds k's record) cannot be read back at the next start.
        let first = tier.region_range(0);
        tier.set_faults(FaultConfig {
            read_error_ranges: std::iter::once(first.start..first.start + 4096).collect(),
            ..FaultConfig::default()
        });
        tier.life(async |shard, life| {
            assert_eq!(life.reports[0].lost_regions, 1);
            assert_eq!(read(&shard, b"k").await, Err(Status::NotFound));
            put(&shard, b"k", &value(7, 1000), WritePolicy::WriteBack, Pin::None).await.expect("a new version");
        });
        tier.crash();
        // Readable again: before, its records were replayed, and k's version 5 came back over version 7.
        tier.set_faults(FaultConfig::default());
        tier.life(async |shard, _| {
            assert_eq!(read(&shard, b"k").await, Err(Status::NotFound));
        });
    }

    #[test]
    fn a_crash_mid_region_keeps_what_was_synced_and_seals_where_the_write_stopped() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            put(&shard, b"synced", &value(1, 2000), WritePolicy::Durable, Pin::None).await.expect("put");
            put(&shard, b"unsynced", &value(2, 2000), WritePolicy::WriteThrough, Pin::None).await.expect("put");
        });
        tier.crash();
        tier.life(async |shard, life| {
            let report = life.reports[0];
            assert_eq!((report.unfinished_regions, report.lost_records, report.dropped_keys), (1, 0, 0), "{report:?}");
            assert_eq!(read(&shard, b"synced").await, Ok(value(1, 2000)));
            assert_eq!(read(&shard, b"unsynced").await, Err(Status::NotFound));
        });
        // The seal written at recovery makes the region whole: the next start finds no unfinished write.
        tier.life(async |_, life| assert_eq!(life.reports[0].unfinished_regions, 0));
    }
}
