//! The scale the engine plans for: a 1 TiB arena holding 16 Mi live allocations, in both modes, and what the
//! allocator's own memory costs per live allocation.

use strata_alloc::{Allocator, AllocatorConfig};

const TIB: u64 = 1 << 40;
const ALLOCATIONS: u32 = 16 << 20;
const SIZE: u64 = TIB / ALLOCATIONS as u64; // 64 KiB: the arena is exactly full.

fn fill_and_measure(config: AllocatorConfig) -> f64 {
    let mut allocator = Allocator::new(config).unwrap();
    let mut live = Vec::with_capacity(ALLOCATIONS as usize);
    for _ in 0..ALLOCATIONS {
        live.push(allocator.allocate(SIZE).unwrap());
    }
    let stats = allocator.stats();
    assert_eq!(stats.live_allocations, ALLOCATIONS);
    assert_eq!(stats.allocated_bytes, TIB);
    assert_eq!(stats.free_bytes, 0);
    let touched_per_allocation = allocator.metadata_bytes().touched as f64 / f64::from(ALLOCATIONS);
    // Free every other allocation (no neighbour is free, nothing merges), then the rest (each merges both
    // ways): the arena is one extent again.
    let (even, odd): (Vec<_>, Vec<_>) = live.into_iter().enumerate().partition(|(index, _)| index % 2 == 0);
    for (_, allocation) in even.into_iter().chain(odd) {
        allocator.free(allocation).unwrap();
    }
    let stats = allocator.stats();
    assert_eq!(stats.free_extents, 1);
    assert_eq!(stats.largest_free_extent_bytes, TIB);
    touched_per_allocation
}

#[test]
fn terabyte_arena_with_sixteen_million_allocations() {
    let base = AllocatorConfig::new(TIB, 4096, ALLOCATIONS);
    let bins = fill_and_measure(base.clone().offset_allocator_compatible());
    let classes = fill_and_measure(base);
    eprintln!("allocator metadata per live allocation: bins {bins:.1} B, classes {classes:.1} B");
    // One 32-byte node per allocation in the bins; a 32-byte slab entry per 64 slots with classes.
    assert!(bins <= 33.0, "bins: {bins} B per allocation");
    assert!(classes <= 2.0, "classes: {classes} B per allocation");
}
