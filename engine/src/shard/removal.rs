//! Removals: one key, keys matching a pattern, and the flush of a clean shutdown.

use std::rc::Rc;

use strata_proto::RemovalReason;

use super::durable::DurablePoint;
use super::reads::record_value_offset;
use super::usage::Use;
use super::{Shard, object_bytes};
use crate::backend::Backend;
use crate::error::EngineError;
use crate::index::{Entry, FLAG_DIRTY, NONE_U32, NONE_U64, index_hash};
use crate::log::{RegionState, read_range, split_location};
use crate::record::{RECORD_HEADER_BYTES, RecordHeader};

impl<E: Backend> Shard<E> {
    /// Removes `key`; a tombstone in the log keeps it removed across a restart.
    pub async fn remove(self: &Rc<Self>, key: &[u8]) -> Result<(), EngineError> {
        match self.remove_unsynced(key).await? {
            Some(point) => self.sync(point).await,
            None => Ok(()),
        }
    }

    /// Removes `key` as [`Shard::remove`] does, leaving the sync of its tombstone to the caller: the point
    /// the log must be durable to before the removal is acknowledged (none: it had no record on the tier).
    /// A frame of removals then syncs once per region (group commit), not once per key: one after another,
    /// a page of 256 removals took a takeover's move 350-400 ms.
    pub async fn remove_unsynced(self: &Rc<Self>, key: &[u8]) -> Result<Option<DurablePoint>, EngineError> {
        self.remove_as(key, RemovalReason::Removed).await
    }

    /// Removes `key` for `reason` (a client's remove, or a cascade), with a tombstone when a record of it
    /// is on the tier. A client's removal is acknowledged only once its tombstone is durable (the point
    /// returned), so that a restart cannot bring the key back; a cascade's is not waited for (nobody was
    /// told it happened).
    pub(super) async fn remove_as(
        self: &Rc<Self>,
        key: &[u8],
        reason: RemovalReason,
    ) -> Result<Option<DurablePoint>, EngineError> {
        if reason == RemovalReason::Removed && self.poisoned.get() {
            // Its tombstone could not be made durable: a removal acknowledged now could be undone by a crash.
            return Err(EngineError::Poisoned);
        }
        let hash = index_hash(key);
        let entry = {
            let mut index = self.index.borrow_mut();
            let Some(id) = index.find(hash) else { return Err(EngineError::NotFound) };
            let entry = *index.get(id);
            let mut dram = self.dram.borrow_mut();
            if entry.dram != NONE_U32 {
                if dram.bytes(entry.dram, 0, key.len()) != key {
                    return Err(EngineError::NotFound);
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
            return Ok(None);
        }
        let point = self.append_tombstone(key, hash, entry.version).await?;
        if reason != RemovalReason::Removed {
            // Nobody waits for a cascade's removal: its tombstone becomes durable with the region, and a put
            // of the key before then waits for it (`Shard::commit_put`).
            self.unsynced_tombstones.borrow_mut().insert(hash, point);
            return Ok(None);
        }
        Ok(Some(point))
    }

    /// The key of entry `entry`: from its DRAM copy, else from its record's header on the NVMe tier (whose
    /// crc covers the key). `None` if neither can be read.
    pub(super) async fn stored_key(self: &Rc<Self>, entry: Entry) -> Option<Vec<u8>> {
        let key_len = usize::from(entry.key_len);
        if entry.dram != NONE_U32 {
            let dram = self.dram.borrow();
            return Some(dram.bytes(entry.dram, 0, key_len).to_vec());
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

    /// The objects a clean shutdown could not write (refused by the tier, left dirty by the last pass, or
    /// all of them on a poisoned tier) leave the node with it: subscribers are told they were evicted, and
    /// the log says how many.
    fn report_unsaved(&self) {
        let index = self.index.borrow();
        let dram = self.dram.borrow();
        let mut unsaved = 0u64;
        for id in index.ids() {
            let entry = index.get(id);
            if entry.flags & FLAG_DIRTY != 0 && entry.dram != NONE_U32 {
                let key = dram.bytes(entry.dram, 0, usize::from(entry.key_len));
                self.events.borrow_mut().removed(key, RemovalReason::Evicted);
                unsaved += 1;
            }
        }
        if unsaved > 0 {
            tracing::warn!(
                shard = self.id,
                unsaved,
                "objects in DRAM could not be written to the NVMe tier at shutdown"
            );
        }
    }

    // ---- start-up and shutdown -----------------------------------------------------------------------

    /// Clean shutdown: writes dirty objects (write-back ones, and those whose record a reclaim took while
    /// they were in DRAM), seals the open region and waits for every region write to complete.
    pub async fn flush_for_shutdown(self: &Rc<Self>) {
        if !self.has_nvme() {
            return;
        }
        // Departures under way finish first: a cascade's removal writes a tombstone.
        self.cascades_settled().await;
        // Writing one object may rotate, and a rotation's reclaim may leave another dirty again: pass over
        // the index until nothing dirty is left, a bounded number of times (DRAM holding more than the tier
        // would otherwise churn forever).
        let mut refused = std::collections::HashSet::new();
        for _pass in 0..8 {
            let dirty: Vec<(u32, u64, u32)> = {
                let index = self.index.borrow();
                index
                    .ids()
                    .map(|id| (id, *index.get(id)))
                    .filter(|(id, entry)| {
                        entry.flags & FLAG_DIRTY != 0 && entry.dram != NONE_U32 && !refused.contains(id)
                    })
                    .map(|(id, entry)| (id, entry.hash, entry.version))
                    .collect()
            };
            if dirty.is_empty() || self.poisoned.get() {
                break;
            }
            for (id, hash, version) in dirty {
                if self.persist(id, hash, version).await.is_err() {
                    refused.insert(id);
                }
            }
        }
        self.report_unsaved();
        if let Ok(_permit) = self.log_lock.acquire_static_permit(1).await {
            self.seal_open();
            if let Some(log) = self.log.borrow_mut().as_mut() {
                log.closed = true;
            }
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

#[cfg(test)]
mod tests {
    use strata_proto::{Pin, Status, WritePolicy};

    use crate::sim::testing::{TestTier, put, read, value};

    #[test]
    fn an_acknowledged_removal_holds_across_a_crash() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            put(&shard, b"k", &value(1, 3000), WritePolicy::Durable, Pin::None).await.expect("put");
            shard.remove(b"k").await.expect("remove");
            assert_eq!(shard.remove(b"k").await.map_err(|error| error.status()), Err(Status::NotFound));
        });
        tier.crash();
        tier.life(async |shard, _| assert_eq!(read(&shard, b"k").await, Err(Status::NotFound)));
    }

    #[test]
    fn keys_matching_a_pattern_are_removed_and_only_those() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            for key in [&b"layer-0"[..], b"layer-1", b"other"] {
                put(&shard, key, &value(1, 100), WritePolicy::WriteThrough, Pin::None).await.expect("put");
            }
            let pattern = regex::bytes::Regex::new("^layer-").expect("pattern");
            assert_eq!(shard.remove_matching(b"", Some(&pattern)).await, 2);
            assert_eq!(read(&shard, b"other").await, Ok(value(1, 100)));
            assert_eq!(read(&shard, b"layer-1").await, Err(Status::NotFound));
        });
    }
}
