//! How a node is set up.

use std::net::SocketAddr;
use std::time::Duration;

use strata_nvme::DeviceSpec;
use strata_proto::{Limits, WritePolicy};

/// How long a busy-polled connection spins with nothing to read before it waits on the reactor: longer
/// than a client's turn between a reply and its next request (tens of microseconds, a sleeping client's
/// wake-up included), so a client in a loop is polled throughout, and short enough that a quiet node stops
/// spinning at once (Seastar's reactor idles after 200 µs of polling).
pub const DEFAULT_BUSY_POLL_IDLE: Duration = Duration::from_millis(1);

/// The engine's settings (the node binary builds it from flags and TOML; see `strata-node --help`).
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Address of shard 0; shard `i` listens on port `+ i`. Port 0 picks free consecutive ports.
    pub listen: SocketAddr,
    /// CPUs to pin shards to, one shard each (the number of shards).
    pub cpus: Vec<usize>,
    /// DRAM tier of the node (split evenly between shards).
    pub dram_bytes: u64,
    /// Use 2 MiB hugepages for the DRAM segments when reserved.
    pub hugepages: bool,
    /// Namespaces of the NVMe tier (none: DRAM only).
    pub nvme: Vec<DeviceSpec>,
    /// Who the node is to the NVMe-oF targets of its remote namespaces (Host NQN, Host Identifier: what
    /// reservations are held by); none: the machine's own identity.
    pub nvme_host: Option<strata_nvme::HostOptions>,
    /// Expected pool UUID of every namespace (from a pool description), or none to accept a namespace of
    /// any pool (and format one that belongs to none).
    pub pool_uuid: Option<[u8; 16]>,
    /// Erase the NVMe tier at start-up instead of recovering it.
    pub format: bool,
    /// Bytes per region of the log.
    pub region_bytes: u64,
    /// Region buffers per shard (one fills while the others are written).
    pub region_buffers: usize,
    /// NVMe-tier reads one shard keeps in flight at most (its queue depth on the device).
    pub nvme_queue_depth: usize,
    /// Default write policy.
    pub write_policy: WritePolicy,
    /// Evict when a tier is fuller than this share of its capacity...
    pub high_watermark: f64,
    /// ...down to this share.
    pub low_watermark: f64,
    /// A read keeps the object in place (not evicted) for this long.
    pub read_lease: Duration,
    /// An NVMe hit is promoted to DRAM when the object was also hit within this window before.
    pub promote_window: Duration,
    /// At reclaim, a record hit within this window is reinserted rather than dropped.
    pub reinsert_window: Duration,
    /// TTL of a soft pin whose put names none.
    pub soft_pin_ttl: Duration,
    /// Pinned objects (hard and soft) may take at most this share of a shard's DRAM; a pin past it is
    /// refused with `Quota`, so pins can never leave the cache without room to work.
    pub max_pinned_share: f64,
    /// Bytes of events each shard keeps for subscribers that fall behind (past it they get LAGGED).
    pub event_log_bytes: usize,
    /// Where subscribers' event frames are written to their sockets.
    pub event_cpus: EventCpus,
    /// Protocol bounds.
    pub limits: Limits,
    /// The node's tenants, each with its token and quotas; none: the node is open (keep it on loopback).
    pub tenants: Vec<crate::tenants::TenantConfig>,
    /// Where to serve `/metrics` and `/healthz`; none: not served.
    pub metrics: Option<SocketAddr>,
    /// Busy-poll each executor for this long before sleeping (latency for CPU).
    pub spin_before_park: Option<Duration>,
    /// Busy-poll client sockets with non-blocking system calls instead of waiting on glommio's reactor:
    /// saves the reactor's wake-up on every frame; the shard's core is kept busy while its clients are
    /// active.
    pub busy_poll: bool,
    /// With `busy_poll`, a connection that has had nothing to read for this long waits on the reactor
    /// until its next frame, so a shard whose clients are all quiet sleeps (zero: poll for as long as a
    /// connection is open).
    pub busy_poll_idle: Duration,
    /// Offer clients on the node's host the shared-memory path: each shard listens on an abstract Unix
    /// socket named after the node's address, which its HELLO names to a client that offers the path.
    pub shared_memory: bool,
    /// Move values by RDMA on this device (as `ibv_devices` names it) for clients that have one: gets are
    /// RDMA-written into, and puts RDMA-read from, memory the client registered. Needs a build with feature
    /// `rdma`; none: TCP and shared memory only.
    pub rdma_device: Option<String>,
    /// Inject these faults (seeded; the seed is offset by the shard id) into every shard's handles on file
    /// namespaces. For tests of torn writes and device errors; never set by the node binary.
    pub faults: Option<strata_nvme::FaultConfig>,
    /// A connection blocked on its peer in the middle of a frame (a put's value or a progressive put's
    /// next part that stops arriving, a reply the client stops reading) for this long, with no byte moving
    /// either way, is closed and what it held (a DRAM reservation, pinned reply buffers) is freed. Zero: never.
    pub stall_timeout: Duration,
    /// What a peer may hold: connections, bytes of values still arriving, and how slowly a frame may move.
    pub peers: crate::peer_limits::PeerLimits,
    /// Reports of the parts outside the shards (cluster membership), served in `/metrics` and `/healthz`.
    pub reports: crate::reports::Reports,
    /// In a cluster, which keys the node owns (published by the members' watch); none alone.
    pub ownership: Option<std::sync::Arc<crate::ownership::Ownership>>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7600)),
            cpus: vec![0],
            dram_bytes: 1 << 30,
            hugepages: true,
            nvme: Vec::new(),
            nvme_host: None,
            pool_uuid: None,
            format: false,
            region_bytes: 16 << 20,
            region_buffers: 3,
            nvme_queue_depth: 32,
            write_policy: WritePolicy::WriteThrough,
            high_watermark: 0.95,
            low_watermark: 0.90,
            read_lease: Duration::from_secs(5),
            promote_window: Duration::from_secs(60),
            reinsert_window: Duration::from_secs(60),
            soft_pin_ttl: Duration::from_secs(600),
            max_pinned_share: 0.5,
            event_log_bytes: 8 << 20,
            event_cpus: EventCpus::Spare,
            limits: Limits::default(),
            tenants: Vec::new(),
            metrics: Some(SocketAddr::from(([127, 0, 0, 1], 9600))),
            spin_before_park: None,
            busy_poll: false,
            busy_poll_idle: DEFAULT_BUSY_POLL_IDLE,
            shared_memory: true,
            rdma_device: None,
            faults: None,
            stall_timeout: Duration::from_secs(30),
            peers: crate::peer_limits::PeerLimits::default(),
            reports: crate::reports::Reports::default(),
            ownership: None,
        }
    }
}

/// Why a configuration is refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// No CPU to run a shard on.
    #[error("at least one core is needed")]
    NoCores,
    /// The watermarks are out of order.
    #[error("watermarks must satisfy 0 < low < high <= 1 (low {low}, high {high})")]
    Watermarks {
        /// The low one.
        low: f64,
        /// The high one.
        high: f64,
    },
    /// The region size is not a power of two from 1 MiB to 1 GiB.
    #[error("region size {0} must be a power of two from 1 MiB to 1 GiB")]
    RegionSize(u64),
    /// The pinned share is out of range.
    #[error("the pinned share {0} must be within 0..=0.9")]
    PinnedShare(f64),
    /// The tenants are inconsistent.
    #[error(transparent)]
    Tenants(#[from] crate::tenants::TenantError),
    /// Fewer than two region buffers per shard.
    #[error("at least 2 region buffers per shard are needed (one fills while one is written)")]
    RegionBuffers,
    /// No NVMe-tier read may be in flight.
    #[error("the NVMe queue depth must be at least 1")]
    QueueDepth,
    /// Too little DRAM per shard.
    #[error("{dram_bytes} bytes of DRAM give each of {shards} shards under 4 MiB")]
    DramPerShard {
        /// The node's DRAM.
        dram_bytes: u64,
        /// Its shards.
        shards: usize,
    },
    /// An empty list of CPUs for event senders.
    #[error("no CPUs for event senders (say `inline` to write events on the shards' cores)")]
    NoEventCpus,
    /// A CPU number past what the system can name.
    #[error("CPU {0} for event senders is past the largest CPU number")]
    EventCpu(usize),
    /// The shards' ports run past 65535.
    #[error("base port + shards exceeds 65535")]
    Ports,
    /// A CPU list that does not parse.
    #[error("{0:?} is not a CPU list (e.g. 0,2-3)")]
    CpuList(String),
}

/// Where a shard's event frames are written to their subscribers' sockets (`crate::event_sender`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventCpus {
    /// By a thread per subscriber on the CPUs this process may run on that no shard is pinned to (its
    /// affinity mask at start-up, as `taskset` set it), or by the shard itself when there are none.
    Spare,
    /// By the shard itself, on its own core.
    Inline,
    /// By a thread per subscriber on these CPUs.
    These(Vec<usize>),
}

impl EventCpus {
    /// Parses `spare`, `inline` or a list of CPUs such as `0,2-3`.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        match text.trim() {
            "spare" => Ok(EventCpus::Spare),
            "inline" => Ok(EventCpus::Inline),
            list => parse_cpu_list(list).map(EventCpus::These),
        }
    }
}

/// Parses a CPU list such as `0,2-3` (the form of `taskset -c`).
pub fn parse_cpu_list(text: &str) -> Result<Vec<usize>, ConfigError> {
    let mut cpus = Vec::new();
    let refused = || ConfigError::CpuList(text.to_string());
    for part in text.split(',').map(str::trim) {
        let number = |text: &str| text.trim().parse::<usize>().map_err(|_| refused());
        match part.split_once('-') {
            Some((first, last)) => {
                let (first, last) = (number(first)?, number(last)?);
                if first > last || last - first >= 4096 {
                    return Err(refused());
                }
                cpus.extend(first..=last);
            }
            None => cpus.push(number(part)?),
        }
    }
    Ok(cpus)
}

impl EngineConfig {
    /// Checks values that would make the node misbehave rather than fail.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.cpus.is_empty() {
            return Err(ConfigError::NoCores);
        }
        if !(0.0 < self.low_watermark && self.low_watermark < self.high_watermark && self.high_watermark <= 1.0) {
            return Err(ConfigError::Watermarks { low: self.low_watermark, high: self.high_watermark });
        }
        if !self.region_bytes.is_power_of_two() || !(1 << 20..=1 << 30).contains(&self.region_bytes) {
            return Err(ConfigError::RegionSize(self.region_bytes));
        }
        if !(0.0..=0.9).contains(&self.max_pinned_share) {
            return Err(ConfigError::PinnedShare(self.max_pinned_share));
        }
        crate::tenants::Tenancy::new(&self.tenants, self.cpus.len() as u32)?;
        if self.region_buffers < 2 {
            return Err(ConfigError::RegionBuffers);
        }
        if self.nvme_queue_depth == 0 {
            return Err(ConfigError::QueueDepth);
        }
        if self.dram_bytes / (self.cpus.len() as u64) < 4 << 20 {
            return Err(ConfigError::DramPerShard { dram_bytes: self.dram_bytes, shards: self.cpus.len() });
        }
        if let EventCpus::These(cpus) = &self.event_cpus {
            if cpus.is_empty() {
                return Err(ConfigError::NoEventCpus);
            }
            if let Some(&cpu) = cpus.iter().find(|cpu| **cpu >= libc::CPU_SETSIZE as usize) {
                return Err(ConfigError::EventCpu(cpu));
            }
        }
        if u64::from(self.listen.port()) + self.cpus.len() as u64 > 65_536 {
            return Err(ConfigError::Ports);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_cpus_parse_and_validate() {
        assert_eq!(EventCpus::parse("spare"), Ok(EventCpus::Spare));
        assert_eq!(EventCpus::parse("inline"), Ok(EventCpus::Inline));
        assert_eq!(EventCpus::parse("0,2-4"), Ok(EventCpus::These(vec![0, 2, 3, 4])));
        for bad in ["", "two", "3-1", "0,", "1-"] {
            assert!(EventCpus::parse(bad).is_err(), "{bad:?} is refused");
        }
        let mut config = EngineConfig { event_cpus: EventCpus::These(Vec::new()), ..EngineConfig::default() };
        assert!(config.validate().is_err(), "an empty list is refused");
        config.event_cpus = EventCpus::These(vec![1 << 20]);
        assert!(config.validate().is_err(), "a CPU past CPU_SETSIZE is refused");
        config.event_cpus = EventCpus::These(vec![0]);
        assert_eq!(config.validate(), Ok(()));
    }
}
