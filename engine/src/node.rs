//! Starting and stopping a node: check and format the NVMe tier, bind one listener per shard, start one
//! pinned glommio executor per shard (each opens its own device handles, builds its DRAM tier and region
//! log, recovers its index, then serves), and serve metrics from a small thread.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use glommio::{LocalExecutorBuilder, Placement};
use strata_nvme::{AnyDevice, DeviceSpec, FileIo, HostOptions, MemoryDevice};

use crate::backend::WallClock;
use crate::config::EngineConfig;
use crate::dram::DramTier;
use crate::metrics::ShardMetrics;
use crate::record::TierHeader;
use crate::segment::PageKind;
use crate::server::ShardServer;
use crate::shard::{RecoveryReport, Shard, ShardParts};
/// The CPUs the calling thread may run on (its affinity mask, as `taskset` set it).
pub use crate::sys::allowed_cpus;
use crate::tier::{FreshIds, NamespaceSlot, TierError};

/// Why a node did not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The configuration is inconsistent.
    #[error("configuration: {0}")]
    Config(#[from] crate::config::ConfigError),
    /// No consecutive free ports for the shards.
    #[error("found no {shards} consecutive free ports")]
    Ports {
        /// Shards (ports) asked for.
        shards: usize,
    },
    /// A namespace could not be opened, checked or formatted.
    #[error("NVMe tier: {0}")]
    Nvme(#[from] TierError),
    /// An executor could not be started or failed.
    #[error("{what}: {reason}")]
    Executor {
        /// Which.
        what: String,
        /// Glommio's error.
        reason: String,
    },
    /// A listener could not be bound.
    #[error("listening on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The node was started under a real-time scheduling policy with a file-backed NVMe tier.
    #[error(
        "strata-node runs under {policy} with a file-backed NVMe tier: io_uring's worker threads (iou-wrk) \
         inherit that policy and starve behind the executors on their cores (glommio spins while a device \
         probe waits on one), so the node would never become ready; start it under SCHED_OTHER (drop chrt; \
         nice -n -20 gives it priority) or without a file tier"
    )]
    RealTimePolicy {
        /// `SCHED_FIFO` or `SCHED_RR`.
        policy: &'static str,
    },
    /// The RDMA device could not be opened (or this build has no RDMA).
    #[error("RDMA: {0}")]
    Rdma(String),
    /// A shard failed to start.
    #[error("shard {shard}: {reason}")]
    Shard {
        /// The shard.
        shard: u32,
        /// Why.
        #[source]
        reason: ShardStartError,
    },
}

/// Why a shard did not start.
#[derive(Debug, thiserror::Error)]
pub enum ShardStartError {
    /// Its handle on a namespace could not be opened.
    #[error("opening {name}: {source}")]
    Open {
        /// The namespace.
        name: String,
        /// Why.
        #[source]
        source: strata_nvme::OpenError,
    },
    /// Its DRAM tier could not be built.
    #[error(transparent)]
    Dram(#[from] crate::dram::DramError),
    /// Its share of the tier could not be laid out.
    #[error(transparent)]
    Tier(#[from] TierError),
    /// Its recovery failed.
    #[error("recovery: {0}")]
    Recovery(#[from] crate::shard::RecoveryError),
    /// Its executor exited before it reported.
    #[error("its executor exited during start-up")]
    Exited,
    /// No side of the mesh of shards was dealt to it.
    #[error("no side of the mesh of shards was dealt to it")]
    NoMesh,
    /// Its DRAM segment could not be registered with the RDMA device.
    #[error("RDMA: {0}")]
    Rdma(String),
}

/// What a started node reports.
#[derive(Clone, Debug)]
pub struct NodeSummary {
    /// Address of shard 0.
    pub listen: SocketAddr,
    /// Shards and their CPUs.
    pub cpus: Vec<usize>,
    /// DRAM per shard.
    pub dram_bytes_per_shard: u64,
    /// Pages backing DRAM.
    pub pages: PageKind,
    /// NVMe namespaces and their capacities.
    pub namespaces: Vec<(String, u64)>,
    /// Regions per shard and region size.
    pub regions_per_shard: Vec<usize>,
    /// Region size.
    pub region_bytes: u64,
    /// Recovery per shard.
    pub recovery: Vec<RecoveryReport>,
    /// Metrics address.
    pub metrics: Option<SocketAddr>,
    /// Names of the configured tenants (none: the node is open).
    pub tenants: Vec<String>,
    /// CPUs of the threads that write event frames (none: the shards write them).
    pub event_cpus: Vec<usize>,
}

impl std::fmt::Display for NodeSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shards = self.cpus.len();
        let last_port = u32::from(self.listen.port()) + shards as u32 - 1;
        writeln!(
            f,
            "strata-node: {shards} shard(s) on CPU(s) {:?}, listening on {} (ports {}-{last_port})",
            self.cpus,
            self.listen,
            self.listen.port()
        )?;
        writeln!(
            f,
            "  DRAM tier: {} MiB ({} MiB per shard) on {}",
            (self.dram_bytes_per_shard * shards as u64) >> 20,
            self.dram_bytes_per_shard >> 20,
            match self.pages {
                PageKind::Huge => "2 MiB hugepages",
                PageKind::Transparent => {
                    "transparent hugepages where the kernel finds them (none reserved: echo N > /proc/sys/vm/nr_hugepages)"
                }
                PageKind::Normal => "normal pages (no hugepages reserved: echo N > /proc/sys/vm/nr_hugepages)",
            }
        )?;
        if self.namespaces.is_empty() {
            writeln!(f, "  NVMe tier: none (DRAM only)")?;
        }
        for (name, capacity) in &self.namespaces {
            writeln!(f, "  NVMe tier: {name}, {} MiB", capacity >> 20)?;
        }
        if !self.namespaces.is_empty() {
            let sum = |field: fn(&RecoveryReport) -> u64| self.recovery.iter().map(field).sum::<u64>();
            writeln!(
                f,
                "  region log: {} MiB regions, {:?} per shard; recovered {} records",
                self.region_bytes >> 20,
                self.regions_per_shard,
                sum(|report| report.records)
            )?;
            let (lost, regions) = (sum(|report| report.lost_records), sum(|report| report.lost_regions));
            if lost + regions > 0 {
                writeln!(
                    f,
                    "  recovery: lost {lost} records ({} bytes) and {regions} regions to damage; dropped {} keys \
                     whose newer record may have been among them",
                    sum(|report| report.lost_bytes),
                    sum(|report| report.dropped_keys)
                )?;
            }
            let unfinished = sum(|report| report.unfinished_regions);
            if unfinished > 0 {
                writeln!(f, "  recovery: {unfinished} regions ended where an unfinished write (a crash) stopped")?;
            }
        }
        if self.tenants.is_empty() {
            let exposure =
                if self.listen.ip().is_loopback() { "on loopback" } else { "NOT on loopback: anyone who can reach it" };
            writeln!(f, "  tenants: none configured — the node is open to every client ({exposure})")?;
        } else {
            writeln!(f, "  tenants: {} (keys scoped per tenant, tokens required)", self.tenants.join(", "))?;
        }
        if self.event_cpus.is_empty() {
            writeln!(f, "  event subscribers: written to by their shards (no CPU besides the shards')")?;
        } else {
            writeln!(f, "  event subscribers: written to by a thread each on CPU(s) {:?}", self.event_cpus)?;
        }
        match self.metrics {
            Some(addr) => write!(f, "  metrics: http://{addr}/metrics and /healthz"),
            None => write!(f, "  metrics: off"),
        }
    }
}

/// A running node.
pub struct Node {
    summary: NodeSummary,
    stop: Arc<AtomicBool>,
    listener_fds: Vec<RawFd>,
    shards: Vec<glommio::ExecutorJoinHandle<()>>,
    metrics_thread: Option<std::thread::JoinHandle<()>>,
    event_senders: Arc<crate::event_sender::EventSenders>,
    /// Each shard's counters.
    pub metrics: Vec<Arc<ShardMetrics>>,
}

impl Node {
    /// What it started with.
    pub fn summary(&self) -> &NodeSummary {
        &self.summary
    }

    /// Address of shard 0.
    pub fn local_addr(&self) -> SocketAddr {
        self.summary.listen
    }

    /// Asks every shard to stop accepting, flush and exit.
    pub fn stop(&self) {
        if !self.stop.swap(true, Ordering::SeqCst) {
            for &fd in &self.listener_fds {
                crate::sys::shutdown_socket(fd);
            }
            self.event_senders.stop();
        }
    }

    /// Event sender threads running now (one per subscriber that has one).
    pub fn event_sender_threads(&self) -> usize {
        self.event_senders.live()
    }

    /// Stops the node and waits for every shard to finish flushing.
    pub fn shutdown(mut self) -> Result<(), NodeError> {
        self.stop();
        let mut result = Ok(());
        for (shard, handle) in std::mem::take(&mut self.shards).into_iter().enumerate() {
            if let Err(error) = handle.join() {
                result = Err(NodeError::Executor { what: format!("shard {shard}"), reason: format!("{error:?}") });
            }
        }
        if let Some(thread) = self.metrics_thread.take() {
            let _ = thread.join();
        }
        result
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
        for handle in std::mem::take(&mut self.shards) {
            let _ = handle.join();
        }
        if let Some(thread) = self.metrics_thread.take() {
            let _ = thread.join();
        }
    }
}

/// How a shard opens its handle on a namespace.
#[derive(Clone)]
enum NamespaceHandle {
    Memory(MemoryDevice),
    /// A file, block device or NVMe-oF namespace, and who the host is to a remote one.
    Spec(DeviceSpec, Box<HostOptions>),
}

/// Opens a handle, its files driven as `files` says; `sized`: create or extend files to their size (done
/// once, when preparing the tier; shards then open the files as they are).
async fn open_handle(
    handle: &NamespaceHandle,
    sized: bool,
    files: FileIo,
) -> Result<AnyDevice, strata_nvme::OpenError> {
    match handle {
        NamespaceHandle::Memory(device) => Ok(AnyDevice::Memory(device.clone())),
        NamespaceHandle::Spec(spec, host) => {
            let spec = match spec {
                DeviceSpec::File { path, .. } if !sized => DeviceSpec::File { path: path.clone(), size_bytes: None },
                other => other.clone(),
            };
            AnyDevice::open_with(&spec, host, files).await
        }
    }
}

fn spec_name(spec: &DeviceSpec) -> String {
    match spec {
        DeviceSpec::Memory { capacity_bytes } => format!("memory:{capacity_bytes}"),
        DeviceSpec::File { path, .. } => path.display().to_string(),
        DeviceSpec::Nvmf(address) => format!("nvmf {} {} ns {}", address.addr, address.subnqn, address.nsid),
    }
}

fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    if std::fs::File::open("/dev/urandom").and_then(|mut file| std::io::Read::read_exact(&mut file, &mut bytes)).is_ok()
    {
        return u64::from_le_bytes(bytes);
    }
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |since| since.as_nanos() as u64)
}

/// Checks every namespace's pool superblock and tier header, formatting what is new (or everything, with
/// `format`); returns the tier headers.
async fn prepare_tier(
    config: &EngineConfig,
    handles: &[NamespaceHandle],
    names: &[String],
) -> Result<Vec<(TierHeader, u64)>, TierError> {
    let fresh = FreshIds {
        pool_uuid: {
            let mut uuid = [0u8; 16];
            uuid[..8].copy_from_slice(&random_u64().to_le_bytes());
            uuid[8..].copy_from_slice(&random_u64().to_le_bytes());
            uuid
        },
        format_id: random_u64(),
    };
    let mut headers = Vec::new();
    for (index, handle) in handles.iter().enumerate() {
        let name = &names[index];
        let device = open_handle(handle, true, FileIo::Reactor)
            .await
            .map_err(|source| TierError::Open { name: name.clone(), source })?;
        let slot = NamespaceSlot { name, index: index as u32, count: handles.len() as u32 };
        headers.push(crate::tier::prepare_namespace(&device, slot, config, fresh).await?);
    }
    Ok(headers)
}

fn bind_listeners(config: &EngineConfig) -> Result<Vec<std::net::TcpListener>, NodeError> {
    let shards = config.cpus.len();
    for _attempt in 0..16 {
        let first = std::net::TcpListener::bind(config.listen)
            .map_err(|source| NodeError::Listen { addr: config.listen, source })?;
        let base = first.local_addr().map_err(|source| NodeError::Listen { addr: config.listen, source })?;
        let mut listeners = vec![first];
        for shard in 1..shards {
            let addr = SocketAddr::new(base.ip(), base.port() + shard as u16);
            match std::net::TcpListener::bind(addr) {
                Ok(listener) => listeners.push(listener),
                Err(source) if config.listen.port() != 0 => return Err(NodeError::Listen { addr, source }),
                Err(_) => break,
            }
        }
        if listeners.len() == shards {
            return Ok(listeners);
        }
    }
    Err(NodeError::Ports { shards })
}

/// The calling thread's scheduling policy when it is a real-time one (executors inherit it).
///
/// Why a file tier refuses it: a busy executor never yields its core to a task of equal real-time
/// priority, and io_uring hands some of its file work (glommio's IOPOLL probe of a device, operations that
/// would block) to worker threads created with the submitter's policy and CPUs. With both on one core the
/// worker never runs and the executor spins on its completion forever (seen: `chrt -f 10 taskset -c 1
/// strata-node` never became ready). A DRAM-only node starts and serves under SCHED_FIFO.
fn real_time_policy() -> Option<&'static str> {
    // SAFETY: sched_getscheduler(2) on the calling thread reads its policy and touches no memory of ours.
    #[allow(unsafe_code)]
    let policy = unsafe { libc::sched_getscheduler(0) };
    match policy {
        libc::SCHED_FIFO => Some("SCHED_FIFO"),
        libc::SCHED_RR => Some("SCHED_RR"),
        _ => None,
    }
}

/// Starts a node; returns once every shard has recovered and is serving.
pub fn start(config: EngineConfig) -> Result<Node, NodeError> {
    config.validate()?;
    if config.nvme.iter().any(|spec| matches!(spec, DeviceSpec::File { .. }))
        && let Some(policy) = real_time_policy()
    {
        return Err(NodeError::RealTimePolicy { policy });
    }
    // Opened before anything else is set up: a device that is not there is the operator's first error.
    let rdma =
        config.rdma_device.as_deref().map(crate::server::open_rdma_device).transpose().map_err(NodeError::Rdma)?;
    let shard_count = config.cpus.len() as u32;
    let names: Vec<String> = config.nvme.iter().map(spec_name).collect();
    let handles: Vec<NamespaceHandle> = config
        .nvme
        .iter()
        .map(|spec| match spec {
            DeviceSpec::Memory { capacity_bytes } => NamespaceHandle::Memory(MemoryDevice::new(*capacity_bytes, 4096)),
            other => NamespaceHandle::Spec(other.clone(), Box::new(config.nvme_host.clone().unwrap_or_default())),
        })
        .collect();
    let tier = open_tier(&config, &handles, &names)?;
    let listeners = bind_listeners(&config)?;
    let listen = listeners[0].local_addr().map_err(|source| NodeError::Listen { addr: config.listen, source })?;
    let listener_fds: Vec<RawFd> = listeners.iter().map(AsRawFd::as_raw_fd).collect();
    let metrics: Vec<Arc<ShardMetrics>> = (0..shard_count).map(|_| Arc::new(ShardMetrics::default())).collect();
    // Read here, on the thread that started the node, before any executor pins itself: the CPUs the
    // operator let the process use.
    let event_senders = Arc::new(crate::event_sender::EventSenders::new(&config.event_cpus, &config.cpus));
    let tenant_ids = config.tenants.iter().map(|tenant| crate::tenants::tenant_id(&tenant.name));
    let shared = ShardShared {
        peer_budget: crate::peer_limits::PeerBudget::new(&config.peers, config.dram_bytes, tenant_ids),
        dram_per_shard: config.dram_bytes / u64::from(shard_count),
        config: Arc::new(config),
        tier: Arc::new(tier),
        handles: Arc::new(handles),
        names: Arc::new(names),
        event_senders: Arc::clone(&event_senders),
        stop: Arc::new(AtomicBool::new(false)),
        base_port: listen.port(),
        shard_count,
        rdma: rdma.map(Arc::new),
    };
    let (executors, started) = spawn_shards(&shared, listeners, &metrics)?;
    let (recovery, regions_per_shard, pages, mut failure) = started;
    let metrics_listener = match shared.config.metrics {
        Some(addr) if failure.is_none() => match std::net::TcpListener::bind(addr) {
            Ok(listener) => Some((listener.local_addr().unwrap_or(addr), listener)),
            Err(source) => {
                failure = Some(NodeError::Listen { addr, source });
                None
            }
        },
        _ => None,
    };
    let config = &shared.config;
    let mut node = Node {
        summary: NodeSummary {
            listen,
            cpus: config.cpus.clone(),
            dram_bytes_per_shard: shared.dram_per_shard,
            pages,
            namespaces: shared.names.iter().cloned().zip(shared.tier.iter().map(|(_, capacity)| *capacity)).collect(),
            regions_per_shard,
            region_bytes: config.region_bytes,
            recovery,
            metrics: metrics_listener.as_ref().map(|(addr, _)| *addr),
            tenants: config.tenants.iter().map(|tenant| tenant.name.clone()).collect(),
            event_cpus: event_senders.cpus().to_vec(),
        },
        stop: Arc::clone(&shared.stop),
        listener_fds,
        shards: executors,
        event_senders,
        metrics_thread: None,
        metrics: metrics.clone(),
    };
    if let Some(error) = failure {
        drop(node);
        return Err(error);
    }
    if let Some((_, listener)) = metrics_listener {
        let stop = Arc::clone(&shared.stop);
        let reports = shared.config.reports.clone();
        node.metrics_thread =
            Some(std::thread::spawn(move || crate::metrics::serve_http(listener, metrics, reports, stop)));
    }
    Ok(node)
}

/// Starts one executor per shard, each on its listener, and waits for every shard's start-up report.
fn spawn_shards(
    shared: &ShardShared,
    listeners: Vec<std::net::TcpListener>,
    metrics: &[Arc<ShardMetrics>],
) -> Result<(Vec<glommio::ExecutorJoinHandle<()>>, ShardsStarted), NodeError> {
    let (ready_sender, ready_receiver) = mpsc::channel::<(u32, Result<ShardStarted, ShardStartError>)>();
    let link_counts = Arc::new(crate::links::LinkCounts::new(shared.shard_count));
    let mut meshes = crate::forward::mesh(shared.shard_count, &link_counts).into_iter();
    let mut executors = Vec::new();
    for (shard, listener) in listeners.into_iter().enumerate() {
        let start = ShardStart {
            shard: shard as u32,
            shared: shared.clone(),
            metrics: Arc::clone(&metrics[shard]),
            peers: meshes.next(),
            ready: ready_sender.clone(),
        };
        match spawn_shard(start, listener) {
            Ok(handle) => executors.push(handle),
            Err(error) => {
                shared.stop.store(true, Ordering::SeqCst);
                return Err(error);
            }
        }
    }
    drop(ready_sender);
    Ok((executors, wait_for_shards(&ready_receiver, shared.shard_count)))
}

/// Every shard's recovery, regions per shard and pages, and the first failure if one did not start.
type ShardsStarted = (Vec<RecoveryReport>, Vec<usize>, PageKind, Option<NodeError>);

/// Reads (or formats) the NVMe tier's headers on an executor of its own, before the shards start.
fn open_tier(
    config: &EngineConfig,
    handles: &[NamespaceHandle],
    names: &[String],
) -> Result<Vec<(TierHeader, u64)>, NodeError> {
    if handles.is_empty() {
        return Ok(Vec::new());
    }
    let (config, handles, names) = (config.clone(), handles.to_vec(), names.to_vec());
    LocalExecutorBuilder::new(Placement::Unbound)
        .name("strata-prepare")
        .io_memory(2 << 20)
        .spawn(move || async move { prepare_tier(&config, &handles, &names).await })
        .map_err(|error| NodeError::Executor {
            what: "starting the tier's executor".into(),
            reason: error.to_string(),
        })?
        .join()
        .map_err(|error| NodeError::Executor { what: "the tier's executor".into(), reason: format!("{error:?}") })?
        .map_err(NodeError::Nvme)
}

/// What every shard's executor shares.
#[derive(Clone)]
struct ShardShared {
    config: Arc<EngineConfig>,
    tier: Arc<Vec<(TierHeader, u64)>>,
    handles: Arc<Vec<NamespaceHandle>>,
    /// The namespaces' names, for messages.
    names: Arc<Vec<String>>,
    event_senders: Arc<crate::event_sender::EventSenders>,
    peer_budget: Arc<crate::peer_limits::PeerBudget>,
    stop: Arc<AtomicBool>,
    base_port: u16,
    dram_per_shard: u64,
    shard_count: u32,
    /// The RDMA device every shard registers its DRAM segment with (`--rdma-device`).
    rdma: Option<Arc<crate::server::RdmaDevice>>,
}

/// What one shard's executor starts from.
struct ShardStart {
    shard: u32,
    shared: ShardShared,
    metrics: Arc<ShardMetrics>,
    /// Its side of the mesh of shards (one per shard, dealt in order).
    peers: Option<crate::forward::MeshEnds>,
    ready: mpsc::Sender<(u32, Result<ShardStarted, ShardStartError>)>,
}

/// What a shard reports once it has recovered: its recovery, its DRAM's pages, its regions.
type ShardStarted = (RecoveryReport, PageKind, usize);

/// Starts shard `start.shard`'s executor on its CPU: it builds and recovers the shard, reports on `ready`,
/// then serves `listener` until the node stops.
fn spawn_shard(
    start: ShardStart,
    listener: std::net::TcpListener,
) -> Result<glommio::ExecutorJoinHandle<()>, NodeError> {
    let (shard, cpu) = (start.shard, start.shared.config.cpus[start.shard as usize]);
    let mut builder =
        LocalExecutorBuilder::new(Placement::Fixed(cpu)).name(&format!("strata-shard-{shard}")).io_memory(2 << 20);
    if let Some(spin) = start.shared.config.spin_before_park {
        builder = builder.spin_before_park(spin);
    }
    builder
        .spawn(move || async move {
            let ShardStart { shard, shared, metrics, peers, ready } = start;
            let idle = &shared.config.busy_poll_idle;
            strata_nvme::tcp::stream::park_idle_polled_sockets_after((!idle.is_zero()).then_some(*idle));
            let server = match build_shard(shard, &shared, metrics, peers).await {
                Ok((server, started)) => {
                    let _ = ready.send((shard, Ok(started)));
                    server
                }
                Err(error) => {
                    let _ = ready.send((shard, Err(error)));
                    return;
                }
            };
            drop(ready);
            glommio::spawn_local(crate::server::sweep_stalled_connections(Rc::downgrade(&server))).detach();
            if shared.config.shared_memory {
                let name = local_socket_name(shared.config.listen, shared.base_port, shard);
                match bind_local_socket(&name) {
                    Ok(local) => {
                        server.offer_local_socket(name.into_bytes());
                        let (server, shared) = (Rc::clone(&server), shared.clone());
                        glommio::spawn_local(async move { accept_local_until_stopped(&server, &shared, local).await })
                            .detach();
                    }
                    Err(error) => tracing::warn!("shard {shard}: no shared-memory path ({name}): {error}"),
                }
            }
            accept_until_stopped(&server, &shared, listener).await;
            // Requests stop here; what was committed is flushed next.
            crate::server::close_connections(&server);
            server.shard.flush_for_shutdown().await;
        })
        .map_err(|error| NodeError::Executor {
            what: format!("starting shard {shard}'s executor on CPU {cpu}"),
            reason: error.to_string(),
        })
}

/// How a shard drives its files: a busy-polled shard polls a ring of each file's own (its completions are
/// seen on the shard's next pass, not at the reactor's next turn); a shard that parks, or whose files
/// carry injected faults (which wrap glommio's file), goes through glommio's reactor.
fn shard_file_io(config: &EngineConfig) -> FileIo {
    if config.busy_poll && config.faults.is_none() {
        // Room for every tier read the shard allows in flight and as many writes and syncs beside them.
        FileIo::Polled { queue_depth: 2 * config.nvme_queue_depth.clamp(1, 2048) as u32 }
    } else {
        FileIo::Reactor
    }
}

/// Opens the shard's devices, builds its DRAM tier and region log, recovers its keys from the tier and
/// joins the mesh of shards.
async fn build_shard(
    shard: u32,
    shared: &ShardShared,
    metrics: Arc<ShardMetrics>,
    peers: Option<crate::forward::MeshEnds>,
) -> Result<(Rc<ShardServer>, ShardStarted), ShardStartError> {
    let config = &shared.config;
    let files = shard_file_io(config);
    let mut devices = Vec::new();
    for (handle, name) in shared.handles.iter().zip(shared.names.iter()) {
        let device = open_handle(handle, false, files)
            .await
            .map_err(|source| ShardStartError::Open { name: name.clone(), source })?;
        let device = match (device, &config.faults) {
            (AnyDevice::File(file), Some(faults)) => {
                let faults = strata_nvme::FaultConfig { seed: faults.seed + u64::from(shard), ..faults.clone() };
                AnyDevice::FaultyFile(Box::new(strata_nvme::FaultDevice::new(file, faults)))
            }
            (device, _) => device,
        };
        devices.push(device);
    }
    let dram = DramTier::new(shared.dram_per_shard, config.hugepages)?;
    let pages = dram.pages();
    let log = crate::tier::region_log(&devices, &shared.tier, shard, config)?;
    let region_count = log.as_ref().map_or(0, |log| log.regions.len());
    let peers = peers.ok_or(ShardStartError::NoMesh)?;
    let shard_state = Shard::new(ShardParts {
        id: shard,
        shard_count: shared.shard_count,
        base_port: shared.base_port,
        config: Rc::new((**config).clone()),
        dram,
        devices,
        log,
        clock: WallClock::new(),
        metrics,
        link_counts: Arc::clone(&peers.link_counts),
    });
    let report = shard_state.recover().await?;
    let forwarder = Rc::new(crate::forward::Forwarder::connect(&shard_state, peers).await);
    // Recovery restored links before the mesh existed: the peers learn of them now.
    forwarder.relay_cascades_of(&shard_state);
    let around = (Arc::clone(&shared.event_senders), Arc::clone(&shared.peer_budget));
    let server = ShardServer::with_rdma(shard_state, forwarder, around, shared.rdma.as_deref())
        .map_err(ShardStartError::Rdma)?;
    Ok((server, (report, pages, region_count)))
}

/// Serves each connection `listener` accepts on a task of its own, until the node stops.
async fn accept_until_stopped(server: &Rc<ShardServer>, shared: &ShardShared, listener: std::net::TcpListener) {
    let listener = crate::sys::adopt_listener(listener);
    loop {
        match listener.accept().await {
            Ok(stream) => {
                if shared.stop.load(Ordering::SeqCst) {
                    break;
                }
                glommio::spawn_local(crate::server::serve(Rc::clone(server), stream)).detach();
            }
            Err(_) if shared.stop.load(Ordering::SeqCst) => break,
            Err(_) => glommio::timer::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// The abstract Unix socket of shard `shard` of the node listening at `listen` (port `base_port`): unique
/// on the host's network namespace as long as the TCP address is.
fn local_socket_name(listen: SocketAddr, base_port: u16, shard: u32) -> String {
    format!("strata-{}-{shard}", SocketAddr::new(listen.ip(), base_port))
}

fn bind_local_socket(name: &str) -> std::io::Result<std::os::unix::net::UnixListener> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Serves each connection the shard's Unix socket accepts, until the node stops. glommio's Unix listener
/// cannot be adopted from a descriptor and its streams do not give theirs out (`recvmsg` needs it), so
/// the listener is polled: a new local connection waits at most [`LOCAL_ACCEPT_POLL`] (connections are
/// long-lived: one per shard per client).
async fn accept_local_until_stopped(
    server: &Rc<ShardServer>,
    shared: &ShardShared,
    listener: std::os::unix::net::UnixListener,
) {
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                if stream.set_nonblocking(false).is_ok() {
                    glommio::spawn_local(crate::server::serve_local(Rc::clone(server), stream)).detach();
                }
            }
            Err(_) => glommio::timer::sleep(LOCAL_ACCEPT_POLL).await,
        }
    }
}

/// How often an idle shard looks for a new connection on its Unix socket.
const LOCAL_ACCEPT_POLL: Duration = Duration::from_millis(5);

/// Waits for every shard's start-up report: their recoveries, regions and pages, or the first failure.
fn wait_for_shards(
    ready: &mpsc::Receiver<(u32, Result<ShardStarted, ShardStartError>)>,
    shard_count: u32,
) -> ShardsStarted {
    let mut recovery = vec![RecoveryReport::default(); shard_count as usize];
    let mut regions_per_shard = vec![0; shard_count as usize];
    let mut pages = PageKind::Normal;
    let mut failure = None;
    for _ in 0..shard_count {
        match ready.recv() {
            Ok((shard, Ok((report, shard_pages, regions)))) => {
                recovery[shard as usize] = report;
                regions_per_shard[shard as usize] = regions;
                pages = shard_pages;
            }
            Ok((shard, Err(reason))) => {
                failure.get_or_insert(NodeError::Shard { shard, reason });
            }
            Err(_) => {
                failure.get_or_insert(NodeError::Shard { shard: 0, reason: ShardStartError::Exited });
            }
        }
    }
    (recovery, regions_per_shard, pages, failure)
}
