//! `allocate` + `free` pairs per second, in both modes, on an 8 GiB arena half full of the same size (the
//! steady state of a cache whose shard is busy: the class already has a partly used slab, the bins a
//! fragmented free list). Run: `cargo bench -p strata-alloc --bench allocate_free`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use strata_alloc::{Allocation, Allocator, AllocatorConfig};

const ARENA_BYTES: u64 = 8 << 30;
const ALIGNMENT_BYTES: u64 = 4096;
const SIZES_BYTES: [u64; 2] = [4_497_408, 65_536];

fn half_full(mode: &str, size_bytes: u64) -> (Allocator, Vec<Allocation>) {
    let base = AllocatorConfig::new(ARENA_BYTES, ALIGNMENT_BYTES, (ARENA_BYTES / ALIGNMENT_BYTES) as u32);
    let config = match mode {
        "bins" => base.offset_allocator_compatible(),
        _ => base.with_size_class(size_bytes),
    };
    let mut allocator = Allocator::new(config).expect("valid config");
    let mut live = Vec::new();
    while allocator.allocated_bytes() < ARENA_BYTES / 2 {
        live.push(allocator.allocate(size_bytes).expect("half the arena fits"));
    }
    // Free a random quarter so the free space is scattered, as after churn.
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for _ in 0..live.len() / 4 {
        let victim = rng.random_range(0..live.len());
        allocator.free(live.swap_remove(victim)).expect("own handle");
    }
    (allocator, live)
}

fn allocate_free_pairs(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("allocate_free_pair");
    group.throughput(Throughput::Elements(1));
    for mode in ["bins", "classes"] {
        for size_bytes in SIZES_BYTES {
            let (mut allocator, _live) = half_full(mode, size_bytes);
            group.bench_function(BenchmarkId::new(mode, size_bytes), |bencher| {
                bencher.iter(|| {
                    let allocation = allocator.allocate(black_box(size_bytes)).expect("space was left free");
                    allocator.free(black_box(allocation)).expect("own handle");
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, allocate_free_pairs);
criterion_main!(benches);
