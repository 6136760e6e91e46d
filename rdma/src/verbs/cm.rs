//! The passive side of RDMA_CM: a listener on an IP address and port, connection requests with their
//! private data, and acceptance of a queue pair this side made (the NVMe/RDMA transport binding connects
//! its queues this way, where Strata's own KV path exchanges endpoints over TCP).
//!
//! The queue pair is one of ours ([`QueuePair`]), not one `rdma_create_qp` made: it is moved to
//! ready-to-receive and ready-to-send with the attributes the connection manager computes for the request
//! (`rdma_init_qp_attr`), then named in `rdma_accept` by its number. Events are read with the channel's
//! descriptor non-blocking and waited for with `poll(2)`, bounded by a timeout.

use std::collections::VecDeque;
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use rdma_sys as sys;

use super::queue_pair::QueuePair;
use super::{last_error, returned_error};
use crate::TransferError;

const CM: &str = "rdma_cm";

/// An RDMA_CM listener and the event channel its connections report on.
pub struct CmListener {
    channel: *mut sys::rdma_event_channel,
    id: *mut sys::rdma_cm_id,
    /// Events read while [`accept`](CmListener::accept) waited for its own, reported next.
    held: VecDeque<CmEvent>,
}

/// What a listener reports.
pub enum CmEvent {
    /// A peer asks to connect.
    Request(CmRequest),
    /// The connection of the request whose [`token`](CmRequest::token) this is ended: the peer
    /// disconnected, or the connection failed. Its queue pair is not told (it is ours, not the manager's):
    /// whoever serves it moves it to the error state.
    Disconnected(usize),
}

// SAFETY: the channel and ids are used from one thread at a time (`&mut self` or ownership).
unsafe impl Send for CmListener {}

impl Drop for CmListener {
    fn drop(&mut self) {
        // Held requests' ids report on the channel: destroyed first.
        self.held.clear();
        // SAFETY: the listener's id and channel, destroyed once; requests hold ids of their own, destroyed
        // before (they borrow the listener).
        unsafe {
            sys::rdma_destroy_id(self.id);
            sys::rdma_destroy_event_channel(self.channel);
        }
    }
}

/// A connection request: its id and what the peer sent with it. Its id reports on its listener's channel:
/// drop it (which disconnects an accepted connection) before the listener.
pub struct CmRequest {
    id: *mut sys::rdma_cm_id,
    /// The peer's private data.
    pub private_data: Vec<u8>,
    /// RDMA READs this side may have in flight towards the peer (the peer's responder resources; the
    /// connection manager reports them from this side's point of view).
    pub initiator_depth: u8,
    /// RDMA READs of the peer's this side must answer at once (the peer's initiator depth).
    pub responder_resources: u8,
}

// SAFETY: the request's id is used by its one owner (the listener's thread, then the executor serving the
// connection, which only destroys it); librdmacm's calls on an id are not tied to a thread.
unsafe impl Send for CmRequest {}

impl CmRequest {
    /// What names this connection in [`CmEvent::Disconnected`] while the request lives.
    pub fn token(&self) -> usize {
        self.id as usize
    }

    /// The RDMA device the request arrived on (the one the listening address belongs to); `None` if the
    /// manager bound none.
    pub fn device_name(&self) -> Option<String> {
        device_name_of(self.id)
    }
}

impl Drop for CmRequest {
    fn drop(&mut self) {
        // SAFETY: the request's own id, destroyed once; destroying it disconnects an accepted connection.
        unsafe { sys::rdma_destroy_id(self.id) };
    }
}

/// One event read from the channel.
pub(super) struct Event {
    pub(super) kind: sys::rdma_cm_event_type::Type,
    pub(super) id: *mut sys::rdma_cm_id,
    pub(super) private_data: Vec<u8>,
    initiator_depth: u8,
    responder_resources: u8,
}

impl CmListener {
    /// Listens on `address` (an address of the RDMA device's network interface).
    pub fn bind(address: SocketAddrV4) -> Result<CmListener, TransferError> {
        let (channel, id) = create_channel_and_id()?;
        let listener = CmListener { channel, id, held: VecDeque::new() };
        let mut socket = socket_address(address);
        // SAFETY: a live id and a sockaddr_in that outlives the call.
        if unsafe { sys::rdma_bind_addr(listener.id, (&mut socket as *mut libc::sockaddr_in).cast()) } != 0 {
            return Err(last_error("rdma_bind_addr", CM));
        }
        // SAFETY: a bound id.
        if unsafe { sys::rdma_listen(listener.id, 16) } != 0 {
            return Err(last_error("rdma_listen", CM));
        }
        Ok(listener)
    }

    /// The next connection request, waiting up to `timeout`; other events are read and dropped.
    pub fn next_request(&mut self, timeout: Duration) -> Result<Option<CmRequest>, TransferError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.next(deadline.saturating_duration_since(Instant::now()))? {
                Some(CmEvent::Request(request)) => return Ok(Some(request)),
                Some(CmEvent::Disconnected(_)) => continue,
                None => return Ok(None),
            }
        }
    }

    /// The next request or end of a connection, waiting up to `timeout`; other events are read and dropped.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<CmEvent>, TransferError> {
        if let Some(held) = self.held.pop_front() {
            return Ok(Some(held));
        }
        let deadline = Instant::now() + timeout;
        while let Some(event) = self.next_event(deadline)? {
            if let Some(reported) = Self::reported(event) {
                return Ok(Some(reported));
            }
        }
        Ok(None)
    }

    /// What `event` means to the listener's user, if anything.
    fn reported(event: Event) -> Option<CmEvent> {
        use sys::rdma_cm_event_type as kind;
        match event.kind {
            kind::RDMA_CM_EVENT_CONNECT_REQUEST => Some(CmEvent::Request(CmRequest {
                id: event.id,
                private_data: event.private_data,
                initiator_depth: event.initiator_depth,
                responder_resources: event.responder_resources,
            })),
            kind::RDMA_CM_EVENT_DISCONNECTED
            | kind::RDMA_CM_EVENT_CONNECT_ERROR
            | kind::RDMA_CM_EVENT_UNREACHABLE
            | kind::RDMA_CM_EVENT_DEVICE_REMOVAL => Some(CmEvent::Disconnected(event.id as usize)),
            _ => None,
        }
    }

    /// Accepts `request` on `pair` (connected by the manager's attributes), with `private_data` (at most
    /// 196 bytes) and at most `reads` RDMA READs each way, then waits up to `timeout` for the connection to
    /// be established.
    pub fn accept(
        &mut self,
        request: &CmRequest,
        pair: &QueuePair,
        (private_data, reads): (&[u8], u8),
        timeout: Duration,
    ) -> Result<(), TransferError> {
        ready_to_send(request.id, pair, reads)?;
        // SAFETY: a plain-data struct; `private_data` outlives the call.
        let mut parameters: sys::rdma_conn_param = unsafe { std::mem::zeroed() };
        parameters.private_data = private_data.as_ptr().cast();
        parameters.private_data_len = private_data.len().min(196) as u8;
        parameters.responder_resources = request.responder_resources.min(reads);
        parameters.initiator_depth = request.initiator_depth.min(reads);
        parameters.rnr_retry_count = 7;
        parameters.qp_num = pair.endpoint().queue_pair_number;
        // SAFETY: a live request id and parameters that outlive the call.
        let status = unsafe { sys::rdma_accept(request.id, &mut parameters) };
        if status != 0 {
            return Err(last_error("rdma_accept", CM));
        }
        let deadline = Instant::now() + timeout;
        while let Some(event) = self.next_event(deadline)? {
            if event.id == request.id && event.kind == sys::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED {
                return Ok(());
            }
            // Another host's request, or another connection's end, is kept for `next`, not lost.
            if let Some(reported) = Self::reported(event) {
                self.held.push_back(reported);
            }
        }
        Err(returned_error("rdma_accept (not established in time)", CM, libc::ETIMEDOUT))
    }

    /// Rejects `request` with `private_data` (at most 148 bytes).
    pub fn reject(&mut self, request: &CmRequest, private_data: &[u8]) -> Result<(), TransferError> {
        // SAFETY: a live request id; `private_data` outlives the call.
        let status =
            unsafe { sys::rdma_reject(request.id, private_data.as_ptr().cast(), private_data.len().min(148) as u8) };
        if status != 0 {
            return Err(last_error("rdma_reject", CM));
        }
        Ok(())
    }

    /// Reads the next event, waiting until `deadline`; `None` when it passed.
    fn next_event(&mut self, deadline: Instant) -> Result<Option<Event>, TransferError> {
        next_event(self.channel, deadline)
    }
}

/// A non-blocking event channel and an id reporting on it.
pub(super) fn create_channel_and_id() -> Result<(*mut sys::rdma_event_channel, *mut sys::rdma_cm_id), TransferError> {
    // SAFETY: creates a channel we own.
    let channel = unsafe { sys::rdma_create_event_channel() };
    if channel.is_null() {
        return Err(last_error("rdma_create_event_channel", CM));
    }
    let mut id = std::ptr::null_mut();
    // SAFETY: a live channel; the id is written on success.
    if unsafe { sys::rdma_create_id(channel, &mut id, std::ptr::null_mut(), sys::rdma_port_space::RDMA_PS_TCP) } != 0 {
        let error = last_error("rdma_create_id", CM);
        // SAFETY: the channel has no id.
        unsafe { sys::rdma_destroy_event_channel(channel) };
        return Err(error);
    }
    // SAFETY: the channel's descriptor is ours; non-blocking, so reading events never waits.
    unsafe {
        let flags = libc::fcntl((*channel).fd, libc::F_GETFL);
        libc::fcntl((*channel).fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    Ok((channel, id))
}

pub(super) fn socket_address(address: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: address.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*address.ip()).to_be() },
        sin_zero: [0; 8],
    }
}

/// The name of the device `id` is bound to, if any.
pub(super) fn device_name_of(id: *mut sys::rdma_cm_id) -> Option<String> {
    // SAFETY: a live id; a bound id's context and device live as long as it, and the device's name is a
    // NUL-terminated string of libibverbs'.
    unsafe {
        let context = (*id).verbs;
        if context.is_null() || (*context).device.is_null() {
            return None;
        }
        let name = sys::ibv_get_device_name((*context).device);
        (!name.is_null()).then(|| std::ffi::CStr::from_ptr(name).to_string_lossy().into_owned())
    }
}

/// Moves `pair` to RTR and RTS with the attributes the manager computed for `id`, with at most `reads`
/// RDMA READs in flight each way.
pub(super) fn ready_to_send(id: *mut sys::rdma_cm_id, pair: &QueuePair, reads: u8) -> Result<(), TransferError> {
    for state in [sys::ibv_qp_state::IBV_QPS_RTR, sys::ibv_qp_state::IBV_QPS_RTS] {
        // SAFETY: a plain-data struct the call fills in for this id.
        let mut attributes: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attributes.qp_state = state;
        let mut mask = 0;
        // SAFETY: a live id.
        if unsafe { sys::rdma_init_qp_attr(id, &mut attributes, &mut mask) } != 0 {
            return Err(last_error("rdma_init_qp_attr", CM));
        }
        if state == sys::ibv_qp_state::IBV_QPS_RTR {
            attributes.max_dest_rd_atomic = attributes.max_dest_rd_atomic.min(reads).max(1);
        } else {
            attributes.max_rd_atomic = attributes.max_rd_atomic.min(reads).max(1);
        }
        pair.modify_with(&mut attributes, mask as u32)?;
    }
    Ok(())
}

/// Reads the next event of `channel`, waiting until `deadline`; `None` when it passed.
pub(super) fn next_event(
    channel: *mut sys::rdma_event_channel,
    deadline: Instant,
) -> Result<Option<Event>, TransferError> {
    loop {
        let mut raw = std::ptr::null_mut();
        // SAFETY: a live, non-blocking channel; the event is ours until acknowledged below.
        if unsafe { sys::rdma_get_cm_event(channel, &mut raw) } == 0 {
            // SAFETY: a live event; its private data (if any) lives until it is acknowledged.
            let event = unsafe {
                let conn = &(*raw).param.conn;
                let private_data = if conn.private_data.is_null() {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(conn.private_data.cast::<u8>(), usize::from(conn.private_data_len))
                        .to_vec()
                };
                Event {
                    kind: (*raw).event,
                    id: (*raw).id,
                    private_data,
                    initiator_depth: conn.initiator_depth,
                    responder_resources: conn.responder_resources,
                }
            };
            // SAFETY: acknowledged once; what was needed of it was copied.
            unsafe { sys::rdma_ack_cm_event(raw) };
            return Ok(Some(event));
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::WouldBlock {
            return Err(TransferError::Verbs { call: "rdma_get_cm_event", device: CM.into(), source: error });
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        // SAFETY: one pollfd on the channel's descriptor, open while the listener lives.
        let mut poll = libc::pollfd { fd: unsafe { (*channel).fd }, events: libc::POLLIN, revents: 0 };
        // SAFETY: as above.
        unsafe { libc::poll(&mut poll, 1, left.as_millis().clamp(1, i32::MAX as u128) as i32) };
    }
}
