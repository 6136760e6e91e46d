//! The active side of RDMA_CM: resolving a peer's address and route (which names the local device to make
//! a queue pair on), then connecting one of our queue pairs with private data, as an NVMe/RDMA host
//! connects each of its queues.
//!
//! The queue pair is ours, not the manager's: on the peer's CONNECT_RESPONSE it is moved to RTR and RTS
//! with the manager's attributes and the connection completed with `rdma_establish`.

use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use rdma_sys as sys;

use super::cm::{Event, create_channel_and_id, device_name_of, next_event, ready_to_send, socket_address};
use super::last_error;
use super::queue_pair::QueuePair;
use crate::TransferError;

const CM: &str = "rdma_cm";

/// A connection to a peer's RDMA_CM listener and the event channel it reports on.
pub struct CmConnection {
    channel: *mut sys::rdma_event_channel,
    id: *mut sys::rdma_cm_id,
}

// SAFETY: the channel and id are used by their one owner at a time (`&mut self` or ownership).
unsafe impl Send for CmConnection {}

impl Drop for CmConnection {
    fn drop(&mut self) {
        // SAFETY: the connection's id and channel, destroyed once, the id first; destroying it disconnects.
        unsafe {
            sys::rdma_destroy_id(self.id);
            sys::rdma_destroy_event_channel(self.channel);
        }
    }
}

impl CmConnection {
    /// Resolves the address and route to `peer`, waiting up to `timeout` for each.
    pub fn resolve(peer: SocketAddrV4, timeout: Duration) -> Result<CmConnection, TransferError> {
        let (channel, id) = create_channel_and_id()?;
        let mut connection = CmConnection { channel, id };
        let mut address = socket_address(peer);
        let millis = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: a live id and a sockaddr_in that outlives the call.
        let resolving = unsafe {
            sys::rdma_resolve_addr(id, std::ptr::null_mut(), (&mut address as *mut libc::sockaddr_in).cast(), millis)
        };
        if resolving != 0 {
            return Err(last_error("rdma_resolve_addr", CM));
        }
        connection.expect(sys::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED, timeout)?;
        // SAFETY: a live id whose address is resolved.
        if unsafe { sys::rdma_resolve_route(id, millis) } != 0 {
            return Err(last_error("rdma_resolve_route", CM));
        }
        connection.expect(sys::rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED, timeout)?;
        Ok(connection)
    }

    /// The local RDMA device the route goes through.
    pub fn device_name(&self) -> Option<String> {
        device_name_of(self.id)
    }

    /// Connects `pair` with `private_data` (at most 56 bytes) and at most `reads` RDMA READs each way,
    /// waiting up to `timeout` for the peer's answer; returns the private data it accepted with.
    pub fn connect(
        &mut self,
        pair: &QueuePair,
        private_data: &[u8],
        reads: u8,
        timeout: Duration,
    ) -> Result<Vec<u8>, TransferError> {
        // SAFETY: a plain-data struct; `private_data` outlives the call.
        let mut parameters: sys::rdma_conn_param = unsafe { std::mem::zeroed() };
        parameters.private_data = private_data.as_ptr().cast();
        parameters.private_data_len = private_data.len().min(56) as u8;
        parameters.responder_resources = reads;
        parameters.initiator_depth = reads;
        parameters.retry_count = 7;
        parameters.rnr_retry_count = 7;
        parameters.qp_num = pair.endpoint().queue_pair_number;
        // SAFETY: a live id with a resolved route, and parameters that outlive the call.
        if unsafe { sys::rdma_connect(self.id, &mut parameters) } != 0 {
            return Err(last_error("rdma_connect", CM));
        }
        let response = self.expect(sys::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_RESPONSE, timeout)?;
        ready_to_send(self.id, pair, reads)?;
        // SAFETY: a live id whose connection the peer accepted.
        if unsafe { sys::rdma_establish(self.id) } != 0 {
            return Err(last_error("rdma_establish", CM));
        }
        Ok(response.private_data)
    }

    /// Waits up to `timeout` for the peer to end this connection; returns whether it did (its DISCONNECTED
    /// event arrived).
    pub fn wait_disconnected(&mut self, timeout: Duration) -> Result<bool, TransferError> {
        let deadline = Instant::now() + timeout;
        while let Some(got) = next_event(self.channel, deadline)? {
            if got.kind == sys::rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Waits for an event of `kind` on this connection; a reject, an error event or the timeout fails.
    fn expect(&mut self, kind: sys::rdma_cm_event_type::Type, timeout: Duration) -> Result<Event, TransferError> {
        use sys::rdma_cm_event_type as event;
        let deadline = Instant::now() + timeout;
        while let Some(got) = next_event(self.channel, deadline)? {
            match got.kind {
                found if found == kind => return Ok(got),
                event::RDMA_CM_EVENT_REJECTED => {
                    return Err(TransferError::Rejected { private_data: got.private_data });
                }
                event::RDMA_CM_EVENT_ADDR_ERROR
                | event::RDMA_CM_EVENT_ROUTE_ERROR
                | event::RDMA_CM_EVENT_UNREACHABLE
                | event::RDMA_CM_EVENT_CONNECT_ERROR
                | event::RDMA_CM_EVENT_DISCONNECTED => {
                    return Err(TransferError::Unreachable(format!("event {} while waiting for {kind}", got.kind)));
                }
                _ => {}
            }
        }
        Err(TransferError::Unreachable(format!("no event {kind} within {timeout:?}")))
    }
}
