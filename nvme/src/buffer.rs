//! Owned I/O buffers that move through the I/O engine: `read(buf, at) -> (buf, result)`.
//!
//! One type for every backend, so placement code above is backend-agnostic, with three storages:
//! - **heap**: an aligned slice of a `Vec` (over-allocated by the alignment and offset into it, which keeps
//!   this module free of `unsafe`), for the memory backend, tests, and data coming from the network;
//! - **dma**: a glommio `DmaBuffer` from the executor's registered I/O memory, which the `uring` backend
//!   writes without a copy;
//! - **read**: the registered buffer glommio's `DmaFile` reads into. glommio cannot read into a buffer the
//!   caller chose, so the `uring` backend returns *its* buffer instead of the one passed in; no byte is copied
//!   either way. Such a buffer is read-only: [`IoBuffer::as_mut_slice`] first copies it to the heap;
//! - **fixed**: aligned heap memory registered with a `ring` backend's io_uring (a fixed buffer), which that
//!   ring reads and writes with `READ_FIXED`/`WRITE_FIXED`: the kernel pinned its pages once, at
//!   registration, instead of at every I/O. Dropped, it goes back to its ring's pool, still registered.

use std::cell::RefCell;
use std::rc::Rc;

use glommio::io::{DmaBuffer, ReadResult};

enum Storage {
    Heap(Vec<u8>),
    Dma(Rc<DmaBuffer>),
    Read(ReadResult),
    Fixed(FixedMemory),
}

/// Memory registered with an io_uring: an aligned heap allocation of `capacity` bytes from `start`, at
/// `index` in the ring's table of fixed buffers.
pub(crate) struct FixedChunk {
    bytes: Vec<u8>,
    start: usize,
    capacity: usize,
    index: u16,
}

impl FixedChunk {
    /// A zeroed allocation of `capacity` bytes aligned to `alignment`, to be registered at `index`.
    pub(crate) fn new(capacity: usize, alignment: usize, index: u16) -> Self {
        let (bytes, start) = aligned_zeroes(capacity, alignment);
        Self { bytes, start, capacity, index }
    }

    /// Its size in bytes.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Its entry in the ring's table of fixed buffers.
    pub(crate) fn index(&self) -> u16 {
        self.index
    }

    /// The iovec to register: the aligned `capacity` bytes. They do not move when the chunk does (the
    /// `Vec`'s heap memory stays where it is).
    pub(crate) fn iovec(&mut self) -> libc::iovec {
        let memory = &mut self.bytes[self.start..self.start + self.capacity];
        libc::iovec { iov_base: memory.as_mut_ptr().cast(), iov_len: memory.len() }
    }
}

/// A zeroed heap allocation with `len` bytes aligned to `alignment` (at least 1) from the offset returned.
fn aligned_zeroes(len: usize, alignment: usize) -> (Vec<u8>, usize) {
    let alignment = alignment.max(1);
    let bytes = vec![0u8; len + alignment];
    let start = bytes.as_ptr().align_offset(alignment);
    (bytes, start)
}

/// A ring's registered chunks not in use. A chunk stays registered (and allocated) for as long as the pool
/// lives, which the ring holds until its last operation completed, or until its table entry is registered
/// again for another chunk: the kernel never sees freed memory.
#[derive(Default)]
pub(crate) struct FixedPool {
    idle: RefCell<Vec<FixedChunk>>,
}

impl FixedPool {
    /// An idle chunk of at least `len` bytes and at most twice that (so a small request does not take a big
    /// chunk), if there is one.
    pub(crate) fn take(&self, len: usize) -> Option<FixedChunk> {
        let mut idle = self.idle.try_borrow_mut().ok()?;
        let position = idle.iter().position(|chunk| chunk.capacity >= len && chunk.capacity <= len.max(1) * 2)?;
        Some(idle.swap_remove(position))
    }

    /// Puts a chunk (lent, or taken and not used) at the end of the idle list. A chunk that cannot go back is
    /// freed here; its table entry is never handed out again, and the kernel keeps its own references to the
    /// pinned pages until the ring closes.
    pub(crate) fn give_back(&self, chunk: FixedChunk) {
        if let Ok(mut idle) = self.idle.try_borrow_mut() {
            idle.push(chunk);
        }
    }

    /// An idle chunk of any size, from the front of the idle list (chunks go back at its end, so the front
    /// has mostly been idle longest): its table entry is to be registered again for a chunk of another size.
    pub(crate) fn take_any_size(&self) -> Option<FixedChunk> {
        let mut idle = self.idle.try_borrow_mut().ok()?;
        (!idle.is_empty()).then(|| idle.remove(0))
    }
}

/// A chunk lent to an `IoBuffer`; gives it back to its pool when dropped.
struct FixedMemory {
    chunk: FixedChunk,
    pool: Rc<FixedPool>,
}

impl Drop for FixedMemory {
    fn drop(&mut self) {
        let empty = FixedChunk { bytes: Vec::new(), start: 0, capacity: 0, index: 0 };
        self.pool.give_back(std::mem::replace(&mut self.chunk, empty));
    }
}

/// An owned buffer of `len()` bytes for block I/O.
pub struct IoBuffer {
    storage: Storage,
    start: usize,
    len: usize,
}

impl std::fmt::Debug for IoBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let storage = match self.storage {
            Storage::Heap(_) => "heap",
            Storage::Dma(_) => "dma",
            Storage::Read(_) => "read",
            Storage::Fixed(_) => "fixed",
        };
        f.debug_struct("IoBuffer").field("storage", &storage).field("len", &self.len).finish()
    }
}

impl IoBuffer {
    /// A zeroed heap buffer of `len` bytes whose first byte is aligned to `alignment` (a power of two).
    pub fn aligned(len: usize, alignment: usize) -> Self {
        let (bytes, start) = aligned_zeroes(len, alignment);
        Self { storage: Storage::Heap(bytes), start, len }
    }

    /// Wraps a vector as it is (its memory is usually not aligned for direct I/O).
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        let len = bytes.len();
        Self { storage: Storage::Heap(bytes), start: 0, len }
    }

    pub(crate) fn from_dma(buffer: DmaBuffer) -> Self {
        let len = buffer.len();
        Self { storage: Storage::Dma(Rc::new(buffer)), start: 0, len }
    }

    pub(crate) fn from_read(result: ReadResult) -> Self {
        let len = result.len();
        Self { storage: Storage::Read(result), start: 0, len }
    }

    /// `len` bytes of a registered chunk (at most its capacity), which returns to `pool` when dropped.
    pub(crate) fn from_fixed(chunk: FixedChunk, len: usize, pool: Rc<FixedPool>) -> Self {
        let (start, len) = (chunk.start, len.min(chunk.capacity));
        Self { storage: Storage::Fixed(FixedMemory { chunk, pool }), start, len }
    }

    /// The index of this buffer in `pool`'s ring's table, when its bytes are a registered chunk of that pool.
    pub(crate) fn fixed_index(&self, pool: &Rc<FixedPool>) -> Option<u16> {
        match &self.storage {
            Storage::Fixed(memory) if Rc::ptr_eq(&memory.pool, pool) => Some(memory.chunk.index),
            _ => None,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        let range = self.start..self.start + self.len;
        match &self.storage {
            Storage::Heap(bytes) => &bytes[range],
            Storage::Dma(buffer) => &buffer.as_bytes()[range],
            Storage::Read(result) => &result[range],
            Storage::Fixed(memory) => &memory.chunk.bytes[range],
        }
    }

    /// The bytes, writable. A buffer that a read returned (glommio's, read-only) or that is shared with an
    /// I/O in flight is first copied to an aligned heap buffer.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let needs_copy = match &mut self.storage {
            Storage::Heap(_) | Storage::Fixed(_) => false,
            Storage::Dma(buffer) => Rc::get_mut(buffer).is_none(),
            Storage::Read(_) => true,
        };
        if needs_copy {
            let mut copy = IoBuffer::aligned(self.len, 4096);
            copy.as_mut_slice().copy_from_slice(self.as_slice());
            *self = copy;
        }
        let range = self.start..self.start + self.len;
        match &mut self.storage {
            Storage::Heap(bytes) => &mut bytes[range],
            Storage::Dma(buffer) => match Rc::get_mut(buffer) {
                Some(buffer) => &mut buffer.as_bytes_mut()[range],
                None => unreachable!("copied above when shared"),
            },
            Storage::Read(_) => unreachable!("copied above"),
            Storage::Fixed(memory) => &mut memory.chunk.bytes[range],
        }
    }

    /// Whether the bytes live in an ordinary heap allocation (not glommio's registered memory).
    pub fn is_heap(&self) -> bool {
        matches!(self.storage, Storage::Heap(_))
    }

    /// Whether the first byte's address is a multiple of `alignment`.
    pub fn is_aligned_to(&self, alignment: u64) -> bool {
        (self.as_slice().as_ptr() as usize as u64).is_multiple_of(alignment.max(1))
    }

    /// Drops the first `count` bytes (a view: nothing is copied).
    pub fn advance(&mut self, count: usize) {
        let count = count.min(self.len);
        self.start += count;
        self.len -= count;
    }

    /// Keeps the first `len` bytes (a view: nothing is copied).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// The glommio buffer to hand to `DmaFile::write_rc_at`, when this is one whole, unviewed.
    pub(crate) fn shared_dma(&self) -> Option<Rc<DmaBuffer>> {
        match &self.storage {
            Storage::Dma(buffer) if self.start == 0 && self.len == buffer.len() => Some(Rc::clone(buffer)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_aligned_zeroed_and_writable() {
        for alignment in [512usize, 4096, 2 << 20] {
            let mut buffer = IoBuffer::aligned(8192, alignment);
            assert!(buffer.is_aligned_to(alignment as u64));
            assert_eq!(buffer.len(), 8192);
            assert!(buffer.as_slice().iter().all(|&byte| byte == 0));
            buffer.as_mut_slice()[100] = 7;
            assert_eq!(buffer.as_slice()[100], 7);
        }
    }

    #[test]
    fn views_move_the_window_without_copying() {
        let mut buffer = IoBuffer::from_vec((0..=255u8).collect());
        buffer.advance(10);
        buffer.truncate(5);
        assert_eq!(buffer.as_slice(), &[10, 11, 12, 13, 14]);
        buffer.advance(100);
        assert!(buffer.is_empty());
    }
}
