//! `strata-bench alloc`: replays KV-cache allocation workloads against `strata-alloc` and reports how densely
//! each mode packs the arena.
//!
//! Two figures per workload and mode:
//! - **utilisation at first failure**: fill an empty arena with the workload's requests until one fails;
//!   allocated bytes (as asked, not as reserved) over capacity at that moment.
//! - **steady-state utilisation**: then churn, as a cache at capacity does. Each new request that fails evicts
//!   a uniformly random live allocation and is retried, until `churn_factor × capacity` bytes have been
//!   allocated. Utilisation is sampled at every failure (the moments the cache is "full") in the second
//!   half of the churn, and averaged. Sampling when full, not after eviction, measures what the allocator can
//!   hold, not how much the eviction loop freed.
//!
//! `ops_per_sec` counts allocator calls (allocations tried and frees) during the churn over its wall time,
//! the workload generator included; the criterion bench measures the bare pair cost.

use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use strata_alloc::{AllocError, Allocation, Allocator, AllocatorConfig};

/// A 64-token block of DeepSeek-V3's MLA cache: 61 layers × 576 × 2 B × 64 tokens.
pub const DEEPSEEK_V3_BLOCK_BYTES: u64 = 4_497_408;
/// A second model's block (e.g. a small model, 152 KiB).
pub const SMALL_MODEL_BLOCK_BYTES: u64 = 155_648;
/// A third model's block (896 KiB).
pub const MEDIUM_MODEL_BLOCK_BYTES: u64 = 917_504;
const NOISE_MIN_BYTES: u64 = 4 << 10;
const NOISE_MAX_BYTES: u64 = 4 << 20;

/// A stream of request sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Every request is one DeepSeek-V3 block (4,497,408 B).
    Uniform,
    /// DeepSeek-V3 blocks and 155,648-B blocks, 50/50 by count.
    TwoClass,
    /// Three block sizes (4,497,408, 917,504, 155,648 B) equally, plus 5% of requests uniform in 4 KiB–4 MiB.
    ThreeClassNoise,
    /// Uniform in 4 KiB–4 MiB.
    Random,
}

impl Workload {
    /// Every workload, in report order.
    pub const ALL: [Workload; 4] = [Workload::Uniform, Workload::TwoClass, Workload::ThreeClassNoise, Workload::Random];

    /// The name used in reports (as on the command line).
    pub fn name(self) -> &'static str {
        match self {
            Workload::Uniform => "uniform",
            Workload::TwoClass => "two-class",
            Workload::ThreeClassNoise => "three-class-noise",
            Workload::Random => "random",
        }
    }

    fn next_size(self, rng: &mut ChaCha8Rng) -> u64 {
        match self {
            Workload::Uniform => DEEPSEEK_V3_BLOCK_BYTES,
            Workload::TwoClass => {
                if rng.random_bool(0.5) {
                    DEEPSEEK_V3_BLOCK_BYTES
                } else {
                    SMALL_MODEL_BLOCK_BYTES
                }
            }
            Workload::ThreeClassNoise => {
                if rng.random_bool(0.05) {
                    rng.random_range(NOISE_MIN_BYTES..=NOISE_MAX_BYTES)
                } else {
                    [DEEPSEEK_V3_BLOCK_BYTES, MEDIUM_MODEL_BLOCK_BYTES, SMALL_MODEL_BLOCK_BYTES][rng.random_range(0..3)]
                }
            }
            Workload::Random => rng.random_range(NOISE_MIN_BYTES..=NOISE_MAX_BYTES),
        }
    }
}

/// Which allocator configuration to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The size-class front off and no exact-fit scan: OffsetAllocator's behaviour (Mooncake Store's).
    Bins,
    /// Strata's defaults: classes learned from the stream (none configured), exact-fit scan on.
    Classes,
}

impl Mode {
    /// Both modes, in report order.
    pub const ALL: [Mode; 2] = [Mode::Bins, Mode::Classes];

    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Bins => "bins",
            Mode::Classes => "classes",
        }
    }
}

/// What to replay.
#[derive(Clone, Debug)]
pub struct AllocBenchConfig {
    /// Arena size.
    pub arena_bytes: u64,
    /// Arena alignment (sizes round up to it).
    pub alignment_bytes: u64,
    /// Churn volume, in arena capacities.
    pub churn_factor: u64,
    /// Seed of the request stream and of eviction choices; one seed reproduces a run.
    pub seed: u64,
}

impl Default for AllocBenchConfig {
    fn default() -> Self {
        Self { arena_bytes: 8 << 30, alignment_bytes: 4096, churn_factor: 10, seed: 42 }
    }
}

/// One row of the report (one JSON object per line with `--output-format=json`).
#[derive(Clone, Debug, Serialize)]
pub struct AllocReport {
    /// The workload's name.
    pub workload: &'static str,
    /// The mode's name.
    pub mode: &'static str,
    /// Allocated / capacity when the first request failed, filling from empty.
    pub utilization_at_first_failure: f64,
    /// Mean allocated / capacity at failures over the second half of the churn.
    pub steady_state_utilization: f64,
    /// Allocator calls per second during the churn.
    pub ops_per_sec: f64,
    /// Lowest utilisation at a failure in the second half of the churn.
    pub steady_state_min_utilization: f64,
    /// Bytes lost to rounding at the end of the churn, as a share of capacity.
    pub rounding_loss_share: f64,
    /// Size classes in use at the end (learned ones included).
    pub size_classes: usize,
    /// Live allocations at the end.
    pub live_allocations: u32,
}

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum AllocBenchError {
    /// The allocator refused its configuration.
    #[error("allocator configuration: {0}")]
    Config(AllocError),
    /// An allocator call failed in a way a replay never should (it would be a bug of the allocator).
    #[error("unexpected allocator error in {workload} ({mode}): {source}")]
    Unexpected {
        /// The workload.
        workload: &'static str,
        /// The mode.
        mode: &'static str,
        /// The error.
        source: AllocError,
    },
}

/// Upper bound on allocator calls in one churn, so that a pathological mode cannot loop for ever.
const CHURN_CALLS_MAX: u64 = 200_000_000;
/// Upper bound on one churn's wall time, for the same reason.
const CHURN_TIME_MAX: Duration = Duration::from_secs(300);

/// Replays `workload` in `mode`.
pub fn run(workload: Workload, mode: Mode, config: &AllocBenchConfig) -> Result<AllocReport, AllocBenchError> {
    let max_allocations = (config.arena_bytes / config.alignment_bytes).min(u64::from(u32::MAX - 1)) as u32;
    let base = AllocatorConfig::new(config.arena_bytes, config.alignment_bytes, max_allocations);
    let allocator_config = match mode {
        Mode::Bins => base.offset_allocator_compatible(),
        Mode::Classes => base,
    };
    let mut allocator = Allocator::new(allocator_config).map_err(AllocBenchError::Config)?;
    let unexpected = |source| AllocBenchError::Unexpected { workload: workload.name(), mode: mode.name(), source };
    let capacity = allocator.capacity() as f64;
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
    let mut live: Vec<Allocation> = Vec::new();

    let mut pending = workload.next_size(&mut rng);
    loop {
        match allocator.allocate(pending) {
            Ok(allocation) => {
                live.push(allocation);
                pending = workload.next_size(&mut rng);
            }
            Err(AllocError::NoSpace { .. } | AllocError::TooManyAllocations { .. }) => break,
            Err(error) => return Err(unexpected(error)),
        }
    }
    let utilization_at_first_failure = allocator.allocated_bytes() as f64 / capacity;

    let churn_bytes = config.churn_factor.max(1) * allocator.capacity();
    let mut churned_bytes = 0u64;
    let mut calls = 0u64;
    let mut samples_sum = 0.0;
    let mut samples = 0u64;
    let mut samples_min = f64::INFINITY;
    let started = Instant::now();
    while churned_bytes < churn_bytes && calls < CHURN_CALLS_MAX {
        if calls.is_multiple_of(4096) && started.elapsed() > CHURN_TIME_MAX {
            break;
        }
        calls += 1;
        match allocator.allocate(pending) {
            Ok(allocation) => {
                churned_bytes += allocation.len();
                live.push(allocation);
                pending = workload.next_size(&mut rng);
            }
            Err(AllocError::NoSpace { .. } | AllocError::TooManyAllocations { .. }) => {
                if churned_bytes >= churn_bytes / 2 {
                    let utilization = allocator.allocated_bytes() as f64 / capacity;
                    samples_sum += utilization;
                    samples += 1;
                    samples_min = samples_min.min(utilization);
                }
                if live.is_empty() {
                    // Nothing left to evict and the request still fails: it can never fit.
                    return Err(unexpected(AllocError::TooLarge {
                        size_bytes: pending,
                        max_bytes: allocator.capacity(),
                    }));
                }
                let victim = live.swap_remove(rng.random_range(0..live.len()));
                calls += 1;
                allocator.free(victim).map_err(unexpected)?;
            }
            Err(error) => return Err(unexpected(error)),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let stats = allocator.stats();
    let steady_state_utilization = if samples == 0 { stats.utilization() } else { samples_sum / samples as f64 };
    Ok(AllocReport {
        workload: workload.name(),
        mode: mode.name(),
        utilization_at_first_failure,
        steady_state_utilization,
        ops_per_sec: if elapsed > 0.0 { calls as f64 / elapsed } else { 0.0 },
        steady_state_min_utilization: if samples == 0 { steady_state_utilization } else { samples_min },
        rounding_loss_share: stats.rounding_loss_bytes as f64 / capacity,
        size_classes: stats.classes.iter().filter(|class| class.slabs > 0).count(),
        live_allocations: stats.live_allocations,
    })
}
