//! NVMe structures as the NVMe Base Specification 2.0 and NVMe over Fabrics 1.1 lay them out: commands,
//! completions, status codes, Identify data, log pages and the Fabrics Connect data.
//!
//! Every structure is encoded into and decoded from its exact little-endian byte layout by hand (no
//! `repr(C)` casts): the offsets are written once, next to the specification's field names, and the unit
//! tests check them against the specification's tables.

mod bytes;
mod command;
mod fabrics;
mod identify;
mod log;
mod reservation;
mod status;

pub use command::{AdminOpcode, Command, Completion, FABRICS_OPCODE, FabricsType, IoOpcode, SglDescriptor};
pub use fabrics::{ConnectData, Property, cap, cc, csts};
pub use identify::{
    ControllerIdentity, ControllerType, NamespaceIdentity, active_namespace_list, namespace_descriptors,
};
pub use log::{DiscoveryEntry, DiscoveryLog, ErrorLogEntry, LogPage, SmartLog};
pub use reservation::{
    AcquireAction, RESERVATION_KEYS_BYTES, RegisterAction, Registrant, ReleaseAction, ReservationStatus,
    ReservationType, decode_keys, encode_keys, reservation_cdw10,
};
pub use status::{NvmeStatus, StatusType};

pub use bytes::{get_u16, get_u32, get_u64};
pub(crate) use bytes::{put_u16, put_u32};

/// Size of a submission queue entry (a command).
pub const COMMAND_BYTES: usize = 64;
/// Size of a completion queue entry.
pub const COMPLETION_BYTES: usize = 16;
/// Size of every Identify data structure.
pub const IDENTIFY_BYTES: usize = 4096;
/// The well-known NQN of a discovery subsystem.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// NQNs are at most 223 bytes of UTF-8 (NVMe Base 2.0, 4.5), stored in 256-byte fields.
pub const NQN_MAX_BYTES: usize = 223;
