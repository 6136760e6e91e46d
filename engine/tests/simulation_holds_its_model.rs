//! The seeded simulation of a node (`strata_engine::sim`) over a few hundred seeds: every seed's run of
//! operations, faults, crashes and restarts holds the model of what must remain, and a seed replays
//! exactly. `scripts/simulate.sh SEEDS` runs any number more.

use strata_engine::sim::{SimReport, simulate};

/// Steps of each seed's run.
const STEPS: usize = 300;

fn run_seeds(seeds: std::ops::Range<u64>) -> Vec<SimReport> {
    seeds
        .map(|seed| match simulate(seed, STEPS) {
            Ok(report) => report,
            Err(failure) => panic!("{failure}"),
        })
        .collect()
}

#[test]
fn seeds_0_to_150_hold_the_model() {
    let reports = run_seeds(0..150);
    // The runs were not idle: they crashed, restarted, lost what crashes may take, and met faults.
    let total = |field: fn(&SimReport) -> u64| reports.iter().map(field).sum::<u64>();
    assert!(total(|report| report.crashes) > 500, "crashes: {}", total(|report| report.crashes));
    assert!(total(|report| report.clean_stops) > 100);
    assert!(total(|report| report.puts_acknowledged) > 10_000);
    assert!(total(|report| report.found) > 50_000);
    assert!(total(|report| report.reported_gone) > 1_000);
    assert!(total(|report| report.errors) > 0, "no fault reached a read");
    assert!(reports.iter().any(|report| report.shards == 3) && reports.iter().any(|report| report.shards == 1));
}

#[test]
fn seeds_150_to_300_hold_the_model() {
    run_seeds(150..300);
}

#[test]
fn a_seed_replays_exactly() {
    for seed in [7, 24, 151] {
        let first = simulate(seed, STEPS).expect("the seed holds");
        let second = simulate(seed, STEPS).expect("the seed holds");
        assert_eq!(first, second, "seed {seed}");
    }
    assert_ne!(simulate(7, STEPS).expect("seed 7").fingerprint, simulate(8, STEPS).expect("seed 8").fingerprint);
}
