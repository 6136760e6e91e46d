//! `strata-bench kv`: drives a node with puts, gets, exists or a mix, and reports what a caller sees.
//!
//! Keys and values are derived from the key index and `--seed`: key `i` is `strata-bench/{seed}/{i}` and its
//! value is a seeded random pattern with `i` in its first eight bytes. So a later run (or another process)
//! can `--verify` what an earlier one wrote, every byte, and a value stored under the wrong key never passes.
//! A put rewrites only those eight bytes of a per-connection buffer: the bench spends its core on moving
//! bytes, not on making them.
//!
//! Each connection is a thread with its own client (one socket per shard). Latency is per call (a batch is
//! one call), measured from the call's *scheduled* start when `--rate` paces the calls, so a slow reply
//! delays the following calls' measurements instead of hiding them (no coordinated omission).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use strata_client::{
    BlockPut, Client, ClientError, ClientOptions, ClusterOptions, Links, PutOptions, SharedBuffer, Transport,
    WritePolicy,
};

use crate::block_bench::options::RandomDistribution;
use crate::block_bench::workload::BlockPicker;
use crate::byte_size::parse_byte_size;
use crate::kv_timeline::{self, IntervalReport, Timeline};
use crate::subscribe_windows::{Completions, WindowReport};

/// What to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KvOp {
    /// Puts.
    Put,
    /// Gets (into a reused buffer, like `get_into`).
    Get,
    /// Gets and puts, `--rwmix` percent gets.
    Mixed,
    /// Exists.
    Exists,
    /// Prefix match of a chain of `--batch` consecutive stored keys (each call must match all of them).
    #[value(name = "prefix-match")]
    #[serde(rename = "prefix-match")]
    PrefixMatch,
}

/// How a run's values move between the node and the bench.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KvTransport {
    /// Over TCP, into and out of the bench's own buffers (the shared-memory path is not offered).
    Tcp,
    /// Through shared memory (`SharedBuffer`): the run fails unless the node offered the path.
    Shm,
    /// `SharedBuffer` calls, through shared memory where the node offers it, else over TCP.
    Auto,
    /// By RDMA (`RdmaBuffer`, `--rdma-device`): the run fails unless every shard connected a queue pair.
    /// Needs a build with feature `rdma`.
    Rdma,
}

/// The buffer a run's values move through in place: shared memory, or memory registered for RDMA.
enum InPlace {
    Shared(SharedBuffer),
    #[cfg(feature = "rdma")]
    Rdma(strata_client::RdmaBuffer),
}

impl InPlace {
    fn new(client: &mut Client, args: &KvArgs, len: usize) -> anyhow::Result<Option<InPlace>> {
        Ok(match args.transport {
            KvTransport::Tcp => None,
            #[cfg(feature = "rdma")]
            KvTransport::Rdma => Some(InPlace::Rdma(client.rdma_buffer(len).context("an RDMA buffer")?)),
            #[cfg(not(feature = "rdma"))]
            KvTransport::Rdma => {
                let _ = client;
                bail!("--transport rdma: this strata-bench was built without feature rdma")
            }
            KvTransport::Shm | KvTransport::Auto => {
                Some(InPlace::Shared(SharedBuffer::new(len).context("a shared buffer")?))
            }
        })
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            InPlace::Shared(buffer) => buffer.as_slice(),
            #[cfg(feature = "rdma")]
            InPlace::Rdma(buffer) => buffer.as_slice(),
        }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            InPlace::Shared(buffer) => buffer.as_mut_slice(),
            #[cfg(feature = "rdma")]
            InPlace::Rdma(buffer) => buffer.as_mut_slice(),
        }
    }

    fn get(
        &mut self,
        client: &mut Client,
        keys: &[&[u8]],
        spans: &[(usize, usize)],
    ) -> Vec<Result<usize, ClientError>> {
        match self {
            InPlace::Shared(buffer) => client.batch_get_into_shared(keys, buffer, spans),
            #[cfg(feature = "rdma")]
            InPlace::Rdma(buffer) => client.batch_get_into_rdma(keys, buffer, spans),
        }
    }

    fn put(
        &self,
        client: &mut Client,
        (keys, spans): (&[&[u8]], &[(usize, usize)]),
        options: PutOptions,
    ) -> Vec<Result<(), ClientError>> {
        match self {
            InPlace::Shared(buffer) => client.batch_put_from_shared(keys, buffer, spans, options),
            #[cfg(feature = "rdma")]
            InPlace::Rdma(buffer) => client.batch_put_from_rdma(keys, buffer, spans, options),
        }
    }
}

/// `strata-bench kv` options.
#[derive(Clone, Debug, clap::Args)]
pub struct KvArgs {
    /// A shard's address of the node.
    #[arg(long, default_value = "127.0.0.1:7600")]
    pub server: String,
    /// Drive a cluster instead of one node: etcd://HOST:PORT[,HOST:PORT…] (--server is then unused).
    #[arg(long)]
    pub cluster: Option<String>,
    /// The cluster's name, with --cluster.
    #[arg(long, default_value = "strata")]
    pub cluster_name: String,
    /// Nodes that store each put, with --cluster.
    #[arg(long, default_value_t = 1)]
    pub replicas: u8,
    /// Operation.
    #[arg(long, value_enum, default_value_t = KvOp::Get)]
    pub op: KvOp,
    /// Percent of gets in --op mixed.
    #[arg(long, default_value_t = 50)]
    pub rwmix: u32,
    /// Bytes per value (4k, 64k, 4m, ...).
    #[arg(long, default_value = "4k", value_parser = parse_byte_size)]
    pub value_size: u64,
    /// Keys in the working set.
    #[arg(long, default_value_t = 10_000)]
    pub keys: u64,
    /// How values move: tcp, shm (shared memory with a node on this host), auto, or rdma.
    #[arg(long, value_enum, default_value_t = KvTransport::Tcp)]
    pub transport: KvTransport,
    /// The RDMA device of `--transport rdma` (as `ibv_devices` names it, e.g. rxe0).
    #[arg(long)]
    pub rdma_device: Option<String>,
    /// Keys per call (1: single-key calls).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Connections (threads, each a client).
    #[arg(long, default_value_t = 1)]
    pub connections: usize,
    /// uniform or zipf:θ.
    #[arg(long, default_value = "uniform")]
    pub distribution: String,
    /// Seconds to run (after preloading).
    #[arg(long, default_value_t = 10.0)]
    pub runtime: f64,
    /// Check every byte read against what the key's value must be.
    #[arg(long)]
    pub verify: bool,
    /// Seed of keys, values and the key sequence.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Read (or check) without writing the keys first.
    #[arg(long)]
    pub no_preload: bool,
    /// Visit every key exactly once (split between connections), then stop.
    #[arg(long)]
    pub once: bool,
    /// Calls per second over all connections (0: as fast as replies come).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Write policy of puts (default: the node's).
    #[arg(long)]
    pub write_policy: Option<String>,
    /// Token for the node's HELLO.
    #[arg(long)]
    pub token: Option<String>,
    /// The node's metrics address, for its CPU time per operation ("off" to skip).
    #[arg(long, default_value = "127.0.0.1:9600")]
    pub metrics: String,
    /// normal or json.
    #[arg(long = "output-format", default_value = "normal")]
    pub output_format: String,
    /// Busy-poll each reply this long before sleeping (e.g. 100us): lower latency, a busy client core.
    #[arg(long)]
    pub spin: Option<String>,
    /// Skip the client's crc32c check of each value read (on by default: checksums are end to end), to
    /// measure what the check costs.
    #[arg(long)]
    pub skip_crc: bool,
    /// Ask for whole replies only (no FRAME_STREAMED): a batch of tier reads is then answered once its last
    /// read is done, to measure what streaming gains.
    #[arg(long)]
    pub no_streamed_replies: bool,
    /// Subscribe to the node's events during the run and count them (events/s in the report).
    #[arg(long)]
    pub subscribe: bool,
    /// Measure what a subscriber costs the puts inside this run: a subscriber is connected in alternate
    /// pairs of windows this long (e.g. 250ms) and puts/s are compared between the two kinds of window
    /// (the report's `windows`; see `subscribe_windows.rs`).
    #[arg(long, value_name = "DURATION", conflicts_with = "subscribe")]
    pub subscribe_windows: Option<String>,
    /// The node's process id, when it runs on this machine: --subscribe-windows then also reports its CPU
    /// time per key in each kind of window (from its threads' /proc schedstat).
    #[arg(long, value_name = "PID", requires = "subscribe_windows")]
    pub node_pid: Option<u32>,
    /// Puts link keys into chains of this many: key i names key i - 1 as its parent unless i is a multiple
    /// of it (the shape of prefix chains, so an eviction cascades down the rest of its chain).
    #[arg(long, value_name = "CHAIN_LENGTH")]
    pub link_parents: Option<u64>,
    /// Also report the run in intervals of this many ms (fio's log_avg_msec): calls, errors and latency
    /// percentiles per interval (the report's `intervals`).
    #[arg(long, value_name = "MS")]
    pub log_avg_msec: Option<u64>,
}

/// Latency percentiles in nanoseconds.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Latency {
    /// Median.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Mean.
    pub mean: f64,
    /// Largest.
    pub max: u64,
}

/// A run's result (the JSON output's fields).
#[derive(Clone, Debug, serde::Serialize)]
pub struct KvReport {
    /// Operation.
    pub op: KvOp,
    /// Bytes per value.
    pub value_size: u64,
    /// Keys per call.
    pub batch: usize,
    /// Connections.
    pub connections: usize,
    /// Keys handled per second.
    pub ops_per_sec: f64,
    /// Value bytes moved per second.
    pub bytes_per_sec: f64,
    /// Calls per second.
    pub calls_per_sec: f64,
    /// Latency per call.
    pub lat_ns: Latency,
    /// Keys that failed (misses of a preloaded key included).
    pub errors: u64,
    /// Keys whose bytes were wrong (with --verify).
    pub mismatches: u64,
    /// Keys not found.
    pub not_found: u64,
    /// Keys handled.
    pub keys_done: u64,
    /// Seconds measured.
    pub runtime_s: f64,
    /// The node's CPU time per key (from its metrics), if reachable.
    pub server_cpu_ns_per_op: Option<f64>,
    /// This process's CPU time per key.
    pub client_cpu_ns_per_op: f64,
    /// Up to 5 error messages.
    pub error_samples: Vec<String>,
    /// Block events received by the --subscribe subscriber during the run: one per key an event names
    /// (an event on the wire names one key or many, as vLLM's do).
    pub events_received: Option<u64>,
    /// The events on the wire that carried them.
    pub wire_events_received: Option<u64>,
    /// Events on the wire it was told it missed (LAGGED).
    pub events_missed: Option<u64>,
    /// Block events received per second.
    pub events_per_sec: Option<f64>,
    /// CPU time of the subscriber's thread per block event received (what looking at the stream costs a
    /// router; at the kernel's 10 ms tick resolution, so meaningful over runs of seconds).
    pub subscriber_cpu_ns_per_event: Option<f64>,
    /// With --subscribe-windows: puts/s with and without a subscriber, windows interleaved.
    pub windows: Option<WindowReport>,
    /// With --log-avg-msec: the run interval by interval.
    pub intervals: Option<Vec<IntervalReport>>,
}

/// The key of index `index`.
pub fn key(seed: u64, index: u64) -> Vec<u8> {
    format!("strata-bench/{seed}/{index}").into_bytes()
}

/// The values of a run: one seeded pattern, tagged with the key index.
pub struct Values {
    pattern: Vec<u8>,
    len: usize,
}

impl Values {
    /// Values of `len` bytes for `seed`.
    pub fn new(seed: u64, len: usize) -> Self {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let words = len / 8 + 1;
        let mut pattern = Vec::with_capacity(words * 8);
        for _ in 0..words {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            pattern.extend_from_slice(&state.to_le_bytes());
        }
        Self { pattern, len }
    }

    /// Writes key `index`'s value into `out`: the whole pattern the first time, the tag after that.
    pub fn fill(&self, index: u64, out: &mut Vec<u8>) {
        if out.len() != self.len {
            out.clear();
            out.extend_from_slice(&self.pattern[..self.len]);
        }
        let tag = index.to_le_bytes();
        let take = tag.len().min(out.len());
        out[..take].copy_from_slice(&tag[..take]);
    }

    /// Makes `out` (as long as a value, holding a value already) key `index`'s value: its tag.
    pub fn stamp(&self, index: u64, out: &mut [u8]) {
        let tag = index.to_le_bytes();
        let take = tag.len().min(out.len());
        out[..take].copy_from_slice(&tag[..take]);
    }

    /// Whether `bytes` is key `index`'s value.
    pub fn matches(&self, index: u64, bytes: &[u8]) -> bool {
        let tag = index.to_le_bytes();
        let take = tag.len().min(self.len);
        bytes.len() == self.len && bytes[..take] == tag[..take] && bytes[take..] == self.pattern[take..self.len]
    }
}

fn distribution(text: &str) -> anyhow::Result<RandomDistribution> {
    if text == "uniform" || text == "random" {
        return Ok(RandomDistribution::Random);
    }
    let theta: f64 = text
        .strip_prefix("zipf:")
        .and_then(|theta| theta.parse().ok())
        .with_context(|| format!("distribution {text:?}: expected uniform or zipf:θ"))?;
    if theta <= 0.0 {
        bail!("zipf's θ must be positive");
    }
    Ok(RandomDistribution::Zipf(theta))
}

fn process_cpu_ns() -> u64 {
    strata_engine::metrics::process_cpu_ns()
}

/// The node's `strata_process_cpu_seconds_total`, in nanoseconds.
pub fn server_cpu_ns(metrics: &str) -> Option<u64> {
    use std::io::{Read, Write};
    if metrics == "off" {
        return None;
    }
    let addr: std::net::SocketAddr = metrics.parse().ok()?;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let line = text.lines().find(|line| line.starts_with("strata_process_cpu_seconds_total "))?;
    let seconds: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some((seconds * 1e9) as u64)
}

struct ThreadResult {
    histogram: Histogram<u64>,
    keys: u64,
    calls: u64,
    bytes: u64,
    errors: u64,
    not_found: u64,
    mismatches: u64,
    samples: Vec<String>,
    timeline: Option<Timeline>,
}

impl ThreadResult {
    /// A call that took `elapsed_ns` completed.
    fn record(&mut self, elapsed_ns: u64) {
        self.histogram.saturating_record(elapsed_ns.max(1));
        if let Some(timeline) = &mut self.timeline {
            timeline.record(elapsed_ns);
        }
    }
}

fn record_error(result: &mut ThreadResult, error: &ClientError) {
    if let Some(timeline) = &mut result.timeline {
        timeline.record_error();
    }
    if *error == ClientError::NotFound {
        result.not_found += 1;
    }
    result.errors += 1;
    if result.samples.len() < 5 {
        result.samples.push(error.to_string());
    }
}

fn connect(args: &KvArgs) -> anyhow::Result<Client> {
    let spin_before_block = match &args.spin {
        Some(text) => Some(crate::pool::parse_duration(text)?),
        None => None,
    };
    let options = ClientOptions {
        token: args.token.as_ref().map(|token| token.as_bytes().to_vec()),
        spin_before_block,
        shared_memory: matches!(args.transport, KvTransport::Shm | KvTransport::Auto),
        rdma_device: args.rdma_device.clone(),
        verify_checksums: !args.skip_crc,
        streamed_replies: !args.no_streamed_replies,
        ..ClientOptions::default()
    };
    if let Some(etcd) = &args.cluster {
        let cluster = ClusterOptions {
            cluster: args.cluster_name.clone(),
            replicas: args.replicas,
            client: options,
            ..ClusterOptions::new(etcd)
        };
        return Client::connect_cluster(&cluster).with_context(|| format!("connecting to cluster {etcd}"));
    }
    let mut client =
        Client::connect(args.server.as_str(), options).with_context(|| format!("connecting to {}", args.server))?;
    if args.transport == KvTransport::Shm && client.shared_transport() != Transport::SharedMemory {
        bail!("--transport shm: the node did not offer the shared-memory path (is it on this host, and on?)");
    }
    #[cfg(feature = "rdma")]
    if args.transport == KvTransport::Rdma && client.rdma_transport() != Transport::Rdma {
        let why = client.rdma_unavailable().unwrap_or_default();
        bail!("--transport rdma: RDMA was not negotiated ({why})");
    }
    Ok(client)
}

/// The bench's puts replace what a previous run or the preload stored under the same key.
fn upserts(policy: Option<WritePolicy>) -> PutOptions {
    PutOptions { policy, upsert: true, ..PutOptions::default() }
}

/// Writes every key once, split between `args.connections` threads, in batches of `args.batch` (at least 8).
pub fn preload(args: &KvArgs, policy: Option<WritePolicy>) -> anyhow::Result<u64> {
    let threads = args.connections.max(1) as u64;
    let failures = std::thread::scope(|scope| -> anyhow::Result<u64> {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                scope.spawn(move || -> anyhow::Result<u64> {
                    let mut client = connect(args)?;
                    let values = Values::new(args.seed, args.value_size as usize);
                    let batch = args.batch.max(8) as u64;
                    let mut failures = 0;
                    let mut index = thread;
                    let mut buffers: Vec<Vec<u8>> = Vec::new();
                    while index < args.keys {
                        let indices: Vec<u64> =
                            (0..batch).map(|step| index + step * threads).filter(|&i| i < args.keys).collect();
                        index += batch * threads;
                        buffers.resize_with(indices.len(), Vec::new);
                        let keys: Vec<Vec<u8>> = indices.iter().map(|&i| key(args.seed, i)).collect();
                        for (buffer, &i) in buffers.iter_mut().zip(&indices) {
                            values.fill(i, buffer);
                        }
                        let items: Vec<(&[u8], &[u8])> =
                            keys.iter().zip(&buffers).map(|(k, v)| (&k[..], &v[..])).collect();
                        failures += client
                            .batch_put_with(&items, upserts(policy))
                            .iter()
                            .filter(|result| result.is_err())
                            .count() as u64;
                    }
                    Ok(failures)
                })
            })
            .collect();
        let mut failures = 0;
        for handle in handles {
            failures += handle.join().map_err(|_| anyhow::anyhow!("a preload thread panicked"))??;
        }
        Ok(failures)
    })?;
    Ok(failures)
}

/// Runs the benchmark.
pub fn run(args: &KvArgs, show_progress: bool) -> anyhow::Result<KvReport> {
    if args.batch == 0 || args.connections == 0 || args.keys == 0 {
        bail!("--batch, --connections and --keys must be at least 1");
    }
    let picker_distribution = distribution(&args.distribution)?;
    let policy = match &args.write_policy {
        Some(text) => Some(WritePolicy::parse(text).with_context(|| format!("write policy {text:?}"))?),
        None => None,
    };
    if args.op != KvOp::Put && !args.no_preload {
        if show_progress {
            eprint!("\rpreloading {} keys of {} bytes...\x1b[K", args.keys, args.value_size);
        }
        let failures = preload(args, policy)?;
        if show_progress {
            eprint!("\r\x1b[K");
        }
        if failures > 0 {
            bail!("{failures} keys failed to preload (is the node big enough for --keys × --value-size?)");
        }
    }
    let events = if args.subscribe { Some(connect(args)?.subscribe_events(None)?) } else { None };
    let window = match &args.subscribe_windows {
        Some(text) => Some(crate::pool::parse_duration(text)?),
        None => None,
    };
    let server_before = server_cpu_ns(&args.metrics);
    let client_before = process_cpu_ns();
    let started = Instant::now();
    let runtime = Duration::from_secs_f64(args.runtime);
    let deadline = started + runtime;
    let threads = args.connections;
    let completions = window.map(|_| Completions::new(started, runtime));
    let workers_done = std::sync::atomic::AtomicBool::new(false);
    type Outcome = (Vec<ThreadResult>, f64, (u64, u64, u64, u64), Option<WindowReport>);
    let (results, elapsed, event_counts, windows) = std::thread::scope(|scope| -> anyhow::Result<Outcome> {
        let completions = completions.as_ref();
        let windowed = completions.zip(window).map(|(completions, window)| {
            scope.spawn(move || {
                crate::subscribe_windows::run(completions, window, runtime, || connect(args), args.node_pid)
            })
        });
        // The subscriber counts until the run ends (its deadline, or every worker done with `--once`) and
        // the stream has been quiet for 200 ms.
        let workers_done = &workers_done;
        let counter = events.map(|events| {
            scope.spawn(move || {
                let cpu_before = strata_engine::metrics::thread_cpu_ns();
                let (mut received, mut wire, mut missed) = (0u64, 0u64, 0u64);
                let mut quiet_since: Option<Instant> = None;
                while quiet_since.is_none_or(|since| since.elapsed() < Duration::from_millis(200)) {
                    // Batches, keys borrowed: a router's cost of looking at each event, not of copying it.
                    match events.next_batch_timeout(Duration::from_millis(20)) {
                        Some(Ok(batch)) => {
                            quiet_since = None;
                            for (_sequence, event) in batch.iter() {
                                match event {
                                    strata_client::EventRef::Lagged { missed: count } => missed += u64::from(count),
                                    event => {
                                        received += event.blocks() as u64;
                                        wire += 1;
                                    }
                                }
                            }
                        }
                        Some(Err(_)) => break,
                        None if Instant::now() >= deadline
                            || workers_done.load(std::sync::atomic::Ordering::Relaxed) =>
                        {
                            quiet_since.get_or_insert_with(Instant::now);
                        }
                        None => {}
                    }
                }
                (received, wire, missed, strata_engine::metrics::thread_cpu_ns().saturating_sub(cpu_before))
            })
        });
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                scope.spawn(move || {
                    run_thread(
                        args,
                        thread,
                        picker_distribution,
                        policy,
                        RunClock { started, deadline, completions },
                        show_progress && thread == 0,
                    )
                })
            })
            .collect();
        let results: anyhow::Result<Vec<ThreadResult>> = handles
            .into_iter()
            .map(|handle| handle.join().map_err(|_| anyhow::anyhow!("a bench thread panicked"))?)
            .collect();
        workers_done.store(true, std::sync::atomic::Ordering::Relaxed);
        // The run ends when its workers do: the subscriber's wait for a quiet stream after that is not
        // time the puts had (counting it made every observed run look up to 10 % slower at 2 s).
        let elapsed = started.elapsed().as_secs_f64();
        let counts = match counter {
            Some(counter) => counter.join().map_err(|_| anyhow::anyhow!("the event counter panicked"))?,
            None => (0, 0, 0, 0),
        };
        let windows = match windowed {
            Some(windowed) => Some(windowed.join().map_err(|_| anyhow::anyhow!("the windowed subscriber panicked"))??),
            None => None,
        };
        Ok((results?, elapsed, counts, windows))
    })?;
    let client_cpu = process_cpu_ns().saturating_sub(client_before);
    let server_after = server_cpu_ns(&args.metrics);
    if show_progress {
        eprint!("\r\x1b[K");
    }
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).context("histogram")?;
    let (mut keys, mut calls, mut bytes, mut errors, mut not_found, mut mismatches) = (0, 0, 0, 0, 0, 0);
    let mut samples = Vec::new();
    let mut timelines = Vec::new();
    for result in results {
        timelines.extend(result.timeline);
        histogram.add(&result.histogram).context("merging histograms")?;
        keys += result.keys;
        calls += result.calls;
        bytes += result.bytes;
        errors += result.errors;
        not_found += result.not_found;
        mismatches += result.mismatches;
        samples.extend(result.samples);
    }
    samples.truncate(5);
    let server_cpu_ns_per_op = match (server_before, server_after) {
        (Some(before), Some(after)) if keys > 0 => Some(after.saturating_sub(before) as f64 / keys as f64),
        _ => None,
    };
    Ok(KvReport {
        op: args.op,
        value_size: args.value_size,
        batch: args.batch,
        connections: args.connections,
        ops_per_sec: keys as f64 / elapsed,
        bytes_per_sec: bytes as f64 / elapsed,
        calls_per_sec: calls as f64 / elapsed,
        lat_ns: Latency {
            p50: histogram.value_at_quantile(0.5),
            p99: histogram.value_at_quantile(0.99),
            p999: histogram.value_at_quantile(0.999),
            mean: histogram.mean(),
            max: histogram.max(),
        },
        errors,
        mismatches,
        not_found,
        keys_done: keys,
        runtime_s: elapsed,
        server_cpu_ns_per_op,
        client_cpu_ns_per_op: if keys > 0 { client_cpu as f64 / keys as f64 } else { 0.0 },
        error_samples: samples,
        events_received: args.subscribe.then_some(event_counts.0),
        wire_events_received: args.subscribe.then_some(event_counts.1),
        events_missed: args.subscribe.then_some(event_counts.2),
        events_per_sec: args.subscribe.then(|| event_counts.0 as f64 / args.runtime.min(elapsed).max(1e-9)),
        subscriber_cpu_ns_per_event: (args.subscribe && event_counts.0 > 0)
            .then(|| event_counts.3 as f64 / event_counts.0 as f64),
        windows,
        intervals: args.log_avg_msec.map(|_| kv_timeline::merge(&timelines)).transpose()?,
    })
}

/// When a worker's run started and must end, and where it counts its completions (`--subscribe-windows`).
struct RunClock<'a> {
    started: Instant,
    deadline: Instant,
    completions: Option<&'a Completions>,
}

fn run_thread(
    args: &KvArgs,
    thread: usize,
    distribution: RandomDistribution,
    policy: Option<WritePolicy>,
    clock: RunClock<'_>,
    show_progress: bool,
) -> anyhow::Result<ThreadResult> {
    let RunClock { started, deadline, completions } = clock;
    let mut client = connect(args)?;
    let values = Values::new(args.seed, args.value_size as usize);
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed ^ (thread as u64).wrapping_mul(0x9e37_79b9));
    let mut picker = BlockPicker::new(args.keys, true, distribution);
    let mut result = ThreadResult {
        histogram: Histogram::new_with_bounds(1, 3_600_000_000_000, 3).context("histogram")?,
        keys: 0,
        calls: 0,
        bytes: 0,
        errors: 0,
        not_found: 0,
        mismatches: 0,
        samples: Vec::new(),
        timeline: args.log_avg_msec.map(|ms| Timeline::new(started, Duration::from_millis(ms))),
    };
    let value_len = args.value_size as usize;
    let mut buffers: Vec<Vec<u8>> = vec![vec![0u8; value_len]; args.batch];
    // With --transport shm, auto or rdma, values move through one buffer in place, a span per key of a call.
    let mut shared = InPlace::new(&mut client, args, value_len.max(1) * args.batch)?;
    let spans: Vec<(usize, usize)> = (0..args.batch).map(|at| (at * value_len, value_len)).collect();
    if let Some(shared) = shared.as_mut() {
        // Each span holds a value from the start; a put then only stamps its key's tag, as `fill` does.
        for span in shared.as_mut_slice().chunks_mut(value_len.max(1)) {
            span.copy_from_slice(&values.pattern[..span.len()]);
        }
    }
    let mut put_values: Vec<Vec<u8>> = vec![Vec::new(); args.batch];
    let interval = (args.rate > 0.0).then(|| Duration::from_secs_f64(args.connections as f64 / args.rate));
    let mut next_call =
        started + interval.map_or(Duration::ZERO, |interval| interval.mul_f64(thread as f64 / args.connections as f64));
    let threads = args.connections as u64;
    let mut once_next = thread as u64;
    let mut last_progress = Instant::now();
    // Bounded by count (--once, or u64::MAX calls) and by time (--runtime).
    for _call in 0..u64::MAX {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        let indices: Vec<u64> = if args.op == KvOp::PrefixMatch {
            let chain = args.batch as u64;
            if chain > args.keys {
                bail!("--op prefix-match needs --keys of at least --batch");
            }
            let start = picker.next(&mut rng) % (args.keys - chain + 1);
            (start..start + chain).collect()
        } else if args.once {
            let indices: Vec<u64> =
                (0..args.batch as u64).map(|step| once_next + step * threads).filter(|&i| i < args.keys).collect();
            once_next += args.batch as u64 * threads;
            if indices.is_empty() {
                break;
            }
            indices
        } else {
            (0..args.batch).map(|_| picker.next(&mut rng)).collect()
        };
        let is_get = match args.op {
            KvOp::Get | KvOp::Exists | KvOp::PrefixMatch => true,
            KvOp::Put => false,
            KvOp::Mixed => rand::RngExt::random_range(&mut rng, 0..100) < args.rwmix,
        };
        // The keys are made before the clock starts: the latency is the client's call, not the bench's
        // formatting of key names (a tenth of a millisecond for a 1,000-key chain).
        let keys: Vec<Vec<u8>> = indices.iter().map(|&i| key(args.seed, i)).collect();
        let key_refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let parents: Vec<Option<Vec<u8>>> = match args.link_parents {
            Some(chain) if !is_get => {
                indices.iter().map(|&i| (i % chain.max(1) != 0).then(|| key(args.seed, i - 1))).collect()
            }
            _ => Vec::new(),
        };
        let scheduled = match interval {
            Some(interval) => {
                // Sleep while far from the call's time, spin the last stretch: a sleep overshoots by the
                // timer slack (50 us), which at tens of thousands of calls per second would make the run fall
                // ever further behind its schedule.
                let spin_below = Duration::from_micros(200);
                let mut now = now;
                while next_call > now {
                    let remaining = next_call - now;
                    if remaining > spin_below {
                        std::thread::sleep(remaining - spin_below);
                    } else {
                        // Yield rather than spin: the kernel's deferred network work on this core (ksoftirqd)
                        // must not wait for a preemption.
                        std::thread::yield_now();
                    }
                    now = Instant::now();
                }
                let scheduled = next_call;
                next_call += interval;
                scheduled
            }
            None => Instant::now(),
        };
        if args.op == KvOp::PrefixMatch {
            let matched = client.prefix_match(&key_refs);
            let elapsed = scheduled.elapsed().as_nanos() as u64;
            result.record(elapsed);
            match matched {
                Ok(count) if count == key_refs.len() => {}
                Ok(count) => record_error(
                    &mut result,
                    &ClientError::Protocol(format!("matched {count} of a stored chain of {}", key_refs.len())),
                ),
                Err(error) => record_error(&mut result, &error),
            }
        } else if args.op == KvOp::Exists {
            let replies = client.batch_exists(&key_refs);
            let elapsed = scheduled.elapsed().as_nanos() as u64;
            result.record(elapsed);
            for reply in replies {
                match reply {
                    Ok(true) => {}
                    Ok(false) => record_error(&mut result, &ClientError::NotFound),
                    Err(error) => record_error(&mut result, &error),
                }
            }
        } else if is_get {
            let replies = match shared.as_mut() {
                Some(shared) => shared.get(&mut client, &key_refs, &spans[..indices.len()]),
                None => {
                    let mut slices: Vec<&mut [u8]> =
                        buffers.iter_mut().take(indices.len()).map(|buffer| &mut buffer[..]).collect();
                    client.batch_get_into(&key_refs, &mut slices)
                }
            };
            let elapsed = scheduled.elapsed().as_nanos() as u64;
            result.record(elapsed);
            for (at, (reply, &index)) in replies.into_iter().zip(&indices).enumerate() {
                let buffer = match &shared {
                    Some(shared) => &shared.as_slice()[spans[at].0..spans[at].0 + value_len],
                    None => &buffers[at][..],
                };
                match reply {
                    Ok(len) => {
                        result.bytes += len as u64;
                        if args.verify && !values.matches(index, &buffer[..len]) {
                            result.mismatches += 1;
                            if result.samples.len() < 5 {
                                result.samples.push(format!("key {index}: bytes differ from what was written"));
                            }
                        }
                    }
                    Err(error) => record_error(&mut result, &error),
                }
            }
        } else {
            let replies = if let Some(shared) = shared.as_mut() {
                for (at, &index) in indices.iter().enumerate() {
                    values.stamp(index, &mut shared.as_mut_slice()[spans[at].0..spans[at].0 + value_len]);
                }
                shared.put(&mut client, (&key_refs, &spans[..indices.len()]), upserts(policy))
            } else if args.link_parents.is_some() {
                for (buffer, &index) in put_values.iter_mut().zip(&indices) {
                    values.fill(index, buffer);
                }
                let parts: Vec<[&[u8]; 1]> = put_values.iter().map(|value| [&value[..]]).collect();
                let blocks: Vec<BlockPut<'_>> = (0..key_refs.len())
                    .map(|at| BlockPut {
                        key: key_refs[at],
                        parts: &parts[at],
                        links: Links { parent: parents[at].as_deref(), group: None },
                    })
                    .collect();
                client.batch_put_blocks(&blocks, upserts(policy))
            } else {
                for (buffer, &index) in put_values.iter_mut().zip(&indices) {
                    values.fill(index, buffer);
                }
                let items: Vec<(&[u8], &[u8])> = key_refs.iter().zip(&put_values).map(|(k, v)| (*k, &v[..])).collect();
                client.batch_put_with(&items, upserts(policy))
            };
            let elapsed = scheduled.elapsed().as_nanos() as u64;
            result.record(elapsed);
            for reply in replies {
                match reply {
                    Ok(()) => result.bytes += value_len as u64,
                    Err(error) => record_error(&mut result, &error),
                }
            }
        }
        result.keys += indices.len() as u64;
        result.calls += 1;
        if let Some(completions) = completions {
            completions.add(indices.len() as u64);
        }
        if show_progress && last_progress.elapsed() >= Duration::from_millis(500) {
            last_progress = Instant::now();
            let seconds = started.elapsed().as_secs_f64();
            eprint!(
                "\r[kv {:?}] {:.0} keys/s (this connection), {:.1}s/{:.0}s\x1b[K",
                args.op,
                result.keys as f64 / seconds,
                seconds,
                args.runtime
            );
        }
    }
    Ok(result)
}

/// The human report.
pub fn format_report(report: &KvReport) -> String {
    let mut out = format!(
        "kv {:?}: value {} B, batch {}, {} connection(s), {:.2} s\n",
        report.op, report.value_size, report.batch, report.connections, report.runtime_s
    );
    out += &format!(
        "  keys/s {:.0}  bandwidth {:.1} MB/s  calls/s {:.0}\n",
        report.ops_per_sec,
        report.bytes_per_sec / 1e6,
        report.calls_per_sec
    );
    out += &format!(
        "  latency per call (us): p50 {:.1}  p99 {:.1}  p99.9 {:.1}  mean {:.1}  max {:.1}\n",
        report.lat_ns.p50 as f64 / 1e3,
        report.lat_ns.p99 as f64 / 1e3,
        report.lat_ns.p999 as f64 / 1e3,
        report.lat_ns.mean / 1e3,
        report.lat_ns.max as f64 / 1e3
    );
    out += &format!(
        "  errors {} (not found {})  mismatches {}  node CPU/key {}  bench CPU/key {:.0} ns\n",
        report.errors,
        report.not_found,
        report.mismatches,
        report.server_cpu_ns_per_op.map_or("n/a".to_string(), |ns| format!("{ns:.0} ns")),
        report.client_cpu_ns_per_op
    );
    if let (Some(received), Some(wire), Some(missed), Some(rate)) =
        (report.events_received, report.wire_events_received, report.events_missed, report.events_per_sec)
    {
        let cpu = report.subscriber_cpu_ns_per_event.map_or("n/a".to_string(), |ns| format!("{ns:.0} ns"));
        out += &format!(
            "  block events received {received} ({rate:.0}/s) in {wire} events, missed {missed} events, subscriber \
             CPU/block event {cpu}\n"
        );
    }
    if let Some(windows) = &report.windows {
        if let (Some(unobserved), Some(observed)) =
            (windows.node_cpu_ns_per_op_unobserved, windows.node_cpu_ns_per_op_observed)
        {
            out +=
                &format!("  node CPU/key in the windows: {unobserved:.0} ns unobserved, {observed:.0} ns observed\n");
        }
        out += &format!(
            "  windows of {:.0} ms, {} of each: keys/s {:.0} unobserved, {:.0} observed = {:.3} x; events received \
             {}, missed {}; window 0 began at {:.6} s (Unix time)\n",
            windows.window_s * 1e3,
            windows.windows_each,
            windows.puts_per_sec_unobserved,
            windows.puts_per_sec_observed,
            windows.ratio,
            windows.events_received,
            windows.events_missed,
            windows.started_unix_s
        );
    }
    for sample in &report.error_samples {
        out += &format!("  e.g. {sample}\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_distinct_per_key_and_checkable() {
        let values = Values::new(7, 4096);
        let mut a = Vec::new();
        let mut b = Vec::new();
        values.fill(1, &mut a);
        values.fill(2, &mut b);
        assert_eq!(a.len(), 4096);
        assert_ne!(a, b);
        assert!(values.matches(1, &a));
        assert!(!values.matches(2, &a));
        a[4000] ^= 1;
        assert!(!values.matches(1, &a));
        let tiny = Values::new(7, 3);
        let mut c = Vec::new();
        tiny.fill(9, &mut c);
        assert!(tiny.matches(9, &c));
    }
}
