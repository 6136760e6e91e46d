//! Protection domains, memory registrations, and spans of registered memory.
//!
//! A registration pins its pages and gives them a local key (for this side's work requests) and a remote
//! key (for the peer's). Which the peer may use is the registration's [`Access`]: the node registers its
//! own memory for local use only, so no remote key it hands out, guessed or replayed, reaches it; a
//! client registers its buffers for remote read and write, and its protection domain keeps them to the
//! queue pairs it made.

use std::sync::Arc;

use rdma_sys as sys;

use super::device::{Device, DeviceContext};
use super::last_error;
use crate::{RemoteSpan, TransferError};

/// A protection domain: registrations and queue pairs in one domain only ever serve each other.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(super) inner: Arc<DomainInner>,
}

pub(super) struct DomainInner {
    pub(super) raw: *mut sys::ibv_pd,
    pub(super) device: Arc<DeviceContext>,
}

// SAFETY: verbs objects may be used from any thread; the domain is only deallocated on drop.
unsafe impl Send for DomainInner {}
// SAFETY: as above.
unsafe impl Sync for DomainInner {}

impl Drop for DomainInner {
    fn drop(&mut self) {
        // SAFETY: every registration and queue pair in the domain holds it alive, so none is left.
        unsafe { sys::ibv_dealloc_pd(self.raw) };
    }
}

impl ProtectionDomain {
    /// A new domain on `device`.
    pub fn new(device: &Device) -> Result<ProtectionDomain, TransferError> {
        // SAFETY: an open context.
        let raw = unsafe { sys::ibv_alloc_pd(device.context.raw) };
        if raw.is_null() {
            return Err(last_error("ibv_alloc_pd", &device.context.name));
        }
        Ok(ProtectionDomain { inner: Arc::new(DomainInner { raw, device: device.context.clone() }) })
    }

    /// The device the domain lives on.
    pub fn device(&self) -> Device {
        Device { context: self.inner.device.clone() }
    }
}

/// What a peer may do with a registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// This side only: sources of RDMA WRITEs, destinations of RDMA READs.
    Local,
    /// The peer may RDMA-READ and -WRITE it too (a client's buffers).
    RemoteReadWrite,
}

impl Access {
    fn flags(self) -> u32 {
        let local = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        match self {
            Access::Local => local,
            Access::RemoteReadWrite => {
                local
                    | sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
                    | sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
            }
        }
    }
}

/// A registration of memory the caller owns.
pub struct MemoryRegion {
    raw: *mut sys::ibv_mr,
    length: u64,
    _domain: Arc<DomainInner>,
}

// SAFETY: the registration is plain keys and an address; deregistered only on drop.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: `raw` came from ibv_reg_mr; after this the device no longer touches the memory.
        unsafe { sys::ibv_dereg_mr(self.raw) };
    }
}

/// A span of this side's registered memory, as a work request names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalSpan {
    /// Address of the first byte.
    pub address: u64,
    /// Bytes.
    pub length: u32,
    /// The registration's local key.
    pub local_key: u32,
}

impl MemoryRegion {
    /// Registers `length` bytes at `address` in `domain`.
    ///
    /// # Safety
    /// The memory must stay allocated for as long as the registration lives, and, while any work request
    /// or a peer (with [`Access::RemoteReadWrite`]) may use it, nothing else may rely on its contents.
    pub unsafe fn register(
        domain: &ProtectionDomain,
        address: *mut u8,
        length: usize,
        access: Access,
    ) -> Result<MemoryRegion, TransferError> {
        // SAFETY: the caller keeps the memory alive; the domain is open.
        let raw = unsafe { sys::ibv_reg_mr(domain.inner.raw, address.cast(), length, access.flags() as i32) };
        if raw.is_null() {
            return Err(last_error("ibv_reg_mr", &domain.inner.device.name));
        }
        Ok(MemoryRegion { raw, length: length as u64, _domain: domain.inner.clone() })
    }

    fn keys(&self) -> (u64, u32, u32) {
        // SAFETY: `raw` is a live registration; its fields are set once by ibv_reg_mr.
        unsafe { ((*self.raw).addr as u64, (*self.raw).lkey, (*self.raw).rkey) }
    }

    fn check(&self, offset: u64, length: u32) -> Result<u64, TransferError> {
        match offset.checked_add(u64::from(length)) {
            Some(end) if end <= self.length => Ok(self.keys().0 + offset),
            _ => Err(TransferError::OutOfRegion { offset, length: u64::from(length), registered: self.length }),
        }
    }

    /// Bytes registered.
    pub fn len(&self) -> u64 {
        self.length
    }

    /// Whether the registration is empty.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// `length` bytes at `offset`, for this side's work requests.
    pub fn local_span(&self, offset: u64, length: u32) -> Result<LocalSpan, TransferError> {
        Ok(LocalSpan { address: self.check(offset, length)?, length, local_key: self.keys().1 })
    }

    /// `length` bytes at `offset`, for the peer to read or write (meaningful only with
    /// [`Access::RemoteReadWrite`]).
    pub fn remote_span(&self, offset: u64, length: u32) -> Result<RemoteSpan, TransferError> {
        Ok(RemoteSpan { address: self.check(offset, length)?, length, remote_key: self.keys().2 })
    }
}

/// Memory this handle allocates (page-aligned, zeroed) and registers: the safe way to own a buffer a work
/// request or a peer fills.
pub struct RegisteredBuffer {
    // Declared first: deregistered before the memory is unmapped.
    region: MemoryRegion,
    address: *mut u8,
    length: usize,
}

// SAFETY: the buffer is owned memory plus its registration.
unsafe impl Send for RegisteredBuffer {}

impl Drop for RegisteredBuffer {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours, and the registration (dropped just before) no longer covers it.
        unsafe { libc::munmap(self.address.cast(), self.length) };
    }
}

impl RegisteredBuffer {
    /// `length` bytes (at least one) of fresh memory, registered in `domain`.
    pub fn new(domain: &ProtectionDomain, length: usize, access: Access) -> Result<RegisteredBuffer, TransferError> {
        let length = length.max(1);
        // SAFETY: an anonymous private mapping; no other memory is affected.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                length,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if address == libc::MAP_FAILED {
            return Err(last_error("mmap", &domain.inner.device.name));
        }
        let address = address.cast::<u8>();
        // SAFETY: the mapping lives as long as the buffer, which drops the registration first.
        match unsafe { MemoryRegion::register(domain, address, length, access) } {
            Ok(region) => Ok(RegisteredBuffer { region, address, length }),
            Err(error) => {
                // SAFETY: our mapping, not registered.
                unsafe { libc::munmap(address.cast(), length) };
                Err(error)
            }
        }
    }

    /// Its registration.
    pub fn region(&self) -> &MemoryRegion {
        &self.region
    }

    /// The bytes, to read.
    ///
    /// Bytes that an in-flight work request or a peer is writing may change under the slice: read them
    /// after the request's completion.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `length` bytes mapped for the buffer's life; changes by the device race only with reads
        // the caller makes before the completion, which the doc above rules out.
        unsafe { std::slice::from_raw_parts(self.address, self.length) }
    }

    /// The bytes, to write.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, with `&mut self` for exclusive access on this side.
        unsafe { std::slice::from_raw_parts_mut(self.address, self.length) }
    }
}
