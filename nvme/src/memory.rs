//! A RAM namespace: the deterministic backend for tests, and a namespace of the NVMe-oF target.

use std::cell::RefCell;

use crate::buffer::IoBuffer;
use crate::device::{BlockDevice, Geometry};
use crate::error::{BlockOp, BlockResult};

/// A block device in memory. Its bytes are allocated zeroed up front (the kernel commits them as touched).
pub struct MemoryDevice {
    name: String,
    geometry: Geometry,
    bytes: RefCell<Vec<u8>>,
}

impl MemoryDevice {
    /// A namespace of `capacity_bytes` (a multiple of `logical_block_bytes`, a power of two).
    pub fn new(capacity_bytes: u64, logical_block_bytes: u64) -> Self {
        Self {
            name: format!("memory:{capacity_bytes}"),
            geometry: Geometry {
                capacity_bytes,
                logical_block_bytes,
                max_transfer_bytes: 8 << 20,
                buffer_alignment_bytes: logical_block_bytes,
            },
            bytes: RefCell::new(vec![0; capacity_bytes as usize]),
        }
    }

    fn range(offset: u64, len: usize) -> std::ops::Range<usize> {
        offset as usize..offset as usize + len
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
        let range = Self::range(offset, buf.len());
        buf.as_mut_slice().copy_from_slice(&self.bytes.borrow()[range]);
        (buf, Ok(()))
    }

    async fn write(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>) {
        if let Err(error) = self.geometry.check(BlockOp::Write, &self.name, offset, buf.len() as u64, Some(&buf)) {
            return (buf, Err(error));
        }
        let range = Self::range(offset, buf.len());
        self.bytes.borrow_mut()[range].copy_from_slice(buf.as_slice());
        (buf, Ok(()))
    }

    async fn flush(&self) -> BlockResult<()> {
        Ok(())
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.geometry.check(BlockOp::WriteZeroes, &self.name, offset, len, None)?;
        self.bytes.borrow_mut()[Self::range(offset, len as usize)].fill(0);
        Ok(())
    }

    async fn deallocate(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.geometry.check(BlockOp::Deallocate, &self.name, offset, len, None)?;
        self.bytes.borrow_mut()[Self::range(offset, len as usize)].fill(0);
        Ok(())
    }
}
