//! The NVMe tier of a shard: a log of fixed-size regions (CacheLib Navy's and foyer's design).
//!
//! Records are appended to the *open* region's buffer in DRAM; when it is full the region is *sealed*: its
//! buffer is written with large sequential writes (in chunks of at most the device's maximum transfer, all in
//! flight together) and made durable, while the next region fills a spare buffer. A `durable` put does not
//! wait for the region to fill: it writes the blocks of the open buffer that are not durable yet and flushes
//! (group commit: every put that arrived meanwhile is made durable by the same write).
//!
//! Regions are dealt to shards round robin over the namespaces (region `r` of the node to shard
//! `r % shards`), so one shard's writes spread over every namespace. Each shard reclaims its own regions
//! FIFO (the shard decides what to reinsert, since that needs its index). A freed region's header is zeroed
//! on the device before the region is reused, so a crash can never bring back its previous generation.
//!
//! This module holds the log's state and its device I/O; the shard drives it and holds its lock.

use std::collections::VecDeque;
use std::rc::Rc;

use glommio::sync::Semaphore;
use strata_nvme::{BlockDevice, BlockError, IoBuffer};

use crate::record::{END_MARK_BYTES, RECORD_HEADER_BYTES, REGION_HEADER_BYTES, RecordHeader, RegionHeader};

/// A location on the tier: region id in the high 32 bits, byte offset in the region in the low 32.
pub fn location(region: u32, offset: u32) -> u64 {
    (u64::from(region) << 32) | u64::from(offset)
}

/// The region and offset of a location.
pub fn split_location(location: u64) -> (u32, u32) {
    ((location >> 32) as u32, location as u32)
}

/// Where a region is and what it is doing.
pub struct RegionInfo {
    /// Which namespace of the shard's list.
    pub device: usize,
    /// Byte offset of the region in that namespace.
    pub device_offset: u64,
    /// Generation, 0 while free.
    pub seq: u64,
    /// Its state.
    pub state: RegionState,
    /// Closed when a sealing write completes (readers of a sealing region wait on it).
    pub sealed: Option<Rc<Semaphore>>,
}

/// The life of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionState {
    /// Holds nothing.
    Free,
    /// Filling in DRAM.
    Open,
    /// Its buffer is being written.
    Sealing,
    /// On the device.
    Sealed,
}

/// A region-sized buffer in device-aligned chunks.
pub struct RegionBuffer {
    chunks: Vec<IoBuffer>,
    chunk_bytes: usize,
}

impl RegionBuffer {
    /// A buffer of `region_bytes` in chunks of `chunk_bytes`, from `device`'s I/O memory.
    pub fn new(device: &impl BlockDevice, region_bytes: u64, chunk_bytes: usize) -> Self {
        let count = (region_bytes as usize).div_ceil(chunk_bytes);
        Self { chunks: (0..count).map(|_| device.alloc_buffer(chunk_bytes)).collect(), chunk_bytes }
    }

    /// Copies `bytes` in at `offset`.
    pub fn write_at(&mut self, mut offset: usize, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let chunk = offset / self.chunk_bytes;
            let within = offset % self.chunk_bytes;
            let take = bytes.len().min(self.chunk_bytes - within);
            self.chunks[chunk].as_mut_slice()[within..within + take].copy_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            offset += take;
        }
    }

    /// Copies `len` bytes at `offset` out.
    pub fn read_at(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        let mut at = offset;
        while out.len() < len {
            let chunk = at / self.chunk_bytes;
            let within = at % self.chunk_bytes;
            let take = (len - out.len()).min(self.chunk_bytes - within);
            out.extend_from_slice(&self.chunks[chunk].as_slice()[within..within + take]);
            at += take;
        }
        out
    }
}

/// The region being filled.
pub struct OpenRegion {
    /// Its id.
    pub id: u32,
    /// Its buffer.
    pub buffer: RegionBuffer,
    /// Bytes used (header and records).
    pub used: usize,
    /// Bytes from the start known durable on the device (a multiple of the block size).
    pub durable: usize,
}

/// The log's state.
pub struct RegionLog {
    /// Bytes per region.
    pub region_bytes: u64,
    /// Bytes per write of a region (≤ every device's maximum transfer).
    pub chunk_bytes: usize,
    /// The largest logical block of the shard's devices.
    pub block_bytes: usize,
    /// This shard's regions, by id.
    pub regions: Vec<RegionInfo>,
    /// Free regions.
    pub free: VecDeque<u32>,
    /// Sealed (or sealing) regions, oldest first.
    pub sealed: VecDeque<u32>,
    /// The open region.
    pub open: Option<OpenRegion>,
    /// Buffers not in use.
    pub spare: Vec<RegionBuffer>,
    /// The next generation number.
    pub next_seq: u64,
    /// The shard.
    pub shard: u32,
    /// The tier's format id.
    pub format_id: u64,
    /// This start's epoch.
    pub epoch: u64,
    /// The node is stopping: the open region was sealed for the last time, and no region opens again.
    pub closed: bool,
}

impl RegionLog {
    /// The largest record a region holds.
    pub fn max_record_bytes(&self) -> usize {
        self.region_bytes as usize - REGION_HEADER_BYTES - RECORD_HEADER_BYTES
    }

    /// Regions in use (open, sealing, sealed).
    pub fn used_regions(&self) -> usize {
        self.regions.len() - self.free.len()
    }

    /// Appends a record to the open region if it has room; returns its location. `covered`: what follows
    /// the header under its crc — the key, then the links of a linked record.
    pub fn try_append(&mut self, header: RecordHeader, covered: &[u8], value: &[&[u8]]) -> Option<u64> {
        let open = self.open.as_mut()?;
        let record_len = header.record_len();
        // Room is always left for the seal record.
        if open.used + record_len + RECORD_HEADER_BYTES > self.region_bytes as usize {
            return None;
        }
        let seq = self.regions[open.id as usize].seq;
        let header = RecordHeader { region_seq: seq, ..header };
        let at = open.used;
        open.buffer.write_at(at, &header.encode(covered, self.format_id));
        open.buffer.write_at(at + RECORD_HEADER_BYTES, covered);
        let mut position = at + RECORD_HEADER_BYTES + covered.len();
        for part in value {
            open.buffer.write_at(position, part);
            position += part.len();
        }
        let padding = at + record_len - position;
        open.buffer.write_at(position, &[0u8; 8][..padding]);
        open.used += record_len;
        write_end_mark(&mut open.buffer, open.used, self.region_bytes as usize);
        Some(location(open.id, at as u32))
    }

    /// Appends the open region's seal record: the last, telling recovery that the region was written
    /// whole (`try_append` always leaves room for it).
    pub fn append_seal(&mut self) {
        let Some(open) = self.open.as_mut() else { return };
        let header = RecordHeader::seal(self.regions[open.id as usize].seq);
        open.buffer.write_at(open.used, &header.encode(&[], self.format_id));
        open.used += RECORD_HEADER_BYTES;
        write_end_mark(&mut open.buffer, open.used, self.region_bytes as usize);
    }

    /// Opens the next free region into a spare buffer; the caller made sure both exist.
    pub fn open_next(&mut self) -> bool {
        if self.closed || self.open.is_some() || self.free.is_empty() || self.spare.is_empty() {
            return self.open.is_some();
        }
        let (Some(id), Some(mut buffer)) = (self.free.pop_front(), self.spare.pop()) else { return false };
        let seq = self.next_seq;
        self.next_seq += 1;
        let region = &mut self.regions[id as usize];
        region.seq = seq;
        region.state = RegionState::Open;
        let header = RegionHeader {
            region_seq: seq,
            shard: self.shard,
            region_id: id,
            format_id: self.format_id,
            epoch: self.epoch,
        };
        buffer.write_at(0, &header.encode());
        write_end_mark(&mut buffer, REGION_HEADER_BYTES, self.region_bytes as usize);
        self.open = Some(OpenRegion { id, buffer, used: REGION_HEADER_BYTES, durable: 0 });
        true
    }
}

/// Zeroes the `END_MARK_BYTES` after a region's last record (if the region has room for them): written
/// with the records, they tell recovery that the records end there.
fn write_end_mark(buffer: &mut RegionBuffer, used: usize, region_bytes: usize) {
    let len = END_MARK_BYTES.min(region_bytes - used);
    buffer.write_at(used, &[0u8; END_MARK_BYTES][..len]);
}

/// Bytes of a region's buffer to write when `used` bytes hold records: through the end mark, in whole
/// blocks, within the region.
pub fn written_len(used: usize, block_bytes: usize, region_bytes: usize) -> usize {
    (used + END_MARK_BYTES).next_multiple_of(block_bytes).min(region_bytes)
}

/// Writes `buffer`'s first `used` bytes and the end mark (rounded up to whole blocks) at `device_offset`, every chunk in
/// flight at once, then flushes. Returns the buffer for reuse.
pub async fn write_region<D: BlockDevice + 'static>(
    devices: Rc<Vec<D>>,
    device: usize,
    device_offset: u64,
    buffer: RegionBuffer,
    used: usize,
    block_bytes: usize,
    region_bytes: usize,
) -> (RegionBuffer, Result<(), BlockError>) {
    let chunk_bytes = buffer.chunk_bytes;
    let write_len = written_len(used, block_bytes, region_bytes);
    enum Pending {
        Write(glommio::Task<(IoBuffer, Result<(), BlockError>)>),
        Keep(IoBuffer),
    }
    let mut pending = Vec::with_capacity(buffer.chunks.len());
    for (index, chunk) in buffer.chunks.into_iter().enumerate() {
        let start = index * chunk_bytes;
        if start >= write_len {
            pending.push(Pending::Keep(chunk));
            continue;
        }
        let devices = Rc::clone(&devices);
        let len = (write_len - start).min(chunk_bytes);
        pending.push(Pending::Write(glommio::spawn_local(async move {
            let device = &devices[device];
            if len == chunk.len() {
                device.write(chunk, device_offset + start as u64).await
            } else {
                let mut part = device.alloc_buffer(len);
                part.as_mut_slice().copy_from_slice(&chunk.as_slice()[..len]);
                let (_, result) = device.write(part, device_offset + start as u64).await;
                (chunk, result)
            }
        })));
    }
    let mut result = Ok(());
    let mut chunks = Vec::with_capacity(pending.len());
    for item in pending {
        let chunk = match item {
            Pending::Keep(chunk) => chunk,
            Pending::Write(task) => {
                let (chunk, written) = task.await;
                if result.is_ok() {
                    result = written;
                }
                chunk
            }
        };
        chunks.push(chunk);
    }
    if result.is_ok() {
        result = devices[device].flush().await;
    }
    (RegionBuffer { chunks, chunk_bytes }, result)
}

/// Copies bytes `[from, to)` of an open region's buffer (block aligned) and writes them, then flushes.
pub async fn write_partial(
    devices: &[impl BlockDevice],
    device: usize,
    device_offset: u64,
    bytes: Vec<u8>,
    from: usize,
    chunk_bytes: usize,
) -> Result<(), BlockError> {
    let device = &devices[device];
    let mut at = 0;
    while at < bytes.len() {
        let len = (bytes.len() - at).min(chunk_bytes);
        let mut buffer = device.alloc_buffer(len);
        buffer.as_mut_slice().copy_from_slice(&bytes[at..at + len]);
        device.write(buffer, device_offset + (from + at) as u64).await.1?;
        at += len;
    }
    device.flush().await
}

/// Bytes read from the device for one record: block-aligned pieces, and where the record starts in them.
pub struct Staged {
    pieces: Vec<IoBuffer>,
    start: usize,
    len: usize,
}

impl Staged {
    /// From bytes in memory (a record read out of the open region's buffer).
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        let len = bytes.len();
        Self { pieces: vec![IoBuffer::from_vec(bytes)], start: 0, len }
    }

    /// Total bytes of the record.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The slices covering `[offset, offset + len)` of the record, in order.
    pub fn slices(&self, offset: usize, len: usize) -> Vec<&[u8]> {
        let mut out = Vec::new();
        let mut skip = self.start + offset;
        let mut remaining = len;
        for piece in &self.pieces {
            let bytes = piece.as_slice();
            if skip >= bytes.len() {
                skip -= bytes.len();
                continue;
            }
            let take = remaining.min(bytes.len() - skip);
            out.push(&bytes[skip..skip + take]);
            remaining -= take;
            skip = 0;
            if remaining == 0 {
                break;
            }
        }
        out
    }

    /// The crc32c of `[offset, offset + len)`, over the pieces in order.
    pub fn crc(&self, offset: usize, len: usize) -> u32 {
        self.slices(offset, len).iter().fold(0, |crc, part| strata_proto::crc32c_append(crc, part))
    }

    /// Copies `[offset, offset + len)` out.
    pub fn copy(&self, offset: usize, len: usize) -> Vec<u8> {
        self.slices(offset, len).concat()
    }
}

/// Reads `len` bytes at `offset` of a region on its device, in block-aligned pieces of at most
/// `chunk_bytes`.
pub async fn read_range(
    devices: &[impl BlockDevice],
    device: usize,
    region_offset: u64,
    offset: usize,
    len: usize,
    chunk_bytes: usize,
) -> Result<Staged, BlockError> {
    let device = &devices[device];
    let block = device.geometry().logical_block_bytes as usize;
    let first = offset / block * block;
    let end = (offset + len).next_multiple_of(block);
    let mut pieces = Vec::with_capacity((end - first).div_ceil(chunk_bytes));
    let mut at = first;
    while at < end {
        let piece_len = (end - at).min(chunk_bytes);
        let (buffer, result) = device.read(device.alloc_buffer(piece_len), region_offset + at as u64).await;
        result?;
        pieces.push(buffer);
        at += piece_len;
    }
    Ok(Staged { pieces, start: offset - first, len })
}
