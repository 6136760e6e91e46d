//! The size-class front: exact-fit slabs for the dominant sizes.
//!
//! A KV-cache deployment writes a few object sizes (one per model and layout) that are rarely bin values, so
//! the bins alone either round them up or strand exact-size holes. Here each dominant size (a *class*, named in
//! the configuration or learned from the stream) gets slabs: runs of up to 64 slots of exactly that size,
//! carved from the core arena as one extent. A slot is found with one bit scan of the slab's free mask, and
//! slabs with a free slot sit on the class's list, so both operations stay O(1). A slab goes back to the
//! arena the moment its last slot is freed, so classes do not hoard memory when the mix changes; at the end
//! of the arena a class carves smaller slabs (halving the slot count down to one) rather than fail while a
//! slot's worth of space is left.

use crate::core::{CoreAllocator, CoreError, NONE};
use crate::learner::{LearnerConfig, SizeLearner};

/// Size classes at most, configured and learned together.
pub(crate) const MAX_CLASSES: usize = 16;
/// Slots per slab at most: one `u64` free mask.
const MAX_SLOTS_PER_SLAB: u64 = 64;
/// A new slab takes at most 1/64 of the free extents' space. Measured on the three-class-noise workload (8 GiB,
/// six seeds): 1/8 gives a steady state of 0.974 and leaves a partly used slab stranded at first failure,
/// 1/64 gives 0.982 and matches the bins at first failure, 1/128 gains nothing more.
const SLAB_SHRINK_RATIO: u64 = 64;

#[derive(Clone, Copy, Debug)]
struct SizeClass {
    slot_units: u64,
    slots_per_slab: u64,
    /// Slabs of this class with at least one free slot, linked through `Slab::prev/next`.
    partial_head: u32,
    slab_count: u32,
    slots_total: u64,
    slots_used: u64,
    learned: bool,
    /// The front's request counter at this class's last request, to pick a cold class to replace.
    last_request: u64,
}

#[derive(Clone, Copy, Debug)]
struct Slab {
    base_units: u64,
    /// Bit `i` set: slot `i` is free.
    free_mask: u64,
    /// The core region that holds the slab; `NONE` for a slab entry not in use (then `next` links the pool).
    core_node: u32,
    prev: u32,
    next: u32,
    class: u8,
    slot_count: u8,
}

impl Slab {
    fn full_mask(&self) -> u64 {
        if self.slot_count == 64 { u64::MAX } else { (1u64 << self.slot_count) - 1 }
    }
}

/// A slot handed out: the slab it lives in, its index there, and its offset in units.
pub(crate) struct SlotPlace {
    pub(crate) slab: u32,
    pub(crate) slot: u8,
    pub(crate) offset_units: u64,
}

/// Occupancy of one class, in units; the public stats convert to bytes.
pub(crate) struct ClassUsage {
    pub(crate) slot_units: u64,
    pub(crate) learned: bool,
    pub(crate) slab_count: u32,
    pub(crate) slots_total: u64,
    pub(crate) slots_used: u64,
}

/// How the front is set up, in units.
pub(crate) struct FrontConfig {
    pub(crate) configured_slot_units: Vec<u64>,
    pub(crate) learner: Option<LearnerConfig>,
    pub(crate) slab_target_units: u64,
    pub(crate) max_slabs: usize,
}

pub(crate) struct SizeClassFront {
    classes: Vec<SizeClass>,
    slabs: Vec<Slab>,
    slab_capacity: usize,
    released_slabs_head: u32,
    learner: Option<SizeLearner>,
    slab_target_units: u64,
    requests: u64,
    /// Free slots of all slabs, in units.
    slab_free_units: u64,
}

impl SizeClassFront {
    pub(crate) fn new(config: FrontConfig) -> Self {
        let mut front = Self {
            classes: Vec::with_capacity(MAX_CLASSES),
            slabs: Vec::with_capacity(config.max_slabs),
            slab_capacity: config.max_slabs,
            released_slabs_head: NONE,
            learner: config.learner.map(SizeLearner::new),
            slab_target_units: config.slab_target_units.max(1),
            requests: 0,
            slab_free_units: 0,
        };
        for slot_units in config.configured_slot_units {
            if front.class_of(slot_units).is_none() && front.classes.len() < MAX_CLASSES {
                let class = front.new_class(slot_units, false);
                front.classes.push(class);
            }
        }
        front
    }

    /// The class that serves `size_units`, if any. Call once per allocation attempt.
    pub(crate) fn route(&mut self, size_units: u64) -> Option<usize> {
        self.requests += 1;
        let class = self.class_of(size_units)?;
        self.classes[class].last_request = self.requests;
        Some(class)
    }

    /// Learns from an allocation the bins served (of a size no class serves). Called after the allocation
    /// succeeded, not per attempt: a caller that retries a failing request after each eviction would otherwise
    /// make any size it retries look dominant. A size promoted here is served by its class from the next
    /// request on.
    pub(crate) fn learn(&mut self, size_units: u64) {
        let Some(learner) = self.learner.as_mut() else {
            return;
        };
        learner.tick();
        // A size of which a slab holds fewer than two slots gains nothing from a class.
        if self.slab_target_units / size_units < 2 || !learner.observe(size_units) {
            return;
        }
        learner.forget(size_units);
        self.promote(size_units);
    }

    /// Moves the learning window on for an allocation a class served.
    pub(crate) fn learn_class_hit(&mut self) {
        if let Some(learner) = self.learner.as_mut() {
            learner.tick();
        }
    }

    fn class_of(&self, size_units: u64) -> Option<usize> {
        self.classes.iter().position(|class| class.slot_units == size_units)
    }

    fn new_class(&self, slot_units: u64, learned: bool) -> SizeClass {
        SizeClass {
            slot_units,
            slots_per_slab: (self.slab_target_units / slot_units).clamp(1, MAX_SLOTS_PER_SLAB),
            partial_head: NONE,
            slab_count: 0,
            slots_total: 0,
            slots_used: 0,
            learned,
            last_request: self.requests,
        }
    }

    /// Makes `size_units` a class: in a free entry, or in place of the least recently requested learned class
    /// that has no slab left. Configured classes are never replaced.
    fn promote(&mut self, size_units: u64) {
        let class = self.new_class(size_units, true);
        if self.classes.len() < MAX_CLASSES {
            self.classes.push(class);
            return;
        }
        let replaced = self
            .classes
            .iter()
            .enumerate()
            .filter(|(_, class)| class.learned && class.slab_count == 0)
            .min_by_key(|(_, class)| class.last_request)
            .map(|(index, _)| index);
        if let Some(replaced) = replaced {
            self.classes[replaced] = class;
        }
    }

    pub(crate) fn slot_units(&self, class: usize) -> u64 {
        self.classes[class].slot_units
    }

    /// A free slot of `class`, carving a new slab from `core` when the class has none.
    pub(crate) fn allocate(&mut self, core: &mut CoreAllocator, class: usize) -> Result<SlotPlace, CoreError> {
        if self.classes[class].partial_head == NONE {
            self.carve_slab(core, class)?;
        }
        let slab_index = self.classes[class].partial_head;
        let slab = &mut self.slabs[slab_index as usize];
        let slot = slab.free_mask.trailing_zeros();
        slab.free_mask &= !(1u64 << slot);
        let now_full = slab.free_mask == 0;
        let offset_units = slab.base_units + u64::from(slot) * self.classes[class].slot_units;
        if now_full {
            self.unlink_partial(slab_index);
        }
        let class_state = &mut self.classes[class];
        class_state.slots_used += 1;
        self.slab_free_units -= class_state.slot_units;
        Ok(SlotPlace { slab: slab_index, slot: slot as u8, offset_units })
    }

    /// Frees a slot. Returns its class's slot size in units, or `None` when `(slab, slot, offset)` is not a
    /// slot in use (a corrupted handle; nothing is changed then).
    pub(crate) fn free(
        &mut self,
        core: &mut CoreAllocator,
        slab_index: u32,
        slot: u8,
        offset_units: u64,
    ) -> Option<u64> {
        let slab = *self.slabs.get(slab_index as usize)?;
        let bit = 1u64.checked_shl(u32::from(slot))?;
        if slab.core_node == NONE || slot >= slab.slot_count || slab.free_mask & bit != 0 {
            return None;
        }
        let class = slab.class as usize;
        let slot_units = self.classes[class].slot_units;
        if slab.base_units + u64::from(slot) * slot_units != offset_units {
            return None;
        }
        let was_full = slab.free_mask == 0;
        let free_mask = slab.free_mask | bit;
        self.slabs[slab_index as usize].free_mask = free_mask;
        self.classes[class].slots_used -= 1;
        self.slab_free_units += slot_units;
        if was_full {
            self.link_partial(slab_index);
        }
        if free_mask == slab.full_mask() {
            self.release_slab(core, slab_index);
        }
        Some(slot_units)
    }

    pub(crate) fn slab_free_units(&self) -> u64 {
        self.slab_free_units
    }

    pub(crate) fn usage(&self) -> impl Iterator<Item = ClassUsage> + '_ {
        self.classes.iter().map(|class| ClassUsage {
            slot_units: class.slot_units,
            learned: class.learned,
            slab_count: class.slab_count,
            slots_total: class.slots_total,
            slots_used: class.slots_used,
        })
    }

    /// Forgets every slab (the core is reset by the caller); classes and what was learned stay.
    pub(crate) fn reset(&mut self) {
        self.slabs.clear();
        self.released_slabs_head = NONE;
        self.slab_free_units = 0;
        for class in &mut self.classes {
            class.partial_head = NONE;
            class.slab_count = 0;
            class.slots_total = 0;
            class.slots_used = 0;
        }
    }

    pub(crate) fn reserved_metadata_bytes(&self) -> usize {
        self.slabs.capacity() * std::mem::size_of::<Slab>()
    }

    pub(crate) fn touched_metadata_bytes(&self) -> usize {
        self.slabs.len() * std::mem::size_of::<Slab>()
    }

    fn carve_slab(&mut self, core: &mut CoreAllocator, class: usize) -> Result<(), CoreError> {
        let slot_units = self.classes[class].slot_units;
        // As the arena runs out, slabs shrink with the free space left: the last slabs of each class are small,
        // so little is stranded in partly used slabs of one class when a request of another fails.
        let mut slot_count =
            self.classes[class].slots_per_slab.min((core.free_units() / (SLAB_SHRINK_RATIO * slot_units)).max(1));
        let (core_node, base_units) = loop {
            match core.allocate(slot_count * slot_units) {
                Ok(region) => break region,
                // Near the end of the arena, a smaller slab still uses what is left.
                Err(CoreError::NoSpace) if slot_count > 1 => slot_count /= 2,
                Err(error) => return Err(error),
            }
        };
        let slab = Slab {
            base_units,
            free_mask: if slot_count == 64 { u64::MAX } else { (1u64 << slot_count) - 1 },
            core_node,
            prev: NONE,
            next: NONE,
            class: class as u8,
            slot_count: slot_count as u8,
        };
        let slab_index = match self.take_slab_entry(slab) {
            Some(index) => index,
            None => {
                core.free(core_node);
                return Err(CoreError::OutOfNodes);
            }
        };
        let class_state = &mut self.classes[class];
        class_state.slab_count += 1;
        class_state.slots_total += slot_count;
        self.slab_free_units += slot_count * slot_units;
        self.link_partial(slab_index);
        Ok(())
    }

    fn take_slab_entry(&mut self, slab: Slab) -> Option<u32> {
        if self.released_slabs_head != NONE {
            let index = self.released_slabs_head;
            self.released_slabs_head = self.slabs[index as usize].next;
            self.slabs[index as usize] = slab;
            return Some(index);
        }
        if self.slabs.len() >= self.slab_capacity {
            return None;
        }
        // Within the capacity reserved in `new`: never reallocates.
        self.slabs.push(slab);
        Some((self.slabs.len() - 1) as u32)
    }

    fn release_slab(&mut self, core: &mut CoreAllocator, slab_index: u32) {
        self.unlink_partial(slab_index);
        let slab = self.slabs[slab_index as usize];
        core.free(slab.core_node);
        let class = &mut self.classes[slab.class as usize];
        let slot_count = u64::from(slab.slot_count);
        class.slab_count -= 1;
        class.slots_total -= slot_count;
        self.slab_free_units -= slot_count * class.slot_units;
        let released = &mut self.slabs[slab_index as usize];
        released.core_node = NONE;
        released.next = self.released_slabs_head;
        self.released_slabs_head = slab_index;
    }

    fn link_partial(&mut self, slab_index: u32) {
        let class = self.slabs[slab_index as usize].class as usize;
        let head = self.classes[class].partial_head;
        let slab = &mut self.slabs[slab_index as usize];
        slab.prev = NONE;
        slab.next = head;
        if head != NONE {
            self.slabs[head as usize].prev = slab_index;
        }
        self.classes[class].partial_head = slab_index;
    }

    fn unlink_partial(&mut self, slab_index: u32) {
        let slab = self.slabs[slab_index as usize];
        if slab.prev != NONE {
            self.slabs[slab.prev as usize].next = slab.next;
        } else {
            self.classes[slab.class as usize].partial_head = slab.next;
        }
        if slab.next != NONE {
            self.slabs[slab.next as usize].prev = slab.prev;
        }
        let unlinked = &mut self.slabs[slab_index as usize];
        unlinked.prev = NONE;
        unlinked.next = NONE;
    }

    /// Walks every slab and class and panics on the first broken invariant. O(n).
    pub(crate) fn assert_invariants(&self, core: &CoreAllocator) {
        let mut slab_free_units = 0;
        for (index, class) in self.classes.iter().enumerate() {
            let mut slabs = 0;
            let mut slots_total = 0;
            let mut slots_free = 0;
            for slab in self.slabs.iter().filter(|slab| slab.core_node != NONE && slab.class as usize == index) {
                slabs += 1;
                slots_total += u64::from(slab.slot_count);
                assert_eq!(slab.free_mask & !slab.full_mask(), 0, "free mask beyond the slab's slots");
                assert_ne!(slab.free_mask, slab.full_mask(), "an empty slab was kept");
                slots_free += u64::from(slab.free_mask.count_ones());
                assert!(
                    core.is_used_at(slab.core_node, slab.base_units, u64::from(slab.slot_count) * class.slot_units),
                    "slab does not own its core region"
                );
            }
            let mut partial = 0;
            let mut node = class.partial_head;
            let mut previous = NONE;
            while node != NONE {
                let slab = &self.slabs[node as usize];
                assert_eq!(slab.class as usize, index, "slab on another class's list");
                assert_ne!(slab.free_mask, 0, "full slab on the partial list");
                assert_eq!(slab.prev, previous, "broken partial list");
                partial += 1;
                previous = node;
                node = slab.next;
            }
            let with_free_slot = self
                .slabs
                .iter()
                .filter(|slab| slab.core_node != NONE && slab.class as usize == index && slab.free_mask != 0)
                .count();
            assert_eq!(partial, with_free_slot, "partial list of class {index}");
            assert_eq!(slabs, class.slab_count, "slab count of class {index}");
            assert_eq!(slots_total, class.slots_total, "slot total of class {index}");
            assert_eq!(slots_total - slots_free, class.slots_used, "used slots of class {index}");
            slab_free_units += slots_free * class.slot_units;
        }
        assert_eq!(slab_free_units, self.slab_free_units, "free slot counter");
    }
}
