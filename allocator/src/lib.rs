//! `strata-alloc`: the offset allocator that Strata's DRAM and HBM segments and NVMe extents are carved from.
//!
//! It hands out *offsets* into an arena of `capacity` bytes; it never touches the arena's memory, so the same
//! allocator serves a hugepage segment, GPU memory or a range of a namespace. Two layers, both O(1):
//!
//! - **The core** (OffsetAllocator's design): free extents in 256 small-float bins (3-bit mantissa) found by a
//!   two-level bitmap, immediate coalescing with both neighbours, region nodes from a pool reserved up
//!   front, so no operation allocates from the heap. A bounded exact-fit scan (see
//!   [`AllocatorConfig::exact_fit_scan_limit`]) reuses exact-size holes that the bins alone strand.
//! - **The size-class front**: the few sizes that dominate a KV-cache workload, configured or learned from the
//!   request stream, are served from exact-fit slabs carved from the core in large extents and returned to
//!   it when empty. A mix of two or three model sizes then loses nothing to rounding and little to
//!   fragmentation between them. Other sizes go to the core.
//!
//! Handles ([`Allocation`]) are neither `Clone` nor `Copy` and `free` consumes them, so a double free cannot
//! be written in safe code; a handle from another allocator, or from before a [`Allocator::reset`], is
//! refused with an error.
//!
//! ```
//! use strata_alloc::{Allocator, AllocatorConfig};
//!
//! let mut allocator = Allocator::new(AllocatorConfig::new(1 << 30, 4096, 1 << 16))?;
//! let block = allocator.allocate(4_497_408)?;
//! assert_eq!(block.offset() % 4096, 0);
//! allocator.free(block)?;
//! assert_eq!(allocator.stats().free_extents, 1);
//! # Ok::<(), strata_alloc::AllocError>(())
//! ```
#![deny(missing_docs, unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod bins;
mod classes;
mod core;
mod error;
mod learner;

use std::sync::atomic::{AtomicU32, Ordering};

use crate::classes::{FrontConfig, SizeClassFront};
use crate::core::{CoreAllocator, CoreError};
use crate::learner::LearnerConfig;

pub use crate::error::AllocError;

/// Sizes of classes the front serves at most (configured and learned together).
pub const MAX_SIZE_CLASSES: usize = classes::MAX_CLASSES;

/// How an [`Allocator`] is set up.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocatorConfig {
    /// Size of the arena. A multiple of `alignment_bytes`.
    pub capacity_bytes: u64,
    /// Every offset handed out is a multiple of this, and sizes are rounded up to it. A power of two; 4 KiB
    /// suits direct I/O and DMA, 64 B a cache line.
    pub alignment_bytes: u64,
    /// Live allocations at most. The node pool (32 bytes per node, two nodes per allocation at worst) and the
    /// slab table are reserved for this many up front.
    pub max_allocations: u32,
    /// When the bitmap search finds no bin that is certain to fit, look at up to this many extents of the
    /// bin that holds extents just below the request's rounded-up size, and take the first that fits.
    /// Bounded, so allocation stays O(1). 0 gives exactly OffsetAllocator's behaviour.
    pub exact_fit_scan_limit: u32,
    /// The size-class front.
    pub size_classes: SizeClassConfig,
}

/// The size-class front's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct SizeClassConfig {
    /// Off: every request goes to the bins (OffsetAllocator behaviour, with `exact_fit_scan_limit` 0).
    pub enabled: bool,
    /// Sizes served by slabs from the start (e.g. the KV block size of each model a node serves).
    pub sizes_bytes: Vec<u64>,
    /// Learn further classes from the request stream.
    pub learn: bool,
    /// Requests per learning window; counts of sizes are halved at the end of each window.
    pub learn_window_requests: u32,
    /// Share of a window's requests a size must reach to become a class.
    pub learn_share: f64,
    /// Target size of one slab (up to 64 slots). Capped at 1/16 of the arena so small arenas hold many slabs.
    pub slab_target_bytes: u64,
}

impl Default for SizeClassConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            sizes_bytes: Vec::new(),
            learn: true,
            learn_window_requests: 1024,
            learn_share: 1.0 / 16.0,
            slab_target_bytes: 32 << 20,
        }
    }
}

impl AllocatorConfig {
    /// An arena with Strata's defaults: size classes on and learned, exact-fit scan of 8 extents.
    pub fn new(capacity_bytes: u64, alignment_bytes: u64, max_allocations: u32) -> Self {
        Self {
            capacity_bytes,
            alignment_bytes,
            max_allocations,
            exact_fit_scan_limit: 8,
            size_classes: SizeClassConfig::default(),
        }
    }

    /// The same arena behaving exactly like OffsetAllocator (Mooncake Store's allocator): bins only, no
    /// exact-fit scan. The baseline that the `bins` mode of `strata-bench alloc` measures.
    pub fn offset_allocator_compatible(mut self) -> Self {
        self.exact_fit_scan_limit = 0;
        self.size_classes.enabled = false;
        self
    }

    /// Adds a configured size class.
    pub fn with_size_class(mut self, size_bytes: u64) -> Self {
        self.size_classes.sizes_bytes.push(size_bytes);
        self
    }
}

/// A live allocation: `len()` bytes at `offset()` of the arena.
///
/// Not `Clone`: the one handle is given back to [`Allocator::free`], which consumes it.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "an allocation that is dropped instead of freed leaks its space until the allocator is reset"]
pub struct Allocation {
    offset_bytes: u64,
    size_bytes: u64,
    place: Place,
    owner: u32,
    epoch: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// An extent of the core, owned by this node.
    Extent { node: u32 },
    /// A slot of a slab.
    Slot { slab: u32, slot: u8 },
}

impl Allocation {
    /// Offset of the first byte in the arena; a multiple of the arena's alignment.
    pub fn offset(&self) -> u64 {
        self.offset_bytes
    }

    /// The size that was asked for.
    pub fn len(&self) -> u64 {
        self.size_bytes
    }

    /// Always false: zero-byte allocations are refused.
    pub fn is_empty(&self) -> bool {
        self.size_bytes == 0
    }

    /// Whether a size-class slab serves it (rather than the bins).
    pub fn is_from_size_class(&self) -> bool {
        matches!(self.place, Place::Slot { .. })
    }
}

/// A snapshot of an allocator's accounting. Every byte of the arena is in exactly one of
/// `allocated_bytes`, `rounding_loss_bytes`, `slab_free_bytes` and `free_bytes`.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocatorStats {
    /// Size of the arena.
    pub capacity_bytes: u64,
    /// Live allocations.
    pub live_allocations: u32,
    /// Bytes asked for by live allocations.
    pub allocated_bytes: u64,
    /// Bytes reserved beyond what live allocations asked for (alignment, slot size).
    pub rounding_loss_bytes: u64,
    /// Free slots inside slabs: usable by their class only.
    pub slab_free_bytes: u64,
    /// Bytes in free extents of the arena, usable by any request that fits in one.
    pub free_bytes: u64,
    /// The largest free extent.
    pub largest_free_extent_bytes: u64,
    /// Number of free extents (1 for an empty arena).
    pub free_extents: u64,
    /// One entry per size class.
    pub classes: Vec<ClassStats>,
}

impl AllocatorStats {
    /// `allocated_bytes / capacity_bytes`.
    pub fn utilization(&self) -> f64 {
        self.allocated_bytes as f64 / self.capacity_bytes as f64
    }
}

/// Occupancy of one size class.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassStats {
    /// The slot size (the class's size rounded up to the arena's alignment).
    pub size_bytes: u64,
    /// Learned from the request stream, rather than configured.
    pub learned: bool,
    /// Slabs carved for this class now.
    pub slabs: u32,
    /// Slots in those slabs.
    pub slots_total: u64,
    /// Slots in use.
    pub slots_used: u64,
}

impl ClassStats {
    /// `slots_used / slots_total`, 0 for a class without slabs.
    pub fn occupancy(&self) -> f64 {
        if self.slots_total == 0 { 0.0 } else { self.slots_used as f64 / self.slots_total as f64 }
    }
}

/// One extent of the arena in address order, as [`Allocator::extents`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Offset of its first byte.
    pub offset_bytes: u64,
    /// Its size.
    pub size_bytes: u64,
    /// Held by an allocation of the bins or by a slab.
    pub in_use: bool,
}

/// The allocator's own memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetadataBytes {
    /// Address space reserved up front for the node pool and slab table.
    pub reserved: usize,
    /// The part of it touched so far (high-water mark); what is resident.
    pub touched: usize,
}

/// An arena of offsets. One owner (a shard) calls it; it is `Send` but holds no lock.
pub struct Allocator {
    id: u32,
    epoch: u32,
    alignment_shift: u32,
    capacity_units: u64,
    max_request_units: u64,
    max_allocations: u32,
    live_allocations: u32,
    allocated_bytes: u64,
    reserved_units: u64,
    core: CoreAllocator,
    front: Option<SizeClassFront>,
}

static NEXT_ALLOCATOR_ID: AtomicU32 = AtomicU32::new(1);

impl Allocator {
    /// Reserves the allocator's metadata for `config.max_allocations` and makes the arena one free extent.
    pub fn new(config: AllocatorConfig) -> Result<Self, AllocError> {
        let invalid = |reason: String| Err(AllocError::InvalidConfig { reason });
        if config.alignment_bytes == 0 || !config.alignment_bytes.is_power_of_two() {
            return invalid(format!("alignment_bytes {} is not a power of two", config.alignment_bytes));
        }
        if config.capacity_bytes == 0 || !config.capacity_bytes.is_multiple_of(config.alignment_bytes) {
            return invalid(format!(
                "capacity_bytes {} is not a positive multiple of alignment_bytes {}",
                config.capacity_bytes, config.alignment_bytes
            ));
        }
        if config.max_allocations == 0 || config.max_allocations == u32::MAX {
            return invalid(format!("max_allocations {} is not in 1..2^32-1", config.max_allocations));
        }
        let classes = &config.size_classes;
        if classes.enabled && classes.learn && !(classes.learn_share > 0.0 && classes.learn_share <= 1.0) {
            return invalid(format!("learn_share {} is not in (0, 1]", classes.learn_share));
        }
        let alignment_shift = config.alignment_bytes.trailing_zeros();
        let capacity_units = config.capacity_bytes >> alignment_shift;
        let max_request_units = capacity_units.min(bins::max_request_units());
        let max_allocations = config.max_allocations as usize;
        // Used extents never outnumber live allocations (a slab holds at least one), and free extents are
        // separated by used ones: 2n + 1 nodes always suffice, so the pool is never the limit.
        let node_capacity = 2 * max_allocations + 1;
        let front = if classes.enabled {
            let mut configured_slot_units = Vec::with_capacity(classes.sizes_bytes.len());
            for &size_bytes in &classes.sizes_bytes {
                let units = size_bytes.div_ceil(config.alignment_bytes);
                if units == 0 || units > max_request_units {
                    return invalid(format!("size class of {size_bytes} bytes does not fit the arena"));
                }
                configured_slot_units.push(units);
            }
            let slab_target_units = (classes.slab_target_bytes >> alignment_shift).min(capacity_units / 16).max(1);
            let learner = classes.learn.then_some(LearnerConfig {
                window_requests: classes.learn_window_requests,
                promote_share: classes.learn_share,
            });
            Some(SizeClassFront::new(FrontConfig {
                configured_slot_units,
                learner,
                slab_target_units,
                max_slabs: max_allocations,
            }))
        } else {
            None
        };
        Ok(Self {
            id: NEXT_ALLOCATOR_ID.fetch_add(1, Ordering::Relaxed),
            epoch: 0,
            alignment_shift,
            capacity_units,
            max_request_units,
            max_allocations: config.max_allocations,
            live_allocations: 0,
            allocated_bytes: 0,
            reserved_units: 0,
            core: CoreAllocator::new(capacity_units, node_capacity, config.exact_fit_scan_limit),
            front,
        })
    }

    /// Reserves `size_bytes` (rounded up to the alignment). O(1).
    pub fn allocate(&mut self, size_bytes: u64) -> Result<Allocation, AllocError> {
        let result = self.allocate_inner(size_bytes);
        self.check_invariants_if_enabled();
        result
    }

    fn allocate_inner(&mut self, size_bytes: u64) -> Result<Allocation, AllocError> {
        if size_bytes == 0 {
            return Err(AllocError::ZeroSize);
        }
        let size_units = size_bytes.div_ceil(1u64 << self.alignment_shift);
        if size_units > self.max_request_units {
            return Err(AllocError::TooLarge { size_bytes, max_bytes: self.max_request_units << self.alignment_shift });
        }
        if self.live_allocations >= self.max_allocations {
            return Err(AllocError::TooManyAllocations { max_allocations: self.max_allocations });
        }
        let class = self.front.as_mut().and_then(|front| front.route(size_units));
        let placed = match (class, self.front.as_mut()) {
            (Some(class), Some(front)) => front.allocate(&mut self.core, class).map(|slot| {
                front.learn_class_hit();
                (Place::Slot { slab: slot.slab, slot: slot.slot }, slot.offset_units, front.slot_units(class))
            }),
            (_, Some(front)) => self.core.allocate_from_end(size_units).map(|(node, offset_units)| {
                front.learn(size_units);
                (Place::Extent { node }, offset_units, size_units)
            }),
            (_, None) => self
                .core
                .allocate(size_units)
                .map(|(node, offset_units)| (Place::Extent { node }, offset_units, size_units)),
        };
        let (place, offset_units, reserved_units) = placed.map_err(|error| self.core_error(error, size_bytes))?;
        self.live_allocations += 1;
        self.allocated_bytes += size_bytes;
        self.reserved_units += reserved_units;
        Ok(Allocation {
            offset_bytes: offset_units << self.alignment_shift,
            size_bytes,
            place,
            owner: self.id,
            epoch: self.epoch,
        })
    }

    fn core_error(&self, error: CoreError, size_bytes: u64) -> AllocError {
        match error {
            CoreError::NoSpace => {
                AllocError::NoSpace { size_bytes, free_bytes: self.core.free_units() << self.alignment_shift }
            }
            CoreError::OutOfNodes => AllocError::TooManyAllocations { max_allocations: self.max_allocations },
        }
    }

    /// Returns an allocation's space. O(1). A handle of another allocator, or from before a reset, is refused
    /// (and dropped: its space is not this allocator's to reclaim).
    pub fn free(&mut self, allocation: Allocation) -> Result<(), AllocError> {
        let result = self.free_inner(allocation);
        self.check_invariants_if_enabled();
        result
    }

    fn free_inner(&mut self, allocation: Allocation) -> Result<(), AllocError> {
        if allocation.owner != self.id {
            return Err(AllocError::ForeignHandle);
        }
        if allocation.epoch != self.epoch {
            return Err(AllocError::StaleHandle);
        }
        let offset_units = allocation.offset_bytes >> self.alignment_shift;
        let reserved_units = match allocation.place {
            Place::Extent { node } => {
                let size_units = allocation.size_bytes.div_ceil(1u64 << self.alignment_shift);
                if !self.core.is_used_at(node, offset_units, size_units) {
                    return Err(AllocError::InvalidHandle);
                }
                self.core.free(node);
                size_units
            }
            Place::Slot { slab, slot } => {
                let front = self.front.as_mut().ok_or(AllocError::InvalidHandle)?;
                front.free(&mut self.core, slab, slot, offset_units).ok_or(AllocError::InvalidHandle)?
            }
        };
        self.live_allocations -= 1;
        self.allocated_bytes -= allocation.size_bytes;
        self.reserved_units -= reserved_units;
        Ok(())
    }

    /// Frees everything at once: the arena becomes one free extent and every outstanding handle becomes
    /// stale. Size classes, configured and learned, are kept.
    pub fn reset(&mut self) {
        self.core.reset();
        if let Some(front) = &mut self.front {
            front.reset();
        }
        self.epoch = self.epoch.wrapping_add(1);
        self.live_allocations = 0;
        self.allocated_bytes = 0;
        self.reserved_units = 0;
    }

    /// The arena's size.
    pub fn capacity(&self) -> u64 {
        self.capacity_units << self.alignment_shift
    }

    /// Bytes asked for by live allocations (O(1), unlike [`Allocator::stats`]).
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated_bytes
    }

    /// The accounting. Walks one bin's list for the largest free extent, so do not call it per operation.
    pub fn stats(&self) -> AllocatorStats {
        let shift = self.alignment_shift;
        let classes: Vec<ClassStats> = self
            .front
            .iter()
            .flat_map(|front| front.usage())
            .map(|usage| ClassStats {
                size_bytes: usage.slot_units << shift,
                learned: usage.learned,
                slabs: usage.slab_count,
                slots_total: usage.slots_total,
                slots_used: usage.slots_used,
            })
            .collect();
        let slab_free_units = self.front.as_ref().map_or(0, SizeClassFront::slab_free_units);
        AllocatorStats {
            capacity_bytes: self.capacity(),
            live_allocations: self.live_allocations,
            allocated_bytes: self.allocated_bytes,
            rounding_loss_bytes: (self.reserved_units << shift) - self.allocated_bytes,
            slab_free_bytes: slab_free_units << shift,
            free_bytes: self.core.free_units() << shift,
            largest_free_extent_bytes: self.core.largest_free_units() << shift,
            free_extents: self.core.free_region_count(),
            classes,
        }
    }

    /// The arena's extents in address order (a slab is one extent in use).
    pub fn extents(&self) -> impl Iterator<Item = Extent> + '_ {
        let shift = self.alignment_shift;
        self.core.extents().map(move |extent| Extent {
            offset_bytes: extent.offset_units << shift,
            size_bytes: extent.size_units << shift,
            in_use: extent.used,
        })
    }

    /// The allocator's own memory: what was reserved up front and what has been touched.
    pub fn metadata_bytes(&self) -> MetadataBytes {
        let front = self.front.as_ref();
        MetadataBytes {
            reserved: self.core.reserved_metadata_bytes() + front.map_or(0, SizeClassFront::reserved_metadata_bytes),
            touched: self.core.touched_metadata_bytes() + front.map_or(0, SizeClassFront::touched_metadata_bytes),
        }
    }

    /// Walks every internal structure and panics on a broken invariant: extents tile the arena, no two free
    /// extents are adjacent, bins and bitmaps agree, slabs own their extents, every counter is exact. O(n).
    pub fn assert_invariants(&self) {
        self.core.assert_invariants();
        let slab_free_units = match &self.front {
            Some(front) => {
                front.assert_invariants(&self.core);
                front.slab_free_units()
            }
            None => 0,
        };
        let used_units: u64 = self.core.extents().filter(|extent| extent.used).map(|extent| extent.size_units).sum();
        assert_eq!(used_units, self.reserved_units + slab_free_units, "used extents = reserved + free slots");
        assert_eq!(self.core.free_units() + used_units, self.capacity_units, "every unit is free or used");
    }

    fn check_invariants_if_enabled(&self) {
        if cfg!(feature = "invariants") {
            self.assert_invariants();
        }
    }
}
