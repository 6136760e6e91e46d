//! The NVMe-oF/TCP target: subsystems by NQN with namespaces on any block backend, the discovery
//! subsystem, a host allow-list per subsystem, and one queue pair served by one core.
//!
//! Each executor (one per configured CPU) binds its own listener on the same address (`SO_REUSEPORT`)
//! and serves the connections the kernel gives it; a controller's admin and I/O queues may therefore be
//! on different cores, and find each other through the [`registry`] at Connect. See ARCHITECTURE.md.

mod admin;
mod buffers;
mod config;
mod connection;
mod io;
#[cfg(feature = "rdma")]
mod rdma;
mod registry;
mod reservations;

use std::io::{Seek, SeekFrom};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use glommio::net::TcpListener;
use glommio::{LocalExecutorBuilder, Placement};

pub use self::config::{NamespaceBackend, NamespaceConfig, SubsystemConfig, TargetConfig};
use self::connection::ExecutorContext;
use self::registry::{NamespaceInfo, Shared, SubsystemInfo, shutdown_socket};
use crate::any_device::AnyDevice;
use crate::device::BlockDevice;
use crate::error::BlockError;
use crate::memory::MemoryDevice;
use crate::ring::{RingDevice, RingWait};
use crate::spec::{DISCOVERY_NQN, NQN_MAX_BYTES};
use crate::uring::{UringDevice, UringOptions};

/// Registered I/O memory per target executor (glommio falls back to ordinary memory beyond it).
const IO_MEMORY_BYTES: usize = 16 << 20;

/// Why a target did not start.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// The configuration is inconsistent; the message says how.
    #[error("target configuration: {0}")]
    Config(String),
    /// A namespace's backend could not be opened.
    #[error("namespace {nsid} of {nqn}: {source}")]
    Namespace {
        /// The subsystem.
        nqn: String,
        /// The namespace ID.
        nsid: u32,
        /// The device error.
        #[source]
        source: BlockError,
    },
    /// The listener could not be bound.
    #[error("listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// An executor could not be started.
    #[error("target executor: {0}")]
    Executor(String),
}

/// A running target.
pub struct TargetHandle {
    local_addr: SocketAddr,
    threads: Vec<JoinHandle<()>>,
    stopping: Arc<AtomicBool>,
    listeners: Vec<RawFd>,
    shared: Arc<Shared>,
    #[cfg(feature = "rdma")]
    rdma: Option<rdma::RdmaListener>,
}

impl TargetHandle {
    /// The address the target listens on (with the port chosen when the configuration said 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops listening, ends every connection and waits for the executors.
    pub fn stop(self) {
        self.stopping.store(true, Ordering::SeqCst);
        for fd in &self.listeners {
            shutdown_socket(*fd);
        }
        {
            let registry = self.shared.registry();
            for fd in &registry.connections {
                shutdown_socket(*fd);
            }
        }
        for thread in self.threads {
            let _ = thread.join();
        }
        // After the executors: their RDMA connections report on the listener's channel.
        #[cfg(feature = "rdma")]
        if let Some(listener) = self.rdma {
            listener.stop();
        }
    }

    /// Serves until the process ends.
    pub fn wait(self) {
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

/// A stable 16-byte identifier for a namespace (NGUID, UUID): hosts see the same one after a restart.
fn identifier(nqn: &str, nsid: u32, kind: u8) -> [u8; 16] {
    let mut id = [0u8; 16];
    for (index, chunk) in id.chunks_exact_mut(4).enumerate() {
        let seed = format!("{nqn}/{nsid}/{kind}/{index}");
        chunk.copy_from_slice(&crate::tcp::pdu::data_digest(seed.as_bytes()).to_le_bytes());
    }
    if kind == 1 {
        id[6] = (id[6] & 0x0f) | 0x40; // UUID version 4 layout, variant 1
        id[8] = (id[8] & 0x3f) | 0x80;
    }
    id
}

fn check_nqn(nqn: &str) -> Result<(), TargetError> {
    if nqn.is_empty() || nqn.len() > NQN_MAX_BYTES || nqn.contains('\0') {
        return Err(TargetError::Config(format!("NQN {nqn:?} must be 1 to {NQN_MAX_BYTES} bytes without NUL")));
    }
    if nqn == DISCOVERY_NQN {
        return Err(TargetError::Config(format!("{DISCOVERY_NQN} is the discovery subsystem, always served")));
    }
    Ok(())
}

fn capacity(config: &NamespaceConfig) -> std::io::Result<u64> {
    match &config.backend {
        NamespaceBackend::Memory { bytes } => Ok(*bytes),
        NamespaceBackend::File { bytes: Some(bytes), .. } => Ok(*bytes),
        NamespaceBackend::File { path, bytes: None } => std::fs::File::open(path)?.seek(SeekFrom::End(0)),
    }
}

fn subsystem_infos(config: &TargetConfig) -> Result<Vec<SubsystemInfo>, TargetError> {
    let mut infos = vec![SubsystemInfo {
        nqn: DISCOVERY_NQN.into(),
        discovery: true,
        allowed_hosts: Vec::new(),
        namespaces: Vec::new(),
        serial: "strata-discovery".into(),
    }];
    for subsystem in &config.subsystems {
        check_nqn(&subsystem.nqn)?;
        if infos.iter().any(|info| info.nqn == subsystem.nqn) {
            return Err(TargetError::Config(format!("subsystem {} is listed twice", subsystem.nqn)));
        }
        let mut namespaces = Vec::new();
        for (index, namespace) in subsystem.namespaces.iter().enumerate() {
            let nsid = index as u32 + 1;
            let capacity_bytes = capacity(namespace)
                .map_err(|error| TargetError::Config(format!("namespace {nsid} of {}: {error}", subsystem.nqn)))?;
            let block = namespace.block_bytes;
            if !block.is_power_of_two() || !(512..=4096).contains(&block) || capacity_bytes < block {
                return Err(TargetError::Config(format!(
                    "namespace {nsid} of {}: {capacity_bytes} bytes in blocks of {block}",
                    subsystem.nqn
                )));
            }
            namespaces.push(NamespaceInfo {
                block_bytes: block,
                capacity_bytes: capacity_bytes / block * block,
                nguid: identifier(&subsystem.nqn, nsid, 0),
                uuid: identifier(&subsystem.nqn, nsid, 1),
                reservations: Default::default(),
            });
        }
        let serial =
            format!("{:08x}{:08x}", crate::tcp::pdu::data_digest(subsystem.nqn.as_bytes()), subsystem.namespaces.len());
        infos.push(SubsystemInfo {
            nqn: subsystem.nqn.clone(),
            discovery: false,
            allowed_hosts: subsystem.allowed_hosts.clone(),
            namespaces,
            serial,
        });
    }
    Ok(infos)
}

/// A namespace's backend, created once for the whole target (memory) or per executor (files).
#[derive(Clone)]
enum Backend {
    Memory(MemoryDevice),
    File { path: std::path::PathBuf, bytes: u64 },
}

async fn open_devices(
    backends: &[Vec<Backend>],
    shared: &Shared,
    config: &TargetConfig,
) -> Result<Vec<Vec<Rc<AnyDevice>>>, TargetError> {
    let mut devices = vec![Vec::new()];
    for (index, subsystem) in backends.iter().enumerate() {
        let mut opened = Vec::new();
        for (ns_index, backend) in subsystem.iter().enumerate() {
            let device = match backend {
                Backend::Memory(device) => AnyDevice::Memory(device.clone()),
                Backend::File { path, bytes } => {
                    let device = open_file(path, *bytes, config).await.map_err(|source| TargetError::Namespace {
                        nqn: shared.subsystems[index + 1].nqn.clone(),
                        nsid: ns_index as u32 + 1,
                        source,
                    })?;
                    let info = &shared.subsystems[index + 1].namespaces[ns_index];
                    let device_block = device.geometry().logical_block_bytes;
                    if !info.block_bytes.is_multiple_of(device_block) {
                        return Err(TargetError::Config(format!(
                            "namespace {} of {}: blocks of {} bytes on {}, whose blocks are {device_block} bytes",
                            ns_index + 1,
                            shared.subsystems[index + 1].nqn,
                            info.block_bytes,
                            path.display()
                        )));
                    }
                    device
                }
            };
            opened.push(Rc::new(device));
        }
        devices.push(opened);
    }
    Ok(devices)
}

/// A file namespace on this executor: through glommio's reactor where the executor parks, on a ring of its
/// own that the executor polls beside its sockets where the target busy-polls (as a busy-polled node's
/// tier: its completions are seen on the executor's next pass, not at the reactor's next turn).
async fn open_file(path: &std::path::Path, bytes: u64, config: &TargetConfig) -> Result<AnyDevice, BlockError> {
    let options = UringOptions { size_bytes: Some(bytes), read_only: false };
    if config.busy_poll.is_zero() {
        return Ok(AnyDevice::File(UringDevice::open(path, &options).await?));
    }
    // Every queue of every connection on this executor may have a command on the namespace.
    let depth = 2 * u32::from(config.queue_entries);
    Ok(AnyDevice::PolledFile(RingDevice::open_with(path, &options, depth, RingWait::Polled)?))
}

/// Starts a target: one executor per CPU of `config.cpus`, each listening on the configured address.
pub fn start(config: TargetConfig) -> Result<TargetHandle, TargetError> {
    if config.cpus.is_empty() {
        return Err(TargetError::Config("no CPU to run on".into()));
    }
    if config.queue_entries < 2 || config.max_h2c_data_bytes < 4096 || !config.max_h2c_data_bytes.is_multiple_of(4) {
        return Err(TargetError::Config("queue entries ≥ 2 and MAXH2CDATA ≥ 4096, a multiple of 4".into()));
    }
    if !config.max_transfer_bytes.is_power_of_two() || config.max_transfer_bytes < 4096 {
        return Err(TargetError::Config("the largest transfer must be a power of two ≥ 4096".into()));
    }
    crate::environment::check_memlock_budget(IO_MEMORY_BYTES as u64, config.cpus.len() as u64)
        .map_err(|error| TargetError::Config(error.to_string()))?;
    let shared = Arc::new(Shared::new(subsystem_infos(&config)?));
    let backends: Vec<Vec<Backend>> = config
        .subsystems
        .iter()
        .zip(&shared.subsystems[1..])
        .map(|(subsystem, info)| {
            subsystem
                .namespaces
                .iter()
                .zip(&info.namespaces)
                .map(|(namespace, ns_info)| match &namespace.backend {
                    NamespaceBackend::Memory { .. } => {
                        Backend::Memory(MemoryDevice::new(ns_info.capacity_bytes, ns_info.block_bytes))
                    }
                    NamespaceBackend::File { path, .. } => {
                        Backend::File { path: path.clone(), bytes: ns_info.capacity_bytes }
                    }
                })
                .collect()
        })
        .collect();
    let config = Arc::new(config);
    let stopping = Arc::new(AtomicBool::new(false));
    let mut handle = TargetHandle {
        local_addr: config.listen,
        threads: Vec::new(),
        stopping: Arc::clone(&stopping),
        listeners: Vec::new(),
        shared: Arc::clone(&shared),
        #[cfg(feature = "rdma")]
        rdma: None,
    };
    let (mut rdma_intakes, rdma_handoffs) = rdma_channels(&config)?;
    for (index, &cpu) in config.cpus.iter().enumerate() {
        let rdma_intake = rdma_intakes.pop();
        let (ready, started) = mpsc::channel::<Result<(SocketAddr, RawFd), TargetError>>();
        let listen = handle.local_addr;
        let (config, shared, backends, stopping) =
            (Arc::clone(&config), Arc::clone(&shared), backends.clone(), Arc::clone(&stopping));
        let thread = LocalExecutorBuilder::new(Placement::Fixed(cpu))
            .name(&format!("strata-target-{index}"))
            .io_memory(IO_MEMORY_BYTES)
            .spin_before_park(config.busy_poll)
            .spawn(move || async move {
                let devices = match open_devices(&backends, &shared, &config).await {
                    Ok(devices) => devices,
                    Err(error) => return drop(ready.send(Err(error))),
                };
                let (listener, fd) = match bind_listener(listen, config.tcp_congestion.as_deref()) {
                    Ok(bound) => bound,
                    Err(source) => return drop(ready.send(Err(TargetError::Listen { addr: listen, source }))),
                };
                let local = listener.local_addr().unwrap_or(listen);
                let _ = ready.send(Ok((local, fd)));
                let ctx =
                    Rc::new(ExecutorContext { shared, config, devices, listen: local, buffers: Default::default() });
                serve_rdma(rdma_intake, &ctx);
                accept_loop(listener, ctx, stopping).await;
            })
            .map_err(|error| TargetError::Executor(error.to_string()));
        let thread = match thread {
            Ok(thread) => thread,
            Err(error) => {
                handle.stop();
                return Err(error);
            }
        };
        handle.threads.push(std::thread::spawn(move || {
            let _ = thread.join();
        }));
        match started.recv() {
            Ok(Ok((local, fd))) => {
                handle.local_addr = local;
                handle.listeners.push(fd);
            }
            Ok(Err(error)) => {
                handle.stop();
                return Err(error);
            }
            Err(_) => {
                handle.stop();
                return Err(TargetError::Executor("an executor ended while starting".into()));
            }
        }
    }
    #[cfg(feature = "rdma")]
    if let Some(address) = config.rdma_listen {
        match rdma::listen(address, &config, rdma_handoffs) {
            Ok(listener) => handle.rdma = Some(listener),
            Err(error) => {
                handle.stop();
                return Err(error);
            }
        }
    }
    #[cfg(not(feature = "rdma"))]
    let () = rdma_handoffs;
    Ok(handle)
}

/// One intake per executor (popped from the end) and the listener's handoffs to them, where the target
/// listens on RDMA.
#[cfg(feature = "rdma")]
fn rdma_channels(config: &TargetConfig) -> Result<(Vec<rdma::Intake>, Vec<rdma::Handoff>), TargetError> {
    let mut intakes = Vec::new();
    let mut handoffs = Vec::new();
    if config.rdma_listen.is_some() {
        for _ in &config.cpus {
            let (handoff, intake) = rdma::channel().map_err(|error| TargetError::Executor(error.to_string()))?;
            handoffs.push(handoff);
            intakes.push(intake);
        }
    }
    intakes.reverse();
    Ok((intakes, handoffs))
}

/// Without feature `rdma`, an RDMA listener is refused before anything starts.
#[cfg(not(feature = "rdma"))]
fn rdma_channels(config: &TargetConfig) -> Result<(Vec<()>, ()), TargetError> {
    match config.rdma_listen {
        Some(address) => Err(TargetError::Config(format!(
            "an NVMe/RDMA listener ({address}) needs a build with RDMA: cargo build --features rdma"
        ))),
        None => Ok((Vec::new(), ())),
    }
}

#[cfg(feature = "rdma")]
fn serve_rdma(intake: Option<rdma::Intake>, ctx: &Rc<ExecutorContext>) {
    if let Some(intake) = intake {
        glommio::spawn_local(rdma::serve_intake(intake, Rc::clone(ctx))).detach();
    }
}

#[cfg(not(feature = "rdma"))]
fn serve_rdma(_: Option<()>, _: &Rc<ExecutorContext>) {}

/// A listener with `SO_REUSEPORT`, as glommio binds one, keeping its descriptor so that `stop` can shut
/// it down and end the pending accept.
fn bind_listener(addr: SocketAddr, congestion: Option<&str>) -> std::io::Result<(TcpListener, RawFd)> {
    let socket = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
    if let Some(algorithm) = congestion {
        crate::tcp::set_congestion_control(socket.as_raw_fd(), algorithm).map_err(|error| {
            std::io::Error::new(error.kind(), format!("TCP congestion control {algorithm:?}: {error}"))
        })?;
    }
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    let fd = socket.into_raw_fd();
    // SAFETY: `fd` is a bound, listening TCP socket that only this listener owns from here on.
    #[allow(unsafe_code)]
    let listener = unsafe { TcpListener::from_raw_fd(fd) };
    Ok((listener, fd))
}

async fn accept_loop(listener: TcpListener, ctx: Rc<ExecutorContext>, stopping: Arc<AtomicBool>) {
    loop {
        match listener.accept().await {
            Ok(stream) => {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                glommio::spawn_local(connection::serve(stream, Rc::clone(&ctx))).detach();
            }
            Err(_) if stopping.load(Ordering::SeqCst) => break,
            // Out of descriptors or a connection reset before accept: keep serving the others.
            Err(_) => glommio::timer::sleep(std::time::Duration::from_millis(10)).await,
        }
    }
}
