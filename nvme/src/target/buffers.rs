//! Recycled data buffers for one executor. A transfer of 128 KiB or more is above glibc's mmap threshold,
//! so a fresh buffer per command costs an mmap, a munmap and a page fault per 4 KiB; reusing buffers
//! keeps the data path free of all three.

use std::cell::RefCell;
use std::collections::HashMap;

use crate::buffer::IoBuffer;

/// Bytes an executor keeps in idle buffers at most.
const KEPT_BYTES_MAX: usize = 64 << 20;
/// Alignment of pooled buffers (enough for any block size).
const ALIGNMENT: usize = 4096;

#[derive(Default)]
pub(crate) struct BufferPool {
    idle: RefCell<HashMap<usize, Vec<IoBuffer>>>,
    kept_bytes: RefCell<usize>,
}

impl BufferPool {
    /// A buffer of `len` bytes (contents unspecified: every caller overwrites it whole).
    pub(crate) fn take(&self, len: usize) -> IoBuffer {
        let recycled = self.idle.borrow_mut().get_mut(&len).and_then(Vec::pop);
        match recycled {
            Some(buffer) => {
                *self.kept_bytes.borrow_mut() -= len;
                buffer
            }
            None => IoBuffer::aligned(len, ALIGNMENT),
        }
    }

    /// Gives a heap buffer back (others, and any beyond the byte budget, are dropped).
    pub(crate) fn give(&self, buffer: IoBuffer) {
        let len = buffer.len();
        let mut kept = self.kept_bytes.borrow_mut();
        if !buffer.is_heap() || len == 0 || *kept + len > KEPT_BYTES_MAX || !buffer.is_aligned_to(ALIGNMENT as u64) {
            return;
        }
        *kept += len;
        self.idle.borrow_mut().entry(len).or_default().push(buffer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_by_size_within_the_budget() {
        let pool = BufferPool::default();
        let mut buffer = pool.take(8192);
        buffer.as_mut_slice()[0] = 7;
        let address = buffer.as_slice().as_ptr();
        pool.give(buffer);
        let again = pool.take(8192);
        assert_eq!(again.as_slice().as_ptr(), address, "the same allocation is reused");
        assert_ne!(pool.take(8192).as_slice().as_ptr(), address, "a second buffer is a new one");
        // A small heap vector is 4 KiB-aligned by chance now and then: keep drawing until one is not.
        let mut drawn = Vec::new();
        let unaligned = loop {
            let vector = vec![0u8; 100];
            if !(vector.as_ptr() as usize).is_multiple_of(ALIGNMENT) {
                break vector;
            }
            drawn.push(vector);
        };
        pool.give(IoBuffer::from_vec(unaligned));
        assert!(pool.idle.borrow().get(&100).is_none(), "unaligned buffers are not kept");
        for _ in 0..(KEPT_BYTES_MAX / (1 << 20)) + 4 {
            pool.give(IoBuffer::aligned(1 << 20, ALIGNMENT));
        }
        assert!(*pool.kept_bytes.borrow() <= KEPT_BYTES_MAX);
    }
}
