//! A RAM namespace: the deterministic backend for tests, and a namespace of the NVMe-oF target.
//!
//! The bytes live in 64-bit atomic words behind an `Arc`, so that clones of one device on several
//! executors (the target serves each queue pair on its own core) see one namespace without a lock and
//! without `unsafe`. Relaxed word accesses compile to plain loads and stores; like a real device, two
//! racing writes to the same block may interleave (at 8-byte granularity), and the caller orders them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::buffer::IoBuffer;
use crate::device::{BlockDevice, Geometry};
use crate::error::{BlockOp, BlockResult};

const WORD: usize = 8;

/// A block device in memory. Its words are allocated zeroed up front (the kernel commits them as
/// touched). Cloning gives another handle on the same bytes.
#[derive(Clone)]
pub struct MemoryDevice {
    name: Arc<str>,
    geometry: Geometry,
    words: Arc<[AtomicU64]>,
}

impl MemoryDevice {
    /// A namespace of `capacity_bytes` (a multiple of `logical_block_bytes`, a power of two ≥ 8).
    pub fn new(capacity_bytes: u64, logical_block_bytes: u64) -> Self {
        let zeroed = Arc::<[AtomicU64]>::new_zeroed_slice(capacity_bytes as usize / WORD);
        // SAFETY: all-zero bytes are a valid `AtomicU64` (zero). The allocation comes from the allocator's
        // zeroed path, so large namespaces cost no time until their pages are touched.
        #[allow(unsafe_code)]
        let words = unsafe { zeroed.assume_init() };
        Self {
            name: format!("memory:{capacity_bytes}").into(),
            geometry: Geometry {
                capacity_bytes,
                logical_block_bytes,
                max_transfer_bytes: 8 << 20,
                buffer_alignment_bytes: logical_block_bytes,
            },
            words,
        }
    }

    fn words(&self, offset: u64, len: usize) -> &[AtomicU64] {
        let first = offset as usize / WORD;
        &self.words[first..first + len / WORD]
    }

    fn store(&self, offset: u64, bytes: &[u8]) {
        for (word, chunk) in self.words(offset, bytes.len()).iter().zip(bytes.chunks_exact(WORD)) {
            let mut value = [0u8; WORD];
            value.copy_from_slice(chunk);
            word.store(u64::from_ne_bytes(value), Ordering::Relaxed);
        }
    }

    fn fill_zero(&self, offset: u64, len: u64) {
        for word in self.words(offset, len as usize) {
            word.store(0, Ordering::Relaxed);
        }
    }
}

impl BlockDevice for MemoryDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn alloc_buffer(&self, len: usize) -> IoBuffer {
        IoBuffer::aligned(len, self.geometry.buffer_alignment_bytes as usize)
    }

    async fn read(&self, mut buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>) {
        if let Err(error) = self.geometry.check(BlockOp::Read, &self.name, offset, buf.len() as u64, Some(&buf)) {
            return (buf, Err(error));
        }
        let words = self.words(offset, buf.len());
        for (chunk, word) in buf.as_mut_slice().chunks_exact_mut(WORD).zip(words) {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
        }
        (buf, Ok(()))
    }

    async fn write(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>) {
        if let Err(error) = self.geometry.check(BlockOp::Write, &self.name, offset, buf.len() as u64, Some(&buf)) {
            return (buf, Err(error));
        }
        self.store(offset, buf.as_slice());
        (buf, Ok(()))
    }

    async fn flush(&self) -> BlockResult<()> {
        Ok(())
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.geometry.check(BlockOp::WriteZeroes, &self.name, offset, len, None)?;
        self.fill_zero(offset, len);
        Ok(())
    }

    async fn deallocate(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.geometry.check(BlockOp::Deallocate, &self.name, offset, len, None)?;
        self.fill_zero(offset, len);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_on_other_threads_see_one_namespace() {
        let device = MemoryDevice::new(1 << 16, 512);
        let writer = device.clone();
        std::thread::spawn(move || {
            futures_lite::future::block_on(async {
                let mut buf = writer.alloc_buffer(512);
                buf.as_mut_slice().fill(0xa5);
                writer.write(buf, 4096).await.1.unwrap();
            })
        })
        .join()
        .unwrap();
        let (buf, result) = futures_lite::future::block_on(device.read(device.alloc_buffer(512), 4096));
        result.unwrap();
        assert!(buf.as_slice().iter().all(|&byte| byte == 0xa5));
    }
}
