//! A completion queue and the completion channel that says, through a file descriptor, when it has
//! something: the descriptor is what a reactor (the node's glommio shard) waits on instead of a thread
//! blocked in `ibv_get_cq_event` or a core spinning on `ibv_poll_cq`.
//!
//! The descriptor is non-blocking. The protocol a waiter follows, in [`CompletionQueue::wait`] and in the
//! shard's reactor alike: poll; when empty, [`arm`](CompletionQueue::arm) and poll again (a completion that
//! landed before the arm raises no event); when still empty, wait for the descriptor to be readable, then
//! [`take_events`](CompletionQueue::take_events) and start over.

use std::ffi::CStr;
use std::fmt;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys as sys;

use super::device::{Device, DeviceContext};
use super::{last_error, returned_error};
use crate::TransferError;

/// Work completions read by one `ibv_poll_cq` call at most.
const POLL_BATCH: usize = 32;

/// A completion queue with its own completion channel.
#[derive(Clone)]
pub struct CompletionQueue {
    pub(super) inner: Arc<QueueInner>,
}

pub(super) struct QueueInner {
    pub(super) raw: *mut sys::ibv_cq,
    channel: *mut sys::ibv_comp_channel,
    device: Arc<DeviceContext>,
}

// SAFETY: verbs objects may be used from any thread; destroyed only on drop.
unsafe impl Send for QueueInner {}
// SAFETY: as above.
unsafe impl Sync for QueueInner {}

impl Drop for QueueInner {
    fn drop(&mut self) {
        // SAFETY: every queue pair using the queue holds it alive, so none is left; every event taken was
        // acknowledged in `take_events`, which ibv_destroy_cq waits for.
        unsafe {
            sys::ibv_destroy_cq(self.raw);
            sys::ibv_destroy_comp_channel(self.channel);
        }
    }
}

/// Why a work request failed, as its completion says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkRequestError {
    /// `ibv_wc_status`.
    pub status: u32,
    /// The provider's own code.
    pub vendor_error: u32,
}

impl WorkRequestError {
    /// The request never ran: its queue pair went to the error state first (`IBV_WC_WR_FLUSH_ERR`).
    pub fn is_flushed(&self) -> bool {
        self.status == sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR
    }

    /// The peer refused the access: a remote key or span it did not grant (`IBV_WC_REM_ACCESS_ERR`).
    pub fn is_remote_access(&self) -> bool {
        self.status == sys::ibv_wc_status::IBV_WC_REM_ACCESS_ERR
    }
}

impl fmt::Display for WorkRequestError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SAFETY: libibverbs returns a static string for every status value, known or not.
        let name = unsafe { CStr::from_ptr(sys::ibv_wc_status_str(self.status)) };
        write!(formatter, "{} (status {}, vendor error {:#x})", name.to_string_lossy(), self.status, self.vendor_error)
    }
}

impl std::error::Error for WorkRequestError {}

/// One finished work request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The identifier the request was posted with.
    pub work_request_id: u64,
    /// What it was (a failed request's kind is not reported by every provider: `Other` then).
    pub kind: CompletionKind,
    /// Bytes moved (for a receive: the bytes the peer sent), or why it failed.
    pub result: Result<u32, WorkRequestError>,
}

/// The kind of work request a completion is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionKind {
    /// A SEND.
    Send,
    /// An RDMA WRITE.
    Write,
    /// An RDMA READ.
    Read,
    /// A receive, filled by the peer's SEND.
    Receive,
    /// Anything else, or not reported.
    Other,
}

impl CompletionKind {
    fn of(opcode: sys::ibv_wc_opcode::Type) -> CompletionKind {
        match opcode {
            sys::ibv_wc_opcode::IBV_WC_SEND => CompletionKind::Send,
            sys::ibv_wc_opcode::IBV_WC_RDMA_WRITE => CompletionKind::Write,
            sys::ibv_wc_opcode::IBV_WC_RDMA_READ => CompletionKind::Read,
            sys::ibv_wc_opcode::IBV_WC_RECV => CompletionKind::Receive,
            _ => CompletionKind::Other,
        }
    }
}

impl CompletionQueue {
    /// A queue of `capacity` completions on `device`, with its own completion channel.
    pub fn new(device: &Device, capacity: u32) -> Result<CompletionQueue, TransferError> {
        let context = &device.context;
        // SAFETY: an open context.
        let channel = unsafe { sys::ibv_create_comp_channel(context.raw) };
        if channel.is_null() {
            return Err(last_error("ibv_create_comp_channel", &context.name));
        }
        // SAFETY: the channel's descriptor is ours; non-blocking so that taking events never waits.
        let flags = unsafe { libc::fcntl((*channel).fd, libc::F_GETFL) };
        let capacity = capacity.clamp(1, i32::MAX as u32) as i32;
        // SAFETY: an open context and channel.
        let raw = unsafe {
            if flags < 0 || libc::fcntl((*channel).fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
                std::ptr::null_mut()
            } else {
                sys::ibv_create_cq(context.raw, capacity, std::ptr::null_mut(), channel, 0)
            }
        };
        if raw.is_null() {
            let error = last_error("ibv_create_cq", &context.name);
            // SAFETY: the channel has no queue on it.
            unsafe { sys::ibv_destroy_comp_channel(channel) };
            return Err(error);
        }
        Ok(CompletionQueue { inner: Arc::new(QueueInner { raw, channel, device: context.clone() }) })
    }

    /// Moves up to `limit` finished work requests into `into`; returns how many.
    pub fn poll(&self, into: &mut Vec<Completion>, limit: usize) -> Result<usize, TransferError> {
        let mut taken = 0;
        while taken < limit {
            // SAFETY: plain-data structs the provider fills in.
            let mut entries: [sys::ibv_wc; POLL_BATCH] = unsafe { std::mem::zeroed() };
            let want = (limit - taken).min(POLL_BATCH) as i32;
            // SAFETY: a live queue and room for `want` entries.
            let got = unsafe { sys::ibv_poll_cq(self.inner.raw, want, entries.as_mut_ptr()) };
            if got < 0 {
                return Err(returned_error("ibv_poll_cq", &self.inner.device.name, -got));
            }
            for entry in &entries[..got as usize] {
                let (result, kind) = if entry.status == sys::ibv_wc_status::IBV_WC_SUCCESS {
                    (Ok(entry.byte_len), CompletionKind::of(entry.opcode))
                } else {
                    // The opcode of a failed completion is undefined in verbs.
                    (
                        Err(WorkRequestError { status: entry.status, vendor_error: entry.vendor_err }),
                        CompletionKind::Other,
                    )
                };
                into.push(Completion { work_request_id: entry.wr_id, kind, result });
            }
            taken += got as usize;
            if got < want {
                break;
            }
        }
        Ok(taken)
    }

    /// Asks for an event on the channel at the next completion.
    pub fn arm(&self) -> Result<(), TransferError> {
        // SAFETY: a live queue.
        let errno = unsafe { sys::ibv_req_notify_cq(self.inner.raw, 0) };
        if errno != 0 {
            return Err(returned_error("ibv_req_notify_cq", &self.inner.device.name, errno));
        }
        Ok(())
    }

    /// Polls up to `limit` completions into `into`; when there are none, arms the queue and polls once more,
    /// so that a completion that landed before the arm is not left waiting for an event that will not come.
    /// `Ok(0)`: armed, nothing there; wait for the channel ([`event_fd`](Self::event_fd)), then take its event.
    pub fn poll_or_arm(&self, into: &mut Vec<Completion>, limit: usize) -> Result<usize, TransferError> {
        let taken = self.poll(into, limit)?;
        if taken > 0 {
            return Ok(taken);
        }
        self.arm()?;
        self.poll(into, limit)
    }

    /// The channel's descriptor: readable when an armed queue has had a completion.
    pub fn event_fd(&self) -> RawFd {
        // SAFETY: the channel lives as long as the queue.
        unsafe { (*self.inner.channel).fd }
    }

    /// Reads and acknowledges one event, without waiting; `false` if there was none. A waiter that armed the
    /// queue once has at most one to take: this spares [`take_events`](Self::take_events)' last read, which
    /// only finds the channel empty.
    pub fn take_event(&self) -> Result<bool, TransferError> {
        let mut queue = std::ptr::null_mut();
        let mut context = std::ptr::null_mut();
        // SAFETY: the channel is non-blocking and only this queue reports to it.
        if unsafe { sys::ibv_get_cq_event(self.inner.channel, &mut queue, &mut context) } != 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(false);
            }
            return Err(TransferError::Verbs {
                call: "ibv_get_cq_event",
                device: self.inner.device.name.clone(),
                source: error,
            });
        }
        // SAFETY: one event just taken from this queue; ibv_destroy_cq waits for every ack.
        unsafe { sys::ibv_ack_cq_events(self.inner.raw, 1) };
        Ok(true)
    }

    /// Reads and acknowledges the events the channel holds, without waiting; returns how many.
    pub fn take_events(&self) -> Result<u32, TransferError> {
        let mut taken = 0;
        while self.take_event()? {
            taken += 1;
        }
        Ok(taken)
    }

    /// Waits, on this thread, until at least one completion is in `into` or `timeout` passes; returns how
    /// many arrived. For clients and tools; a glommio shard waits on [`event_fd`](Self::event_fd) instead.
    pub fn wait(&self, into: &mut Vec<Completion>, limit: usize, timeout: Duration) -> Result<usize, TransferError> {
        let deadline = Instant::now() + timeout;
        loop {
            let taken = self.poll_or_arm(into, limit)?;
            if taken > 0 {
                return Ok(taken);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(0);
            }
            self.wait_readable(left)?;
            self.take_events()?;
        }
    }

    fn wait_readable(&self, timeout: Duration) -> Result<(), TransferError> {
        let mut poll = libc::pollfd { fd: self.event_fd(), events: libc::POLLIN, revents: 0 };
        let millis = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one pollfd on the channel's descriptor, open while the queue lives.
        if unsafe { libc::poll(&mut poll, 1, millis) } < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() != std::io::ErrorKind::Interrupted {
                return Err(TransferError::Verbs {
                    call: "poll",
                    device: self.inner.device.name.clone(),
                    source: error,
                });
            }
        }
        Ok(())
    }
}
