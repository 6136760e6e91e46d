//! The DRAM tier of a shard: the segment, its allocator, the table of resident objects and the clock that
//! picks eviction victims.
//!
//! An object in DRAM is `[key][value]` in one allocation; the key is kept so that a hit is checked against
//! the key asked for (the index is keyed by hash). A resident object has a *slot*; the slot counts the
//! readers that are sending its bytes (pins). Replacing or evicting an object whose slot is pinned detaches
//! it from its entry (*retires* it) and frees the allocation when the last reader unpins: readers of the old
//! version finish with the old bytes, and no range is reused while a socket still sends from it.
//!
//! Eviction is CLOCK (second chance) over slots in the order they were filled: a hit sets the entry's
//! referenced flag, the clock clears it once before evicting.

use std::collections::VecDeque;

use strata_alloc::{AllocError, Allocation, Allocator, AllocatorConfig};

use crate::index::NONE_U32;
use crate::segment::{PageKind, Segment, SegmentRange};

/// A resident object.
struct DramObject {
    allocation: Option<Allocation>,
    /// Entry id in the index, [`RESERVED`] while a put fills it, or `NONE_U32` once retired.
    entry: u32,
    /// Distinguishes reuses of the slot in the clock queue.
    generation: u32,
    pins: u32,
}

/// [`DramObject::entry`] of a slot allocated and not yet published: alive, though no entry names it (a
/// progressive put's readers pin it while it fills, and their unpin must not free it).
const RESERVED: u32 = u32::MAX - 1;

/// Stale clock positions tolerated beyond the live ones before they are dropped (so that a nearly empty
/// tier does not compact on every put).
const STALE_POSITIONS_SLACK: usize = 1024;

/// A shard's DRAM tier.
pub struct DramTier {
    segment: Segment,
    allocator: Allocator,
    objects: Vec<DramObject>,
    free_slots: Vec<u32>,
    clock: VecDeque<(u32, u32)>,
}

/// Why a DRAM tier could not be built.
#[derive(Debug, thiserror::Error)]
pub enum DramError {
    /// The segment could not be mapped.
    #[error("mapping a DRAM segment of {capacity_bytes} bytes: {source}")]
    Map {
        /// Bytes asked for.
        capacity_bytes: u64,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The allocator refused its configuration.
    #[error("DRAM allocator: {0}")]
    Allocator(#[from] AllocError),
}

/// Why DRAM space could not be had.
#[derive(Debug)]
pub enum DramFull {
    /// The allocator has no room (evict first).
    NoSpace,
    /// The object can never fit this tier.
    TooLarge,
}

impl DramTier {
    /// A tier of `capacity_bytes` (hugepages when `try_huge` and reserved).
    pub fn new(capacity_bytes: u64, try_huge: bool) -> Result<Self, DramError> {
        let segment = Segment::map(capacity_bytes as usize, try_huge)
            .map_err(|source| DramError::Map { capacity_bytes, source })?;
        let capacity_bytes = (capacity_bytes.min(segment.len() as u64) / 64) * 64;
        // One allocation per 2 KiB on average bounds the allocator's node pool to 32 bytes per 2 KiB
        // (1.6 %), reserved up front.
        let max_allocations = (capacity_bytes / 2048).clamp(4096, u64::from(u32::MAX / 4)) as u32;
        let allocator = Allocator::new(AllocatorConfig::new(capacity_bytes, 64, max_allocations))?;
        Ok(Self { segment, allocator, objects: Vec::new(), free_slots: Vec::new(), clock: VecDeque::new() })
    }

    /// `len` bytes from `at` of slot `slot`'s object (`[key][value]`), for reading while the tier is
    /// borrowed: the slot is published (or a progressive put's readers read what arrived of it), so nothing
    /// writes these bytes.
    pub fn bytes(&self, slot: u32, at: usize, len: usize) -> &[u8] {
        self.segment.bytes(self.offset(slot) + at as u64, len)
    }

    /// Flips `bits` in byte `at` of slot `slot`'s object (tests of damage to DRAM).
    #[cfg(test)]
    pub fn corrupt(&mut self, slot: u32, at: usize, bits: u8) {
        self.segment.bytes_mut(self.offset(slot) + at as u64, 1)[0] ^= bits;
    }

    /// A handle on `len` bytes from `at` of slot `slot`'s object, for a guard that outlives this borrow
    /// (a reader's pin).
    pub fn range(&self, slot: u32, at: usize, len: usize) -> SegmentRange {
        self.segment.range(self.offset(slot) + at as u64, len)
    }

    /// Where the segment lies (its first byte, its length), to register it with an RDMA device.
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub fn segment_memory(&self) -> (*mut u8, usize) {
        (self.segment.start(), self.segment.len())
    }

    /// Pages backing the segment.
    pub fn pages(&self) -> PageKind {
        self.segment.pages()
    }

    /// Capacity in bytes.
    pub fn capacity_bytes(&self) -> u64 {
        self.allocator.capacity()
    }

    /// Bytes allocated.
    pub fn allocated_bytes(&self) -> u64 {
        self.allocator.allocated_bytes()
    }

    /// Slots in use (resident, unpublished or retired-but-pinned objects).
    pub fn resident_objects(&self) -> usize {
        self.objects.len() - self.free_slots.len()
    }

    /// Allocates `len` bytes for an object that is not published yet, and hands its bytes to `fill` (a
    /// range nobody else has seen); returns its slot.
    pub fn allocate_with(&mut self, len: u64, fill: impl FnOnce(&mut [u8])) -> Result<u32, DramFull> {
        let (slot, offset) = self.allocate_slot(len)?;
        fill(self.segment.bytes_mut(offset, len as usize));
        Ok(slot)
    }

    /// Allocates `len` bytes for an object that is not published yet; returns its slot and a handle on its
    /// bytes for the one reservation that fills them.
    pub fn allocate(&mut self, len: u64) -> Result<(u32, SegmentRange), DramFull> {
        let (slot, offset) = self.allocate_slot(len)?;
        Ok((slot, self.segment.range(offset, len as usize)))
    }

    fn allocate_slot(&mut self, len: u64) -> Result<(u32, u64), DramFull> {
        let allocation = match self.allocator.allocate(len.max(1)) {
            Ok(allocation) => allocation,
            Err(AllocError::TooLarge { .. }) => return Err(DramFull::TooLarge),
            Err(_) => return Err(DramFull::NoSpace),
        };
        let offset = allocation.offset();
        let object = DramObject { allocation: Some(allocation), entry: RESERVED, generation: 0, pins: 0 };
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                let generation = self.objects[slot as usize].generation.wrapping_add(1);
                self.objects[slot as usize] = DramObject { generation, ..object };
                slot
            }
            None => {
                self.objects.push(object);
                (self.objects.len() - 1) as u32
            }
        };
        Ok((slot, offset))
    }

    /// Offset of a slot's bytes in the segment.
    fn offset(&self, slot: u32) -> u64 {
        self.objects[slot as usize].allocation.as_ref().map_or(0, Allocation::offset)
    }

    /// Makes `slot` the DRAM copy of `entry` and enters it into the clock.
    pub fn publish(&mut self, slot: u32, entry: u32) {
        let object = &mut self.objects[slot as usize];
        object.entry = entry;
        self.clock.push_back((slot, object.generation));
        // A replaced or removed object leaves its position behind, skipped when the clock reaches it. The
        // clock runs only when the tier is full, so a workload that overwrites a working set smaller than
        // the tier would grow the queue by one position per put without end (8 bytes a put: gigabytes an
        // hour, and a page fault every 512 puts). Dropping the stale positions once they outnumber the
        // live ones keeps it within twice the resident objects, at amortised O(1) per put.
        if self.clock.len() > 2 * self.resident_objects() + STALE_POSITIONS_SLACK {
            self.drop_stale_positions();
        }
    }

    /// Whether a clock position still names the slot's current, published object.
    fn is_live(&self, slot: u32, generation: u32) -> bool {
        let object = &self.objects[slot as usize];
        object.generation == generation && object.entry != NONE_U32 && object.allocation.is_some()
    }

    /// Removes every stale position from the clock, keeping the order of the rest.
    fn drop_stale_positions(&mut self) {
        let mut clock = std::mem::take(&mut self.clock);
        clock.retain(|&(slot, generation)| self.is_live(slot, generation));
        self.clock = clock;
    }

    /// The entry a slot is the copy of, or `NONE_U32`.
    pub fn entry_of(&self, slot: u32) -> u32 {
        self.objects[slot as usize].entry
    }

    /// Starts loading the slot's bookkeeping (a put that replaces the object retires it shortly) or, with
    /// `bytes` (the bookkeeping asked for earlier), the first line of the object's bytes.
    pub fn prefetch(&self, slot: u32, bytes: bool) {
        let Some(object) = self.objects.get(slot as usize) else { return };
        match (&object.allocation, bytes) {
            (_, false) => crate::index::prefetch(object),
            (Some(allocation), true) => self.segment.prefetch(allocation.offset()),
            (None, true) => {}
        }
    }

    /// Detaches `slot` from its entry and frees it, now or when its last reader unpins.
    pub fn retire(&mut self, slot: u32) {
        let object = &mut self.objects[slot as usize];
        object.entry = NONE_U32;
        if object.pins == 0 {
            self.release(slot);
        }
    }

    fn release(&mut self, slot: u32) {
        let object = &mut self.objects[slot as usize];
        if let Some(allocation) = object.allocation.take() {
            // A handle this allocator made and that is freed once (taken out of the slot): cannot fail.
            let freed = self.allocator.free(allocation);
            debug_assert!(freed.is_ok(), "freeing a DRAM allocation: {freed:?}");
        }
        self.free_slots.push(slot);
    }

    /// A reader starts sending the slot's bytes.
    pub fn pin(&mut self, slot: u32) {
        self.objects[slot as usize].pins += 1;
    }

    /// A reader is done with the slot's bytes.
    pub fn unpin(&mut self, slot: u32) {
        let object = &mut self.objects[slot as usize];
        debug_assert!(object.pins > 0, "unpinning an unpinned slot");
        object.pins = object.pins.saturating_sub(1);
        if object.pins == 0 && object.entry == NONE_U32 && object.allocation.is_some() {
            self.release(slot);
        }
    }

    /// Whether readers are sending the slot's bytes.
    pub fn is_pinned(&self, slot: u32) -> bool {
        self.objects[slot as usize].pins > 0
    }

    /// The next published slot in clock order, taken off the clock (the caller puts it back with
    /// [`DramTier::requeue`] if it spares it). Stale clock positions (freed or reused slots) are skipped.
    pub fn next_candidate(&mut self) -> Option<u32> {
        while let Some((slot, generation)) = self.clock.pop_front() {
            if self.is_live(slot, generation) {
                return Some(slot);
            }
        }
        None
    }

    /// Puts a spared candidate back at the end of the clock.
    pub fn requeue(&mut self, slot: u32) {
        self.clock.push_back((slot, self.objects[slot as usize].generation));
    }

    /// Positions on the clock (an upper bound on the candidates an eviction pass may look at).
    pub fn clock_len(&self) -> usize {
        self.clock.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_retired_object_is_freed_by_its_last_reader() {
        let mut tier = DramTier::new(4 << 20, false).expect("tier");
        let (slot, _) = tier.allocate(1 << 20).expect("allocate");
        tier.publish(slot, 7);
        tier.pin(slot);
        tier.pin(slot);
        tier.retire(slot);
        assert_eq!(tier.allocated_bytes(), 1 << 20, "still held by readers");
        tier.unpin(slot);
        assert_eq!(tier.allocated_bytes(), 1 << 20);
        tier.unpin(slot);
        assert_eq!(tier.allocated_bytes(), 0);
        assert_eq!(tier.next_candidate(), None, "a retired slot is not a candidate");
    }

    #[test]
    fn a_reader_of_a_reservation_being_filled_does_not_free_it() {
        // A progressive put's readers pin its slot before it is published; the put still owns it after.
        let mut tier = DramTier::new(4 << 20, false).expect("tier");
        let (slot, _) = tier.allocate(1 << 20).expect("allocate");
        tier.pin(slot);
        tier.unpin(slot);
        assert_eq!(tier.allocated_bytes(), 1 << 20, "the put's reservation is intact");
        let (other, _) = tier.allocate(4096).expect("allocate");
        assert_ne!(other, slot, "and its slot is not handed out again");
        tier.pin(slot);
        tier.retire(slot);
        assert_eq!(tier.allocated_bytes(), (1 << 20) + 4096, "an abandoned put's reservation waits for its reader");
        tier.unpin(slot);
        assert_eq!(tier.allocated_bytes(), 4096);
    }

    #[test]
    fn the_clock_visits_slots_in_fill_order_and_skips_reused_ones() {
        let mut tier = DramTier::new(4 << 20, false).expect("tier");
        let (a, _) = tier.allocate(4096).expect("a");
        let (b, _) = tier.allocate(4096).expect("b");
        tier.publish(a, 1);
        tier.publish(b, 2);
        tier.retire(a);
        let (c, _) = tier.allocate(4096).expect("c");
        assert_eq!(c, a, "slot reused");
        tier.publish(c, 3);
        assert_eq!(tier.next_candidate(), Some(b));
        assert_eq!(tier.next_candidate(), Some(c));
        assert_eq!(tier.entry_of(c), 3);
        assert_eq!(tier.next_candidate(), None);
    }

    #[test]
    fn overwriting_a_small_working_set_keeps_the_clock_bounded() {
        let mut tier = DramTier::new(4 << 20, false).expect("tier");
        let mut live: Vec<u32> = Vec::new();
        // Ten live objects replaced 100,000 times: without eviction ever running.
        for round in 0..100_000u32 {
            if live.len() == 10 {
                let old = live.remove(0);
                tier.retire(old);
            }
            let (slot, _) = tier.allocate(64).expect("room");
            tier.publish(slot, round);
            live.push(slot);
            assert!(tier.clock_len() <= 2 * 10 + STALE_POSITIONS_SLACK + 1, "round {round}: {}", tier.clock_len());
        }
        // The live objects are still on the clock, oldest first.
        let mut visited = Vec::new();
        while let Some(slot) = tier.next_candidate() {
            visited.push(slot);
        }
        assert_eq!(visited, live);
    }
}
