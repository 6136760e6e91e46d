//! A memory namespace behind a volatile write cache: what a power cut leaves on a device that acknowledges
//! writes before they are durable. The backend of crash tests and of the engine's seeded simulation.
//!
//! A write is visible to reads as soon as it completes, but it is durable only once a flush completes
//! after it. [`VolatileDisk::crash`] decides, from a seed, what each write since the last flush left on the
//! medium: all of it, none of it, or some of its logical blocks (NVMe promises atomicity per block only, so
//! a torn write may keep any subset of its blocks, not only a prefix). Handles opened before a crash fail
//! every operation afterwards, so nothing of the old life can write into the new one.
//!
//! The bytes live in one `Vec` behind an `Rc`: every handle is on one thread (the simulation runs one
//! executor at a time), and the disk outlives the executors that use it.

use std::cell::RefCell;
use std::rc::Rc;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::buffer::IoBuffer;
use crate::device::{BlockDevice, Geometry};
use crate::error::{BlockError, BlockErrorKind, BlockOp, BlockResult};

/// A write not yet made durable: where, what it wrote, and what was there before (to undo it at a crash).
struct Unflushed {
    offset: u64,
    written: Vec<u8>,
    before: Vec<u8>,
}

struct Medium {
    bytes: Vec<u8>,
    unflushed: Vec<Unflushed>,
    /// Bumped by every crash; a handle of an older life fails.
    life: u64,
}

/// What a crash did to the writes that were not durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrashReport {
    /// Writes that reached the medium whole.
    pub kept: u64,
    /// Writes of which some blocks, not all, reached it.
    pub torn: u64,
    /// Writes of which nothing reached it.
    pub lost: u64,
}

/// A namespace in memory with a volatile write cache; [`VolatileDisk::handle`] opens devices on it.
#[derive(Clone)]
pub struct VolatileDisk {
    medium: Rc<RefCell<Medium>>,
    geometry: Geometry,
    name: Rc<str>,
}

impl VolatileDisk {
    /// A zeroed namespace of `capacity_bytes` (a multiple of `logical_block_bytes`).
    pub fn new(capacity_bytes: u64, logical_block_bytes: u64) -> Self {
        let medium = Medium { bytes: vec![0; capacity_bytes as usize], unflushed: Vec::new(), life: 0 };
        Self {
            medium: Rc::new(RefCell::new(medium)),
            geometry: Geometry {
                capacity_bytes,
                logical_block_bytes,
                max_transfer_bytes: 8 << 20,
                buffer_alignment_bytes: logical_block_bytes,
            },
            name: format!("volatile:{capacity_bytes}").into(),
        }
    }

    /// A device on this namespace, valid until the next crash.
    pub fn handle(&self) -> VolatileDevice {
        VolatileDevice { disk: self.clone(), life: self.medium.borrow().life }
    }

    /// Writes completed since the last flush.
    pub fn unflushed_writes(&self) -> usize {
        self.medium.borrow().unflushed.len()
    }

    /// A power cut: every write since the last flush keeps all, none or some of its blocks, as `seed`
    /// decides; the handles opened so far fail from now on.
    pub fn crash(&self, seed: u64) -> CrashReport {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut medium = self.medium.borrow_mut();
        let unflushed = std::mem::take(&mut medium.unflushed);
        // Undo every unflushed write, newest first: the medium is then as the last flush left it.
        for write in unflushed.iter().rev() {
            let at = write.offset as usize;
            medium.bytes[at..at + write.before.len()].copy_from_slice(&write.before);
        }
        // Then each write, oldest first, leaves what its fate says.
        let block = self.geometry.logical_block_bytes as usize;
        let mut report = CrashReport::default();
        for write in &unflushed {
            let at = write.offset as usize;
            match rng.random_range(0..3u8) {
                0 => {
                    medium.bytes[at..at + write.written.len()].copy_from_slice(&write.written);
                    report.kept += 1;
                }
                1 => report.lost += 1,
                _ => {
                    for (index, chunk) in write.written.chunks(block).enumerate() {
                        if rng.random_bool(0.5) {
                            let from = at + index * block;
                            medium.bytes[from..from + chunk.len()].copy_from_slice(chunk);
                        }
                    }
                    report.torn += 1;
                }
            }
        }
        medium.life += 1;
        report
    }

    /// A power cut in which every write since the last flush is lost whole (the worst case a test wants).
    pub fn crash_losing_unflushed(&self) {
        let mut medium = self.medium.borrow_mut();
        let unflushed = std::mem::take(&mut medium.unflushed);
        for write in unflushed.iter().rev() {
            let at = write.offset as usize;
            medium.bytes[at..at + write.before.len()].copy_from_slice(&write.before);
        }
        medium.life += 1;
    }

    /// Flips the bits of `mask` in the byte at `offset`, on the medium itself (durable, as media damage is).
    pub fn corrupt(&self, offset: u64, mask: u8) {
        let mut medium = self.medium.borrow_mut();
        if let Some(byte) = medium.bytes.get_mut(offset as usize) {
            *byte ^= mask;
        }
    }

    /// Bytes of the namespace.
    pub fn capacity_bytes(&self) -> u64 {
        self.geometry.capacity_bytes
    }

    /// A copy of the medium's bytes (what reads see now).
    pub fn snapshot(&self) -> Vec<u8> {
        self.medium.borrow().bytes.clone()
    }
}

/// A handle on a [`VolatileDisk`].
pub struct VolatileDevice {
    disk: VolatileDisk,
    life: u64,
}

impl VolatileDevice {
    /// Checks the request and that this handle's life is the disk's.
    fn check(&self, op: BlockOp, offset: u64, len: u64, buf: Option<&IoBuffer>) -> BlockResult<()> {
        self.disk.geometry.check(op, &self.disk.name, offset, len, buf)?;
        self.check_life(op, offset)
    }

    /// Fails a handle opened before the last crash.
    fn check_life(&self, op: BlockOp, offset: u64) -> BlockResult<()> {
        if self.disk.medium.borrow().life != self.life {
            return Err(BlockError::new(op, &self.disk.name, offset, BlockErrorKind::Injected));
        }
        Ok(())
    }

    fn store(&self, offset: u64, written: &[u8]) {
        let mut medium = self.disk.medium.borrow_mut();
        let at = offset as usize;
        let before = medium.bytes[at..at + written.len()].to_vec();
        medium.bytes[at..at + written.len()].copy_from_slice(written);
        medium.unflushed.push(Unflushed { offset, written: written.to_vec(), before });
    }
}

impl BlockDevice for VolatileDevice {
    fn name(&self) -> &str {
        &self.disk.name
    }

    fn geometry(&self) -> Geometry {
        self.disk.geometry
    }

    fn alloc_buffer(&self, len: usize) -> IoBuffer {
        IoBuffer::aligned(len, self.disk.geometry.buffer_alignment_bytes as usize)
    }

    async fn read(&self, mut buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>) {
        if let Err(error) = self.check(BlockOp::Read, offset, buf.len() as u64, Some(&buf)) {
            return (buf, Err(error));
        }
        let at = offset as usize;
        let len = buf.len();
        buf.as_mut_slice().copy_from_slice(&self.disk.medium.borrow().bytes[at..at + len]);
        (buf, Ok(()))
    }

    async fn write(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>) {
        if let Err(error) = self.check(BlockOp::Write, offset, buf.len() as u64, Some(&buf)) {
            return (buf, Err(error));
        }
        self.store(offset, buf.as_slice());
        (buf, Ok(()))
    }

    async fn flush(&self) -> BlockResult<()> {
        self.check_life(BlockOp::Flush, 0)?;
        self.disk.medium.borrow_mut().unflushed.clear();
        Ok(())
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.check(BlockOp::WriteZeroes, offset, len, None)?;
        self.store(offset, &vec![0; len as usize]);
        Ok(())
    }

    async fn deallocate(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.check(BlockOp::Deallocate, offset, len, None)?;
        self.store(offset, &vec![0; len as usize]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_of(byte: u8) -> IoBuffer {
        let mut buf = IoBuffer::aligned(4096, 4096);
        buf.as_mut_slice().fill(byte);
        buf
    }

    fn run(test: impl Future<Output = ()> + 'static) {
        futures_lite::future::block_on(test);
    }

    #[test]
    fn flushed_writes_survive_a_crash_and_old_handles_fail_after_it() {
        run(async {
            let disk = VolatileDisk::new(1 << 20, 4096);
            let device = disk.handle();
            device.write(block_of(1), 0).await.1.expect("write");
            device.flush().await.expect("flush");
            for seed in 0..16 {
                disk.crash(seed);
                assert_eq!(disk.snapshot()[..4096], [1u8; 4096], "seed {seed}");
            }
            assert!(device.read(IoBuffer::aligned(4096, 4096), 0).await.1.is_err(), "a handle of an old life");
            let (read, result) = disk.handle().read(IoBuffer::aligned(4096, 4096), 0).await;
            result.expect("read");
            assert_eq!(read.as_slice(), &[1u8; 4096]);
        });
    }

    #[test]
    fn unflushed_writes_are_kept_lost_or_torn_by_block() {
        run(async {
            let mut seen = CrashReport::default();
            for seed in 0..64 {
                let disk = VolatileDisk::new(1 << 20, 4096);
                let device = disk.handle();
                let mut eight = IoBuffer::aligned(8 * 4096, 4096);
                eight.as_mut_slice().fill(7);
                device.write(eight, 0).await.1.expect("write");
                assert_eq!(disk.unflushed_writes(), 1);
                let report = disk.crash(seed);
                seen.kept += report.kept;
                seen.lost += report.lost;
                seen.torn += report.torn;
                let bytes = disk.snapshot();
                for block in bytes[..8 * 4096].chunks(4096) {
                    assert!(block == [7u8; 4096] || block == [0u8; 4096], "a block is whole or untouched");
                }
                let kept = bytes[..8 * 4096].chunks(4096).filter(|block| block[0] == 7).count();
                match report {
                    CrashReport { kept: 1, .. } => assert_eq!(kept, 8),
                    CrashReport { lost: 1, .. } => assert_eq!(kept, 0),
                    _ => assert_eq!(report.torn, 1),
                }
            }
            assert!(seen.kept > 0 && seen.lost > 0 && seen.torn > 0, "{seen:?}");
        });
    }

    #[test]
    fn overlapping_unflushed_writes_resolve_in_order() {
        run(async {
            for seed in 0..64 {
                let disk = VolatileDisk::new(1 << 20, 4096);
                let device = disk.handle();
                device.write(block_of(1), 0).await.1.expect("write");
                device.flush().await.expect("flush");
                device.write(block_of(2), 0).await.1.expect("write");
                device.write(block_of(3), 0).await.1.expect("write");
                disk.crash(seed);
                let first = disk.snapshot()[0];
                assert!([1, 2, 3].contains(&first), "seed {seed}: {first}");
            }
        });
    }
}
