//! The shared memory one local connection registered: sealed memfds the node mapped, by id, and the one
//! copy between a region and the node's own memory that a shared item costs.
//!
//! Safety of the mapping rests on the seal: a region is accepted only if the client sealed it against
//! shrinking (`F_SEAL_SHRINK`), so no page the node mapped can vanish under a copy (which would raise
//! SIGBUS in the node). The client may still write its memory while the node copies: the node keeps no Rust
//! reference to a region, only raw copies and a get's read-back for its crc, and checks a put's crc on its
//! own copy of the bytes.
//!
//! A region stays mapped until the connection releases it or closes, so a client that dies mid-transfer
//! leaves the node a valid mapping, unmapped when its connection is closed.

use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;

use strata_proto::SharedSpan;

/// Regions one connection may hold at once.
pub(super) const MAX_REGIONS: usize = 64;
/// Bytes one connection may hold mapped at once. Pages of a region the node writes (a get into memory
/// the client never touched) are allocated then; the bound caps what a client can make the node allocate.
pub(super) const MAX_REGION_BYTES: u64 = 64 << 30;

/// Why a REGISTER was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegisterError {
    /// The frame came with no descriptor.
    #[error("no descriptor came with the REGISTER")]
    NoDescriptor,
    /// The descriptor is not a memfd sealed against shrinking.
    #[error("the memory is not a memfd sealed against shrinking (F_SEAL_SHRINK)")]
    NotSealed,
    /// An empty file.
    #[error("an empty region")]
    Empty,
    /// Past [`MAX_REGIONS`] or [`MAX_REGION_BYTES`].
    #[error("past the connection's bound of shared memory ({MAX_REGIONS} regions, {MAX_REGION_BYTES} bytes)")]
    Bound,
    /// `fstat` or `mmap` failed.
    #[error("mapping the region: {0}")]
    Map(std::io::Error),
}

impl RegisterError {
    pub(crate) fn status(&self) -> strata_proto::Status {
        match self {
            RegisterError::Bound => strata_proto::Status::Quota,
            _ => strata_proto::Status::Invalid,
        }
    }
}

/// Bytes copied before they are read back for the check: read back from this core's L2 cache, and long
/// enough for the copy's string stores to run at full speed (16 KiB chunks made a 4 MiB get 15–25 % slower
/// here, a chunk of the whole value no faster).
const CHECKED_CHUNK_BYTES: usize = 256 << 10;

/// Why a shared get's value is not in the client's memory as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CopyFault {
    /// The span is not in a region of the connection, or the value does not fit in it.
    NotTheConnections,
    /// The copy's crc32c is not the value's: the client wrote its memory during the copy, or the copy
    /// failed.
    Differs,
}

impl CopyFault {
    /// The item's answer: `Invalid` for a span that is not the connection's, `TransferChecksum` for a copy
    /// that differs (the node's own bytes intact: see `get::damaged` for the other case).
    pub(crate) fn status(self) -> strata_proto::Status {
        match self {
            CopyFault::NotTheConnections => strata_proto::Status::Invalid,
            CopyFault::Differs => strata_proto::Status::TransferChecksum,
        }
    }
}

/// A memfd mapped shared, read-write, for the life of the region.
struct Region {
    id: u32,
    base: NonNull<u8>,
    len: usize,
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `base` and `len` are the mapping `map` made, unmapped once, here.
        #[allow(unsafe_code)]
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// The regions of one connection.
#[derive(Default)]
pub(crate) struct SharedRegions {
    regions: Vec<Region>,
    next_id: u32,
}

impl SharedRegions {
    /// Maps a client's memfd; returns its id.
    pub(crate) fn register(&mut self, memory: OwnedFd) -> Result<u32, RegisterError> {
        let fd = memory.as_raw_fd();
        // SAFETY: fcntl(F_GET_SEALS) reads the descriptor's seals; it has no memory effects.
        #[allow(unsafe_code)]
        let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(RegisterError::NotSealed);
        }
        let len = std::fs::File::from(memory.try_clone().map_err(RegisterError::Map)?)
            .metadata()
            .map_err(RegisterError::Map)?
            .len();
        if len == 0 {
            return Err(RegisterError::Empty);
        }
        let held: u64 = self.regions.iter().map(|region| region.len as u64).sum();
        if self.regions.len() >= MAX_REGIONS || held + len > MAX_REGION_BYTES {
            return Err(RegisterError::Bound);
        }
        let len = len as usize;
        // SAFETY: a fresh shared mapping of `len` bytes of the file, at an address the kernel picks; the
        // seal keeps the file at least this long for as long as it is mapped.
        #[allow(unsafe_code)]
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        if base == libc::MAP_FAILED {
            return Err(RegisterError::Map(std::io::Error::last_os_error()));
        }
        let base = NonNull::new(base.cast::<u8>()).ok_or(RegisterError::Map(std::io::ErrorKind::Other.into()))?;
        self.next_id += 1;
        self.regions.push(Region { id: self.next_id, base, len });
        Ok(self.next_id)
    }

    /// Unmaps region `id`; false if there is none.
    pub(crate) fn release(&mut self, id: u32) -> bool {
        let before = self.regions.len();
        self.regions.retain(|region| region.id != id);
        self.regions.len() != before
    }

    /// The first byte of `span` in its region, if the region exists and holds the whole span.
    fn place(&self, span: &SharedSpan) -> Option<*mut u8> {
        let region = self.regions.iter().find(|region| region.id == span.region)?;
        let end = span.end()?;
        if end > region.len as u64 {
            return None;
        }
        // SAFETY: `offset` ≤ `end` ≤ the mapping's length, so the pointer stays within the mapping.
        #[allow(unsafe_code)]
        Some(unsafe { region.base.as_ptr().add(span.offset as usize) })
    }

    /// Copies `pieces`, in order, to the start of `span` (a get) and checks the copy against `crc`, the
    /// value's crc32c, in the client's memory.
    ///
    /// The check reads each chunk of the copy back while it is still in this core's cache: it costs the
    /// crc's arithmetic, where the client's own pass would pull every line back across cores (the larger
    /// part of a small batch's call, docs/BENCHMARKS.md). It covers what the client's pass covered, the
    /// bytes in its memory against the crc stored with the value, so a client told so in HELLO skips its
    /// pass ([`strata_proto::HELLO_CHECKED_COPIES`]).
    pub(crate) fn copy_into(&self, span: &SharedSpan, pieces: &[&[u8]], crc: u32) -> Result<(), CopyFault> {
        let total: usize = pieces.iter().map(|piece| piece.len()).sum();
        let Some(mut at) = self.place(span).filter(|_| total <= span.len as usize) else {
            return Err(CopyFault::NotTheConnections);
        };
        let mut copied = 0u32;
        for chunk in pieces.iter().flat_map(|piece| piece.chunks(CHECKED_CHUNK_BYTES)) {
            // SAFETY: the destination lies within the mapping (`place` checked the span, `total` fits in
            // it); the source is the node's own memory, which no mapping of a client overlaps. The slice
            // read back lives for the crc alone, which reads each byte once: a client writing its memory
            // meanwhile can change only the crc, and fails its own get.
            #[allow(unsafe_code)]
            unsafe {
                std::ptr::copy_nonoverlapping(chunk.as_ptr(), at, chunk.len());
                copied = strata_proto::crc32c_append(copied, std::slice::from_raw_parts(at, chunk.len()));
                at = at.add(chunk.len());
            }
        }
        if copied != crc {
            return Err(CopyFault::Differs);
        }
        Ok(())
    }

    /// Copies `span` into `destination` (a put; as long as the span); false if the span is not the
    /// connection's.
    pub(crate) fn copy_out(&self, span: &SharedSpan, destination: &mut [u8]) -> bool {
        let Some(from) = self.place(span).filter(|_| destination.len() == span.len as usize) else { return false };
        // SAFETY: the source lies within the mapping (checked by `place`) and the destination is the
        // node's own memory, `span.len` bytes long.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::copy_nonoverlapping(from, destination.as_mut_ptr(), destination.len());
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    /// A memfd of `len` bytes sealed against shrinking, as a client registers.
    #[allow(unsafe_code)]
    fn sealed_memfd(len: i64) -> OwnedFd {
        // SAFETY: memfd_create with a NUL-terminated name; ftruncate and fcntl on the descriptor it made,
        // which the OwnedFd then owns alone.
        unsafe {
            let fd = libc::memfd_create(c"checked-copy".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
            assert!(fd >= 0);
            assert_eq!(libc::ftruncate(fd, len), 0);
            assert_eq!(libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
            OwnedFd::from_raw_fd(fd)
        }
    }

    /// Reads `len` bytes at `offset` of the memfd, through the file rather than the node's mapping.
    fn file_bytes(memory: &OwnedFd, offset: u64, len: usize) -> Vec<u8> {
        use std::os::unix::fs::FileExt;
        let file = std::fs::File::from(memory.try_clone().expect("dup"));
        let mut bytes = vec![0u8; len];
        file.read_exact_at(&mut bytes, offset).expect("read");
        bytes
    }

    #[test]
    fn a_copy_is_answered_only_when_it_matches_the_values_crc_in_the_clients_memory() {
        let memory = sealed_memfd(1 << 20);
        let mut regions = SharedRegions::default();
        let region = regions.register(memory.try_clone().expect("dup")).expect("register");
        // Pieces across the check's chunks, at an odd offset: a value the tier returns in two buffers.
        let len = 2 * CHECKED_CHUNK_BYTES as u32 + 1_000;
        let value: Vec<u8> = (0..len).map(|at| (at.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        let (head, tail) = value.split_at(CHECKED_CHUNK_BYTES + 77);
        let span = SharedSpan { region, len: 600_000, offset: 4_097 };
        let crc = strata_proto::crc32c(&value);

        assert_eq!(regions.copy_into(&span, &[head, tail], crc), Ok(()));
        assert_eq!(file_bytes(&memory, 4_097, value.len()), value, "the value is in the client's memory");

        // The same bytes under another value's crc (as if the copy had come out otherwise): refused.
        assert_eq!(regions.copy_into(&span, &[head, tail], crc ^ 1), Err(CopyFault::Differs));
        let outside = SharedSpan { offset: (1 << 20) - 10, ..span };
        assert_eq!(regions.copy_into(&outside, &[head, tail], crc), Err(CopyFault::NotTheConnections));
        let elsewhere = SharedSpan { region: region + 1, ..span };
        assert_eq!(regions.copy_into(&elsewhere, &[head, tail], crc), Err(CopyFault::NotTheConnections));
        let short = SharedSpan { len: value.len() as u32 - 1, ..span };
        assert_eq!(regions.copy_into(&short, &[head, tail], crc), Err(CopyFault::NotTheConnections));
    }
}
