//! Property test: random sequences of allocate / free / reset, in every mode, checked after each step against
//! a reference model (a map of live ranges) and the allocator's own extent list.

use std::collections::BTreeMap;

use proptest::prelude::*;
use strata_alloc::{AllocError, Allocation, Allocator, AllocatorConfig};

#[derive(Clone, Debug)]
enum Op {
    Allocate(u64),
    /// Frees the live allocation at this index (modulo the number live).
    Free(usize),
    Reset,
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    OffsetAllocator,
    LearnedClasses,
    ConfiguredClasses,
}

const CLASS_SIZES: [u64; 3] = [12_288, 40_960, 3_000];

fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        // The dominant sizes, so that classes are learned and slabs fill, empty and are returned.
        6 => prop::sample::select(CLASS_SIZES.to_vec()),
        3 => 1u64..70_000,
        // Edge sizes: zero and larger than any arena below.
        1 => prop::sample::select(vec![0, 1, 1 << 40]),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => size_strategy().prop_map(Op::Allocate),
        8 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::Reset),
    ]
}

fn config(mode: Mode, capacity_bytes: u64, alignment_bytes: u64) -> AllocatorConfig {
    let mut config = AllocatorConfig::new(capacity_bytes, alignment_bytes, 512);
    // Small windows so that learning happens within a test case.
    config.size_classes.learn_window_requests = 32;
    config.size_classes.learn_share = 0.2;
    config.size_classes.slab_target_bytes = 64 << 10;
    match mode {
        Mode::OffsetAllocator => config.offset_allocator_compatible(),
        Mode::LearnedClasses => config,
        Mode::ConfiguredClasses => {
            config.size_classes.learn = false;
            CLASS_SIZES.iter().fold(config, |config, &size| config.with_size_class(size))
        }
    }
}

struct Model {
    capacity_bytes: u64,
    alignment_bytes: u64,
    /// offset → requested size of each live allocation.
    live: BTreeMap<u64, u64>,
}

impl Model {
    fn overlaps(&self, offset: u64, size: u64) -> bool {
        let before = self.live.range(..=offset).next_back();
        let after = self.live.range(offset..).next();
        before.is_some_and(|(&start, &len)| start + len > offset)
            || after.is_some_and(|(&start, _)| start < offset + size)
    }

    fn allocated_bytes(&self) -> u64 {
        self.live.values().sum()
    }
}

/// Everything that must hold after any operation.
fn check_against_model(allocator: &Allocator, model: &Model) {
    allocator.assert_invariants();
    let stats = allocator.stats();
    assert_eq!(stats.live_allocations as usize, model.live.len(), "live allocations");
    assert_eq!(stats.allocated_bytes, model.allocated_bytes(), "allocated bytes");
    assert_eq!(
        stats.allocated_bytes + stats.rounding_loss_bytes + stats.slab_free_bytes + stats.free_bytes,
        model.capacity_bytes,
        "every byte is allocated, lost to rounding, a free slot or free: {stats:?}"
    );

    // The extents tile the arena; free ones match the stats; each live allocation lies inside one in use.
    let extents: Vec<_> = allocator.extents().collect();
    let mut expected_offset = 0;
    for extent in &extents {
        assert_eq!(extent.offset_bytes, expected_offset, "extents tile the arena");
        expected_offset += extent.size_bytes;
    }
    assert_eq!(expected_offset, model.capacity_bytes);
    let free: Vec<_> = extents.iter().filter(|extent| !extent.in_use).collect();
    assert_eq!(free.len() as u64, stats.free_extents, "free extent count");
    assert_eq!(free.iter().map(|extent| extent.size_bytes).sum::<u64>(), stats.free_bytes, "free bytes");
    assert_eq!(
        free.iter().map(|extent| extent.size_bytes).max().unwrap_or(0),
        stats.largest_free_extent_bytes,
        "largest free extent"
    );
    for (&offset, &size) in &model.live {
        let holder = extents
            .iter()
            .find(|extent| extent.offset_bytes <= offset && offset < extent.offset_bytes + extent.size_bytes)
            .expect("a live allocation lies in some extent");
        assert!(holder.in_use, "live allocation at {offset} lies in a free extent");
        assert!(offset + size <= holder.offset_bytes + holder.size_bytes, "allocation crosses its extent");
    }
}

fn run(mode: Mode, capacity_pages: u64, alignment_bytes: u64, ops: Vec<Op>) {
    // Whole 4 KiB pages, so the capacity is a multiple of every alignment tried.
    let capacity_bytes = capacity_pages * 4096;
    let mut allocator = Allocator::new(config(mode, capacity_bytes, alignment_bytes)).unwrap();
    let mut model = Model { capacity_bytes, alignment_bytes, live: BTreeMap::new() };
    let mut handles: Vec<Allocation> = Vec::new();
    for op in ops {
        match op {
            Op::Allocate(size) => match allocator.allocate(size) {
                Ok(allocation) => {
                    let offset = allocation.offset();
                    assert_eq!(allocation.len(), size);
                    assert_eq!(offset % model.alignment_bytes, 0, "alignment");
                    assert!(offset + size <= model.capacity_bytes, "inside the arena");
                    assert!(!model.overlaps(offset, size), "allocation at {offset}+{size} overlaps a live one");
                    model.live.insert(offset, size);
                    handles.push(allocation);
                }
                Err(AllocError::ZeroSize) => assert_eq!(size, 0),
                Err(AllocError::TooLarge { .. }) => assert!(size > model.capacity_bytes),
                Err(AllocError::TooManyAllocations { max_allocations }) => {
                    assert_eq!(model.live.len(), max_allocations as usize)
                }
                Err(AllocError::NoSpace { .. }) => {
                    // Whatever the mode, a free extent that the request's bin is certain to fit would have been
                    // found: the largest free extent is below the size rounded up by one bin step (1/8).
                    let aligned = size.div_ceil(alignment_bytes) * alignment_bytes;
                    let largest = allocator.stats().largest_free_extent_bytes;
                    assert!(
                        largest < aligned + aligned / 8 + alignment_bytes,
                        "NoSpace with {largest} B free in one extent for {size} B"
                    );
                }
                Err(other) => panic!("unexpected error {other:?} for size {size}"),
            },
            Op::Free(index) => {
                if handles.is_empty() {
                    continue;
                }
                let allocation = handles.swap_remove(index % handles.len());
                let offset = allocation.offset();
                allocator.free(allocation).unwrap();
                model.live.remove(&offset).expect("model knew the allocation");
            }
            Op::Reset => {
                allocator.reset();
                model.live.clear();
                // Every handle from before is stale now, and refusing one changes nothing.
                if let Some(stale) = handles.pop() {
                    assert_eq!(allocator.free(stale), Err(AllocError::StaleHandle));
                }
                handles.clear();
            }
        }
        check_against_model(&allocator, &model);
    }
    // Freeing everything restores one free extent.
    for allocation in handles.drain(..) {
        let offset = allocation.offset();
        allocator.free(allocation).unwrap();
        model.live.remove(&offset);
    }
    check_against_model(&allocator, &model);
    let stats = allocator.stats();
    assert_eq!(stats.free_extents, 1);
    assert_eq!(stats.largest_free_extent_bytes, capacity_bytes);
    assert_eq!(stats.free_bytes, capacity_bytes);
    assert!(stats.classes.iter().all(|class| class.slabs == 0), "empty slabs are returned: {:?}", stats.classes);
}

fn mode_strategy() -> impl Strategy<Value = Mode> {
    prop_oneof![Just(Mode::OffsetAllocator), Just(Mode::LearnedClasses), Just(Mode::ConfiguredClasses)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn allocator_matches_reference_model(
        mode in mode_strategy(),
        capacity_pages in 12u64..200,
        alignment_bytes in prop::sample::select(vec![64u64, 512, 4096]),
        ops in prop::collection::vec(op_strategy(), 1..400),
    ) {
        run(mode, capacity_pages, alignment_bytes, ops);
    }
}
