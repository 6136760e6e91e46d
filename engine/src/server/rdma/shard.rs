//! A shard's RDMA: its protection domain and its DRAM segment registered for local access.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use strata_proto::Status;
use strata_transfer::Endpoint;
use strata_transfer::verbs::{
    Access, CompletionQueue, Device, LocalSpan, MemoryRegion, ProtectionDomain, QueuePair, QueuePairOptions,
};

use super::link::{QUEUE_DEPTH, RdmaLink};
use crate::dram::DramTier;
use crate::metrics::{ShardMetrics, add};
use crate::shard::Shard;

/// An opened RDMA device, shared by the node's shards.
pub(crate) type RdmaDevice = Device;

/// Opens the device `--rdma-device` names; the error lists the devices there are.
pub(crate) fn open_device(name: &str) -> Result<RdmaDevice, String> {
    Device::open(name).map_err(|error| error.to_string())
}

/// One shard's protection domain, and its DRAM segment registered in it for local access only: the
/// source of RDMA WRITEs and the destination of RDMA READs, never reachable by a client.
pub(crate) struct ShardRdma {
    domain: ProtectionDomain,
    /// Declared before `_dram`: deregistered while the segment is still mapped.
    segment: MemoryRegion,
    segment_start: usize,
    /// Holds the DRAM tier, and so the segment's mapping, for as long as the registration lives.
    _dram: Rc<RefCell<DramTier>>,
    pub(super) busy_poll: bool,
    pub(super) metrics: Arc<ShardMetrics>,
}

impl ShardRdma {
    /// Registers `shard`'s DRAM segment on `device`.
    pub(crate) fn new(device: &RdmaDevice, shard: &Shard) -> Result<ShardRdma, String> {
        let domain = ProtectionDomain::new(device).map_err(|error| error.to_string())?;
        let dram = shard.dram_tier();
        let (start, len) = dram.borrow().segment_memory();
        // SAFETY: the segment stays mapped while `_dram` holds the tier, which outlives the registration
        // (field order); the node never lets a client reach it (local access only), and writes into it only
        // through RDMA READs into a put's own reservation.
        #[allow(unsafe_code)]
        let segment = unsafe { MemoryRegion::register(&domain, start, len, Access::Local) }
            .map_err(|error| format!("registering the DRAM segment ({len} bytes): {error}"))?;
        Ok(ShardRdma {
            domain,
            segment,
            segment_start: start as usize,
            _dram: dram,
            busy_poll: shard.config.busy_poll,
            metrics: Arc::clone(&shard.metrics),
        })
    }

    pub(super) fn domain(&self) -> &ProtectionDomain {
        &self.domain
    }

    /// `bytes` as a span of the registered segment, if they lie in it.
    pub(super) fn segment_span(&self, bytes: &[u8]) -> Option<LocalSpan> {
        let offset = (bytes.as_ptr() as usize).checked_sub(self.segment_start)?;
        self.segment.local_span(offset as u64, u32::try_from(bytes.len()).ok()?).ok()
    }

    /// A queue pair for one connection, connected to the client's endpoint (`client`, 28 bytes): the link
    /// and the node's endpoint to answer with.
    pub(crate) fn connect(self: &Rc<Self>, client: &[u8]) -> Result<(RdmaLink, Vec<u8>), Status> {
        let remote = Endpoint::decode(client).map_err(|_| Status::Invalid)?;
        let device = self.domain.device();
        let made = CompletionQueue::new(&device, QUEUE_DEPTH * 2).and_then(|completions| {
            let options = QueuePairOptions { send_queue_depth: QUEUE_DEPTH, ..QueuePairOptions::default() };
            let pair = QueuePair::new(&self.domain, &completions, options)?;
            pair.connect(&remote)?;
            Ok((completions, pair))
        });
        match made {
            Ok((completions, pair)) => {
                let endpoint = pair.endpoint().encode().to_vec();
                add(&self.metrics.rdma_connections, 1);
                Ok((RdmaLink::new(Rc::clone(self), pair, completions), endpoint))
            }
            Err(error) => {
                tracing::warn!("connecting an RDMA queue pair for a client: {error}");
                Err(Status::Io)
            }
        }
    }
}
