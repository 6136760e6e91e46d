//! `strata-nvme`: block devices and (as the NVMe-oF issue lands) NVMe structures, the NVMe/TCP codec, and the
//! NVMe-oF target and host.
//!
//! The I/O layering follows STYLE.md: a [`BlockDevice`] knows its [`Geometry`] and moves owned, aligned
//! [`IoBuffer`]s; cross-cutting behaviour wraps a device instead of being a flag inside each backend
//! ([`StatsDevice`], [`FaultDevice`], [`QueueDepthLimit`]); the placement code above (the engine's region
//! log, the bench) is generic over the device.
//!
//! Backends: [`MemoryDevice`] (a RAM namespace), [`VolatileDevice`] (a RAM namespace behind a volatile
//! write cache, for crash tests), [`UringDevice`] (glommio `DmaFile`, O_DIRECT, io_uring) and
//! [`RingDevice`] (our own io_uring, for executors dedicated to I/O).
//! [`NvmfDevice`] (a namespace of a remote NVMe-oF/TCP controller, [`host`]) implements it too; the
//! NVMe-oF target ([`target`]) serves any of them. [`spec`] and [`tcp`] hold the NVMe structures and the
//! NVMe/TCP PDU codec both sides share; [`rdma`] the NVMe/RDMA binding's connection private data and keyed
//! SGL descriptors.
#![deny(missing_docs, unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod any_device;
mod buffer;
mod device;
pub mod environment;
mod error;
mod faults;
pub mod host;
mod memory;
mod queue_depth;
pub mod rdma;
pub mod readiness;
mod ring;
pub mod spec;
mod stats;
pub mod superblock;
pub mod target;
pub mod tcp;
mod uring;
mod volatile;

pub use crate::any_device::{AnyDevice, DeviceSpec, FileIo, OpenError};
pub use crate::buffer::IoBuffer;
pub use crate::device::{BlockDevice, Geometry, IoTiming};
pub use crate::error::{BlockError, BlockErrorKind, BlockOp, BlockResult};
pub use crate::faults::{FaultConfig, FaultDevice, FaultStats};
pub use crate::host::{HostOptions, NvmfAddress, NvmfDevice, NvmfError, NvmfTransport};
pub use crate::memory::MemoryDevice;
pub use crate::queue_depth::QueueDepthLimit;
pub use crate::ring::{RingDevice, RingWait};
pub use crate::stats::{DeviceStats, OpStats, StatsDevice, latency_histogram};
pub use crate::uring::{UringDevice, UringOptions};
pub use crate::volatile::{CrashReport, VolatileDevice, VolatileDisk};
