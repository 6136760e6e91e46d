//! `strata-bench stalls`: how often, and for how long, this machine takes a core away from a thread that
//! never sleeps. A thread pinned to one CPU reads the clock in a loop; a gap between two reads longer than
//! the threshold is a stall (an interrupt storm, a kernel thread, another VM on the host). Tail latency
//! of a busy-polling node or client can be no better than this floor, so the KV benchmark's p99 rows print
//! it beside them.
//!
//! The report also gives the CPU's *steal* time over the watch (from `/proc/stat`): time the hypervisor ran
//! something else on this virtual CPU. On this project's VMs a busy-polling core beside disk I/O makes the
//! host freeze the whole VM for milliseconds in every 100 ms period (docs/BENCHMARKS.md), which a guest's
//! own tools (`perf sched`) cannot see: the thread looks on-CPU throughout. Steal tells those stalls apart
//! from the guest's kernel threads.

use std::time::{Duration, Instant};

use anyhow::bail;
use hdrhistogram::Histogram;
use serde::Serialize;

/// What `strata-bench stalls` was asked to do.
#[derive(clap::Args, Debug, Clone)]
pub struct StallArgs {
    /// The CPU to spin on.
    #[arg(long, default_value_t = 0)]
    pub cpu: usize,
    /// How long to watch, e.g. 4s.
    #[arg(long, default_value = "4s", value_parser = crate::pool::parse_duration)]
    pub runtime: Duration,
    /// The shortest gap that counts as a stall, e.g. 50us.
    #[arg(long, default_value = "50us", value_parser = crate::pool::parse_duration)]
    pub threshold: Duration,
    /// normal or json.
    #[arg(long = "output-format", default_value = "normal")]
    pub output_format: String,
}

/// One stall: when it began (since the start) and how long it lasted.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct Stall {
    /// Start, in µs since the watch began.
    pub at_us: u64,
    /// Length, µs.
    pub us: u64,
}

/// What the watch saw.
#[derive(Clone, Debug, Serialize)]
pub struct StallReport {
    /// The CPU watched.
    pub cpu: usize,
    /// Seconds watched.
    pub runtime_s: f64,
    /// The threshold, µs.
    pub threshold_us: u64,
    /// Stalls seen.
    pub stalls: u64,
    /// Stalls per second.
    pub stalls_per_sec: f64,
    /// Time lost to stalls, as a fraction of the runtime.
    pub lost_fraction: f64,
    /// Stall lengths, µs: p50, p99, max.
    pub p50_us: u64,
    /// See `p50_us`.
    pub p99_us: u64,
    /// See `p50_us`.
    pub max_us: u64,
    /// The longest stalls, longest first (at most 8).
    pub longest: Vec<Stall>,
    /// Steal time of the CPU during the watch, as a fraction of the runtime; `None` where `/proc/stat`
    /// does not say (not Linux, or a kernel without steal accounting).
    pub steal_fraction: Option<f64>,
}

/// The steal time, in clock ticks (`USER_HZ`), of `cpu` in the text of `/proc/stat`: the eighth number of
/// its `cpuN` line (user nice system idle iowait irq softirq steal ...).
pub fn steal_ticks(proc_stat: &str, cpu: usize) -> Option<u64> {
    let name = format!("cpu{cpu}");
    let line = proc_stat.lines().find(|line| line.split_whitespace().next() == Some(name.as_str()))?;
    line.split_whitespace().nth(8)?.parse().ok()
}

fn read_steal_ticks(cpu: usize) -> Option<u64> {
    steal_ticks(&std::fs::read_to_string("/proc/stat").ok()?, cpu)
}

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) -> anyhow::Result<()> {
    let bound = 8 * std::mem::size_of::<libc::cpu_set_t>();
    if cpu >= bound {
        bail!("CPU {cpu} is beyond the {bound} CPUs an affinity mask names");
    }
    // SAFETY: `set` is a plain bitmask on the stack, sized as the call is told.
    #[allow(unsafe_code)]
    let result = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if result != 0 {
        bail!("pinning to CPU {cpu}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Watches one CPU on a thread of its own (so the caller's affinity is left alone).
pub fn run(args: &StallArgs) -> anyhow::Result<StallReport> {
    let args = args.clone();
    std::thread::Builder::new()
        .name("strata-stalls".into())
        .spawn(move || watch(&args))?
        .join()
        .map_err(|_| anyhow::anyhow!("the watching thread panicked"))?
}

fn watch(args: &StallArgs) -> anyhow::Result<StallReport> {
    if args.threshold.is_zero() {
        bail!("--threshold must be positive");
    }
    pin_to(args.cpu)?;
    let threshold_ns = args.threshold.as_nanos() as u64;
    let mut lengths: Histogram<u64> = Histogram::new_with_bounds(1, 60_000_000, 3)?;
    let mut longest: Vec<Stall> = Vec::new();
    let mut lost_ns = 0u64;
    let steal_before = read_steal_ticks(args.cpu);
    let started = Instant::now();
    let deadline = started + args.runtime;
    let mut last = started;
    // Bounded by time: the deadline is checked on every read of the clock.
    loop {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        let gap_ns = now.duration_since(last).as_nanos() as u64;
        if gap_ns >= threshold_ns {
            lost_ns += gap_ns;
            lengths.saturating_record((gap_ns / 1000).max(1));
            let stall = Stall { at_us: last.duration_since(started).as_micros() as u64, us: gap_ns / 1000 };
            if longest.len() < 8 || longest.last().is_some_and(|shortest| shortest.us < stall.us) {
                longest.push(stall);
                longest.sort_by_key(|stall| std::cmp::Reverse(stall.us));
                longest.truncate(8);
            }
        }
        last = now;
    }
    let runtime = started.elapsed().as_secs_f64();
    // SAFETY: sysconf has no preconditions.
    #[allow(unsafe_code)]
    let ticks_per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let steal_fraction = match (steal_before, read_steal_ticks(args.cpu)) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before) as f64 / ticks_per_sec / runtime),
        _ => None,
    };
    let stalls = lengths.len();
    let quantile = |q: f64| if stalls == 0 { 0 } else { lengths.value_at_quantile(q) };
    Ok(StallReport {
        cpu: args.cpu,
        runtime_s: runtime,
        threshold_us: threshold_ns / 1000,
        stalls,
        stalls_per_sec: stalls as f64 / runtime,
        lost_fraction: lost_ns as f64 / 1e9 / runtime,
        p50_us: quantile(0.5),
        p99_us: quantile(0.99),
        max_us: if stalls == 0 { 0 } else { lengths.max() },
        longest,
        steal_fraction,
    })
}

/// The human report.
pub fn format_report(report: &StallReport) -> String {
    let longest: Vec<String> =
        report.longest.iter().map(|stall| format!("{} us at {:.3} s", stall.us, stall.at_us as f64 / 1e6)).collect();
    format!(
        "CPU {}: {} stalls of >= {} us in {:.1} s ({:.1}/s), {:.3} % of the time lost; length p50 {} us, p99 {} us, max {} us\n  longest: {}\n  steal (the host ran something else on this CPU): {}\n",
        report.cpu,
        report.stalls,
        report.threshold_us,
        report.runtime_s,
        report.stalls_per_sec,
        report.lost_fraction * 100.0,
        report.p50_us,
        report.p99_us,
        report.max_us,
        if longest.is_empty() { "none".to_string() } else { longest.join(", ") },
        report.steal_fraction.map_or("not reported".to_string(), |steal| format!("{:.3} % of the time", steal * 100.0))
    )
}

#[cfg(test)]
mod tests {
    use super::steal_ticks;

    const PROC_STAT: &str = "cpu  10 0 20 300 4 0 5 61 0 0\n\
                             cpu0 5 0 10 150 2 0 3 17 0 0\n\
                             cpu1 5 0 10 150 2 0 2 44 0 0\n\
                             cpu10 1 0 1 1 0 0 0 99 0 0\n\
                             intr 12345\n";

    #[test]
    fn steal_is_the_eighth_number_of_the_cpus_own_line() {
        assert_eq!(steal_ticks(PROC_STAT, 0), Some(17));
        assert_eq!(steal_ticks(PROC_STAT, 1), Some(44));
        // `cpu1` is not a prefix match for `cpu10`, nor the other way round.
        assert_eq!(steal_ticks(PROC_STAT, 10), Some(99));
        assert_eq!(steal_ticks(PROC_STAT, 2), None);
        assert_eq!(steal_ticks("cpu0 1 2 3\n", 0), None, "a kernel line without the steal column");
    }
}
