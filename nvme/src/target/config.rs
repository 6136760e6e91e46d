//! What a target serves: where it listens, its subsystems, their namespaces and allowed hosts.

use std::net::{SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::time::Duration;

/// A namespace's backing store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamespaceBackend {
    /// RAM, zeroed, shared by the target's executors.
    Memory {
        /// Capacity in bytes.
        bytes: u64,
    },
    /// A file or block device through the `uring` backend (O_DIRECT), opened on each executor.
    File {
        /// The path.
        path: PathBuf,
        /// Create or extend a regular file to this size; `None`: use it as it is.
        bytes: Option<u64>,
    },
}

/// One namespace of a subsystem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceConfig {
    /// Where its bytes live.
    pub backend: NamespaceBackend,
    /// Logical block size in bytes (512 or 4096).
    pub block_bytes: u64,
}

impl NamespaceConfig {
    /// Parses `memory:SIZE` or `file:PATH[,size=SIZE]` (sizes as `parse_size` reads them), with an optional
    /// `,block=N`.
    pub fn parse(spec: &str, parse_size: impl Fn(&str) -> Option<u64>) -> Result<Self, String> {
        let (kind, rest) = spec
            .split_once(':')
            .ok_or_else(|| format!("namespace {spec:?}: expected memory:SIZE or file:PATH[,size=SIZE]"))?;
        let mut parts = rest.split(',');
        let first = parts.next().unwrap_or_default();
        let mut size = None;
        let mut block_bytes = 4096;
        for option in parts {
            let (key, value) = option
                .split_once('=')
                .ok_or_else(|| format!("namespace {spec:?}: option {option:?} is not key=value"))?;
            let value =
                parse_size(value).ok_or_else(|| format!("namespace {spec:?}: {key}={value:?} is not a size"))?;
            match key {
                "size" => size = Some(value),
                "block" if value == 512 || value == 4096 => block_bytes = value,
                "block" => return Err(format!("namespace {spec:?}: block must be 512 or 4096")),
                _ => return Err(format!("namespace {spec:?}: unknown option {key:?} (size, block)")),
            }
        }
        let backend = match kind {
            "memory" => NamespaceBackend::Memory {
                bytes: parse_size(first).or(size).ok_or_else(|| format!("namespace {spec:?}: memory needs a size"))?,
            },
            "file" if !first.is_empty() => NamespaceBackend::File { path: first.into(), bytes: size },
            _ => return Err(format!("namespace {spec:?}: expected memory:SIZE or file:PATH[,size=SIZE]")),
        };
        Ok(Self { backend, block_bytes })
    }
}

/// One NVM subsystem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubsystemConfig {
    /// Its NQN.
    pub nqn: String,
    /// Namespaces, NSID 1, 2, ... in this order.
    pub namespaces: Vec<NamespaceConfig>,
    /// Host NQNs allowed to connect; empty: any host.
    pub allowed_hosts: Vec<String>,
}

/// A target.
#[derive(Clone, Debug)]
pub struct TargetConfig {
    /// Address to listen on (port 0: any free port, see [`crate::TargetHandle::local_addr`]).
    pub listen: SocketAddr,
    /// An NVMe/RDMA listener beside the TCP one: an IPv4 address of an RDMA device's interface (needs
    /// feature `rdma`).
    pub rdma_listen: Option<SocketAddrV4>,
    /// The NVM subsystems (the discovery subsystem is always served too).
    pub subsystems: Vec<SubsystemConfig>,
    /// CPUs to run one executor on each (each serves the queue pairs the kernel hands its listener).
    pub cpus: Vec<usize>,
    /// How long an idle executor spins before sleeping in the kernel: zero sleeps at once; a long time is
    /// SPDK-style busy polling (one core burnt for the lowest latency).
    pub busy_poll: Duration,
    /// TCP congestion control for accepted connections (`None`: the system's default). See
    /// [`crate::tcp::set_congestion_control`].
    pub tcp_congestion: Option<String>,
    /// Entries per queue the controller offers (CAP.MQES + 1) and MAXCMD.
    pub queue_entries: u16,
    /// Most data per H2CData PDU the target accepts (MAXH2CDATA).
    pub max_h2c_data_bytes: u32,
    /// Largest in-capsule data on any queue (IOCCSZ for I/O queues).
    pub in_capsule_data_bytes: u32,
    /// Largest transfer of one command (reported as MDTS, a power of two ≥ 4 KiB).
    pub max_transfer_bytes: u32,
    /// How long a connection may take from its accept to a queue connected (over TCP, ICReq and a Connect
    /// that succeeds; over RDMA, a Connect that succeeds); one that takes longer is closed, so that a peer
    /// that opens connections and says nothing holds none (nor an RDMA queue's pinned receives) for ever.
    /// Zero: no limit.
    pub handshake_timeout: Duration,
}

impl TargetConfig {
    /// A target on `listen` serving `subsystems` on one executor (the first online CPU), with the
    /// defaults used in tests and benchmarks.
    pub fn new(listen: SocketAddr, subsystems: Vec<SubsystemConfig>) -> Self {
        Self {
            listen,
            rdma_listen: None,
            subsystems,
            cpus: vec![0],
            busy_poll: Duration::ZERO,
            tcp_congestion: None,
            queue_entries: 128,
            max_h2c_data_bytes: 1 << 20,
            in_capsule_data_bytes: 16 << 10,
            max_transfer_bytes: 1 << 20,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(text: &str) -> Option<u64> {
        let (digits, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
        let shift = match unit.to_ascii_lowercase().as_str() {
            "" => 0,
            "k" | "kib" => 10,
            "m" | "mib" => 20,
            "g" | "gib" => 30,
            _ => return None,
        };
        digits.parse::<u64>().ok().map(|value| value << shift)
    }

    #[test]
    fn namespace_specs_parse_as_the_cli_writes_them() {
        assert_eq!(
            NamespaceConfig::parse("memory:1GiB", size),
            Ok(NamespaceConfig { backend: NamespaceBackend::Memory { bytes: 1 << 30 }, block_bytes: 4096 })
        );
        assert_eq!(
            NamespaceConfig::parse("file:/tmp/x,size=8GiB,block=512", size),
            Ok(NamespaceConfig {
                backend: NamespaceBackend::File { path: "/tmp/x".into(), bytes: Some(8 << 30) },
                block_bytes: 512
            })
        );
        assert!(NamespaceConfig::parse("disk:/x", size).is_err());
        assert!(NamespaceConfig::parse("file:/x,block=1000", size).is_err());
        assert!(NamespaceConfig::parse("memory:lots", size).is_err());
    }
}
