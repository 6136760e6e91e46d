//! Runs the seeded simulation of a node (`strata_engine::sim`).
//!
//! ```text
//! simulate --seeds N [--from S] [--steps K]   seeds S..S+N; stops at the first failure, naming its seed
//! simulate --seed S [--steps K]               replays one seed and prints its report or its failure
//! ```
//! Exits 1 on a failure.

use std::process::ExitCode;

use strata_engine::sim::simulate;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| -> Option<u64> {
        let at = args.iter().position(|arg| arg == flag)?;
        args.get(at + 1).and_then(|text| text.parse().ok())
    };
    let steps = value("--steps").unwrap_or(400) as usize;
    let (from, count) = match (value("--seed"), value("--seeds")) {
        (Some(seed), _) => (seed, 1),
        (None, Some(count)) => (value("--from").unwrap_or(0), count),
        (None, None) => {
            eprintln!("usage: simulate --seeds N [--from S] [--steps K] | --seed S [--steps K]");
            return ExitCode::from(2);
        }
    };
    let started = std::time::Instant::now();
    for seed in from..from + count {
        match simulate(seed, steps) {
            Ok(report) if count == 1 => println!("{report:#?}"),
            Ok(_) => {}
            Err(failure) => {
                eprintln!("{failure}");
                println!("FAILED seed {seed}");
                return ExitCode::from(1);
            }
        }
    }
    println!("{count} seeds from {from} passed, {steps} steps each, in {:.1} s", started.elapsed().as_secs_f64());
    ExitCode::SUCCESS
}
