//! The DRAM segment of a shard: one large anonymous mapping, 2 MiB hugepages when the machine has them
//! reserved (`MAP_HUGETLB`), normal pages otherwise (advised for transparent hugepages), carved into
//! objects by the shard's `strata-alloc` allocator.
//!
//! `unsafe` in the engine lives here and in the two guards built on [`SegmentRange`] (`shard::reads::DramPin`
//! and `shard::put::PutReservation`), besides the system calls of `sys.rs` and the server's `TCP_INFO`
//! read. Soundness rests on rules the DRAM tier and the shard keep:
//! - ranges the allocator gives out never overlap;
//! - a range is written only while it is *unpublished* (allocated, not yet in the index), through the one
//!   reservation that allocated it, and never where a reader may be looking (a progressive put's readers
//!   see only the prefix that arrived, and the reservation refuses to hand that prefix out again);
//! - a published range is only read, and is freed only when no reader holds it (the DRAM tier's pins);
//! - the mapping outlives every guard: each holds the DRAM tier, which owns the segment.
//!
//! Borrowed reads ([`Segment::bytes`]) are tied to a borrow of the segment; what must outlive a borrow (a
//! pin held across a socket send, a reservation filled across reads of the socket) holds a
//! [`SegmentRange`], whose slices are `unsafe` to take, with the contract stated there.
//!
//! Everything runs on the shard's executor thread: the segment is neither `Send` nor `Sync`.

use std::ptr::NonNull;

/// Which pages back a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageKind {
    /// 2 MiB hugepages (reserved with `/proc/sys/vm/nr_hugepages`).
    Huge,
    /// Normal pages the kernel may back with transparent 2 MiB hugepages (its THP setting allows them).
    Transparent,
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
        let base = map_anonymous(len, 0)?;
        // Transparent hugepages where the kernel allows them ("madvise" or "always"; refused under "never",
        // which leaves 4 KiB pages): gets land on values scattered over the segment, and on 4 KiB pages each
        // one walks the page table, for its prefetch and again for its copy.
        let transparent = advise(base, len, libc::MADV_HUGEPAGE).is_ok() && transparent_hugepages_allowed();
        let pages = if transparent { PageKind::Transparent } else { PageKind::Normal };
        // Dropped (unmapped) if it cannot be populated.
        let segment = Self { base, len, pages, _not_send: std::marker::PhantomData };
        // Every page faulted in now, so that puts never pay a page fault (a quarter of a 4 MiB put's time on
        // normal pages) and the memory is committed before the node says it is ready: a machine without it
        // is an error here, not a node killed for memory later.
        match advise(base, len, libc::MADV_POPULATE_WRITE) {
            Ok(()) => {}
            Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
                // Kernels before 5.14: touch a byte of each page (zero, as the page already reads).
                for offset in (0..len).step_by(4096) {
                    // SAFETY: within the fresh mapping, which nothing else has seen yet.
                    #[allow(unsafe_code)]
                    unsafe {
                        base.as_ptr().add(offset).write_volatile(0)
                    };
                }
            }
            Err(error) => return Err(error),
        }
        Ok(segment)
    }

    /// The first byte of the mapping, for a registration with a device (RDMA) that must know where the
    /// segment lies; nothing may be read or written through it outside the rules above.
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub fn start(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
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

    /// The bytes of `[offset, offset + len)`, for reading while the segment is borrowed. Sound under the
    /// module's rules: no `&mut` into a range exists where a reader looks.
    pub fn bytes(&self, offset: u64, len: usize) -> &[u8] {
        let offset = self.check(offset, len);
        // SAFETY: in bounds (checked); the mapping lives as long as `self`; by the module's rules no
        // mutable slice covers these bytes while they are read.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.base.as_ptr().add(offset), len)
        }
    }

    /// The bytes of `[offset, offset + len)` of a range just allocated, for filling while the segment is
    /// borrowed mutably (nothing else can look at a range nobody has been given yet).
    pub fn bytes_mut(&mut self, offset: u64, len: usize) -> &mut [u8] {
        let offset = self.check(offset, len);
        // SAFETY: in bounds; `&mut self` excludes every borrowed read; guards only cover ranges handed out
        // before, which the caller's fresh range does not overlap (module rules).
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(self.base.as_ptr().add(offset), len)
        }
    }

    /// A handle on `[offset, offset + len)` that outlives a borrow of the segment (see [`SegmentRange`]).
    pub fn range(&self, offset: u64, len: usize) -> SegmentRange {
        let offset = self.check(offset, len);
        SegmentRange { start: self.base.as_ptr().wrapping_add(offset), len }
    }
}

/// A range of a segment held by a guard that outlives a borrow of the segment: a reader's pin, a put's
/// reservation. It is a pointer and a length; taking a slice of it is `unsafe`, with the contract below.
#[derive(Clone, Copy, Debug)]
pub struct SegmentRange {
    start: *mut u8,
    len: usize,
}

impl SegmentRange {
    /// Bytes in the range.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `[at, at + len)` of the range, as a shorter range (panics past its end).
    pub fn sub(&self, at: usize, len: usize) -> SegmentRange {
        assert!(at.checked_add(len).is_some_and(|end| end <= self.len), "range {at}+{len} past {}", self.len);
        SegmentRange { start: self.start.wrapping_add(at), len }
    }

    /// The range's bytes, for reading.
    ///
    /// # Safety
    /// For as long as the slice lives: the segment is still mapped (the caller holds the DRAM tier), the
    /// range is not freed or reused (it is pinned, or reserved by the caller), and no mutable slice covers
    /// any of its bytes.
    #[allow(unsafe_code)]
    pub unsafe fn as_slice<'a>(&self) -> &'a [u8] {
        // SAFETY: in bounds of the mapping (made by `Segment::range` and `sub`, both checked); the rest is the
        // caller's contract.
        unsafe { std::slice::from_raw_parts(self.start, self.len) }
    }

    /// The range's bytes, for filling.
    ///
    /// # Safety
    /// For as long as the slice lives: the segment is still mapped, the range is reserved for the caller
    /// alone, and no other slice (shared or mutable) covers any of its bytes.
    #[allow(unsafe_code, clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice<'a>(&self) -> &'a mut [u8] {
        // SAFETY: in bounds of the mapping; the rest is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.start, self.len) }
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

/// Whether the kernel's THP setting lets a mapping advised `MADV_HUGEPAGE` have hugepages (not `[never]`).
fn transparent_hugepages_allowed() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|setting| !setting.contains("[never]"))
}

/// `madvise(advice)` over the mapping at `base`.
#[allow(unsafe_code)]
fn advise(base: NonNull<u8>, len: usize, advice: libc::c_int) -> std::io::Result<()> {
    // SAFETY: advice over exactly the mapping `map_anonymous` made; neither advice given here frees memory.
    if unsafe { libc::madvise(base.as_ptr().cast(), len, advice) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
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
        let mut segment = Segment::map(4 << 20, true).expect("map");
        assert!(segment.len() >= 4 << 20);
        segment.bytes_mut(4096, 5).copy_from_slice(b"hello");
        assert_eq!(segment.bytes(4096, 5), b"hello");
        assert_eq!(segment.bytes(0, 4), &[0, 0, 0, 0]);
        let range = segment.range(4096, 5);
        // SAFETY: the segment lives to the end of the test and no mutable slice covers the range.
        #[allow(unsafe_code)]
        let read = unsafe { range.sub(1, 3).as_slice() };
        assert_eq!(read, b"ell");
    }

    #[test]
    #[should_panic(expected = "past")]
    fn a_sub_range_past_its_range_is_refused() {
        let segment = Segment::map(2 << 20, false).expect("map");
        let _ = segment.range(0, 8).sub(4, 8);
    }

    #[test]
    #[should_panic(expected = "out of bounds")]
    fn a_range_past_the_end_is_refused() {
        let segment = Segment::map(2 << 20, false).expect("map");
        let _ = segment.bytes(segment.len() as u64 - 2, 4);
    }
}
