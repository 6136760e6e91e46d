//! State shared by the target's executors: the subsystems (fixed at start), the controllers (created by
//! admin-queue Connect, found by I/O-queue Connect on any executor) and the sockets to tear down.
//!
//! It sits behind one mutex, taken on the control path only (Connect, Property Get/Set, Keep Alive,
//! Identify, log pages). Reads and writes never touch it: each queue counts its I/O in its own atomics,
//! written by that queue alone and summed when a host asks for the SMART log.

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::reservations::{HostId, Reservations};
use crate::spec::{ErrorLogEntry, NvmeStatus, csts};

/// Error log entries kept per controller (ELPE + 1).
pub(crate) const ERROR_LOG_ENTRIES: usize = 16;

/// One namespace as the control path describes it.
pub(crate) struct NamespaceInfo {
    pub(crate) block_bytes: u64,
    pub(crate) capacity_bytes: u64,
    pub(crate) nguid: [u8; 16],
    pub(crate) uuid: [u8; 16],
    pub(crate) reservations: Reservations,
}

/// A subsystem; index 0 of [`Shared::subsystems`] is the discovery subsystem.
pub(crate) struct SubsystemInfo {
    pub(crate) nqn: String,
    pub(crate) discovery: bool,
    pub(crate) allowed_hosts: Vec<String>,
    pub(crate) namespaces: Vec<NamespaceInfo>,
    pub(crate) serial: String,
}

impl SubsystemInfo {
    pub(crate) fn allows(&self, hostnqn: &str) -> bool {
        self.allowed_hosts.is_empty() || self.allowed_hosts.iter().any(|host| host == hostnqn)
    }
}

/// I/O counters of one queue (single writer: its connection).
#[derive(Default)]
pub(crate) struct QueueCounters {
    pub(crate) reads: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) media_errors: AtomicU64,
}

impl QueueCounters {
    pub(crate) fn add(counter: &AtomicU64, value: u64) {
        counter.store(counter.load(Ordering::Relaxed) + value, Ordering::Relaxed);
    }
}

pub(crate) struct Controller {
    pub(crate) subsystem: usize,
    pub(crate) hostnqn: String,
    pub(crate) host_id: HostId,
    pub(crate) cc: u32,
    pub(crate) csts: u32,
    pub(crate) kato_ms: u32,
    pub(crate) last_keep_alive: Instant,
    pub(crate) io_queues_granted: u16,
    pub(crate) async_event_config: u32,
    /// Queue ID → the socket serving it (admin queue is 0).
    pub(crate) queues: HashMap<u16, RawFd>,
    pub(crate) errors: VecDeque<ErrorLogEntry>,
    pub(crate) error_count: u64,
}

impl Controller {
    pub(crate) fn ready(&self) -> bool {
        self.csts & csts::READY != 0
    }

    pub(crate) fn record_error(&mut self, sqid: u16, cid: u16, status: NvmeStatus, lba: u64, nsid: u32) {
        self.error_count += 1;
        if self.errors.len() == ERROR_LOG_ENTRIES {
            self.errors.pop_back();
        }
        self.errors.push_front(ErrorLogEntry { error_count: self.error_count, sqid, cid, status, lba, nsid });
    }
}

pub(crate) struct Registry {
    pub(crate) controllers: HashMap<u16, Controller>,
    next_cntlid: u16,
    /// Every open connection's socket, so that stopping the target can end them.
    pub(crate) connections: HashSet<RawFd>,
    /// Per subsystem, the counters of every I/O queue it ever had.
    pub(crate) counters: Vec<Vec<Arc<QueueCounters>>>,
}

/// What every executor of a target shares.
pub(crate) struct Shared {
    pub(crate) subsystems: Vec<SubsystemInfo>,
    pub(crate) started: Instant,
    registry: Mutex<Registry>,
}

impl Shared {
    pub(crate) fn new(subsystems: Vec<SubsystemInfo>) -> Self {
        let counters = subsystems.iter().map(|_| Vec::new()).collect();
        Self {
            subsystems,
            started: Instant::now(),
            registry: Mutex::new(Registry {
                controllers: HashMap::new(),
                next_cntlid: 1,
                connections: HashSet::new(),
                counters,
            }),
        }
    }

    /// The registry. A poisoned lock (a panic elsewhere while holding it) still holds consistent data:
    /// every critical section only inserts or removes whole entries.
    pub(crate) fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Registry {
    /// A fresh controller ID (1 ..= 0xFFEF, the range NVMe-oF allows), or `None` when all are in use.
    pub(crate) fn allocate_cntlid(&mut self) -> Option<u16> {
        for _ in 0..0xffef {
            let cntlid = self.next_cntlid;
            self.next_cntlid = if cntlid >= 0xffef { 1 } else { cntlid + 1 };
            if !self.controllers.contains_key(&cntlid) {
                return Some(cntlid);
            }
        }
        None
    }

    /// Removes a controller and shuts down every socket of its queues, so their connections end.
    pub(crate) fn tear_down(&mut self, cntlid: u16) {
        if let Some(controller) = self.controllers.remove(&cntlid) {
            for fd in controller.queues.values() {
                shutdown_socket(*fd);
            }
        }
    }
}

/// Shuts a socket down in both directions: its reader sees end of stream, on whatever executor it runs.
pub(crate) fn shutdown_socket(fd: RawFd) {
    // SAFETY: shutdown(2) only acts on the descriptor number; the registry removes a descriptor before its
    // connection closes it, so the number still names that connection's socket.
    #[allow(unsafe_code)]
    unsafe {
        libc::shutdown(fd, libc::SHUT_RDWR);
    }
}
