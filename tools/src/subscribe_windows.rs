//! `strata-bench kv --subscribe-windows W`: what an event subscriber costs the puts, measured inside one
//! run. The run is cut into windows of `W`; a subscriber is connected during windows 1-2, 5-6, 9-10, ...
//! (the pattern off, on, on, off) and closed during the others, and the puts completed in each window are
//! counted. On this shared machine the node's cost per put drifts by a third within a minute (the host's
//! other tenants), which swamped the few per cent that separate two runs seconds apart; windows a fraction of a second long alternate faster than that drift, and the
//! off-on-on-off order cancels a steady trend as well (both kinds of window have the same mean time).
//! The first part of each window (`settle`) is left out: the node stops recording events only once it
//! notices a closed subscriber, at its next frame. Given the node's pid (a node on this machine), the node's
//! own CPU time per put is counted per kind of window too, which tells the node's cost of an observed put
//! from what the subscriber costs the client's core.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use strata_client::{Client, EventRef, EventStream};

/// Resolution of the completion counts.
const BUCKET: Duration = Duration::from_millis(1);

/// Keys completed per millisecond of the run, added to by every worker (one relaxed add per call).
pub struct Completions {
    started: Instant,
    buckets: Vec<AtomicU64>,
}

impl Completions {
    /// Counters for a run of `runtime` from `started`.
    pub fn new(started: Instant, runtime: Duration) -> Self {
        let buckets = (runtime.as_millis() as usize / BUCKET.as_millis() as usize) + 2;
        Self { started, buckets: (0..buckets).map(|_| AtomicU64::new(0)).collect() }
    }

    /// `keys` completed now.
    pub fn add(&self, keys: u64) {
        self.add_at(self.started.elapsed(), keys);
    }

    fn add_at(&self, offset: Duration, keys: u64) {
        let at = (offset.as_millis() / BUCKET.as_millis()) as usize;
        if let Some(bucket) = self.buckets.get(at) {
            bucket.fetch_add(keys, Ordering::Relaxed);
        }
    }

    /// Keys completed between `from` and `to` (offsets from the start, whole buckets).
    fn between(&self, from: Duration, to: Duration) -> u64 {
        let bucket = |offset: Duration| ((offset.as_millis() / BUCKET.as_millis()) as usize).min(self.buckets.len());
        self.buckets[bucket(from)..bucket(to).max(bucket(from))]
            .iter()
            .map(|bucket| bucket.load(Ordering::Relaxed))
            .sum()
    }
}

/// The windows' result (the JSON report's `windows`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct WindowReport {
    /// Length of a window, seconds.
    pub window_s: f64,
    /// Seconds left out at the start of each window.
    pub settle_s: f64,
    /// Windows of each kind counted.
    pub windows_each: usize,
    /// Keys per second in the windows without a subscriber.
    pub puts_per_sec_unobserved: f64,
    /// Keys per second in the windows with one.
    pub puts_per_sec_observed: f64,
    /// Observed over unobserved.
    pub ratio: f64,
    /// With `--node-pid`: the node's CPU time per key without a subscriber, from its threads'
    /// `/proc/PID/task/*/schedstat` (nanoseconds on a CPU, stolen time excluded) at each window's ends.
    pub node_cpu_ns_per_op_unobserved: Option<f64>,
    /// And with one.
    pub node_cpu_ns_per_op_observed: Option<f64>,
    /// Block events received (one per key an event names). Not a rate: what was in flight each time the subscriber closed is not received
    /// (the events row takes its events/s from a run subscribed throughout).
    pub events_received: u64,
    /// Events the subscriber was told it missed.
    pub events_missed: u64,
    /// When window 0 began, in seconds since the Unix epoch (`CLOCK_REALTIME`): the clock `perf record -k
    /// CLOCK_REALTIME` stamps samples with, so `scripts/perf-windows.py` can split a profile of the node by
    /// kind of window.
    pub started_unix_s: f64,
}

/// Whether window `index` has a subscriber: off, on, on, off, repeated.
fn observed(index: usize) -> bool {
    matches!(index % 4, 1 | 2)
}

struct Totals {
    keys: u64,
    seconds: f64,
    /// The node's CPU time over the counted parts; `None` without a pid or once a reading failed.
    node_ns: Option<u64>,
}

/// The CPU time of every thread of process `pid` so far, in nanoseconds (the first field of each thread's
/// `schedstat`, kept by the scheduler to the nanosecond; the process-wide tick counts of `/proc/PID/stat`,
/// read through the node's metrics, were too coarse for windows: half the `/proc` total over one run).
pub fn threads_cpu_ns(pid: u32) -> Option<u64> {
    let mut total = 0u64;
    for thread in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        // A thread that exits during the scan takes its time with it; the rest still count.
        let Ok(stat) = std::fs::read_to_string(thread.path().join("schedstat")) else { continue };
        total += stat.split_whitespace().next().and_then(|field| field.parse::<u64>().ok()).unwrap_or(0);
    }
    Some(total)
}

/// Runs the windows from `completions`' start until the last whole group of four ends within
/// `runtime`, subscribing with `connect()`'s client; with `node_pid`, also the node's CPU time per window.
pub fn run(
    completions: &Completions,
    window: Duration,
    runtime: Duration,
    connect: impl Fn() -> anyhow::Result<Client>,
    node_pid: Option<u32>,
) -> anyhow::Result<WindowReport> {
    let groups = (runtime.as_secs_f64() / window.as_secs_f64() / 4.0).floor() as usize;
    if groups == 0 {
        anyhow::bail!("--subscribe-windows needs a --runtime of at least four windows");
    }
    let settle = (window / 5).min(Duration::from_millis(50));
    let node_cpu = || node_pid.and_then(threads_cpu_ns);
    let start_totals = || Totals { keys: 0, seconds: 0.0, node_ns: node_pid.map(|_| 0) };
    let mut totals = [start_totals(), start_totals()];
    let mut events = EventCount::default();
    let mut stream = None;
    // Bounded by count: four windows per group.
    for index in 0..groups * 4 {
        let start = window * index as u32;
        let kind = usize::from(observed(index));
        if observed(index) && stream.is_none() {
            stream = Some(connect()?.subscribe_events(None).context("subscribing")?);
        } else if !observed(index) {
            // Closing it is the node's cue to stop recording (noticed within a frame, inside `settle`).
            stream = None;
        }
        events.wait(stream.as_ref(), completions.started + start + settle)?;
        let cpu_before = node_cpu();
        let end = completions.started + start + window;
        events.wait(stream.as_ref(), end)?;
        let cpu_after = node_cpu();
        // Every completion up to the window's end has been counted once this bucket closes.
        events.wait(stream.as_ref(), end + BUCKET)?;
        let total = &mut totals[kind];
        total.keys += completions.between(start + settle, start + window);
        total.seconds += (window - settle).as_secs_f64();
        total.node_ns = match (total.node_ns, cpu_before, cpu_after) {
            (Some(sum), Some(before), Some(after)) => Some(sum + after.saturating_sub(before)),
            _ => None,
        };
    }
    let [unobserved, observed_totals] = totals;
    let rate = |totals: &Totals| totals.keys as f64 / totals.seconds.max(1e-9);
    let cpu = |totals: &Totals| totals.node_ns.filter(|_| totals.keys > 0).map(|ns| ns as f64 / totals.keys as f64);
    Ok(WindowReport {
        window_s: window.as_secs_f64(),
        settle_s: settle.as_secs_f64(),
        windows_each: groups * 2,
        puts_per_sec_unobserved: rate(&unobserved),
        puts_per_sec_observed: rate(&observed_totals),
        ratio: rate(&observed_totals) / rate(&unobserved).max(1e-9),
        node_cpu_ns_per_op_unobserved: cpu(&unobserved),
        node_cpu_ns_per_op_observed: cpu(&observed_totals),
        events_received: events.received,
        events_missed: events.missed,
        started_unix_s: started_unix_s(completions.started),
    })
}

/// The events received, and the count of those the node said were missed.
#[derive(Default)]
struct EventCount {
    received: u64,
    missed: u64,
}

impl EventCount {
    /// Until `until`: counts the events `stream` delivers, or sleeps without one.
    fn wait(&mut self, stream: Option<&EventStream>, until: Instant) -> anyhow::Result<()> {
        let Some(stream) = stream else {
            sleep_until(until);
            return Ok(());
        };
        // Bounded by time.
        while Instant::now() < until {
            let Some(batch) = stream.next_batch_timeout(until.saturating_duration_since(Instant::now())) else {
                continue;
            };
            for (_sequence, event) in batch.context("the event stream failed")?.iter() {
                match event {
                    EventRef::Lagged { missed } => self.missed += u64::from(missed),
                    event => self.received += event.blocks() as u64,
                }
            }
        }
        Ok(())
    }
}

/// `instant` (in the past) in seconds since the Unix epoch.
fn started_unix_s(instant: Instant) -> f64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    now.as_secs_f64() - instant.elapsed().as_secs_f64()
}

fn sleep_until(when: Instant) {
    let now = Instant::now();
    if when > now {
        std::thread::sleep(when - now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_alternate_off_on_on_off_so_both_kinds_have_the_same_mean_time() {
        let kinds: Vec<bool> = (0..8).map(observed).collect();
        assert_eq!(kinds, [false, true, true, false, false, true, true, false]);
        let mean = |want: bool| {
            let times: Vec<usize> = (0..8).filter(|&index| observed(index) == want).collect();
            times.iter().sum::<usize>() as f64 / times.len() as f64
        };
        assert_eq!(mean(true), mean(false));
    }

    #[test]
    fn a_process_cpu_time_is_read_from_its_threads_and_a_missing_process_has_none() {
        // A child that spins, so no other test's threads come and go in the process measured (this test
        // process's own total drops whenever a finished test's thread exits).
        let mut child = std::process::Command::new("sh").args(["-c", "while :; do :; done"]).spawn().expect("sh");
        let pid = child.id();
        let first = threads_cpu_ns(pid).expect("the child");
        let waited = Instant::now();
        let mut last = first;
        // Bounded by time: 10 s for 10 ms of the child's CPU to be counted, even on a loaded machine.
        while last < first + 10_000_000 && waited.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
            last = threads_cpu_ns(pid).expect("the child");
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(last >= first + 10_000_000, "{first} -> {last} ns over {:?} of a spinning child", waited.elapsed());
        assert_eq!(threads_cpu_ns(u32::MAX), None);
    }

    #[test]
    fn completions_are_counted_in_the_window_they_happened_in() {
        let completions = Completions::new(Instant::now(), Duration::from_millis(100));
        let ms = Duration::from_millis;
        completions.add_at(ms(30), 5);
        completions.add_at(ms(59), 7);
        completions.add_at(ms(60), 100);
        assert_eq!(completions.between(ms(25), ms(60)), 12);
        assert_eq!(completions.between(ms(0), ms(25)), 0);
        assert_eq!(completions.between(ms(60), ms(61)), 100);
        // Past the end of the run: not counted, and nothing panics.
        completions.add_at(Duration::from_secs(5), 1);
        assert_eq!(completions.between(ms(61), Duration::from_secs(10)), 0);
        assert_eq!(completions.between(Duration::from_secs(10), ms(5)), 0);
    }
}
