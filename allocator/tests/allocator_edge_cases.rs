//! The edges of the allocator's contract: refused sizes, alignment, exhaustion, stale and foreign handles,
//! configured and learned classes.

use strata_alloc::{AllocError, Allocator, AllocatorConfig};

const MIB: u64 = 1 << 20;

fn allocator(config: AllocatorConfig) -> Allocator {
    Allocator::new(config).unwrap()
}

#[test]
fn zero_size_is_refused() {
    let mut allocator = allocator(AllocatorConfig::new(MIB, 4096, 16));
    assert_eq!(allocator.allocate(0), Err(AllocError::ZeroSize));
    assert_eq!(allocator.stats().live_allocations, 0);
}

#[test]
fn larger_than_the_arena_is_refused_but_the_whole_arena_fits() {
    for config in
        [AllocatorConfig::new(MIB, 4096, 16), AllocatorConfig::new(MIB, 4096, 16).offset_allocator_compatible()]
    {
        let mut allocator = allocator(config);
        assert_eq!(allocator.allocate(MIB + 1), Err(AllocError::TooLarge { size_bytes: MIB + 1, max_bytes: MIB }));
        let whole = allocator.allocate(MIB).unwrap();
        assert_eq!(whole.offset(), 0);
        assert_eq!(allocator.stats().free_extents, 0);
        allocator.free(whole).unwrap();
        assert_eq!(allocator.stats().largest_free_extent_bytes, MIB);
    }
}

#[test]
fn offsets_are_aligned_and_sizes_rounded_up() {
    for alignment in [1u64, 8, 64, 4096, 2 * MIB] {
        let mut allocator = allocator(AllocatorConfig::new(64 * MIB, alignment, 1024));
        let mut live = Vec::new();
        for size in [1u64, 7, 100, 4095, 4097, 65_537, 3 * MIB + 1] {
            let allocation = allocator.allocate(size).unwrap();
            assert_eq!(allocation.offset() % alignment, 0, "alignment {alignment} size {size}");
            live.push(allocation);
        }
        let stats = allocator.stats();
        let asked: u64 = live.iter().map(|allocation| allocation.len()).sum();
        let reserved: u64 = live.iter().map(|allocation| allocation.len().div_ceil(alignment) * alignment).sum();
        assert_eq!(stats.allocated_bytes, asked);
        assert_eq!(stats.rounding_loss_bytes, reserved - asked, "alignment {alignment}");
    }
}

#[test]
fn invalid_configurations_are_typed_errors() {
    let cases = [
        AllocatorConfig::new(MIB, 3000, 16),
        AllocatorConfig::new(MIB, 0, 16),
        AllocatorConfig::new(MIB + 1, 4096, 16),
        AllocatorConfig::new(0, 4096, 16),
        AllocatorConfig::new(MIB, 4096, 0),
        AllocatorConfig::new(MIB, 4096, 16).with_size_class(2 * MIB),
    ];
    for config in cases {
        assert!(matches!(Allocator::new(config.clone()), Err(AllocError::InvalidConfig { .. })), "{config:?}");
    }
}

#[test]
fn exhaustion_is_an_error_and_the_allocator_keeps_working() {
    for config in
        [AllocatorConfig::new(MIB, 4096, 1024), AllocatorConfig::new(MIB, 4096, 1024).offset_allocator_compatible()]
    {
        let mut allocator = allocator(config);
        let mut live = Vec::new();
        let error = loop {
            match allocator.allocate(10_000) {
                Ok(allocation) => live.push(allocation),
                Err(error) => break error,
            }
            assert!(live.len() <= 1024, "never more than fit");
        };
        assert!(matches!(error, AllocError::NoSpace { size_bytes: 10_000, .. }), "{error:?}");
        // 10,000 B round up to 12,288 B (three 4 KiB units): 85 fit in 1 MiB, with one unit left over.
        assert_eq!(live.len(), 85);
        let freed = live.pop().unwrap();
        allocator.free(freed).unwrap();
        live.push(allocator.allocate(10_000).expect("space freed is reused"));
    }
}

#[test]
fn the_live_allocation_bound_is_enforced() {
    let mut allocator = allocator(AllocatorConfig::new(MIB, 64, 3));
    let live: Vec<_> = (0..3).map(|_| allocator.allocate(64).unwrap()).collect();
    assert_eq!(allocator.allocate(64), Err(AllocError::TooManyAllocations { max_allocations: 3 }));
    drop(live);
}

#[test]
fn a_handle_from_before_reset_is_stale() {
    let mut allocator = allocator(AllocatorConfig::new(MIB, 4096, 16));
    let old = allocator.allocate(8192).unwrap();
    allocator.reset();
    let new = allocator.allocate(8192).unwrap();
    // The new allocation reuses the same offset; the old handle must not free it.
    assert_eq!(new.offset(), old.offset());
    assert_eq!(allocator.free(old), Err(AllocError::StaleHandle));
    assert_eq!(allocator.stats().live_allocations, 1);
    allocator.free(new).unwrap();
    assert_eq!(allocator.stats().free_extents, 1);
}

#[test]
fn a_handle_from_another_allocator_is_foreign() {
    let mut first = allocator(AllocatorConfig::new(MIB, 4096, 16));
    let mut second = allocator(AllocatorConfig::new(MIB, 4096, 16));
    let from_first = first.allocate(4096).unwrap();
    let from_second = second.allocate(4096).unwrap();
    assert_eq!(from_first.offset(), from_second.offset());
    assert_eq!(second.free(from_first), Err(AllocError::ForeignHandle));
    assert_eq!(second.stats().live_allocations, 1, "the foreign free changed nothing");
    second.free(from_second).unwrap();
}

#[test]
fn a_configured_class_is_served_by_slabs_that_are_returned_when_empty() {
    let size = 155_648;
    let mut allocator = allocator(AllocatorConfig::new(256 * MIB, 4096, 4096).with_size_class(size));
    let live: Vec<_> = (0..100).map(|_| allocator.allocate(size).unwrap()).collect();
    assert!(live.iter().all(|allocation| allocation.is_from_size_class()));
    let stats = allocator.stats();
    let class = &stats.classes[0];
    assert!(!class.learned);
    assert_eq!(class.size_bytes, size);
    assert_eq!(class.slots_used, 100);
    assert!(class.slabs >= 2, "100 slots need at least two 64-slot slabs");
    assert_eq!(stats.rounding_loss_bytes, 0, "an exact-fit class loses nothing to rounding");
    for allocation in live {
        allocator.free(allocation).unwrap();
    }
    let stats = allocator.stats();
    assert_eq!(stats.classes[0].slabs, 0);
    assert_eq!(stats.free_extents, 1);
}

#[test]
fn a_dominant_size_is_learned_and_rare_sizes_are_not() {
    let block = 4_497_408;
    let mut allocator = allocator(AllocatorConfig::new(1 << 30, 4096, 4096));
    let mut live = Vec::new();
    for request in 0..200u64 {
        // Half the requests are one block size, the rest all distinct.
        let size = if request % 2 == 0 { block } else { 4096 * (1 + request) };
        live.push(allocator.allocate(size).unwrap());
    }
    let last_block = live.iter().rev().find(|allocation| allocation.len() == block).unwrap();
    assert!(last_block.is_from_size_class(), "the block size was not learned");
    let classes = allocator.stats().classes;
    assert_eq!(classes.len(), 1, "only the dominant size becomes a class: {classes:?}");
    assert!(classes[0].learned);
    assert_eq!(classes[0].size_bytes, block);
    assert!(
        live.iter().filter(|allocation| allocation.len() != block).all(|allocation| !allocation.is_from_size_class())
    );
}

#[test]
fn a_class_uses_the_arena_to_its_last_slot() {
    // An arena of exactly 10 blocks: slabs are capped at 1/16 of the arena and shrink with the free space, so
    // the class ends on single-slot slabs and leaves no block-sized space unused.
    let block: u64 = 4_497_408;
    let capacity = 10 * block.div_ceil(4096) * 4096;
    let mut allocator = allocator(AllocatorConfig::new(capacity, 4096, 64).with_size_class(block));
    let mut live = Vec::new();
    while let Ok(allocation) = allocator.allocate(block) {
        live.push(allocation);
    }
    assert_eq!(live.len(), 10, "every block-sized piece of the arena is used");
    assert_eq!(allocator.stats().free_bytes, 0);
}
