//! `strata-bench memcpy`: one thread copying a value of `--size` between two buffers as fast as it can,
//! the reference beside which the shared-memory path is measured (a get through shared memory is one such
//! copy on the node, plus the request's round trip and the client's crc check).

use std::time::{Duration, Instant};

use crate::byte_size::parse_byte_size;

/// `strata-bench memcpy` options.
#[derive(Clone, Debug, clap::Args)]
pub struct MemcpyArgs {
    /// Bytes per copy.
    #[arg(long, default_value = "4m", value_parser = parse_byte_size)]
    pub size: u64,
    /// Seconds to run.
    #[arg(long, default_value_t = 5.0)]
    pub runtime: f64,
    /// Distinct sources copied from in turn (1: the same buffer every time, which stays in cache; the
    /// size of a get's working set, e.g. 64 × 4 MiB, copies from memory as a node's DRAM tier does).
    #[arg(long, default_value_t = 1)]
    pub sources: usize,
}

/// Copies per second and bytes per second of one thread.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct MemcpyReport {
    /// Bytes per copy.
    pub size: u64,
    /// Copies per second.
    pub copies_per_sec: f64,
    /// Bytes per second.
    pub bytes_per_sec: f64,
}

/// Copies from each source in turn into one destination (every buffer written first, so no page is
/// faulted in the timed loop) until the runtime has passed.
pub fn run(args: &MemcpyArgs) -> MemcpyReport {
    let size = args.size.max(1) as usize;
    let sources: Vec<Vec<u8>> = (0..args.sources.max(1)).map(|at| vec![at as u8; size]).collect();
    let mut destination = vec![0u8; size];
    let deadline = Duration::from_secs_f64(args.runtime.max(0.01));
    let started = Instant::now();
    let mut copies = 0u64;
    // Bounded by time (and, absurdly, by count).
    for _ in 0..u64::MAX {
        let source = &sources[copies as usize % sources.len()];
        destination.copy_from_slice(std::hint::black_box(source));
        std::hint::black_box(&mut destination);
        copies += 1;
        if started.elapsed() >= deadline {
            break;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    MemcpyReport {
        size: size as u64,
        copies_per_sec: copies as f64 / seconds,
        bytes_per_sec: (copies * size as u64) as f64 / seconds,
    }
}
