//! The `uring` backend: a regular file or a block device through glommio's `DmaFile` (O_DIRECT, io_uring),
//! one queue per executor.
//!
//! glommio quirk (LAB.md): the first time a process opens a `DmaFile` on a device, glommio probes polled I/O
//! by reading the first block. If that block holds no data (an empty file, or a hole), the probe "succeeds",
//! glommio marks the device pollable for the whole process, and every later O_DIRECT read fails with
//! `EOPNOTSUPP` while writes succeed. So before opening, [`UringDevice::open`] makes sure the file's first
//! block is real data (writing zeroes into a hole changes no byte a reader sees), and a read that still fails
//! with `EOPNOTSUPP` is reported as that quirk, with the fix.

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::io::{DmaFile, OpenOptions};

use crate::buffer::IoBuffer;
use crate::device::{BlockDevice, Geometry};
use crate::environment::check_direct_io;
use crate::error::{BlockError, BlockErrorKind, BlockOp, BlockResult};

/// The largest transfer we submit as one command. The kernel splits larger requests for the device itself;
/// this bounds the registered memory one I/O takes from the executor's pool.
const MAX_TRANSFER_BYTES: u64 = 8 << 20;
/// The first block written to give the polled-I/O probe real data to read.
const PROBE_BLOCK_BYTES: usize = 4096;

/// How to open a `uring` device.
#[derive(Clone, Debug)]
pub struct UringOptions {
    /// For a regular file: create it if missing and extend it to this size if shorter. `None`: use the file
    /// (or block device) as it is.
    pub size_bytes: Option<u64>,
    /// Open read-only.
    pub read_only: bool,
}

/// A file or block device driven through io_uring with O_DIRECT. Must be opened and used on one glommio
/// executor.
pub struct UringDevice {
    name: String,
    path: PathBuf,
    file: DmaFile,
    geometry: Geometry,
}

impl UringDevice {
    /// Opens `path`: prepares the file (see the module doc), checks O_DIRECT support, opens it through
    /// glommio and reads its first block to prove reads work.
    pub async fn open(path: &Path, options: &UringOptions) -> BlockResult<Self> {
        let name = path.display().to_string();
        let open_error = |kind| BlockError::new(BlockOp::Open, &name, 0, kind);
        let capacity_bytes = prepare_file(path, options).map_err(|error| open_error(BlockErrorKind::Io(error)))?;
        check_direct_io(path)?;
        let file = OpenOptions::new()
            .read(true)
            .write(!options.read_only)
            .dma_open(path)
            .await
            .map_err(|error| open_error(BlockErrorKind::Io(error.into())))?;
        let logical_block_bytes = file.alignment().max(512);
        let capacity_bytes = capacity_bytes - capacity_bytes % logical_block_bytes;
        if capacity_bytes == 0 {
            return Err(open_error(BlockErrorKind::Environment(format!(
                "{name} is empty: give a size (e.g. --size) to create or extend it"
            ))));
        }
        let device = Self {
            geometry: Geometry {
                capacity_bytes,
                logical_block_bytes,
                max_transfer_bytes: MAX_TRANSFER_BYTES,
                buffer_alignment_bytes: logical_block_bytes,
            },
            name,
            path: path.to_path_buf(),
            file,
        };
        let probe = device.alloc_buffer(logical_block_bytes as usize);
        let (_, result) = device.read(probe, 0).await;
        result?;
        Ok(device)
    }

    /// The path opened.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A checked range read into glommio's own registered buffer.
    async fn read_aligned(&self, offset: u64, len: usize) -> BlockResult<IoBuffer> {
        match self.file.read_at_aligned(offset, len).await {
            Ok(result) if result.len() == len => Ok(IoBuffer::from_read(result)),
            Ok(result) => {
                let kind = BlockErrorKind::ShortTransfer { done: result.len() as u64, len: len as u64 };
                Err(BlockError::new(BlockOp::Read, &self.name, offset, kind))
            }
            Err(error) => Err(self.io_error(BlockOp::Read, offset, error.into())),
        }
    }

    fn io_error(&self, op: BlockOp, offset: u64, error: std::io::Error) -> BlockError {
        // glommio's errors convert to an `io::Error` that keeps the kind but not always the raw errno.
        if error.raw_os_error() == Some(libc::EOPNOTSUPP) || error.kind() == std::io::ErrorKind::Unsupported {
            return BlockError::new(
                op,
                &self.name,
                offset,
                BlockErrorKind::Environment(
                    "O_DIRECT read failed with EOPNOTSUPP: glommio marked this device as supporting polled I/O \
                     because the first file this process opened on it was empty (glommio quirk). Open a file \
                     whose first block holds data first; strata-nvme's UringDevice::open does this for its own \
                     files, so another DmaFile was opened before it"
                        .into(),
                ),
            );
        }
        BlockError::new(op, &self.name, offset, BlockErrorKind::Io(error))
    }
}

/// Creates or extends a regular file as asked and makes its first block real data; returns the capacity.
pub(crate) fn prepare_file(path: &Path, options: &UringOptions) -> std::io::Result<u64> {
    let exists = path.exists();
    if exists && std::fs::metadata(path)?.file_type().is_block_device() {
        let mut device = std::fs::File::open(path)?;
        return device.seek(SeekFrom::End(0));
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(!options.read_only || !exists)
        .create(!options.read_only)
        .truncate(false)
        .open(path)?;
    let mut length = file.metadata()?.len();
    if let Some(size_bytes) = options.size_bytes
        && length < size_bytes
        && !options.read_only
    {
        file.set_len(size_bytes)?;
        length = size_bytes;
    }
    if length >= PROBE_BLOCK_BYTES as u64 && !first_block_has_data(&file) && !options.read_only {
        file.seek(SeekFrom::Start(0))?;
        file.write_all(&[0u8; PROBE_BLOCK_BYTES])?;
        file.sync_data()?;
    }
    Ok(length)
}

/// Whether the first byte of the file is in a data extent rather than a hole (`SEEK_DATA`).
fn first_block_has_data(file: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: lseek on a descriptor we own changes only that descriptor's position.
    #[allow(unsafe_code)]
    let data_offset = unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_DATA) };
    data_offset == 0
}

impl BlockDevice for UringDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn alloc_buffer(&self, len: usize) -> IoBuffer {
        IoBuffer::from_dma(self.file.alloc_dma_buffer(len))
    }

    async fn read(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>) {
        let _pending = crate::tcp::stream::ReactorIo::start();
        if let Err(error) = self.geometry.check(BlockOp::Read, &self.name, offset, buf.len() as u64, Some(&buf)) {
            return (buf, Err(error));
        }
        match self.read_aligned(offset, buf.len()).await {
            Ok(read) => (read, Ok(())),
            Err(error) => (buf, Err(error)),
        }
    }

    async fn write(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>) {
        let _pending = crate::tcp::stream::ReactorIo::start();
        let len = buf.len();
        if let Err(error) = self.geometry.check(BlockOp::Write, &self.name, offset, len as u64, Some(&buf)) {
            return (buf, Err(error));
        }
        let dma = match buf.shared_dma() {
            Some(dma) => dma,
            None => {
                let mut staging = self.file.alloc_dma_buffer(len);
                staging.as_bytes_mut().copy_from_slice(buf.as_slice());
                Rc::new(staging)
            }
        };
        let result = match self.file.write_rc_at(dma, offset).await {
            Ok(done) if done == len => Ok(()),
            Ok(done) => Err(BlockError::new(
                BlockOp::Write,
                &self.name,
                offset,
                BlockErrorKind::ShortTransfer { done: done as u64, len: len as u64 },
            )),
            Err(error) => Err(self.io_error(BlockOp::Write, offset, error.into())),
        };
        (buf, result)
    }

    async fn flush(&self) -> BlockResult<()> {
        let _pending = crate::tcp::stream::ReactorIo::start();
        self.file.fdatasync().await.map_err(|error| self.io_error(BlockOp::Flush, 0, error.into()))
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.geometry.check(BlockOp::WriteZeroes, &self.name, offset, len, None)?;
        let zeroes = |len: u64| {
            // glommio's buffers are not zeroed on allocation.
            let mut buffer = self.file.alloc_dma_buffer(len as usize);
            buffer.as_bytes_mut().fill(0);
            Rc::new(buffer)
        };
        let chunk_bytes = len.min(1 << 20);
        let full_chunk = zeroes(chunk_bytes);
        let end = offset + len;
        let mut position = offset;
        while position < end {
            let this_chunk = chunk_bytes.min(end - position);
            let source = if this_chunk == chunk_bytes { Rc::clone(&full_chunk) } else { zeroes(this_chunk) };
            let done = self
                .file
                .write_rc_at(source, position)
                .await
                .map_err(|error| self.io_error(BlockOp::WriteZeroes, position, error.into()))?;
            if done as u64 != this_chunk {
                let kind = BlockErrorKind::ShortTransfer { done: done as u64, len: this_chunk };
                return Err(BlockError::new(BlockOp::WriteZeroes, &self.name, position, kind));
            }
            position += this_chunk;
        }
        Ok(())
    }

    async fn deallocate(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.geometry.check(BlockOp::Deallocate, &self.name, offset, len, None)?;
        self.file
            .deallocate(offset, len)
            .await
            .map_err(|error| self.io_error(BlockOp::Deallocate, offset, error.into()))
    }
}
