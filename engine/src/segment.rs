//! The DRAM segment of a shard: one large anonymous mapping, 2 MiB hugepages when the machine has them
//! reserved (`MAP_HUGETLB`), normal pages otherwise, carved into objects by the shard's `strata-alloc`
//! allocator.
//!
//! This is the engine's only `unsafe` module. The segment hands out byte slices of ranges the allocator
//! gave out; soundness rests on two rules the shard keeps (and asserts where it can):
//! - a range is written only while it is *unpublished* (allocated for a put that is still receiving its
//!   bytes, not yet in the index), by the one task that allocated it;
//! - a published range is only read, and is freed only when no reader holds it (the shard's pin counts).
//!   Ranges never overlap, so a writer's `&mut [u8]` never aliases a reader's `&[u8]`.
//!
//! Everything runs on the shard's executor thread: the segment is neither `Send` nor `Sync`.

use std::ptr::NonNull;

/// Which pages back a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageKind {
    /// 2 MiB hugepages (reserved with `/proc/sys/vm/nr_hugepages`).
    Huge,
    /// Normal 4 KiB pages.
    Normal,
}

const HUGE_PAGE_BYTES: usize = 2 << 20;

/// A shard's DRAM segment.
pub struct Segment {
    base: NonNull<u8>,
    len: usize,
    pages: PageKind,
    _not_send: std::marker::PhantomData<*mut u8>,
}

impl Segment {
    /// Maps `len` bytes, on hugepages when `try_huge` and the machine has enough reserved, else on normal
    /// pages (the caller reports which).
    pub fn map(len: usize, try_huge: bool) -> std::io::Result<Self> {
        let len = len.max(HUGE_PAGE_BYTES).next_multiple_of(HUGE_PAGE_BYTES);
        // Without MAP_NORESERVE: a hugepage mapping must be backed by reserved pages up front, or touching
        // a page later would be a SIGBUS rather than an error now.
        if try_huge && let Ok(base) = map_anonymous(len, libc::MAP_HUGETLB | libc::MAP_POPULATE) {
            return Ok(Self { base, len, pages: PageKind::Huge, _not_send: std::marker::PhantomData });
        }
        // MAP_POPULATE: fault every page in now, so that puts never pay a page fault (a quarter of a 4 MiB
        // put's time on normal pages) and the memory is committed before the node says it is ready.
        let base = map_anonymous(len, libc::MAP_POPULATE)?;
        Ok(Self { base, len, pages: PageKind::Normal, _not_send: std::marker::PhantomData })
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the segment is empty (never: it is at least one hugepage).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pages backing it.
    pub fn pages(&self) -> PageKind {
        self.pages
    }

    fn check(&self, offset: u64, len: usize) -> usize {
        let offset = offset as usize;
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "segment range {offset}+{len} out of bounds"
        );
        offset
    }

    /// Starts loading the line at `offset` (ignored past the end).
    pub fn prefetch(&self, offset: u64) {
        if (offset as usize) < self.len {
            crate::index::prefetch_address(self.base.as_ptr().wrapping_add(offset as usize));
        }
    }

    /// The bytes of a published range, for reading.
    ///
    /// The returned slice's lifetime is not tied to a borrow of the segment, because readers hold it across
    /// awaits (a socket send); the caller holds a pin on the range for as long as it keeps the slice.
    #[allow(unsafe_code)]
    pub fn bytes<'a>(&self, offset: u64, len: usize) -> &'a [u8] {
        let offset = self.check(offset, len);
        // SAFETY: in bounds (checked); the mapping lives as long as the shard, which outlives every
        // connection task holding a pin (the shard is dropped after its tasks); the range is not written
        // while published (module rules).
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(offset), len) }
    }

    /// The bytes of an unpublished range, for filling.
    #[allow(unsafe_code, clippy::mut_from_ref)]
    pub fn bytes_mut<'a>(&self, offset: u64, len: usize) -> &'a mut [u8] {
        let offset = self.check(offset, len);
        // SAFETY: in bounds; the allocator gave this range to exactly one put, which is the only holder of
        // a reference into it until it publishes the range (module rules), so this does not alias.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(offset), len) }
    }
}

#[allow(unsafe_code)]
fn map_anonymous(len: usize, extra_flags: libc::c_int) -> std::io::Result<NonNull<u8>> {
    // SAFETY: an anonymous private mapping at an address the kernel picks; no existing memory is touched.
    let address = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
            -1,
            0,
        )
    };
    if address == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    NonNull::new(address.cast::<u8>()).ok_or_else(|| std::io::Error::other("mmap returned null"))
}

impl Drop for Segment {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no slice outlives the shard (module rules).
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_read_back_what_was_written() {
        let segment = Segment::map(4 << 20, true).expect("map");
        assert!(segment.len() >= 4 << 20);
        segment.bytes_mut(4096, 5).copy_from_slice(b"hello");
        assert_eq!(segment.bytes(4096, 5), b"hello");
        assert_eq!(segment.bytes(0, 4), &[0, 0, 0, 0]);
    }

    #[test]
    #[should_panic(expected = "out of bounds")]
    fn a_range_past_the_end_is_refused() {
        let segment = Segment::map(2 << 20, false).expect("map");
        let _ = segment.bytes(segment.len() as u64 - 2, 4);
    }
}
