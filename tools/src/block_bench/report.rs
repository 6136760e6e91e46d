//! Reports: fio's human format, and fio's JSON field names for what strata-bench measures, so that tools
//! reading fio's JSON read ours (`jobs[].read.iops`, `bw` in KiB/s, `runtime` in ms, `clat_ns.percentile`).

use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

use super::options::JobOptions;
use super::runner::{DirectionResult, JobResult};

/// fio's default percentile list.
pub const PERCENTILES: [f64; 17] =
    [1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99];

/// Merges jobs into one entry, as fio's `group_reporting` does: counts and histograms add up, CPU times add
/// up, the runtime is the longest.
pub fn group(results: &[JobResult]) -> Option<JobResult> {
    let mut merged = results.first()?.clone();
    for result in &results[1..] {
        merged.read.merge(&result.read);
        merged.write.merge(&result.write);
        merged.runtime = merged.runtime.max(result.runtime);
        merged.usr_cpu += result.usr_cpu;
        merged.sys_cpu += result.sys_cpu;
        merged.mismatch_count += result.mismatch_count;
        merged.verified_blocks += result.verified_blocks;
        merged.mismatches.extend(result.mismatches.iter().copied());
        if merged.error.is_none() {
            merged.error.clone_from(&result.error);
        }
    }
    Some(merged)
}

fn runtime_ms(result: &JobResult) -> u64 {
    result.runtime.as_millis() as u64
}

fn bytes_per_second(direction: &DirectionResult, result: &JobResult) -> f64 {
    let seconds = result.runtime.as_secs_f64();
    if seconds > 0.0 { direction.bytes as f64 / seconds } else { 0.0 }
}

fn iops(direction: &DirectionResult, result: &JobResult) -> f64 {
    let seconds = result.runtime.as_secs_f64();
    if seconds > 0.0 { direction.ios as f64 / seconds } else { 0.0 }
}

fn cpu_percent(cpu: std::time::Duration, result: &JobResult) -> f64 {
    let seconds = result.runtime.as_secs_f64();
    if seconds > 0.0 { 100.0 * cpu.as_secs_f64() / seconds } else { 0.0 }
}

/// One latency histogram as fio writes it (`min`, `max`, `mean`, `stddev`, `N`, and for `clat_ns` the
/// `percentile` table).
fn latency_json(histogram: &Histogram<u64>, with_percentiles: bool) -> Value {
    let has_samples = !histogram.is_empty();
    let mut latency = json!({
        "min": if has_samples { histogram.min() } else { 0 },
        "max": if has_samples { histogram.max() } else { 0 },
        "mean": if has_samples { histogram.mean() } else { 0.0 },
        "stddev": if has_samples { histogram.stdev() } else { 0.0 },
        "N": histogram.len(),
    });
    if with_percentiles {
        let mut percentiles = serde_json::Map::new();
        for percentile in PERCENTILES {
            let value = if has_samples { histogram.value_at_percentile(percentile) } else { 0 };
            percentiles.insert(format!("{percentile:.6}"), json!(value));
        }
        latency["percentile"] = Value::Object(percentiles);
    }
    latency
}

fn direction_json(direction: &DirectionResult, result: &JobResult, lat_percentiles: bool) -> Value {
    let bw_bytes = bytes_per_second(direction, result);
    json!({
        "io_bytes": direction.bytes,
        "io_kbytes": direction.bytes / 1024,
        "bw_bytes": bw_bytes.round() as u64,
        "bw": (bw_bytes / 1024.0).round() as u64,
        "iops": iops(direction, result),
        "runtime": runtime_ms(result),
        "total_ios": direction.ios,
        "slat_ns": latency_json(&direction.slat_ns, false),
        "clat_ns": latency_json(&direction.clat_ns, true),
        "lat_ns": latency_json(&direction.lat_ns, lat_percentiles),
    })
}

/// One job's JSON entry.
pub fn job_json(result: &JobResult, job: &JobOptions) -> Value {
    json!({
        "jobname": result.name,
        "groupid": 0,
        "error": if result.error.is_some() { 5 } else { 0 },
        "error_message": result.error,
        "job options": {
            "rw": job.rw.name(),
            "bs": job.bs.to_string(),
            "iodepth": job.iodepth.to_string(),
            "ioengine": job.ioengine.name(),
            "direct": "1",
        },
        "read": direction_json(&result.read, result, job.lat_percentiles),
        "write": direction_json(&result.write, result, job.lat_percentiles),
        "usr_cpu": cpu_percent(result.usr_cpu, result),
        "sys_cpu": cpu_percent(result.sys_cpu, result),
        "ctx": 0,
        "verify": {
            "blocks_checked": result.verified_blocks,
            "mismatches": result.mismatch_count,
            "first_mismatches": result.mismatches.iter().map(|mismatch| json!({
                "offset": mismatch.offset,
                "reason": mismatch.kind.to_string(),
            })).collect::<Vec<_>>(),
        },
    })
}

/// The whole JSON document.
pub fn document_json(entries: Vec<Value>) -> Value {
    let timestamp =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_secs());
    json!({
        "fio version": concat!("strata-bench-", env!("CARGO_PKG_VERSION")),
        "timestamp": timestamp,
        "jobs": entries,
    })
}

/// `bytes` in fio's style: `294MiB` with `base` 1024, `308MB` with 1000.
fn human_bytes(bytes: f64, base: f64, units: [&str; 5]) -> String {
    let mut value = bytes;
    let mut unit = 0;
    while value >= base && unit < units.len() - 1 {
        value /= base;
        unit += 1;
    }
    if value >= 100.0 || unit == 0 {
        format!("{value:.0}{}", units[unit])
    } else {
        format!("{value:.1}{}", units[unit])
    }
}

fn human_bytes_binary(bytes: f64) -> String {
    human_bytes(bytes, 1024.0, ["B", "KiB", "MiB", "GiB", "TiB"])
}

fn human_bytes_decimal(bytes: f64) -> String {
    human_bytes(bytes, 1000.0, ["B", "kB", "MB", "GB", "TB"])
}

fn human_count(count: f64) -> String {
    if count >= 1e6 {
        format!("{:.2}M", count / 1e6)
    } else if count >= 1e3 {
        format!("{:.1}k", count / 1e3)
    } else {
        format!("{count:.0}")
    }
}

/// fio picks a latency line's unit from its mean.
fn latency_unit(histogram: &Histogram<u64>) -> (&'static str, f64) {
    if histogram.mean() >= 1_000_000.0 {
        ("msec", 1_000_000.0)
    } else if histogram.mean() >= 1_000.0 {
        ("usec", 1_000.0)
    } else {
        ("nsec", 1.0)
    }
}

fn direction_text(
    out: &mut String,
    label: &str,
    direction: &DirectionResult,
    result: &JobResult,
    lat_percentiles: bool,
) {
    if direction.ios == 0 {
        return;
    }
    let bw = bytes_per_second(direction, result);
    let _ = writeln!(
        out,
        "  {label}: IOPS={}, BW={}/s ({}/s)({}/{}msec)",
        human_count(iops(direction, result)),
        human_bytes_binary(bw),
        human_bytes_decimal(bw),
        human_bytes_binary(direction.bytes as f64),
        runtime_ms(result)
    );
    for (label, histogram) in [("slat", &direction.slat_ns), ("clat", &direction.clat_ns), (" lat", &direction.lat_ns)]
    {
        let (unit, divisor) = latency_unit(histogram);
        let scaled = |value: f64| value / divisor;
        let _ = writeln!(
            out,
            "    {label} ({unit}): min={:.0}, max={:.0}, avg={:.2}, stdev={:.2}",
            scaled(histogram.min() as f64),
            scaled(histogram.max() as f64),
            scaled(histogram.mean()),
            scaled(histogram.stdev())
        );
    }
    percentiles_text(out, "clat", &direction.clat_ns);
    if lat_percentiles {
        percentiles_text(out, " lat", &direction.lat_ns);
    }
}

/// A percentile table as fio prints it, four to a line.
fn percentiles_text(out: &mut String, label: &str, histogram: &Histogram<u64>) {
    let (unit, divisor) = latency_unit(histogram);
    let scaled = |value: f64| value / divisor;
    let _ = writeln!(out, "    {label} percentiles ({unit}):");
    for row in PERCENTILES.chunks(4) {
        let cells: Vec<String> = row
            .iter()
            .map(|&percentile| {
                format!("{percentile:5.2}th=[{:>6.0}]", scaled(histogram.value_at_percentile(percentile) as f64))
            })
            .collect();
        let _ = writeln!(out, "     | {}", cells.join(", "));
    }
}

/// One job's human report.
pub fn job_text(result: &JobResult, job: &JobOptions, clones: u32) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}: (g=0): rw={}, bs=(R) {}B-{}B, (W) {}B-{}B, ioengine={}, iodepth={}",
        result.name,
        job.rw.name(),
        job.bs,
        job.bs,
        job.bs,
        job.bs,
        job.ioengine.name(),
        job.iodepth
    );
    let error_code = if result.error.is_some() { 5 } else { 0 };
    let _ =
        writeln!(out, "{}: (groupid=0, jobs={clones}): err={error_code:>2}: pid={}", result.name, std::process::id());
    if let Some(error) = &result.error {
        let _ = writeln!(out, "  error: {error}");
    }
    direction_text(&mut out, "read", &result.read, result, job.lat_percentiles);
    direction_text(&mut out, "write", &result.write, result, job.lat_percentiles);
    let _ = writeln!(
        out,
        "  cpu          : usr={:.2}%, sys={:.2}%",
        cpu_percent(result.usr_cpu, result),
        cpu_percent(result.sys_cpu, result)
    );
    if result.verified_blocks > 0 || result.mismatch_count > 0 {
        let _ =
            writeln!(out, "  verify       : blocks={}, mismatches={}", result.verified_blocks, result.mismatch_count);
        for mismatch in &result.mismatches {
            let _ = writeln!(out, "    mismatch at offset {}: {}", mismatch.offset, mismatch.kind);
        }
    }
    out
}

/// fio's closing "Run status" lines over all results.
pub fn run_status_text(results: &[JobResult]) -> String {
    let mut out = String::from("\nRun status group 0 (all jobs):\n");
    for (label, pick) in [("READ", true), ("WRITE", false)] {
        let directions: Vec<(&DirectionResult, &JobResult)> =
            results.iter().map(|result| (if pick { &result.read } else { &result.write }, result)).collect();
        let bytes: u64 = directions.iter().map(|(direction, _)| direction.bytes).sum();
        if bytes == 0 {
            continue;
        }
        let longest = results.iter().map(|result| result.runtime).max().unwrap_or_default();
        let shortest = results.iter().map(|result| result.runtime).min().unwrap_or_default();
        let bw = if longest.as_secs_f64() > 0.0 { bytes as f64 / longest.as_secs_f64() } else { 0.0 };
        let _ = writeln!(
            out,
            "  {label:>5}: bw={}/s ({}/s), io={} ({}), run={}-{}msec",
            human_bytes_binary(bw),
            human_bytes_decimal(bw),
            human_bytes_binary(bytes as f64),
            human_bytes_decimal(bytes as f64),
            shortest.as_millis(),
            longest.as_millis()
        );
    }
    out
}
