//! DRAM eviction: making room for a put, for the node or for one tenant, by moving or dropping the oldest objects.

use std::rc::Rc;

use strata_proto::{RemovalReason, Tier};

use super::usage::Use;
use super::{Shard, object_bytes};
use crate::backend::Backend;
use crate::index::{FLAG_DIRTY, FLAG_PINNED, FLAG_REFERENCED, NONE_U32, NONE_U64};
use crate::metrics::add;
use crate::tenants::tenant_of;

/// Clock positions a promotion may visit to make its room. A promotion is optional: when DRAM is full of
/// objects the clock spares (leased, referenced, pinned, dirty), giving up after a few steps costs one
/// lost promotion, where sweeping the whole clock costs every tier hit a pass over DRAM.
pub(super) const PROMOTION_CLOCK_STEPS: usize = 32;

/// How far one run of the DRAM clock may go.
#[derive(Clone, Copy)]
pub(super) struct Sweep {
    /// Only this tenant's objects are taken (a put over the tenant's DRAM quota).
    pub only_tenant: Option<u32>,
    /// At most this many clock positions; `None`: three turns of the clock.
    pub max_steps: Option<usize>,
    /// Dirty objects are written to the log and taken; otherwise they are passed over (no I/O, no wait).
    pub write_dirty: bool,
}

impl Sweep {
    /// A put's sweep: any object, three turns of the clock, dirty ones written first.
    const PUT: Sweep = Sweep { only_tenant: None, max_steps: None, write_dirty: true };
}

impl<E: Backend> Shard<E> {
    /// Evicts from DRAM (CLOCK, sparing pinned, leased and recently referenced objects) when allocating
    /// `need` bytes would pass the high watermark, down to the low one. Dirty objects are written to the
    /// log first. `hard`: also when under the high watermark (the allocator found no piece that fits).
    pub(super) async fn make_dram_room(self: &Rc<Self>, need: u64, hard: bool) {
        self.make_dram_room_within(need, hard, Sweep::PUT).await;
    }

    /// [`Shard::make_dram_room`] within `sweep`'s bounds.
    pub(super) async fn make_dram_room_within(self: &Rc<Self>, need: u64, hard: bool, sweep: Sweep) {
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
        self.evict_dram(sweep, move |shard| shard.dram.borrow().allocated_bytes() as f64 > target).await;
    }

    /// Evicts `tenant`'s own objects from DRAM until it has `need` bytes fewer there (a put over its DRAM
    /// quota makes room among its own objects, never another tenant's).
    pub(super) async fn make_tenant_room(self: &Rc<Self>, tenant: u32, need: u64) {
        let start = self.tenants.usage.borrow().get(&tenant).map_or(0, |usage| usage.dram);
        let target = start.saturating_sub(need);
        let sweep = Sweep { only_tenant: Some(tenant), ..Sweep::PUT };
        self.evict_dram(sweep, move |shard| {
            shard.tenants.usage.borrow().get(&tenant).map_or(0, |usage| usage.dram) > target
        })
        .await;
    }

    /// The DRAM clock: evicts (objects of `sweep.only_tenant`, or any) while `over` says the tier is over
    /// its target, within `sweep`'s bound on steps.
    pub(super) async fn evict_dram(self: &Rc<Self>, sweep: Sweep, over: impl Fn(&Self) -> bool) {
        let clock_len = self.dram.borrow().clock_len();
        let mut budget = sweep.max_steps.unwrap_or(clock_len * 3 + 8);
        let mut visited = 0usize;
        let now = self.now_tick();
        let only_tenant = sweep.only_tenant;
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
                let key = dram.bytes(slot, 0, usize::from(entry.key_len));
                if only_tenant.is_some_and(|tenant| tenant_of(key, self.tenants.tenancy.is_tenanted()) != tenant) {
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
            let dirty = entry.flags & FLAG_DIRTY != 0 && self.has_nvme();
            if dirty && !sweep.write_dirty {
                self.dram.borrow_mut().requeue(slot);
                continue;
            }
            if dirty && self.persist(entry_id, entry.hash, entry.version).await.is_ok() {
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
            let key = dram.bytes(slot, 0, usize::from(current.key_len)).to_vec();
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
        add(&self.metrics.dram_clock_steps, visited as u64);
        self.update_gauges();
    }

    // ---- reads ---------------------------------------------------------------------------------------
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use strata_proto::{Pin, WritePolicy};

    use super::PROMOTION_CLOCK_STEPS;
    use crate::sim::testing::{TestTier, put, read, value};

    #[test]
    fn dram_moves_its_oldest_objects_to_the_tier_and_keeps_hard_pins() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            put(&shard, b"pinned", &value(0, 64 << 10), WritePolicy::WriteThrough, Pin::Hard).await.expect("pinned");
            for index in 1..40u8 {
                let key = [b'k', index];
                put(&shard, &key, &value(index, 64 << 10), WritePolicy::WriteThrough, Pin::None).await.expect("put");
            }
            assert!(shard.metrics.dram_evictions.load(Ordering::Relaxed) > 0);
            assert!(!shard.in_dram(b"k\x01") && shard.has_tier_copy(b"k\x01"), "the oldest went to the tier");
            assert!(shard.in_dram(b"k\x27"), "the newest stayed");
            assert!(shard.in_dram(b"pinned"), "a hard pin is never evicted");
            assert_eq!(read(&shard, b"k\x01").await, Ok(value(1, 64 << 10)), "served from the tier");
        });
    }

    #[test]
    fn a_write_back_object_is_written_before_it_leaves_dram() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            put(&shard, b"first", &value(1, 64 << 10), WritePolicy::WriteBack, Pin::None).await.expect("put");
            assert!(!shard.has_tier_copy(b"first"), "write-back: not written yet");
            for index in 0..40u8 {
                put(&shard, &[b'k', index], &value(index, 64 << 10), WritePolicy::WriteBack, Pin::None)
                    .await
                    .expect("put");
            }
            assert!(!shard.in_dram(b"first") && shard.has_tier_copy(b"first"));
            assert!(shard.metrics.dram_writebacks.load(Ordering::Relaxed) > 0);
            assert_eq!(read(&shard, b"first").await, Ok(value(1, 64 << 10)));
        });
    }

    /// A small DRAM tier under reads of a working set four times its size, every object leased by its last
    /// read: each tier hit is due for promotion and nothing in DRAM may go. A promotion must give up after
    /// a few clock steps, not sweep the clock three times over (which made each such get cost a pass over
    /// DRAM: 20 K gets/s fell to 3 K between two runs of the same load), and after one gives up none is
    /// tried again in the same tick.
    #[test]
    fn a_promotion_gives_up_after_a_few_clock_steps_when_dram_is_leased() {
        let tier = TestTier::new(|config| {
            config.read_lease = Duration::from_secs(60);
            config.promote_window = Duration::from_secs(600);
        });
        tier.life(async |shard, _| {
            let keys: Vec<Vec<u8>> = (0..1024u32).map(|index| format!("block-{index}").into_bytes()).collect();
            for (index, key) in keys.iter().enumerate() {
                put(&shard, key, &value(index as u8, 4096), WritePolicy::WriteThrough, Pin::None).await.expect("put");
            }
            // Reads 1 ms apart (all inside the lease), or all in one tick.
            let read_all = async |step: Duration| {
                for (index, key) in keys.iter().enumerate() {
                    tier.world.clock.advance(step);
                    assert_eq!(read(&shard, key).await, Ok(value(index as u8, 4096)), "{index}");
                }
            };
            let steps = || shard.metrics.dram_clock_steps.load(Ordering::Relaxed);
            let tier_hits = || shard.metrics.nvme_hits.load(Ordering::Relaxed);
            read_all(Duration::from_millis(1)).await;
            read_all(Duration::from_millis(1)).await;
            let (steps_before, hits_before) = (steps(), tier_hits());
            read_all(Duration::from_millis(10)).await;
            let (swept, hits) = (steps() - steps_before, tier_hits() - hits_before);
            assert!(hits > 512, "the working set is mostly on the tier: {hits} tier hits");
            assert!(
                swept <= hits * PROMOTION_CLOCK_STEPS as u64,
                "{swept} clock steps for {hits} tier hits: promotions swept DRAM"
            );
            assert!(shard.metrics.promotions_skipped.load(Ordering::Relaxed) > 0, "leased DRAM: promotions skipped");
            let steps_before = steps();
            read_all(Duration::ZERO).await;
            assert!(steps() - steps_before <= PROMOTION_CLOCK_STEPS as u64, "one sweep a tick");
            // Once the leases run out, DRAM has room to give again and promotions resume.
            tier.world.clock.advance(Duration::from_secs(61));
            let promoted = shard.metrics.promotions.load(Ordering::Relaxed);
            read_all(Duration::from_millis(10)).await;
            assert!(shard.metrics.promotions.load(Ordering::Relaxed) > promoted, "promotions resume");
        });
    }
}
