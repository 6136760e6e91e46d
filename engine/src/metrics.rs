//! Counters a shard keeps and the node's `/metrics` (Prometheus text format) and `/healthz`.
//!
//! Each shard owns one [`ShardMetrics`] and is its only writer (relaxed atomic adds on its own cache lines);
//! the metrics thread only reads. There is no lock on the data path, and a scrape never stops a shard.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use strata_proto::{Opcode, Status};

/// Latency buckets of the per-op histograms, upper bounds in microseconds.
pub const LATENCY_BUCKETS_US: [u64; 16] =
    [5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 500_000, 1_000_000];

const OPS: usize = Opcode::ALL.len();

type Field = fn(&ShardMetrics) -> &AtomicU64;

/// Counters of one operation.
#[derive(Default)]
pub struct OpMetrics {
    /// Frames.
    pub frames: AtomicU64,
    /// Items (keys).
    pub items: AtomicU64,
    /// Items that did not succeed (misses excluded).
    pub errors: AtomicU64,
    /// Items that missed.
    pub misses: AtomicU64,
    /// Histogram of frame latency.
    pub latency_buckets: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
    /// Sum of frame latencies in nanoseconds.
    pub latency_sum_ns: AtomicU64,
}

/// Counters and gauges of one shard.
#[derive(Default)]
pub struct ShardMetrics {
    /// Per opcode, in wire order.
    pub ops: [OpMetrics; OPS],
    /// Open client connections.
    pub connections: AtomicU64,
    /// Connections closed for a protocol violation.
    pub protocol_errors: AtomicU64,
    /// Connections closed because their peer stalled mid-frame (`stall_timeout`).
    pub stalled_connections: AtomicU64,
    /// Connections closed because a frame moved slower than the minimum transfer rate.
    pub slow_connections: AtomicU64,
    /// Connections refused because the node or their tenant had its limit of connections.
    pub connections_refused: AtomicU64,
    /// Put items refused because the bytes of values still arriving were at their cap.
    pub partial_frame_refusals: AtomicU64,
    /// Bytes of values still arriving, claimed by this shard's connections (gauge).
    pub partial_frame_bytes: AtomicU64,
    /// Connections refused at HELLO (wrong token).
    pub auth_failures: AtomicU64,
    /// Items that arrived at the wrong shard and were forwarded.
    pub forwarded: AtomicU64,
    /// Items answered MOVED: sent under an older cluster membership for keys the node no longer owns.
    pub moved: AtomicU64,
    /// RDMA queue pairs connected for clients (RDMA_CONNECT).
    pub rdma_connections: AtomicU64,
    /// RDMA READs and WRITEs posted.
    pub rdma_work_requests: AtomicU64,
    /// RDMA work requests that completed with an error (their items answered TRANSFER).
    pub rdma_failures: AtomicU64,
    /// Times a connection waited on the reactor for its completion channel (the queue was empty once armed).
    pub rdma_waits: AtomicU64,
    /// Bytes received in values.
    pub bytes_in: AtomicU64,
    /// Bytes sent in values.
    pub bytes_out: AtomicU64,
    /// DRAM: resident objects (gauge).
    pub dram_objects: AtomicU64,
    /// DRAM: bytes allocated (gauge).
    pub dram_bytes: AtomicU64,
    /// DRAM: capacity (gauge).
    pub dram_capacity_bytes: AtomicU64,
    /// DRAM hits.
    pub dram_hits: AtomicU64,
    /// DRAM evictions.
    pub dram_evictions: AtomicU64,
    /// Objects that left because their parent or a member of their group did.
    pub cascade_removals: AtomicU64,
    /// Objects whose DRAM copy was written to NVMe on eviction (write-back).
    pub dram_writebacks: AtomicU64,
    /// NVMe: regions in use (gauge).
    pub nvme_regions_used: AtomicU64,
    /// NVMe: regions of the shard (gauge).
    pub nvme_regions: AtomicU64,
    /// NVMe: bytes per region (gauge).
    pub nvme_region_bytes: AtomicU64,
    /// NVMe hits.
    pub nvme_hits: AtomicU64,
    /// The most NVMe-tier reads the shard had in flight at once (gauge).
    pub nvme_reads_in_flight_peak: AtomicU64,
    /// Objects promoted from NVMe to DRAM.
    pub promotions: AtomicU64,
    /// NVMe hits due for promotion that found no DRAM room within a few clock steps.
    pub promotions_skipped: AtomicU64,
    /// DRAM clock positions visited by eviction.
    pub dram_clock_steps: AtomicU64,
    /// Regions reclaimed.
    pub reclaims: AtomicU64,
    /// Records reinserted at reclaim.
    pub reinsertions: AtomicU64,
    /// Objects dropped from the NVMe tier at reclaim.
    pub nvme_evictions: AtomicU64,
    /// Records appended.
    pub records_appended: AtomicU64,
    /// Bytes of records appended.
    pub record_bytes_appended: AtomicU64,
    /// Durable syncs (group commits).
    pub durable_syncs: AtomicU64,
    /// Stored bytes that failed their checksum on read (dropped, never served).
    pub checksum_failures: AtomicU64,
    /// Upserted objects dropped as possibly superseded: stored before the node was last out of its cluster.
    pub stale_upserts_dropped: AtomicU64,
    /// Device errors.
    pub io_errors: AtomicU64,
    /// Index: objects (gauge).
    pub index_objects: AtomicU64,
    /// Index: bytes (gauge).
    pub index_bytes: AtomicU64,
    /// Recovery: records restored at start-up.
    pub recovered_records: AtomicU64,
    /// Recovery: records lost to damage at start-up (damaged records, and spans of unreadable bytes).
    pub recovery_lost_records: AtomicU64,
    /// Recovery: bytes of those records and spans.
    pub recovery_lost_bytes: AtomicU64,
    /// Recovery: regions whose header was damaged or that could not be read.
    pub recovery_lost_regions: AtomicU64,
    /// Recovery: keys dropped because a newer record of theirs may have been among those lost.
    pub recovery_dropped_keys: AtomicU64,
    /// Whether the NVMe tier is poisoned by a failed write (gauge, 0/1).
    pub nvme_poisoned: AtomicU64,
    /// Whether a target refused the shard's I/O with a reservation conflict (gauge, 0/1): another node took
    /// the namespace over and fenced this one off it, which must stop serving.
    pub nvme_fenced: AtomicU64,
    /// Bytes of pinned objects, hard and soft (gauge).
    pub pinned_bytes: AtomicU64,
    /// Per tenant usage of this shard, published by the shard (with `try_lock`, never waiting).
    pub tenants: std::sync::Mutex<Vec<TenantGauge>>,
}

/// A tenant's bytes on one shard.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantGauge {
    /// Its name.
    pub tenant: String,
    /// DRAM bytes.
    pub dram_bytes: u64,
    /// NVMe bytes.
    pub nvme_bytes: u64,
    /// Pinned bytes.
    pub pinned_bytes: u64,
}

/// Adds `value` to a counter.
pub fn add(counter: &AtomicU64, value: u64) {
    counter.fetch_add(value, Ordering::Relaxed);
}

/// Sets a gauge.
pub fn set(gauge: &AtomicU64, value: u64) {
    gauge.store(value, Ordering::Relaxed);
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

impl ShardMetrics {
    /// Records a frame of `opcode` with `items` items, the failed and missed ones, and its latency.
    pub fn frame(&self, opcode: Opcode, items: u64, errors: u64, misses: u64, latency_ns: u64) {
        let op = &self.ops[opcode as usize - 1];
        add(&op.frames, 1);
        add(&op.items, items);
        add(&op.errors, errors);
        add(&op.misses, misses);
        add(&op.latency_sum_ns, latency_ns);
        let micros = latency_ns / 1000;
        let bucket = LATENCY_BUCKETS_US.iter().position(|&bound| micros <= bound).unwrap_or(LATENCY_BUCKETS_US.len());
        add(&op.latency_buckets[bucket], 1);
    }
}

/// Whether an item status counts as an error (a miss is not one, nor a put of a key already stored).
pub fn is_error(status: Status) -> bool {
    !matches!(status, Status::Ok | Status::NotFound | Status::Exists)
}

/// CPU time of the whole process (user + system), in nanoseconds.
pub fn process_cpu_ns() -> u64 {
    cpu_ns_in_stat("/proc/self/stat")
}

/// The calling thread's CPU time (user + system), in nanoseconds, at the kernel's tick resolution.
pub fn thread_cpu_ns() -> u64 {
    cpu_ns_in_stat("/proc/thread-self/stat")
}

fn cpu_ns_in_stat(path: &str) -> u64 {
    // A stat file's fields 14 and 15 (utime, stime) in clock ticks; the field after the command name,
    // which is in parentheses and may hold spaces, is field 3.
    let Ok(stat) = std::fs::read_to_string(path) else { return 0 };
    let Some(after_name) = stat.rfind(')').map(|at| &stat[at + 1..]) else { return 0 };
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |index: usize| fields.get(index).and_then(|field| field.parse::<u64>().ok()).unwrap_or(0);
    // After the name: field 3 is index 0, so utime (14) is index 11 and stime (15) index 12.
    let ticks_per_second = 100; // USER_HZ on Linux
    (ticks(11) + ticks(12)) * (1_000_000_000 / ticks_per_second)
}

/// Renders every shard's metrics in Prometheus text format.
pub fn render(shards: &[std::sync::Arc<ShardMetrics>]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# HELP strata_process_cpu_seconds_total CPU time of the node process (user + system).");
    let _ = writeln!(out, "# TYPE strata_process_cpu_seconds_total counter");
    let _ = writeln!(out, "strata_process_cpu_seconds_total {:.6}", process_cpu_ns() as f64 / 1e9);
    let _ = writeln!(out, "# TYPE strata_shards gauge\nstrata_shards {}", shards.len());

    render_ops(&mut out, shards);
    render_tiers(&mut out, shards);
    render_counters(&mut out, shards);
    render_tenants(&mut out, shards);
    out
}

/// A counter summed over the shards.
fn sum_of(shards: &[std::sync::Arc<ShardMetrics>], field: Field) -> u64 {
    shards.iter().map(|shard| get(field(shard))).sum()
}

/// Per operation: items, frames, errors, misses, and the latency histogram.
fn render_ops(out: &mut String, shards: &[std::sync::Arc<ShardMetrics>]) {
    let _ = writeln!(out, "# HELP strata_op_items_total Items (keys) handled, per operation.");
    let _ = writeln!(out, "# TYPE strata_op_items_total counter");
    for opcode in Opcode::ALL {
        let index = opcode as usize - 1;
        let items: u64 = shards.iter().map(|shard| get(&shard.ops[index].items)).sum();
        let _ = writeln!(out, "strata_op_items_total{{op=\"{}\"}} {items}", opcode.name());
    }
    for (name, help, field) in [
        (
            "strata_op_frames_total",
            "Frames handled, per operation.",
            (|op: &OpMetrics| &op.frames) as fn(&OpMetrics) -> &AtomicU64,
        ),
        ("strata_op_errors_total", "Items that failed (misses excluded), per operation.", |op: &OpMetrics| &op.errors),
        ("strata_op_misses_total", "Items that missed, per operation.", |op: &OpMetrics| &op.misses),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for opcode in Opcode::ALL {
            let index = opcode as usize - 1;
            let value: u64 = shards.iter().map(|shard| get(field(&shard.ops[index]))).sum();
            let _ = writeln!(out, "{name}{{op=\"{}\"}} {value}", opcode.name());
        }
    }
    let _ =
        writeln!(out, "# HELP strata_op_latency_seconds Latency of a frame, from its header read to its reply sent.");
    let _ = writeln!(out, "# TYPE strata_op_latency_seconds histogram");
    for opcode in Opcode::ALL {
        let index = opcode as usize - 1;
        let mut cumulative = 0u64;
        for (bucket, bound) in LATENCY_BUCKETS_US.iter().enumerate() {
            cumulative += shards.iter().map(|shard| get(&shard.ops[index].latency_buckets[bucket])).sum::<u64>();
            let _ = writeln!(
                out,
                "strata_op_latency_seconds_bucket{{op=\"{}\",le=\"{}\"}} {cumulative}",
                opcode.name(),
                *bound as f64 / 1e6
            );
        }
        cumulative +=
            shards.iter().map(|shard| get(&shard.ops[index].latency_buckets[LATENCY_BUCKETS_US.len()])).sum::<u64>();
        let _ = writeln!(out, "strata_op_latency_seconds_bucket{{op=\"{}\",le=\"+Inf\"}} {cumulative}", opcode.name());
        let sum_ns: u64 = shards.iter().map(|shard| get(&shard.ops[index].latency_sum_ns)).sum();
        let _ = writeln!(out, "strata_op_latency_seconds_sum{{op=\"{}\"}} {:.9}", opcode.name(), sum_ns as f64 / 1e9);
        let _ = writeln!(out, "strata_op_latency_seconds_count{{op=\"{}\"}} {cumulative}", opcode.name());
    }
}

/// Per tier: objects, bytes, capacity, hits, evictions.
fn render_tiers(out: &mut String, shards: &[std::sync::Arc<ShardMetrics>]) {
    let sum = |field: Field| sum_of(shards, field);
    let tiers: [(&str, &str, &str, Field); 6] = [
        ("strata_tier_objects", "gauge", "dram", |s| &s.dram_objects),
        ("strata_tier_bytes", "gauge", "dram", |s| &s.dram_bytes),
        ("strata_tier_capacity_bytes", "gauge", "dram", |s| &s.dram_capacity_bytes),
        ("strata_tier_hits_total", "counter", "dram", |s| &s.dram_hits),
        ("strata_tier_evictions_total", "counter", "dram", |s| &s.dram_evictions),
        ("strata_tier_hits_total", "counter", "nvme", |s| &s.nvme_hits),
    ];
    let mut typed = std::collections::HashSet::new();
    for (name, kind, tier, field) in tiers {
        if typed.insert(name) {
            let _ = writeln!(out, "# TYPE {name} {kind}");
        }
        let _ = writeln!(out, "{name}{{tier=\"{tier}\"}} {}", sum(field));
    }
    let region_bytes = shards.first().map_or(0, |shard| get(&shard.nvme_region_bytes));
    let _ = writeln!(out, "strata_tier_bytes{{tier=\"nvme\"}} {}", sum(|s| &s.nvme_regions_used) * region_bytes);
    let _ = writeln!(out, "strata_tier_capacity_bytes{{tier=\"nvme\"}} {}", sum(|s| &s.nvme_regions) * region_bytes);
    let _ = writeln!(out, "strata_tier_evictions_total{{tier=\"nvme\"}} {}", sum(|s| &s.nvme_evictions));
}

/// The node-wide counters and gauges.
fn render_counters(out: &mut String, shards: &[std::sync::Arc<ShardMetrics>]) {
    let sum = |field: Field| sum_of(shards, field);
    let counters: [(&str, &str, Field); 38] = [
        ("strata_misses_total", "Lookups that found no object.", |s| &s.ops[Opcode::Get as usize - 1].misses),
        ("strata_promotions_total", "Objects promoted from NVMe to DRAM.", |s| &s.promotions),
        ("strata_promotions_skipped_total", "NVMe hits due for promotion that found no DRAM room at once.", |s| {
            &s.promotions_skipped
        }),
        ("strata_dram_clock_steps_total", "DRAM clock positions visited by eviction.", |s| &s.dram_clock_steps),
        ("strata_dram_writebacks_total", "Objects written to NVMe when evicted from DRAM.", |s| &s.dram_writebacks),
        ("strata_region_reclaims_total", "NVMe regions reclaimed.", |s| &s.reclaims),
        ("strata_reinsertions_total", "Records reinserted when their region was reclaimed.", |s| &s.reinsertions),
        ("strata_records_appended_total", "Records appended to the region log.", |s| &s.records_appended),
        ("strata_record_bytes_appended_total", "Bytes of records appended.", |s| &s.record_bytes_appended),
        ("strata_durable_syncs_total", "Durable syncs of the open region (group commits).", |s| &s.durable_syncs),
        ("strata_checksum_failures_total", "Stored objects that failed their checksum (never served).", |s| {
            &s.checksum_failures
        }),
        ("strata_io_errors_total", "Device errors.", |s| &s.io_errors),
        (
            "strata_stale_upserts_dropped_total",
            "Upserted objects dropped: stored before the node was last out of its cluster.",
            |s| &s.stale_upserts_dropped,
        ),
        ("strata_forwarded_total", "Items that reached the wrong shard and were forwarded.", |s| &s.forwarded),
        (
            "strata_moved_total",
            "Items answered MOVED: an older cluster membership's request for a key owned elsewhere.",
            |s| &s.moved,
        ),
        ("strata_rdma_connections_total", "RDMA queue pairs connected for clients.", |s| &s.rdma_connections),
        ("strata_rdma_work_requests_total", "RDMA READs and WRITEs posted.", |s| &s.rdma_work_requests),
        ("strata_rdma_failures_total", "RDMA work requests that completed with an error.", |s| &s.rdma_failures),
        (
            "strata_rdma_waits_total",
            "Waits on the reactor for an RDMA completion channel (the queue was empty once armed).",
            |s| &s.rdma_waits,
        ),
        (
            "strata_cascade_removals_total",
            "Objects that left because their parent or a member of their group left.",
            |s| &s.cascade_removals,
        ),
        ("strata_protocol_errors_total", "Connections closed for a protocol violation.", |s| &s.protocol_errors),
        (
            "strata_stalled_connections_total",
            "Connections closed because their peer stalled in the middle of a frame.",
            |s| &s.stalled_connections,
        ),
        (
            "strata_slow_connections_total",
            "Connections closed because a frame moved slower than the minimum transfer rate.",
            |s| &s.slow_connections,
        ),
        (
            "strata_connections_refused_total",
            "Connections refused at the node's or their tenant's connection limit.",
            |s| &s.connections_refused,
        ),
        (
            "strata_partial_frame_refusals_total",
            "Put items refused because the bytes of values still arriving were at their cap.",
            |s| &s.partial_frame_refusals,
        ),
        ("strata_partial_frame_bytes", "Bytes of values still arriving (claimed against the cap).", |s| {
            &s.partial_frame_bytes
        }),
        ("strata_auth_failures_total", "HELLOs refused for a wrong token.", |s| &s.auth_failures),
        ("strata_value_bytes_received_total", "Bytes of values received.", |s| &s.bytes_in),
        ("strata_value_bytes_sent_total", "Bytes of values sent.", |s| &s.bytes_out),
        ("strata_recovered_records_total", "Records restored from the NVMe tier at start-up.", |s| {
            &s.recovered_records
        }),
        ("strata_recovery_lost_records_total", "Records lost to damage found at start-up.", |s| {
            &s.recovery_lost_records
        }),
        ("strata_recovery_lost_bytes_total", "Bytes of the records lost to damage found at start-up.", |s| {
            &s.recovery_lost_bytes
        }),
        ("strata_recovery_lost_regions_total", "Regions damaged or unreadable at start-up.", |s| {
            &s.recovery_lost_regions
        }),
        (
            "strata_recovery_dropped_keys_total",
            "Keys dropped at start-up because a newer record of theirs may have been lost.",
            |s| &s.recovery_dropped_keys,
        ),
        ("strata_connections", "Open client connections.", |s| &s.connections),
        ("strata_index_objects", "Objects in the index.", |s| &s.index_objects),
        ("strata_index_bytes", "Bytes of the index.", |s| &s.index_bytes),
        ("strata_pinned_bytes", "Bytes of pinned objects (hard and soft).", |s| &s.pinned_bytes),
    ];
    for (name, help, field) in counters {
        let kind = if name.ends_with("_total") { "counter" } else { "gauge" };
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}", sum(field));
    }
    let _ =
        writeln!(out, "# TYPE strata_nvme_poisoned gauge\nstrata_nvme_poisoned {}", sum(|s| &s.nvme_poisoned).min(1));
    let _ = writeln!(out, "# TYPE strata_nvme_fenced gauge\nstrata_nvme_fenced {}", sum(|s| &s.nvme_fenced).min(1));
    let peak = shards.iter().map(|shard| get(&shard.nvme_reads_in_flight_peak)).max().unwrap_or(0);
    let _ = writeln!(
        out,
        "# HELP strata_nvme_reads_in_flight_peak The most NVMe-tier reads one shard had in flight at once.\n\
         # TYPE strata_nvme_reads_in_flight_peak gauge\nstrata_nvme_reads_in_flight_peak {peak}"
    );
}

/// Per tenant: bytes per tier.
fn render_tenants(out: &mut String, shards: &[std::sync::Arc<ShardMetrics>]) {
    let mut per_tenant: std::collections::BTreeMap<String, TenantGauge> = std::collections::BTreeMap::new();
    for shard in shards {
        let published = shard.tenants.lock().map(|gauges| gauges.clone()).unwrap_or_default();
        for gauge in published {
            let total = per_tenant.entry(gauge.tenant.clone()).or_default();
            total.dram_bytes += gauge.dram_bytes;
            total.nvme_bytes += gauge.nvme_bytes;
            total.pinned_bytes += gauge.pinned_bytes;
        }
    }
    if !per_tenant.is_empty() {
        let _ = writeln!(
            out,
            "# HELP strata_tenant_bytes Bytes of a tenant's objects per tier.\n# TYPE strata_tenant_bytes gauge"
        );
        for (name, gauge) in &per_tenant {
            // A label value escapes backslashes, quotes and newlines (Prometheus text format).
            let tenant = name.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
            for (tier, bytes) in
                [("dram", gauge.dram_bytes), ("nvme", gauge.nvme_bytes), ("pinned", gauge.pinned_bytes)]
            {
                let _ = writeln!(out, "strata_tenant_bytes{{tenant=\"{tenant}\",tier=\"{tier}\"}} {bytes}");
            }
        }
    }
}

/// `/healthz`: 503 when the NVMe tier is poisoned; otherwise 200, "ok" or a "degraded" line per part that
/// is (the shards still serve).
fn health(
    shards: &[std::sync::Arc<ShardMetrics>],
    reports: &crate::reports::Reports,
) -> (&'static str, &'static str, String) {
    if fenced(shards) {
        return ("503 Service Unavailable", "text/plain", "fenced: another node took the nvme tier over\n".to_string());
    }
    if shards.iter().any(|shard| get(&shard.nvme_poisoned) != 0) {
        return ("503 Service Unavailable", "text/plain", "nvme tier poisoned by a failed write\n".to_string());
    }
    let degraded = reports.degraded();
    if degraded.is_empty() {
        return ("200 OK", "text/plain", "ok\n".to_string());
    }
    ("200 OK", "text/plain", degraded.iter().map(|line| format!("degraded: {line}\n")).collect())
}

/// Capacity and use of a node's tiers, summed over its shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierUsage {
    /// DRAM tier bytes.
    pub dram_capacity: u64,
    /// DRAM bytes allocated.
    pub dram_used: u64,
    /// NVMe tier bytes (whole regions).
    pub nvme_capacity: u64,
    /// NVMe bytes in regions in use.
    pub nvme_used: u64,
    /// Keys in the shards' indexes.
    pub keys: u64,
}

/// Whether a shard was fenced off its NVMe tier (a reservation conflict): the node must stop serving.
pub fn fenced(shards: &[std::sync::Arc<ShardMetrics>]) -> bool {
    shards.iter().any(|shard| get(&shard.nvme_fenced) != 0)
}

/// The tiers' capacity and use now, from the shards' gauges.
pub fn tier_usage(shards: &[std::sync::Arc<ShardMetrics>]) -> TierUsage {
    let mut usage = TierUsage::default();
    for shard in shards {
        let region_bytes = get(&shard.nvme_region_bytes);
        usage.dram_capacity += get(&shard.dram_capacity_bytes);
        usage.dram_used += get(&shard.dram_bytes);
        usage.nvme_capacity += get(&shard.nvme_regions) * region_bytes;
        usage.nvme_used += get(&shard.nvme_regions_used) * region_bytes;
        usage.keys += get(&shard.index_objects);
    }
    usage
}

/// Serves `/metrics` and `/healthz` on `listener` until `stop` is set (checked between requests and every
/// 100 ms), with the parts' `reports` after the shards'. One thread, blocking I/O: a scrape is a few
/// kilobytes every few seconds.
pub fn serve_http(
    listener: std::net::TcpListener,
    shards: Vec<std::sync::Arc<ShardMetrics>>,
    reports: crate::reports::Reports,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use std::io::{Read, Write};
    let _ = listener.set_nonblocking(true);
    while !stop.load(Ordering::SeqCst) {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
            Err(_) => continue,
        };
        let mut stream = stream;
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(2)));
        let mut request = [0u8; 2048];
        let read = stream.read(&mut request).unwrap_or(0);
        let line = String::from_utf8_lossy(&request[..read]);
        let path = line.split_whitespace().nth(1).unwrap_or("");
        let (status, content_type, body) = match path {
            "/metrics" => ("200 OK", "text/plain; version=0.0.4", render(&shards) + &reports.metrics()),
            "/healthz" => health(&shards, &reports),
            _ => ("404 Not Found", "text/plain", "try /metrics or /healthz\n".to_string()),
        };
        let _ = write!(
            stream,
            "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
}
