//! Region reclaim: the oldest sealed region is emptied, its live records reinserted or dropped, so the log can reuse it.

use std::rc::Rc;

use strata_nvme::BlockDevice;
use strata_proto::RemovalReason;

use super::pins::is_pinned;
use super::usage::Use;
use super::{Shard, object_bytes};
use crate::backend::Backend;
use crate::error::EngineError;
use crate::index::{FLAG_DIRTY, FLAG_RECORD_LINKED, FLAG_RECORD_VERSIONED, Index, NONE_U32, NONE_U64, index_hash};
use crate::log::{RegionLog, RegionState, Staged, location, read_range, split_location};
use crate::metrics::add;
use crate::record::{RECORD_TOMBSTONE, RecordHeader};
use crate::scan::{Scanned, scan_region};

impl<E: Backend> Shard<E> {
    /// Reclaims the oldest sealed region: reinserts its recently hit (and pinned or leased) records into the
    /// open region when `reinsert`, drops the others from the index, zeroes its header, frees it.
    pub(super) async fn reclaim_oldest(self: &Rc<Self>, reinsert: bool) -> Result<(), EngineError> {
        let (id, wait) = {
            let log = self.log.borrow();
            let Some(log) = log.as_ref() else { return Err(EngineError::Invalid("no NVMe tier")) };
            let Some(&id) = log.sealed.front() else {
                return Err(EngineError::NoSpace("NVMe tier: nothing sealed to reclaim"));
            };
            (id, log.regions[id as usize].sealed.clone())
        };
        if let Some(done) = wait {
            let _ = done.acquire(1).await;
        }
        let (device, device_offset, seq, region_bytes, chunk_bytes, block_bytes) = {
            let log = self.log.borrow();
            let Some(log) = log.as_ref() else { return Err(EngineError::Invalid("no NVMe tier")) };
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
        let moved = {
            let mut index = self.index.borrow_mut();
            let mut log_ref = self.log.borrow_mut();
            let Some(log) = log_ref.as_mut() else { return Err(EngineError::Invalid("no NVMe tier")) };
            let format_id = log.format_id;
            let mut damaged = false;
            let mut moved = 0u64;
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
                        let record = ReclaimedRecord { region: id, at, header, covered: &covered[..] };
                        let keep_within = reinsert.then_some((now, recent));
                        moved += u64::from(self.reclaim_record(&mut index, log, staged, record, keep_within));
                    }
                }
                Err(error) => {
                    tracing::error!(shard = self.id, region = id, %error, "region unreadable for reclaim: its objects are dropped");
                    add(&self.metrics.io_errors, 1);
                    damaged = true;
                }
            }
            if damaged {
                self.drop_region_entries(&mut index, id);
            }
            let region = &mut log.regions[id as usize];
            region.state = RegionState::Free;
            region.seq = 0;
            log.sealed.pop_front();
            moved
        };
        // The copies moved to the open region are made durable before the region they came from is given
        // up: a crash in between would otherwise lose both.
        if moved > 0 {
            self.sync_open_held().await?;
        }
        // Zero the header, durably, before reuse, so that a crash cannot bring this generation back.
        self.zero_region_header(device, device_offset, block_bytes).await;
        if let Some(log) = self.log.borrow_mut().as_mut() {
            log.free.push_back(id);
        }
        add(&self.metrics.reclaims, 1);
        Ok(())
    }

    /// Moves one record of a region being reclaimed to the open region when the object is still wanted
    /// (`keep_within`: reclaim reinserts, at tick `now`, objects hit within `recent` ticks, pinned, leased or
    /// held by their group), or drops it from the tier; a record that is no longer its key's current
    /// version is passed over. Returns whether it moved the record.
    ///
    /// An object dropped from the tier that is still in DRAM stays there, dirty again: it is written anew
    /// when it leaves DRAM or the node stops, as a write-back object is.
    fn reclaim_record(
        &self,
        index: &mut Index,
        log: &mut RegionLog,
        staged: &Staged,
        record: ReclaimedRecord<'_>,
        keep_within: Option<(u32, u32)>,
    ) -> bool {
        let ReclaimedRecord { region, at, header, covered } = record;
        let key = &covered[..usize::from(header.key_len)];
        let Some(entry_id) = index.find(index_hash(key)) else { return false };
        let entry = *index.get(entry_id);
        if entry.nvme != location(region, at as u32) {
            return false;
        }
        // What is kept moves into the open region; all but pinned objects only while they leave a quarter of
        // it to new writes, so that a tier of hot objects still takes puts.
        let room_left = log.open.as_ref().is_some_and(|open| open.used + header.record_len() <= reinsert_limit(log));
        let keep = keep_within.is_some_and(|(now, recent)| {
            is_pinned(&entry)
                || (room_left
                    && (self.leased(&entry, now)
                        || (entry.last_hit != 0 && now.saturating_sub(entry.last_hit) <= recent)
                        || self.group_stays(index, entry_id, now)))
        });
        let moved = if keep && header.flags & RECORD_TOMBSTONE == 0 {
            let value = staged.slices(at + header.value_offset(), header.value_len as usize);
            log.try_append(header, covered, &value)
        } else {
            None
        };
        let entry = index.get_mut(entry_id);
        if let Some(new_location) = moved {
            entry.nvme = new_location;
            add(&self.metrics.reinsertions, 1);
            return true;
        }
        entry.nvme = NONE_U64;
        if entry.dram != NONE_U32 {
            entry.flags = (entry.flags | FLAG_DIRTY) & !(FLAG_RECORD_LINKED | FLAG_RECORD_VERSIONED);
        }
        let dropped = *entry;
        add(&self.metrics.nvme_evictions, 1);
        self.account(key, Use::Nvme, object_bytes(&dropped), false);
        if dropped.dram == NONE_U32 {
            self.forget(index, entry_id, Some(key));
            self.events.borrow_mut().removed(key, RemovalReason::Evicted);
        }
        false
    }

    /// Drops every entry that still points at `region`, whose records the scan could not read: an object
    /// with a DRAM copy keeps it, the rest are lost, and subscribers are told to resync.
    fn drop_region_entries(&self, index: &mut Index, region: u32) {
        let ids: Vec<u32> = index.ids().collect();
        let mut lost = 0u32;
        for entry_id in ids {
            let entry = *index.get(entry_id);
            if entry.nvme != NONE_U64 && split_location(entry.nvme).0 == region {
                index.get_mut(entry_id).nvme = NONE_U64;
                if entry.dram == NONE_U32 {
                    self.forget(index, entry_id, None);
                    lost += 1;
                }
            }
        }
        self.events.borrow_mut().lost(lost);
    }

    /// Zeroes a reclaimed region's header, durably, before reuse, so that a crash cannot bring this
    /// generation back; a failure poisons the shard.
    async fn zero_region_header(&self, device: usize, device_offset: u64, block_bytes: usize) {
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
    }
}

/// How full reinsertion may make the open region (bytes from its start).
fn reinsert_limit(log: &RegionLog) -> usize {
    log.region_bytes as usize / 4 * 3
}

/// One record found by a reclaim's scan of `region`, at byte `at`: its header and the bytes its crc covers.
struct ReclaimedRecord<'a> {
    region: u32,
    at: usize,
    header: RecordHeader,
    covered: &'a [u8],
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use strata_proto::{Pin, WritePolicy};

    use crate::sim::testing::{TestTier, fill, put, read, value};

    #[test]
    fn records_moved_by_reclaim_are_durable_before_their_region_is_given_up() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            put(&shard, b"pinned", &value(1, 3000), WritePolicy::Durable, Pin::Hard).await.expect("put");
            // Write-through fillers (nothing syncs them) until a reclaim moves the pinned record; the crash
            // comes right after.
            for index in 0..400 {
                let key = format!("filler-{index}");
                put(&shard, key.as_bytes(), &value(index as u8, 16 << 10), WritePolicy::WriteThrough, Pin::None)
                    .await
                    .expect("filler");
                if shard.metrics.reinsertions.load(Ordering::Relaxed) > 0 {
                    break;
                }
            }
            assert!(shard.metrics.reinsertions.load(Ordering::Relaxed) > 0, "reclaim moved the record");
        });
        // Before: the moved copy sat in the open region's buffer while its old region's header was zeroed.
        tier.crash();
        tier.life(async |shard, _| {
            assert_eq!(read(&shard, b"pinned").await, Ok(value(1, 3000)));
        });
    }

    #[test]
    fn an_object_in_dram_whose_record_reclaim_took_is_written_again_at_a_clean_stop() {
        let tier = TestTier::new(|config| config.reinsert_window = Duration::ZERO);
        tier.life(async |shard, _| {
            put(&shard, b"hot", &value(1, 3000), WritePolicy::Durable, Pin::None).await.expect("put");
            let mut taken = false;
            for round in 0..40 {
                fill(&shard, round * 8, 8, 16 << 10).await;
                // Read often enough to stay in DRAM, but not within the reinsertion window.
                read(&shard, b"hot").await.expect("read");
                tier.world.clock.advance(Duration::from_secs(1));
                if !shard.has_tier_copy(b"hot") {
                    taken = true;
                    break;
                }
            }
            assert!(taken && shard.in_dram(b"hot"), "reclaim took the record of an object in DRAM");
            // Before: it was not dirty, so the clean stop did not write it, and the restart lost it.
            shard.flush_for_shutdown().await;
        });
        tier.life(async |shard, _| {
            assert_eq!(read(&shard, b"hot").await, Ok(value(1, 3000)));
        });
    }
}
