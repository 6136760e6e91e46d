//! The reason the size-class front exists: on a mix of real KV-block sizes that are not bin values, Strata's
//! allocator holds more than OffsetAllocator's bins, filling from empty and at steady state. Utilisation is
//! deterministic for a seed, so this is a behavioural test, not a timing one; the full-scale figures are in
//! docs/BENCHMARKS.md.

use strata_tools::alloc_bench::{AllocBenchConfig, Mode, Workload, run};

fn config(seed: u64) -> AllocBenchConfig {
    AllocBenchConfig { arena_bytes: 1 << 30, alignment_bytes: 4096, churn_factor: 10, seed }
}

#[test]
fn classes_beat_bins_on_block_mixes_at_steady_state() {
    for seed in [1, 2, 3] {
        for workload in [Workload::Uniform, Workload::TwoClass, Workload::ThreeClassNoise] {
            let bins = run(workload, Mode::Bins, &config(seed)).unwrap();
            let classes = run(workload, Mode::Classes, &config(seed)).unwrap();
            assert!(
                classes.steady_state_utilization > bins.steady_state_utilization + 0.1,
                "{workload:?} seed {seed}: classes {:.4} vs bins {:.4}",
                classes.steady_state_utilization,
                bins.steady_state_utilization
            );
            assert!(classes.steady_state_utilization >= 0.93, "{workload:?} seed {seed}: {classes:?}");
            assert!(classes.utilization_at_first_failure >= 0.97, "{workload:?} seed {seed}: {classes:?}");
            assert!(classes.size_classes >= 1, "{workload:?}: nothing learned");
        }
    }
}

#[test]
fn a_stream_of_distinct_sizes_learns_no_class() {
    let report = run(Workload::Random, Mode::Classes, &config(7)).unwrap();
    assert_eq!(report.size_classes, 0, "{report:?}");
    // And the front costs nothing in density there: it is the bins plus the exact-fit scan.
    let bins = run(Workload::Random, Mode::Bins, &config(7)).unwrap();
    assert!(report.steady_state_utilization >= bins.steady_state_utilization - 0.01, "{report:?} vs {bins:?}");
}
