//! The region log's writes: records and tombstones, durable syncs, sealing and opening regions.

use std::rc::Rc;

use glommio::sync::Semaphore;

use super::reads::record_value_offset;
use super::usage::Use;
use super::{Shard, object_bytes};
use crate::backend::Backend;
use crate::error::EngineError;
use crate::index::{
    Entry, FLAG_DIRTY, FLAG_LINKED, FLAG_PINNED, FLAG_RECORD_LINKED, FLAG_RECORD_VERSIONED, FLAG_REPLICAS_MASK,
    NONE_U32, NONE_U64,
};
use crate::log::{RegionLog, RegionState, split_location, write_partial, write_region, written_len};
use crate::metrics::add;
use crate::record::{RECORD_LINKED, RECORD_PINNED, RECORD_TOMBSTONE, RECORD_VERSIONED, RecordHeader};

/// Regions reclaimed at most per rotation, so one put never waits for a long reclaim.
const MAX_RECLAIMS_PER_ROTATION: usize = 4;
/// Rotations one append may ask for before it gives up.
const MAX_ROTATIONS_PER_APPEND: usize = 4;

/// Where a durable put's record ends, to sync up to.
#[derive(Clone, Copy, Debug)]
pub struct DurablePoint {
    pub(super) region: u32,
    pub(super) seq: u64,
    pub(super) end: usize,
}

impl DurablePoint {
    /// The region generation it is in (points of one generation are synced by one write).
    pub fn region_key(&self) -> (u32, u64) {
        (self.region, self.seq)
    }
}

/// The durable point just past `len` bytes of record at location `at` of `log`.
pub(super) fn point_after(log: &RegionLog, at: u64, len: usize) -> DurablePoint {
    let (region, offset) = split_location(at);
    DurablePoint { region, seq: log.regions[region as usize].seq, end: offset as usize + len }
}

impl<E: Backend> Shard<E> {
    /// The point a put of the key whose index hash is `hash` must sync before it is acknowledged: where the
    /// tombstone of its last removal ends, if that removal was not synced and may not be durable yet.
    pub(super) fn unsynced_tombstone(&self, hash: u64) -> Option<DurablePoint> {
        let point = self.unsynced_tombstones.borrow_mut().remove(&hash)?;
        (!self.is_durable(point)).then_some(point)
    }

    /// Whether the log is durable up to `point`: its region was sealed (or since reclaimed), or synced
    /// that far.
    fn is_durable(&self, point: DurablePoint) -> bool {
        let log = self.log.borrow();
        let Some(log) = log.as_ref() else { return true };
        let region = &log.regions[point.region as usize];
        match region.state {
            _ if region.seq != point.seq => true,
            RegionState::Sealed | RegionState::Free => true,
            RegionState::Sealing => false,
            RegionState::Open => log.open.as_ref().is_some_and(|open| open.durable >= point.end),
        }
    }

    /// Forgets the unsynced tombstones that region `region` of generation `seq` made durable (it sealed).
    fn forget_tombstones_of(&self, region: u32, seq: u64) {
        let mut tombstones = self.unsynced_tombstones.borrow_mut();
        if !tombstones.is_empty() {
            tombstones.retain(|_, point| point.region_key() != (region, seq));
        }
    }

    /// Where the record of `entry` at location `at` ends: what a sync must cover to make it durable.
    pub(super) fn durable_point(&self, at: u64, entry: &Entry) -> Result<DurablePoint, EngineError> {
        let log = self.log.borrow();
        let Some(log) = log.as_ref() else { return Err(EngineError::Invalid("no NVMe tier")) };
        Ok(point_after(log, at, record_value_offset(entry) + entry.value_len as usize))
    }

    /// Appends a tombstone for version `version` of `key` (hash `hash`) to the open region, rotating if it
    /// is full; returns where it ends, for a sync.
    pub(super) async fn append_tombstone(
        self: &Rc<Self>,
        key: &[u8],
        hash: u64,
        version: u32,
    ) -> Result<DurablePoint, EngineError> {
        let header = RecordHeader {
            region_seq: 0,
            key_hash: hash,
            value_len: 0,
            value_crc: 0,
            key_len: key.len() as u16,
            flags: RECORD_TOMBSTONE,
            version,
        };
        // A fresh region has room for a tombstone unless reclaim filled it with what it kept.
        for _ in 0..MAX_ROTATIONS_PER_APPEND {
            if self.poisoned.get() {
                return Err(EngineError::Poisoned);
            }
            let full = {
                let mut log = self.log.borrow_mut();
                let Some(log) = log.as_mut() else { return Err(EngineError::Invalid("no NVMe tier")) };
                if let Some(at) = log.try_append(header, key, &[]) {
                    return Ok(point_after(log, at, header.record_len()));
                }
                log.open.as_ref().map(|open| open.id)
            };
            self.rotate_boxed(full).await?;
        }
        Err(EngineError::NoSpace("open region, after rotations"))
    }

    /// Appends the DRAM copy of entry `id` to the log (if it is still version `version` and dirty).
    pub(super) async fn persist(self: &Rc<Self>, id: u32, hash: u64, version: u32) -> Result<u64, EngineError> {
        // A fresh region has room for any record that passed the size check, unless reclaim filled it with
        // what it kept: a few rotations, then NO_SPACE rather than rotating for ever.
        for _ in 0..MAX_ROTATIONS_PER_APPEND {
            let full_region = {
                let mut index = self.index.borrow_mut();
                let entry = *index.get(id);
                if entry.hash != hash || entry.version != version {
                    // Replaced or removed meanwhile: nothing of this version is left to write.
                    return Err(EngineError::NotFound);
                }
                if entry.flags & FLAG_DIRTY == 0 && entry.nvme != NONE_U64 {
                    // Written already: by eviction's write-back, say, while this write waited on a rotation
                    // (its DRAM copy may be gone since). Before, that answered a durable put NOT_FOUND.
                    return Ok(entry.nvme);
                }
                if entry.dram == NONE_U32 {
                    return Err(EngineError::NotFound);
                }
                if self.poisoned.get() {
                    return Err(EngineError::Poisoned);
                }
                let mut log = self.log.borrow_mut();
                let Some(log) = log.as_mut() else { return Err(EngineError::Invalid("no NVMe tier")) };
                // Links and an upsert's version survive a restart: the record carries them after the key.
                let links = (entry.flags & FLAG_LINKED != 0)
                    .then(|| self.links.book.borrow().of(id))
                    .flatten()
                    .map(|links| RecordHeader::encode_links(links.parent, links.group));
                let cluster_version = self.version_of(&entry).map(|version| version.encode());
                let header = RecordHeader {
                    region_seq: 0,
                    key_hash: hash,
                    value_len: entry.value_len,
                    value_crc: entry.value_crc,
                    key_len: entry.key_len,
                    // Hard pins survive a restart; soft pins are a hint with a TTL and do not.
                    flags: if entry.flags & FLAG_PINNED != 0 { RECORD_PINNED } else { 0 }
                        | if links.is_some() { RECORD_LINKED } else { 0 }
                        | if cluster_version.is_some() { RECORD_VERSIONED } else { 0 }
                        // The replica count sits in the same bits of both.
                        | (entry.flags & FLAG_REPLICAS_MASK),
                    version,
                };
                if header.record_len() > log.max_record_bytes() {
                    return Err(EngineError::TooLarge("a record is larger than a region"));
                }
                let dram = self.dram.borrow();
                let key_len = usize::from(entry.key_len);
                let bytes = dram.bytes(entry.dram, 0, key_len + entry.value_len as usize);
                let (usage, quotas) = self.usage_of(&bytes[..key_len]);
                if quotas.nvme.is_some_and(|quota| usage.nvme + object_bytes(&entry) > quota) {
                    // Over the tenant's NVMe quota: the object stays in DRAM only (and is dropped when
                    // evicted from it).
                    return Err(EngineError::Quota("tenant's NVMe"));
                }
                let covered = match (links, cluster_version) {
                    (None, None) => std::borrow::Cow::Borrowed(&bytes[..key_len]),
                    (links, cluster_version) => std::borrow::Cow::Owned(
                        [
                            &bytes[..key_len],
                            links.as_ref().map_or(&[][..], |links| &links[..]),
                            cluster_version.as_ref().map_or(&[][..], |version| &version[..]),
                        ]
                        .concat(),
                    ),
                };
                match log.try_append(header, &covered, &[&bytes[key_len..]]) {
                    Some(at) => {
                        self.account(&bytes[..key_len], Use::Nvme, object_bytes(&entry), true);
                        let entry = index.get_mut(id);
                        entry.nvme = at;
                        entry.flags &= !FLAG_DIRTY;
                        entry.flags &= !(FLAG_RECORD_LINKED | FLAG_RECORD_VERSIONED);
                        if links.is_some() {
                            entry.flags |= FLAG_RECORD_LINKED;
                        }
                        if cluster_version.is_some() {
                            entry.flags |= FLAG_RECORD_VERSIONED;
                        }
                        add(&self.metrics.records_appended, 1);
                        add(&self.metrics.record_bytes_appended, header.record_len() as u64);
                        return Ok(at);
                    }
                    None => log.open.as_ref().map(|open| open.id),
                }
            };
            self.rotate_boxed(full_region).await?;
        }
        Err(EngineError::NoSpace("open region, after rotations"))
    }

    /// Makes the log durable up to `point` (group commit: one write and flush covers every record appended
    /// before it).
    pub async fn sync(self: &Rc<Self>, point: DurablePoint) -> Result<(), EngineError> {
        let _permit = self.log_lock.acquire_static_permit(1).await.map_err(|_| EngineError::ShuttingDown)?;
        self.sync_held(point).await
    }

    /// Makes the open region durable up to what it holds now (reclaim, before it destroys the copies it
    /// moved there); the caller holds the log's lock.
    pub(super) async fn sync_open_held(self: &Rc<Self>) -> Result<(), EngineError> {
        let point = {
            let log = self.log.borrow();
            let Some(log) = log.as_ref() else { return Ok(()) };
            let Some(open) = log.open.as_ref() else { return Ok(()) };
            DurablePoint { region: open.id, seq: log.regions[open.id as usize].seq, end: open.used }
        };
        self.sync_held(point).await
    }

    /// [`Shard::sync`], with the log's lock already held.
    async fn sync_held(self: &Rc<Self>, point: DurablePoint) -> Result<(), EngineError> {
        enum Step {
            Done(Result<(), EngineError>),
            Wait(Option<Rc<Semaphore>>),
            Write { device: usize, device_offset: u64, bytes: Vec<u8>, from: usize, used: usize, chunk_bytes: usize },
        }
        loop {
            let step = {
                let mut guard = self.log.borrow_mut();
                match guard.as_mut() {
                    None => Step::Done(Err(EngineError::Invalid("no NVMe tier"))),
                    Some(log) => {
                        let block_bytes = log.block_bytes;
                        let chunk_bytes = log.chunk_bytes;
                        let region = &log.regions[point.region as usize];
                        let settled = if self.poisoned.get() { Err(EngineError::Poisoned) } else { Ok(()) };
                        match region.state {
                            // Another generation: sealed and since reclaimed, so durable when it was sealed.
                            _ if region.seq != point.seq => Step::Done(settled),
                            RegionState::Sealed | RegionState::Free => Step::Done(settled),
                            RegionState::Sealing => Step::Wait(region.sealed.clone()),
                            RegionState::Open => {
                                let (device, device_offset) = (region.device, region.device_offset);
                                match log.open.as_mut() {
                                    None => Step::Done(Err(EngineError::Invalid("an open region with no buffer"))),
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
                        return Err(EngineError::device(error));
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

    /// [`Shard::rotate`] with its future on the heap. A rotation may reclaim, sync and write, and its future
    /// holds all of that state; every append awaits a possible rotation, and every put and eviction awaits
    /// an append, so inline it would make each of their futures larger by as much and be copied at every
    /// call. Rotations come once per region, appends once per record.
    async fn rotate_boxed(self: &Rc<Self>, full: Option<u32>) -> Result<(), EngineError> {
        Box::pin(self.rotate(full)).await
    }

    /// Seals the open region `full` (unless another task already did) and opens the next, reclaiming as
    /// the watermarks say.
    pub(super) async fn rotate(self: &Rc<Self>, full: Option<u32>) -> Result<(), EngineError> {
        let _permit = self.log_lock.acquire_static_permit(1).await.map_err(|_| EngineError::ShuttingDown)?;
        {
            let log = self.log.borrow();
            let Some(log) = log.as_ref() else { return Err(EngineError::Invalid("no NVMe tier")) };
            if log.closed {
                return Err(EngineError::ShuttingDown);
            }
            if log.open.as_ref().map(|open| open.id) != full {
                return Ok(());
            }
        }
        self.seal_open();
        // A spare buffer: wait for the oldest sealing write if every buffer is in flight.
        loop {
            let wait = {
                let log = self.log.borrow();
                let Some(log) = log.as_ref() else { return Err(EngineError::Invalid("no NVMe tier")) };
                if !log.spare.is_empty() {
                    break;
                }
                log.sealed.iter().find_map(|&id| log.regions[id as usize].sealed.clone())
            };
            match wait {
                Some(done) => {
                    let _ = done.acquire(1).await;
                }
                None => return Err(EngineError::NoSpace("region buffers")),
            }
        }
        if self.log.borrow().as_ref().is_some_and(|log| log.free.is_empty()) {
            self.reclaim_oldest(false).await?;
        }
        if !self.log.borrow_mut().as_mut().is_some_and(RegionLog::open_next) {
            return Err(EngineError::NoSpace("NVMe tier"));
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
    pub(super) fn seal_open(self: &Rc<Self>) {
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
            let seq = {
                let mut log = shard.log.borrow_mut();
                log.as_mut().map(|log| {
                    let region = &mut log.regions[id as usize];
                    region.state = RegionState::Sealed;
                    region.sealed = None;
                    log.spare.push(buffer);
                    region.seq
                })
            };
            match result {
                Err(error) => shard.poison("writing a region", &error),
                Ok(()) => {
                    if let Some(seq) = seq {
                        shard.forget_tombstones_of(id, seq);
                    }
                }
            }
            done.close();
        })
        .detach();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use strata_proto::{Pin, Status, WritePolicy};

    use crate::sim::testing::{TestTier, put, read, value};

    #[test]
    fn durable_puts_share_one_sync_and_survive_a_crash() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            for index in 0..5u8 {
                put(&shard, &[b'w', index], &value(index, 1000), WritePolicy::WriteThrough, Pin::None)
                    .await
                    .expect("put");
            }
            let syncs = shard.metrics.durable_syncs.load(Ordering::Relaxed);
            put(&shard, b"durable", &value(9, 1000), WritePolicy::Durable, Pin::None).await.expect("put");
            assert_eq!(shard.metrics.durable_syncs.load(Ordering::Relaxed), syncs + 1, "one write covers them");
        });
        tier.crash();
        tier.life(async |shard, _| {
            assert_eq!(read(&shard, b"durable").await, Ok(value(9, 1000)));
            // The write-through records before it were made durable by the same write.
            assert_eq!(read(&shard, b"w\x00").await, Ok(value(0, 1000)));
        });
    }

    #[test]
    fn a_durable_put_larger_than_a_region_is_refused_before_anything_is_stored() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            let status = put(&shard, b"big", &value(1, 200 << 10), WritePolicy::Durable, Pin::None).await;
            assert_eq!(status, Err(Status::TooLarge));
            assert_eq!(shard.exists(b"big").map_err(|error| error.status()), Err(Status::NotFound));
        });
    }

    #[test]
    fn a_durable_put_written_back_by_eviction_while_its_own_write_waits_is_acknowledged() {
        let mut tier = TestTier::new(|_| {});
        // Device operations yield to the executor, so that other puts evict while a rotation waits.
        tier.set_faults(strata_nvme::FaultConfig { seed: 7, max_yields: 8, ..strata_nvme::FaultConfig::default() });
        tier.life(async |shard, _| {
            let tasks: Vec<_> = (0..8u8)
                .map(|writer| {
                    let shard = std::rc::Rc::clone(&shard);
                    glommio::spawn_local(async move {
                        let mut failed = Vec::new();
                        // 4.8 MB in all: the 6 MiB tier never reclaims (which may drop a cold object
                        // before its own put's write resumes, answering it NOT_FOUND as a miss).
                        for at in 0..10u32 {
                            let key = format!("w{writer}-{at}");
                            let result =
                                put(&shard, key.as_bytes(), &value(writer, 60_000), WritePolicy::Durable, Pin::None)
                                    .await;
                            if let Err(status) = result {
                                failed.push((key, status));
                            }
                        }
                        failed
                    })
                })
                .collect();
            let mut failed = Vec::new();
            for task in tasks {
                failed.extend(task.await);
            }
            assert!(failed.is_empty(), "{} durable puts failed: {:?}", failed.len(), &failed[..failed.len().min(5)]);
        });
    }
}
