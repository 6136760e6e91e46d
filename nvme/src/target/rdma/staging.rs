//! Registered buffers that a queue pair's RDMA READs land in and its RDMA WRITEs leave from.
//!
//! A command's data is copied between the namespace's own buffer and one of these: registering each
//! command's buffer instead would pin and unpin its pages per I/O (`ibv_reg_mr` costs more than copying a
//! few KiB), and the namespace's buffers come from several pools. Buffers are cut in powers of two from
//! 4 KiB, registered at first use and kept for the next command of their size, up to
//! [`IDLE_BYTES_MAX`] idle: what is in use is bounded by the queue's commands times the largest transfer,
//! as a TCP queue's write buffers are.

use std::cell::RefCell;

use strata_transfer::TransferError;
use strata_transfer::verbs::{Access, ProtectionDomain, RegisteredBuffer};

/// Idle registered bytes a queue keeps for reuse; beyond it a returned buffer is deregistered.
pub(super) const IDLE_BYTES_MAX: usize = 8 << 20;
/// The smallest buffer cut.
const SMALLEST: usize = 4096;

/// One queue pair's staging buffers.
pub(super) struct Staging {
    domain: ProtectionDomain,
    idle: RefCell<Vec<RegisteredBuffer>>,
}

impl Staging {
    pub(super) fn new(domain: ProtectionDomain) -> Staging {
        Staging { domain, idle: RefCell::new(Vec::new()) }
    }

    /// A buffer of at least `len` bytes: an idle one of its size, or a new registration.
    pub(super) fn take(&self, len: usize) -> Result<RegisteredBuffer, TransferError> {
        let size = len.max(SMALLEST).next_power_of_two();
        let mut idle = self.idle.borrow_mut();
        if let Some(at) = idle.iter().position(|buffer| buffer.as_slice().len() == size) {
            return Ok(idle.swap_remove(at));
        }
        drop(idle);
        RegisteredBuffer::new(&self.domain, size, Access::Local)
    }

    /// Keeps `buffer` for reuse, or deregisters it when the idle ones already hold enough.
    pub(super) fn give_back(&self, buffer: RegisteredBuffer) {
        let mut idle = self.idle.borrow_mut();
        let held: usize = idle.iter().map(|buffer| buffer.as_slice().len()).sum();
        if held + buffer.as_slice().len() <= IDLE_BYTES_MAX {
            idle.push(buffer);
        }
    }
}
