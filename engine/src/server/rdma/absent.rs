//! RDMA in a build without feature `rdma`: types that cannot exist, so every path that would move bytes by
//! RDMA is unreachable by construction, and a node asked for a device says which feature it lacks.

use strata_proto::{SharedSpan, Status};

use super::Transfer;
use crate::shard::Shard;

/// An opened RDMA device: none in this build.
pub(crate) enum RdmaDevice {}

/// A shard's RDMA: none in this build.
pub(crate) enum ShardRdma {}

/// A connection's RDMA: none in this build.
pub(crate) enum RdmaLink {}

/// Refuses: this build has no RDMA.
pub(crate) fn open_device(name: &str) -> Result<RdmaDevice, String> {
    Err(format!(
        "RDMA device {name:?} asked for, but this binary was built without RDMA \
         (cargo build --release -p strata-tools --features rdma)"
    ))
}

impl ShardRdma {
    pub(crate) fn new(device: &RdmaDevice, _shard: &Shard) -> Result<ShardRdma, String> {
        match *device {}
    }

    pub(crate) fn connect(&self, _client: &[u8]) -> Result<(RdmaLink, Vec<u8>), Status> {
        match *self {}
    }
}

impl RdmaLink {
    pub(crate) fn register(&mut self, _span: &[u8]) -> Result<u32, Status> {
        match *self {}
    }

    pub(crate) fn release(&mut self, _region: u32) -> bool {
        match *self {}
    }

    pub(crate) async fn write(&mut self, _transfers: &[Transfer<'_>]) -> Vec<Result<(), Status>> {
        match *self {}
    }

    pub(crate) async fn read(&mut self, _span: &SharedSpan, _destination: &mut [u8]) -> Result<(), Status> {
        match *self {}
    }
}
