//! A host queue's NVMe/RDMA link (feature `rdma`): the queue pair connected through RDMA_CM with the
//! binding's private data, a command capsule SENT per command, response capsules received into posted
//! receives, and the data in registered buffers the controller RDMA-READs (writes) and -WRITEs (reads)
//! through the Keyed SGL each command names.
//!
//! *Why staging buffers:* the caller's buffer is copied into (writes) or out of (reads) a registered one
//! kept per command ID, rather than registering each caller's buffer per I/O (a registration pins pages; a
//! copy of a few KiB costs less). The staging buffers are registered for remote access for the life of the
//! queue: the controller, which holds the namespace's bytes anyway, is trusted with them, as the kernel's
//! host trusts it with a request's buffer until the response. Every command's data goes by Keyed SGL, none
//! in the capsule: one path, which every NVMe/RDMA controller serves.

use std::cell::RefCell;
use std::net::SocketAddrV4;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use strata_transfer::TransferError;
use strata_transfer::verbs::{
    Access, CmConnection, CompletionQueue, Device, ProtectionDomain, QueuePair, QueuePairOptions, RegisteredBuffer,
};

use super::NvmfError;
use super::queue::HostQueue;
use crate::buffer::IoBuffer;
use crate::rdma::KeyedSgl;
use crate::rdma::cm::{ConnectAccept, ConnectRequest, decode_reject};
use crate::rdma::link::{self, POLL_BATCH, READS_IN_FLIGHT, post_receive, received_slot};
use crate::spec::{COMMAND_BYTES, COMPLETION_BYTES, Command, Completion};

/// How long resolving the controller's address and route, and its answer to the connection, may take.
const CONNECT_WAIT: Duration = Duration::from_secs(10);
/// The smallest staging buffer.
const SMALLEST_STAGED: usize = 4096;

/// One queue's RDMA link. Fields drop in order: the queue pair before the buffers it may be moving.
pub(crate) struct RdmaLink {
    pair: Arc<QueuePair>,
    completions: CompletionQueue,
    domain: ProtectionDomain,
    /// A receive per response capsule the controller may send at once.
    receives: RegisteredBuffer,
    /// A command capsule per command ID.
    capsules: RefCell<RegisteredBuffer>,
    /// Each command ID's staging buffer, kept for the next command with that ID.
    staged: RefCell<Vec<Option<RegisteredBuffer>>>,
    /// Dropped last: destroying the id disconnects the controller.
    _connection: CmConnection,
}

impl RdmaLink {
    /// Connects queue `qid` of `entries` commands to the controller at `peer` (blocking, bounded by
    /// [`CONNECT_WAIT`]: the setup path); returns the link and the commands the controller accepted.
    pub(crate) fn connect(peer: SocketAddrV4, qid: u16, entries: u16) -> Result<(RdmaLink, u16), NvmfError> {
        let failed =
            |what: &str, error: TransferError| NvmfError::Rdma(format!("queue {qid} to {peer}: {what}: {error}"));
        let mut connection = CmConnection::resolve(peer, CONNECT_WAIT).map_err(|error| failed("resolve", error))?;
        let name =
            connection.device_name().ok_or_else(|| NvmfError::Rdma(format!("{peer}: no RDMA device routes there")))?;
        let made = Self::make(&name, entries).map_err(|error| failed("queue pair", error))?;
        let (pair, completions, domain, receives) = made;
        let request = ConnectRequest {
            queue_id: qid,
            host_receive_queue_size: entries,
            host_send_queue_size: entries - 1,
            controller_id: 0xffff,
        };
        let accepted = match connection.connect(&pair, &request.encode(), READS_IN_FLIGHT, CONNECT_WAIT) {
            Ok(accepted) => accepted,
            Err(TransferError::Rejected { private_data }) => {
                let status = decode_reject(&private_data).map_or("no status".to_string(), |status| status.to_string());
                return Err(NvmfError::Rdma(format!("queue {qid} to {peer}: the controller rejected it ({status})")));
            }
            Err(error) => return Err(failed("connect", error)),
        };
        let granted = ConnectAccept::decode(&accepted)
            .map(|accept| accept.controller_receive_queue_size)
            .filter(|&granted| granted > 0)
            .ok_or_else(|| NvmfError::Rdma(format!("queue {qid} to {peer}: unreadable accept private data")))?;
        let capsules = RegisteredBuffer::new(&domain, usize::from(entries) * COMMAND_BYTES, Access::Local)
            .map_err(|error| failed("capsules", error))?;
        let link = RdmaLink {
            pair: Arc::new(pair),
            completions,
            domain,
            receives,
            capsules: RefCell::new(capsules),
            staged: RefCell::new((0..entries).map(|_| None).collect()),
            _connection: connection,
        };
        Ok((link, granted.min(entries)))
    }

    /// The queue pair, its completion queue and its posted receives, on device `name`.
    fn make(
        name: &str,
        entries: u16,
    ) -> Result<(QueuePair, CompletionQueue, ProtectionDomain, RegisteredBuffer), TransferError> {
        let device = Device::open(name)?;
        let domain = ProtectionDomain::new(&device)?;
        let entries = u32::from(entries);
        // The controller RDMA-READs and -WRITEs the staging buffers through this queue pair.
        let options = QueuePairOptions {
            send_queue_depth: entries,
            receive_queue_depth: entries,
            remote_access: true,
            ..QueuePairOptions::default()
        };
        let completions = CompletionQueue::new(&device, 2 * entries)?;
        let pair = QueuePair::new(&domain, &completions, options)?;
        let receives = RegisteredBuffer::new(&domain, entries as usize * COMPLETION_BYTES, Access::Local)?;
        for slot in 0..entries as usize {
            post_receive(&pair, &receives, slot, COMPLETION_BYTES)?;
        }
        Ok((pair, completions, domain, receives))
    }

    /// Stages the data of command `cid` (a write's bytes copied in; room for a read's) and returns the
    /// Keyed SGL that names it; a command without data names nothing (length 0).
    pub(crate) fn stage(&self, cid: u16, write: Option<&IoBuffer>, read_len: usize) -> Result<KeyedSgl, NvmfError> {
        let len = write.map_or(read_len, IoBuffer::len);
        if len == 0 {
            return Ok(KeyedSgl { address: 0, length: 0, key: 0, invalidate: false });
        }
        let mut staged = self.staged.borrow_mut();
        let slot = &mut staged[usize::from(cid)];
        if slot.as_ref().is_none_or(|buffer| buffer.as_slice().len() < len) {
            let size = len.max(SMALLEST_STAGED).next_power_of_two();
            let buffer = RegisteredBuffer::new(&self.domain, size, Access::RemoteReadWrite)
                .map_err(|error| NvmfError::Rdma(format!("staging {size} bytes: {error}")))?;
            *slot = Some(buffer);
        }
        let Some(buffer) = slot.as_mut() else { unreachable!("filled above") };
        if let Some(data) = write {
            buffer.as_mut_slice()[..len].copy_from_slice(data.as_slice());
        }
        let remote = buffer.region().remote_span(0, len as u32).map_err(|error| NvmfError::Rdma(error.to_string()))?;
        Ok(KeyedSgl { address: remote.address, length: remote.length, key: remote.remote_key, invalidate: false })
    }

    /// SENDs command `cid` with `sgl` in its descriptor bytes (which `Command` cannot hold: a key overlaps
    /// the generic descriptor's length).
    pub(crate) fn send(&self, command: &Command, sgl: KeyedSgl) -> Result<(), NvmfError> {
        let mut bytes = command.encode();
        bytes[24..40].copy_from_slice(&sgl.encode().map_err(|error| NvmfError::Rdma(error.to_string()))?);
        let at = usize::from(command.cid) * COMMAND_BYTES;
        self.capsules.borrow_mut().as_mut_slice()[at..at + COMMAND_BYTES].copy_from_slice(&bytes);
        let local = self
            .capsules
            .borrow()
            .region()
            .local_span(at as u64, COMMAND_BYTES as u32)
            .map_err(|error| NvmfError::Rdma(error.to_string()))?;
        // SAFETY: the capsule's slot belongs to `cid`, which is not reused before the command completes,
        // after the controller has received (and the queue pair finished sending) it.
        #[allow(unsafe_code)]
        let posted = unsafe { self.pair.post_send(u64::from(command.cid), local) };
        posted.map_err(|error| NvmfError::Rdma(format!("send: {error}")))
    }

    /// Copies a completed read's data of command `cid` into `into`.
    pub(crate) fn copy_out(&self, cid: u16, into: &mut IoBuffer) {
        if let Some(Some(staged)) = self.staged.borrow().get(usize::from(cid)) {
            let len = into.len().min(staged.as_slice().len());
            into.as_mut_slice()[..len].copy_from_slice(&staged.as_slice()[..len]);
        }
    }

    /// Ends the link: the queue pair goes to the error state, which flushes its receives and ends
    /// [`run`](Self::run).
    pub(crate) fn close(&self) {
        let _ = self.pair.fail();
    }

    /// Takes the link's completions until it fails: each response capsule completes its command.
    pub(crate) async fn run(queue: Rc<HostQueue>) {
        let Some(link) = queue.rdma_link() else { return };
        let mut done = Vec::with_capacity(POLL_BATCH);
        let reason = 'serving: loop {
            done.clear();
            if let Err(error) = link::next(&link.completions, &mut done, POLL_BATCH).await {
                break format!("completion queue: {error}");
            }
            for completion in done.drain(..) {
                let bytes = match completion.result {
                    Ok(bytes) => bytes as usize,
                    Err(error) => break 'serving format!("work request failed: {error}"),
                };
                // A SEND's completion (its ID is the command's) says nothing the response will not.
                let Some(slot) = received_slot(&completion) else { continue };
                let at = slot * COMPLETION_BYTES;
                let Some(response) = link.receives.as_slice()[at..at + bytes.min(COMPLETION_BYTES)].first_chunk()
                else {
                    break 'serving format!("a response capsule of {bytes} bytes");
                };
                let response = Completion::decode(response);
                if let Err(error) = post_receive(&link.pair, &link.receives, slot, COMPLETION_BYTES) {
                    break 'serving format!("post receive: {error}");
                }
                queue.complete_response(response);
            }
        };
        queue.fail(reason);
    }
}
