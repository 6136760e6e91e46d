//! The NVMe-oF host: a userspace initiator that is itself a block device ([`NvmfDevice`]), over TCP or
//! (feature `rdma`) RDMA, plus discovery ([`discover`], TCP).
//!
//! A controller has an admin queue (Connect, Property Get/Set for the enable handshake, Identify, Set
//! Features, Keep Alive) and one I/O queue per executor that uses it; each queue is one TCP connection
//! served by a reader task and a writer task on that executor, or one RDMA queue pair served by a
//! completion task (`host/rdma.rs`). Commands are pipelined up to the queue depth; over TCP reads land straight
//! in the caller's buffer from C2HData PDUs, and writes go in the capsule when small enough and after the
//! controller's R2T otherwise. A command that gets no completion within the command timeout breaks its
//! queue, as a lost connection does: the queue's connection is shut down, and each block command in flight
//! is sent again on a new one (a few times at most, as Linux's host requeues them), reconnecting until the
//! controller-loss timeout. Other commands in flight fail with a typed error.

mod controller;
mod device;
mod identity;
mod queue;
#[cfg(feature = "rdma")]
mod rdma;
mod reservations;
mod settings;

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

pub use self::controller::{ControllerInfo, discover};
pub use self::device::{IoQueueHandle, NvmfDevice};
pub use self::identity::{machine_identity, node_host_id};
pub use self::settings::ConnectSettings;
use crate::spec::NvmeStatus;
use crate::tcp::{Digests, TransportError};

/// The transport binding a controller is reached by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NvmfTransport {
    /// NVMe/TCP.
    Tcp,
    /// NVMe/RDMA (feature `rdma`): `addr` is an IPv4 address an RDMA device routes to.
    Rdma,
}

/// Where a namespace is: `trtype=tcp|rdma,traddr=ADDR,trsvcid=PORT,subnqn=NQN,ns=N` (nvme-cli's names),
/// and how to connect to it where that differs from the host's options (`,hdr_digest,io_timeout=5`...:
/// [`ConnectSettings`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmfAddress {
    /// The transport (`trtype`; TCP when not given).
    pub transport: NvmfTransport,
    /// Transport address and service (port).
    pub addr: SocketAddr,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Namespace ID.
    pub nsid: u32,
    /// Connection settings given with the address (none by default).
    pub settings: ConnectSettings,
}

impl NvmfAddress {
    /// Namespace `nsid` of subsystem `subnqn` at `addr` over NVMe/TCP, with the host's own settings.
    pub fn tcp(addr: SocketAddr, subnqn: impl Into<String>, nsid: u32) -> Self {
        Self { transport: NvmfTransport::Tcp, addr, subnqn: subnqn.into(), nsid, settings: ConnectSettings::default() }
    }

    /// Parses the fio-style `--filename` of `--ioengine=nvmf` (`ns` defaults to 1, `trsvcid` to 4420).
    pub fn parse(text: &str) -> Result<Self, NvmfError> {
        let invalid = |what: String| NvmfError::InvalidAddress(format!("{text:?}: {what}"));
        let (mut traddr, mut trsvcid, mut subnqn, mut nsid) = (None, 4420u16, None, 1u32);
        let mut transport = NvmfTransport::Tcp;
        let mut settings = ConnectSettings::default();
        for part in text.split(',') {
            let (key, value) = match part.split_once('=') {
                Some((key, value)) => (key, Some(value)),
                None => (part, None),
            };
            if settings.set(key, value).map_err(invalid)? {
                continue;
            }
            let value = value.ok_or_else(|| invalid(format!("{part:?} is not key=value")))?;
            match key {
                "trtype" if value.eq_ignore_ascii_case("tcp") => transport = NvmfTransport::Tcp,
                "trtype" if value.eq_ignore_ascii_case("rdma") => transport = NvmfTransport::Rdma,
                "trtype" => return Err(invalid(format!("transport {value:?} is not supported (tcp, rdma)"))),
                "traddr" => traddr = Some(value.to_string()),
                "trsvcid" => {
                    trsvcid = value.parse().map_err(|_| invalid(format!("trsvcid {value:?} is not a port")))?
                }
                "subnqn" => subnqn = Some(value.to_string()),
                "ns" | "nsid" => nsid = value.parse().map_err(|_| invalid(format!("ns {value:?} is not a number")))?,
                _ => {
                    let keys = settings::KEYS;
                    return Err(invalid(format!("unknown key {key:?} (trtype, traddr, trsvcid, subnqn, ns; {keys})")));
                }
            }
        }
        let traddr = traddr.ok_or_else(|| invalid("traddr is missing".into()))?;
        let subnqn = subnqn.ok_or_else(|| invalid("subnqn is missing".into()))?;
        let addr = resolve(&traddr, trsvcid).map_err(invalid)?;
        if nsid == 0 || nsid == u32::MAX {
            return Err(invalid("ns must be a namespace ID from 1".into()));
        }
        if transport == NvmfTransport::Rdma && !addr.is_ipv4() {
            return Err(invalid("trtype=rdma takes an IPv4 traddr".into()));
        }
        if transport == NvmfTransport::Rdma && settings.wants_digests() {
            return Err(invalid("digests (hdr_digest, data_digest) are NVMe/TCP's, not NVMe/RDMA's".into()));
        }
        Ok(Self { transport, addr, subnqn, nsid, settings })
    }
}

impl std::fmt::Display for NvmfAddress {
    /// The form [`NvmfAddress::parse`] reads.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (ip, port) = (self.addr.ip(), self.addr.port());
        let transport = match self.transport {
            NvmfTransport::Tcp => "tcp",
            NvmfTransport::Rdma => "rdma",
        };
        write!(f, "trtype={transport},traddr={ip},trsvcid={port},subnqn={},ns={}", self.subnqn, self.nsid)?;
        write!(f, "{}", self.settings)
    }
}

/// Resolves `ADDR` and a port (IPv6 literals with or without brackets).
pub fn resolve(traddr: &str, port: u16) -> Result<SocketAddr, String> {
    let host = traddr.trim_start_matches('[').trim_end_matches(']');
    (host, port)
        .to_socket_addrs()
        .map_err(|error| format!("{traddr}: {error}"))?
        .next()
        .ok_or_else(|| format!("{traddr} resolves to no address"))
}

/// How the host connects.
#[derive(Clone, Debug)]
pub struct HostOptions {
    /// The host NQN presented at Connect (targets check it against their allow-lists); by default the
    /// machine's (`/etc/nvme/hostnqn`).
    pub hostnqn: String,
    /// The host identifier (a UUID): who holds reservations; by default the machine's (`/etc/nvme/hostid`).
    pub host_id: [u8; 16],
    /// Header and data digests to ask for.
    pub digests: Digests,
    /// Entries per I/O queue (the queue depth), at most the controller's MQES + 1.
    pub queue_entries: u16,
    /// Keep-alive timeout for the controller in milliseconds (0: none); Keep Alive is sent every half.
    pub keep_alive_ms: u32,
    /// How long a command may wait for its completion (and a connection for its ICResp) before the queue
    /// is declared broken and reconnected (zero: for ever). Linux's `io_timeout` is the same 30 s.
    pub command_timeout: Duration,
    /// How long to keep trying to reconnect a lost controller before failing for good.
    pub controller_loss_timeout: Duration,
    /// Pause between reconnect attempts.
    pub reconnect_delay: Duration,
    /// Ask the controller to disable SQ flow control (it may then complete reads with the C2HData
    /// SUCCESS flag, saving a response PDU per read).
    pub disable_sq_flow_control: bool,
    /// Busy-poll the I/O queues' sockets (SPDK style): lowest latency, one core kept busy per queue. The
    /// admin queue always sleeps when idle.
    pub busy_poll: bool,
    /// TCP congestion control for the queues' sockets (`None`: the system's default). See
    /// [`crate::tcp::set_congestion_control`].
    pub tcp_congestion: Option<String>,
}

impl Default for HostOptions {
    /// The machine's own host identity ([`machine_identity`]), and Strata's defaults for the rest.
    fn default() -> Self {
        let (hostnqn, host_id) = machine_identity();
        Self {
            hostnqn,
            host_id,
            digests: Digests::default(),
            queue_entries: 128,
            keep_alive_ms: 10_000,
            command_timeout: Duration::from_secs(30),
            controller_loss_timeout: Duration::from_secs(60),
            reconnect_delay: Duration::from_secs(1),
            disable_sq_flow_control: true,
            busy_poll: false,
            tcp_congestion: None,
        }
    }
}

/// What can go wrong talking to a controller.
#[derive(Debug, thiserror::Error)]
pub enum NvmfError {
    /// The address string is malformed.
    #[error("NVMe-oF address {0}")]
    InvalidAddress(String),
    /// TCP connect failed.
    #[error("connect to {addr}: {source}")]
    Connect {
        /// The address.
        addr: SocketAddr,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// The connection failed or the controller broke the protocol.
    #[error("NVMe/TCP connection: {0}")]
    Transport(#[from] TransportError),
    /// A command completed with an error status.
    #[error("{command} failed: {status}")]
    Status {
        /// The command.
        command: &'static str,
        /// Its status.
        status: NvmeStatus,
    },
    /// The controller answered something this host cannot use.
    #[error("controller: {0}")]
    Protocol(String),
    /// The connection was lost while the command was in flight.
    #[error("the connection to the controller was lost ({0})")]
    Disconnected(String),
    /// An NVMe/RDMA queue could not be made, connected or kept (or the build has no RDMA).
    #[error("NVMe/RDMA: {0}")]
    Rdma(String),
    /// The controller did not become ready in time.
    #[error("{0} timed out")]
    Timeout(&'static str),
    /// Reconnecting failed for the whole controller-loss timeout.
    #[error("controller lost: no reconnect succeeded within {after:?}; last error: {last}")]
    ControllerLost {
        /// The controller-loss timeout.
        after: Duration,
        /// The last reconnect error.
        last: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_with_nvme_cli_names() {
        let address = NvmfAddress::parse("trtype=tcp,traddr=127.0.0.1,trsvcid=4421,subnqn=nqn.x:y,ns=2").unwrap();
        assert_eq!(address.addr, "127.0.0.1:4421".parse().unwrap());
        assert_eq!((address.subnqn.as_str(), address.nsid), ("nqn.x:y", 2));
        assert_eq!(NvmfAddress::parse("traddr=::1,subnqn=n").unwrap().addr, "[::1]:4420".parse().unwrap());
        let rdma = NvmfAddress::parse("trtype=rdma,traddr=10.0.2.15,subnqn=n").unwrap();
        assert_eq!((rdma.transport, rdma.addr), (NvmfTransport::Rdma, "10.0.2.15:4420".parse().unwrap()));
        for address in [address, NvmfAddress::parse("traddr=::1,subnqn=n").unwrap(), rdma] {
            assert_eq!(NvmfAddress::parse(&address.to_string()).unwrap(), address, "{address}");
        }
        for bad in [
            "traddr=127.0.0.1",
            "subnqn=n",
            "trtype=fc,traddr=127.0.0.1,subnqn=n",
            "trtype=rdma,traddr=::1,subnqn=n",
            "traddr=1.2.3.4,subnqn=n,ns=0",
            "x",
        ] {
            assert!(matches!(NvmfAddress::parse(bad), Err(NvmfError::InvalidAddress(_))), "{bad}");
        }
    }

    #[test]
    fn an_address_carries_its_connection_settings_and_prints_them_back() {
        let text = "traddr=127.0.0.1,subnqn=n,hdr_digest,data_digest=0,queue_size=32,io_timeout=2.5,ctrl_loss_tmo=600";
        let address = NvmfAddress::parse(text).unwrap();
        let settings = &address.settings;
        assert_eq!(
            (settings.header_digest, settings.data_digest, settings.queue_size),
            (Some(true), Some(false), Some(32))
        );
        assert_eq!(settings.io_timeout, Some(Duration::from_millis(2500)));
        assert_eq!(settings.ctrl_loss, Some(Duration::from_secs(600)));
        assert_eq!((settings.keep_alive, settings.reconnect_delay), (None, None));
        assert_eq!(NvmfAddress::parse(&address.to_string()).unwrap(), address, "{address}");
        assert_eq!(NvmfAddress::parse("traddr=127.0.0.1,subnqn=n").unwrap().settings, ConnectSettings::default());
        for (bad, says) in [
            ("trtype=rdma,traddr=10.0.0.1,subnqn=n,data_digest=1", "NVMe/TCP's"),
            ("traddr=127.0.0.1,subnqn=n,io_timeout=soon", "io_timeout"),
            ("traddr=127.0.0.1,subnqn=n,hdgst=1", "unknown key"),
            ("traddr=127.0.0.1,subnqn", "not key=value"),
        ] {
            let error = NvmfAddress::parse(bad).unwrap_err().to_string();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }
}
