//! Hard and soft pins, and read leases: what keeps an object from eviction.

use super::usage::Use;
use super::{Shard, object_bytes};
use crate::backend::Backend;
use crate::index::{Entry, FLAG_PINNED, FLAG_SOFT_PINNED, Index};
use crate::metrics::set;

/// What the shard knows of its pinned objects. The index entry says *whether* an object is pinned (a flag);
/// soft pins' expiry ticks live here, because only a few objects are pinned and the entry has no room to
/// spare for them (see the index's budget).
#[derive(Default)]
pub struct PinBook {
    /// Entry hash → tick at which the soft pin lapses.
    pub(super) soft_expiry: std::collections::HashMap<u64, u32>,
    /// Bytes (key + value) of pinned objects, hard and soft.
    pub(super) bytes: u64,
    /// The most `bytes` may reach.
    pub(super) limit: u64,
}

pub(super) fn is_pinned(entry: &Entry) -> bool {
    entry.flags & (FLAG_PINNED | FLAG_SOFT_PINNED) != 0
}

impl<E: Backend> Shard<E> {
    pub(super) fn unpin_entry(&self, entry: &Entry, key: Option<&[u8]>) {
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
    pub(super) fn pin_holds(&self, index: &mut Index, id: u32, key: &[u8], now: u32) -> bool {
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
    pub(super) fn soft_pin_live(&self, hash: u64, now: u32) -> bool {
        self.pins.borrow().soft_expiry.get(&hash).is_some_and(|&expiry| now < expiry)
    }

    /// Whether a read lease holds the object in place.
    pub(super) fn leased(&self, entry: &Entry, now: u32) -> bool {
        entry.last_hit != 0 && now < entry.last_hit.saturating_add(Self::ticks(self.config.read_lease))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use strata_proto::{Pin, Status, WritePolicy};

    use crate::sim::testing::{TestTier, put, value};

    #[test]
    fn a_soft_pin_keeps_its_object_in_dram_until_its_ttl_lapses() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            let soft = Pin::Soft { ttl_seconds: 2 };
            put(&shard, b"soft", &value(0, 64 << 10), WritePolicy::WriteThrough, soft).await.expect("put");
            let fill = async |from: u8| {
                for index in from..from + 30 {
                    let key = [b'k', index];
                    put(&shard, &key, &value(index, 64 << 10), WritePolicy::WriteThrough, Pin::None)
                        .await
                        .expect("put");
                }
            };
            fill(0).await;
            assert!(shard.in_dram(b"soft"), "pinned while its TTL runs");
            tier.world.clock.advance(Duration::from_secs(3));
            fill(30).await;
            assert!(!shard.in_dram(b"soft"), "evicted once it lapsed");
        });
    }

    #[test]
    fn pins_past_the_pinned_share_of_dram_are_refused() {
        let tier = TestTier::new(|config| config.max_pinned_share = 0.25);
        tier.life(async |shard, _| {
            // 1 MiB of DRAM: a quarter is 256 KiB, three 100 KB pins are past it.
            for index in 0..2u8 {
                put(&shard, &[b'p', index], &value(index, 100_000), WritePolicy::WriteThrough, Pin::Hard)
                    .await
                    .expect("pin");
            }
            let third = put(&shard, b"p\x02", &value(2, 100_000), WritePolicy::WriteThrough, Pin::Hard).await;
            assert_eq!(third, Err(Status::Quota));
            assert!(shard.metrics.pinned_bytes.load(Ordering::Relaxed) <= 256 << 10);
        });
    }
}
