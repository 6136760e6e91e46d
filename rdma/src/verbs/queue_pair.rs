//! A reliable-connected queue pair: created, connected to a peer's [`Endpoint`], and posting RDMA READs
//! and WRITEs and SENDs, each signalled, so that every request has exactly one completion, and receives
//! for the peer's SENDs (the capsules of NVMe over RDMA).

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use rdma_sys as sys;

use super::completion::{CompletionQueue, QueueInner};
use super::device::PORT;
use super::memory::{DomainInner, LocalSpan, ProtectionDomain};
use super::{last_error, returned_error};
use crate::{Endpoint, PathMtu, RemoteSpan, TransferError};

/// How a queue pair is made.
#[derive(Clone, Copy, Debug)]
pub struct QueuePairOptions {
    /// Work requests in flight at most.
    pub send_queue_depth: u32,
    /// Receives posted at most (SEND messages the peer may have in flight to this side).
    pub receive_queue_depth: u32,
    /// Whether the peer may RDMA-READ and -WRITE this side's registrations through this queue pair. The
    /// node's queue pairs say no: a client's queue pair has nothing to reach on the node.
    pub remote_access: bool,
    /// Local ACK timeout, 4.096 µs × 2^this (14: about 67 ms): how long a lost packet or a dead peer takes
    /// to notice, with `retry_count`.
    pub ack_timeout_exponent: u8,
    /// Retransmissions before a request fails with `IBV_WC_RETRY_EXC_ERR` (at most 7).
    pub retry_count: u8,
}

impl Default for QueuePairOptions {
    fn default() -> Self {
        QueuePairOptions {
            send_queue_depth: 128,
            receive_queue_depth: 1,
            remote_access: false,
            ack_timeout_exponent: 14,
            retry_count: 7,
        }
    }
}

/// An RC queue pair.
pub struct QueuePair {
    raw: *mut sys::ibv_qp,
    local: Endpoint,
    options: QueuePairOptions,
    domain: Arc<DomainInner>,
    _completions: Arc<QueueInner>,
}

// SAFETY: posting to a queue pair is thread-safe in libibverbs; destroyed only on drop.
unsafe impl Send for QueuePair {}
// SAFETY: as above.
unsafe impl Sync for QueuePair {}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: `raw` came from ibv_create_qp; its queue and domain outlive it (held above).
        unsafe { sys::ibv_destroy_qp(self.raw) };
    }
}

impl QueuePair {
    /// A queue pair in `domain` whose sends and receives complete on `completions`, in the INIT state.
    pub fn new(
        domain: &ProtectionDomain,
        completions: &CompletionQueue,
        options: QueuePairOptions,
    ) -> Result<QueuePair, TransferError> {
        let device = &domain.inner.device;
        // SAFETY: a plain-data struct; the fields below are the ones RC needs.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = completions.inner.raw;
        init.recv_cq = completions.inner.raw;
        init.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        init.cap.max_send_wr = options.send_queue_depth.max(1);
        init.cap.max_recv_wr = options.receive_queue_depth.max(1);
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        // SAFETY: a live domain and queue.
        let raw = unsafe { sys::ibv_create_qp(domain.inner.raw, &mut init) };
        if raw.is_null() {
            return Err(last_error("ibv_create_qp", &device.name));
        }
        let port = device.port;
        let local = Endpoint {
            // SAFETY: a live queue pair; its number is set at creation.
            queue_pair_number: unsafe { (*raw).qp_num },
            packet_sequence_number: (RandomState::new().hash_one(raw as usize) as u32) & 0x00ff_ffff,
            local_id: port.local_id,
            mtu: port.mtu,
            gid: port.gid,
        };
        let pair =
            QueuePair { raw, local, options, domain: domain.inner.clone(), _completions: completions.inner.clone() };
        pair.to_init()?;
        Ok(pair)
    }

    /// What the peer needs to connect to this queue pair.
    pub fn endpoint(&self) -> Endpoint {
        self.local
    }

    fn device_name(&self) -> &str {
        &self.domain.device.name
    }

    fn modify(&self, attributes: &mut sys::ibv_qp_attr, mask: u32, call: &'static str) -> Result<(), TransferError> {
        // SAFETY: a live queue pair; `mask` names exactly the attributes set.
        let errno = unsafe { sys::ibv_modify_qp(self.raw, attributes, mask as i32) };
        if errno != 0 {
            return Err(returned_error(call, self.device_name(), errno));
        }
        Ok(())
    }

    fn to_init(&self) -> Result<(), TransferError> {
        use sys::ibv_qp_attr_mask as mask;
        // SAFETY: a plain-data struct.
        let mut attributes: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attributes.qp_state = sys::ibv_qp_state::IBV_QPS_INIT;
        attributes.port_num = PORT;
        attributes.qp_access_flags = if self.options.remote_access {
            sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0 | sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
        } else {
            0
        };
        let fields =
            mask::IBV_QP_STATE.0 | mask::IBV_QP_PKEY_INDEX.0 | mask::IBV_QP_PORT.0 | mask::IBV_QP_ACCESS_FLAGS.0;
        self.modify(&mut attributes, fields, "ibv_modify_qp(INIT)")
    }

    /// Connects to the peer's queue pair: ready to receive, then ready to send.
    pub fn connect(&self, remote: &Endpoint) -> Result<(), TransferError> {
        use sys::ibv_qp_attr_mask as mask;
        let port = self.domain.device.port;
        // SAFETY: a plain-data struct.
        let mut attributes: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attributes.qp_state = sys::ibv_qp_state::IBV_QPS_RTR;
        attributes.path_mtu = u32::from(PathMtu::min(port.mtu, remote.mtu).code());
        attributes.dest_qp_num = remote.queue_pair_number;
        attributes.rq_psn = remote.packet_sequence_number;
        attributes.max_dest_rd_atomic = port.max_reads_answered;
        attributes.min_rnr_timer = 12;
        attributes.ah_attr.is_global = 1;
        attributes.ah_attr.dlid = remote.local_id;
        attributes.ah_attr.port_num = PORT;
        attributes.ah_attr.grh.dgid = sys::ibv_gid { raw: remote.gid };
        attributes.ah_attr.grh.sgid_index = port.gid_index;
        attributes.ah_attr.grh.hop_limit = 64;
        let fields = mask::IBV_QP_STATE.0
            | mask::IBV_QP_AV.0
            | mask::IBV_QP_PATH_MTU.0
            | mask::IBV_QP_DEST_QPN.0
            | mask::IBV_QP_RQ_PSN.0
            | mask::IBV_QP_MAX_DEST_RD_ATOMIC.0
            | mask::IBV_QP_MIN_RNR_TIMER.0;
        self.modify(&mut attributes, fields, "ibv_modify_qp(RTR)")?;

        // SAFETY: a plain-data struct.
        let mut attributes: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attributes.qp_state = sys::ibv_qp_state::IBV_QPS_RTS;
        attributes.timeout = self.options.ack_timeout_exponent.min(31);
        attributes.retry_cnt = self.options.retry_count.min(7);
        attributes.rnr_retry = 7;
        attributes.sq_psn = self.local.packet_sequence_number;
        attributes.max_rd_atomic = port.max_reads_issued;
        let fields = mask::IBV_QP_STATE.0
            | mask::IBV_QP_TIMEOUT.0
            | mask::IBV_QP_RETRY_CNT.0
            | mask::IBV_QP_RNR_RETRY.0
            | mask::IBV_QP_SQ_PSN.0
            | mask::IBV_QP_MAX_QP_RD_ATOMIC.0;
        self.modify(&mut attributes, fields, "ibv_modify_qp(RTS)")
    }

    /// Applies `attributes` (the fields `mask` names), as a connection manager computed them.
    pub(super) fn modify_with(&self, attributes: &mut sys::ibv_qp_attr, mask: u32) -> Result<(), TransferError> {
        self.modify(attributes, mask, "ibv_modify_qp")
    }

    /// Moves the queue pair to the error state: every request still queued completes, flushed. What a
    /// connection does when its peer is gone, so that no registration stays in use.
    pub fn fail(&self) -> Result<(), TransferError> {
        // SAFETY: a plain-data struct.
        let mut attributes: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attributes.qp_state = sys::ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut attributes, sys::ibv_qp_attr_mask::IBV_QP_STATE.0, "ibv_modify_qp(ERR)")
    }

    /// Posts an RDMA WRITE of `local` into the peer's `remote`, of `local.length` bytes.
    ///
    /// # Safety
    /// `local`'s bytes must stay allocated and unchanged until the completion of `work_request_id` is
    /// polled.
    pub unsafe fn post_write(
        &self,
        work_request_id: u64,
        local: LocalSpan,
        remote: RemoteSpan,
    ) -> Result<(), TransferError> {
        // SAFETY: the caller keeps `local` valid until the completion.
        unsafe { self.post(sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE, work_request_id, local, remote) }
    }

    /// Posts an RDMA READ of the peer's `remote` into `local`, of `local.length` bytes.
    ///
    /// # Safety
    /// `local`'s bytes must stay allocated, and nothing may read or write them, until the completion of
    /// `work_request_id` is polled.
    pub unsafe fn post_read(
        &self,
        work_request_id: u64,
        local: LocalSpan,
        remote: RemoteSpan,
    ) -> Result<(), TransferError> {
        // SAFETY: the caller keeps `local` valid and untouched until the completion.
        unsafe { self.post(sys::ibv_wr_opcode::IBV_WR_RDMA_READ, work_request_id, local, remote) }
    }

    /// Posts a SEND of `local` (the peer's next posted receive takes it).
    ///
    /// # Safety
    /// `local`'s bytes must stay allocated and unchanged until the completion of `work_request_id` is
    /// polled.
    pub unsafe fn post_send(&self, work_request_id: u64, local: LocalSpan) -> Result<(), TransferError> {
        // SAFETY: the caller keeps `local` valid until the completion.
        unsafe { self.post_send_after_write(work_request_id, None, local, None) }
    }

    /// Posts a SEND of `message`, after an RDMA WRITE of `write`'s local span into its remote one where
    /// given, in one call (one system call on providers that post through the kernel). The WRITE is not
    /// signalled: the SEND's completion, `work_request_id`, says both are done (a queue pair completes in
    /// order), and the peer sees the message only once the written bytes are in place; a failure of either
    /// is reported under `work_request_id`. With `invalidate`, the SEND invalidates that remote key of the
    /// peer's as it lands (SEND with Invalidate), which spares the peer a local invalidation of its own.
    ///
    /// # Safety
    /// The written span's and `message`'s bytes must stay allocated and unchanged until that completion is
    /// polled.
    pub unsafe fn post_send_after_write(
        &self,
        work_request_id: u64,
        write: Option<(LocalSpan, RemoteSpan)>,
        message: LocalSpan,
        invalidate: Option<u32>,
    ) -> Result<(), TransferError> {
        let mut sent = sys::ibv_sge { addr: message.address, length: message.length, lkey: message.local_key };
        // SAFETY: a plain-data struct (unions included); the fields a SEND uses are set below.
        let mut send: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        send.wr_id = work_request_id;
        send.sg_list = &mut sent;
        send.num_sge = 1;
        send.opcode = sys::ibv_wr_opcode::IBV_WR_SEND;
        send.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        if let Some(key) = invalidate {
            send.opcode = sys::ibv_wr_opcode::IBV_WR_SEND_WITH_INV;
            send.imm_data_invalidated_rkey_union.invalidated_rkey = key;
        }
        let Some((local, remote)) = write else {
            let mut bad = std::ptr::null_mut();
            // SAFETY: a live queue pair; the request and its element outlive the call, which copies them.
            let errno = unsafe { sys::ibv_post_send(self.raw, &mut send, &mut bad) };
            return self.posted(errno, "ibv_post_send");
        };
        let mut written = sys::ibv_sge { addr: local.address, length: local.length, lkey: local.local_key };
        let mut request = rdma_request(sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE, work_request_id, &mut written, remote)?;
        request.next = &mut send;
        request.send_flags = 0;
        let mut bad = std::ptr::null_mut();
        // SAFETY: a live queue pair; both requests and their elements outlive the call, which copies them.
        let errno = unsafe { sys::ibv_post_send(self.raw, &mut request, &mut bad) };
        self.posted(errno, "ibv_post_send")
    }

    /// Posts a receive into `local`, for the peer's next SEND (of at most `local.length` bytes).
    ///
    /// # Safety
    /// `local`'s bytes must stay allocated, and nothing may read or write them, until the completion of
    /// `work_request_id` is polled.
    pub unsafe fn post_receive(&self, work_request_id: u64, local: LocalSpan) -> Result<(), TransferError> {
        let mut element = sys::ibv_sge { addr: local.address, length: local.length, lkey: local.local_key };
        let mut request =
            sys::ibv_recv_wr { wr_id: work_request_id, next: std::ptr::null_mut(), sg_list: &mut element, num_sge: 1 };
        let mut bad = std::ptr::null_mut();
        // SAFETY: a live queue pair; the request and its element outlive the call, which copies them.
        let errno = unsafe { sys::ibv_post_recv(self.raw, &mut request, &mut bad) };
        self.posted(errno, "ibv_post_recv")
    }

    fn posted(&self, errno: i32, call: &'static str) -> Result<(), TransferError> {
        match errno {
            0 => Ok(()),
            libc::ENOMEM => Err(TransferError::SendQueueFull { capacity: self.options.send_queue_depth }),
            errno => Err(returned_error(call, self.device_name(), errno)),
        }
    }

    unsafe fn post(
        &self,
        opcode: sys::ibv_wr_opcode::Type,
        work_request_id: u64,
        local: LocalSpan,
        remote: RemoteSpan,
    ) -> Result<(), TransferError> {
        let mut element = sys::ibv_sge { addr: local.address, length: local.length, lkey: local.local_key };
        let mut request = rdma_request(opcode, work_request_id, &mut element, remote)?;
        let mut bad = std::ptr::null_mut();
        // SAFETY: a live queue pair; the request and its element outlive the call, which copies them.
        let errno = unsafe { sys::ibv_post_send(self.raw, &mut request, &mut bad) };
        self.posted(errno, "ibv_post_send")
    }
}

/// A signalled RDMA READ or WRITE (`opcode`) of `element`'s bytes to or from `remote`; refused when the
/// local span is longer than the remote one. The request points at `element`, which must outlive its post.
fn rdma_request(
    opcode: sys::ibv_wr_opcode::Type,
    work_request_id: u64,
    element: &mut sys::ibv_sge,
    remote: RemoteSpan,
) -> Result<sys::ibv_send_wr, TransferError> {
    if element.length > remote.length {
        return Err(TransferError::OutOfRegion {
            offset: 0,
            length: u64::from(element.length),
            registered: u64::from(remote.length),
        });
    }
    // SAFETY: a plain-data struct (unions included); the fields RDMA READ/WRITE use are set below.
    let mut request: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
    request.wr_id = work_request_id;
    request.sg_list = element;
    request.num_sge = 1;
    request.opcode = opcode;
    request.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
    request.wr.rdma = sys::rdma_t { remote_addr: remote.address, rkey: remote.remote_key };
    Ok(request)
}
