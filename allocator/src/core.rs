//! The O(1) core: regions of an arena in a doubly linked list by address, free regions in 256 size bins
//! found through a two-level bitmap, nodes from a pool reserved up front.
//!
//! Everything here counts in *units* (the arena's minimum alignment); the public front converts bytes.
//!
//! Both operations are O(1): `allocate` finds the first non-empty bin at or above the request's rounded-up
//! bin with two bit scans, takes that bin's head, and files the remainder as a new free region; `free`
//! merges the region with its free neighbours (at most two) and files the result. The optional *exact-fit
//! scan* adds a bounded look (at most `exact_fit_scan_limit` entries) into the request's rounded-down bin
//! when the bitmap search fails. That bin is where a hole of exactly the request's size lives, and
//! OffsetAllocator never looks there, which is why it strands exact-size holes of sizes that are not bin
//! values (a 4,497,408-byte KV block is 5% above its bin). With the limit at 0 the core behaves exactly like
//! OffsetAllocator.

use crate::bins::{BIN_COUNT, LAST_BIN, bin_round_down, bin_round_up};

/// Index of "no node" in the intrusive lists.
pub(crate) const NONE: u32 = u32::MAX;

/// The top bit of `Node::size_and_used` marks a region handed out.
const USED_BIT: u64 = 1 << 63;

/// One region of the arena. 32 bytes: the pool for 16 million allocations is 1 GiB of address space
/// (reserved, committed only as it is touched).
#[derive(Clone, Copy, Debug)]
struct Node {
    offset: u64,
    size_and_used: u64,
    /// Free regions: the neighbours in the bin list. Pooled nodes: `bin_next` links the pool's free list.
    bin_prev: u32,
    bin_next: u32,
    /// Regions in address order (free or used).
    neighbor_prev: u32,
    neighbor_next: u32,
}

impl Node {
    fn size(&self) -> u64 {
        self.size_and_used & !USED_BIT
    }

    fn is_used(&self) -> bool {
        self.size_and_used & USED_BIT != 0
    }
}

/// Which end of a free region an allocation takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RegionEnd {
    Start,
    End,
}

/// Why the core could not allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CoreError {
    /// No free region is big enough (the caller decides what to report).
    NoSpace,
    /// The node pool is exhausted. Unreachable while the front bounds live allocations (see `Allocator`),
    /// kept as an error rather than a panic.
    OutOfNodes,
}

/// A region of the arena, in units, as reported by [`CoreAllocator::extents`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CoreExtent {
    pub(crate) offset_units: u64,
    pub(crate) size_units: u64,
    pub(crate) used: bool,
}

pub(crate) struct CoreAllocator {
    capacity_units: u64,
    nodes: Vec<Node>,
    node_capacity: usize,
    /// Head of the pool's list of released nodes, linked through `bin_next`.
    released_nodes_head: u32,
    /// The region at offset 0, where an address-order walk starts.
    first_node: u32,
    bin_heads: [u32; BIN_COUNT],
    /// Bit `t` set: some bin in `8t..8t+8` is non-empty.
    top_bitmap: u32,
    /// Bit `l` of entry `t` set: bin `8t+l` is non-empty.
    leaf_bitmaps: [u8; BIN_COUNT / 8],
    free_units: u64,
    free_region_count: u64,
    exact_fit_scan_limit: u32,
}

impl CoreAllocator {
    /// An arena of `capacity_units` with room for `node_capacity` regions (used and free together).
    pub(crate) fn new(capacity_units: u64, node_capacity: usize, exact_fit_scan_limit: u32) -> Self {
        let mut core = Self {
            capacity_units,
            nodes: Vec::with_capacity(node_capacity),
            node_capacity,
            released_nodes_head: NONE,
            first_node: NONE,
            bin_heads: [NONE; BIN_COUNT],
            top_bitmap: 0,
            leaf_bitmaps: [0; BIN_COUNT / 8],
            free_units: 0,
            free_region_count: 0,
            exact_fit_scan_limit,
        };
        core.reset();
        core
    }

    /// Forgets every allocation: the arena becomes one free region. Keeps the node pool's memory.
    pub(crate) fn reset(&mut self) {
        self.nodes.clear();
        self.released_nodes_head = NONE;
        self.bin_heads = [NONE; BIN_COUNT];
        self.top_bitmap = 0;
        self.leaf_bitmaps = [0; BIN_COUNT / 8];
        self.free_units = 0;
        self.free_region_count = 0;
        self.first_node = NONE;
        if self.capacity_units > 0 {
            // The pool holds at least one node (checked by the front), so this cannot fail.
            if let Ok(node) = self.take_node(0, self.capacity_units) {
                self.first_node = node;
                self.file_free_region(node);
            }
        }
    }

    pub(crate) fn free_units(&self) -> u64 {
        self.free_units
    }

    pub(crate) fn free_region_count(&self) -> u64 {
        self.free_region_count
    }

    /// The largest free region, exact: the top non-empty bin is found in O(1), and only that bin's list
    /// (regions within 12.5% of each other, or all regions above the last bin's value) is walked.
    pub(crate) fn largest_free_units(&self) -> u64 {
        if self.top_bitmap == 0 {
            return 0;
        }
        let top = 31 - self.top_bitmap.leading_zeros();
        let leaf = 7 - self.leaf_bitmaps[top as usize].leading_zeros();
        let mut largest = 0;
        let mut node = self.bin_heads[(top * 8 + leaf) as usize];
        while node != NONE {
            let region = &self.nodes[node as usize];
            largest = largest.max(region.size());
            node = region.bin_next;
        }
        largest
    }

    /// Allocates exactly `size_units` (> 0) from the start of the free region found. Returns the node that
    /// now owns the region and its offset.
    pub(crate) fn allocate(&mut self, size_units: u64) -> Result<(u32, u64), CoreError> {
        self.allocate_at(size_units, RegionEnd::Start)
    }

    /// Like [`CoreAllocator::allocate`], but takes the *end* of the free region found. The front places slabs
    /// with `allocate` and everything else with this, so the two grow towards each other from the ends of
    /// free space instead of interleaving: the holes that odd-sized allocations leave then neighbour each
    /// other and merge, rather than being trapped between slabs.
    pub(crate) fn allocate_from_end(&mut self, size_units: u64) -> Result<(u32, u64), CoreError> {
        self.allocate_at(size_units, RegionEnd::End)
    }

    fn allocate_at(&mut self, size_units: u64, end: RegionEnd) -> Result<(u32, u64), CoreError> {
        debug_assert!(size_units > 0);
        let free_node = self.find_free_region(size_units).ok_or(CoreError::NoSpace)?;
        let region = self.nodes[free_node as usize];
        let remainder = region.size() - size_units;
        if remainder == 0 {
            self.unfile_free_region(free_node);
            self.nodes[free_node as usize].size_and_used = size_units | USED_BIT;
            return Ok((free_node, region.offset));
        }
        // The free node stays free and shrinks; a new node takes the allocated part. Taking it first means a
        // failure leaves the arena as it was.
        let (used_offset, remainder_offset) = match end {
            RegionEnd::Start => (region.offset, region.offset + size_units),
            RegionEnd::End => (region.offset + remainder, region.offset),
        };
        let used_node = self.take_node(used_offset, size_units | USED_BIT)?;
        let old_bin = bin_round_down(region.size());
        if bin_round_down(remainder) == old_bin {
            // Same bin: the region keeps its place in the bin list, only its bounds change. This is the common
            // case when carving from a large region, and saves an unlink and a link per allocation.
            let shrunk = &mut self.nodes[free_node as usize];
            shrunk.offset = remainder_offset;
            shrunk.size_and_used = remainder;
            self.free_units -= size_units;
        } else {
            self.unfile_free_region(free_node);
            let shrunk = &mut self.nodes[free_node as usize];
            shrunk.offset = remainder_offset;
            shrunk.size_and_used = remainder;
            self.file_free_region(free_node);
        }
        match end {
            RegionEnd::Start => self.link_before(free_node, used_node),
            RegionEnd::End => self.link_after(free_node, used_node),
        }
        Ok((used_node, used_offset))
    }

    /// Inserts `new` before `node` in address order.
    fn link_before(&mut self, node: u32, new: u32) {
        let prev = self.nodes[node as usize].neighbor_prev;
        self.nodes[new as usize].neighbor_prev = prev;
        self.nodes[new as usize].neighbor_next = node;
        if prev != NONE {
            self.nodes[prev as usize].neighbor_next = new;
        } else {
            self.first_node = new;
        }
        self.nodes[node as usize].neighbor_prev = new;
    }

    /// Inserts `new` after `node` in address order.
    fn link_after(&mut self, node: u32, new: u32) {
        let next = self.nodes[node as usize].neighbor_next;
        self.nodes[new as usize].neighbor_prev = node;
        self.nodes[new as usize].neighbor_next = next;
        if next != NONE {
            self.nodes[next as usize].neighbor_prev = new;
        }
        self.nodes[node as usize].neighbor_next = new;
    }

    /// Returns a region to the arena, merging it with free neighbours. `node` must be a used node that this
    /// allocator handed out (the front checks handles before calling).
    pub(crate) fn free(&mut self, node: u32) {
        let mut region = self.nodes[node as usize];
        debug_assert!(region.is_used(), "free of a region that is not in use");
        let mut offset = region.offset;
        let mut size = region.size();

        let prev = region.neighbor_prev;
        if prev != NONE && !self.nodes[prev as usize].is_used() {
            let prev_region = self.nodes[prev as usize];
            self.unfile_free_region(prev);
            offset = prev_region.offset;
            size += prev_region.size();
            region.neighbor_prev = prev_region.neighbor_prev;
            if region.neighbor_prev != NONE {
                self.nodes[region.neighbor_prev as usize].neighbor_next = node;
            }
            if self.first_node == prev {
                self.first_node = node;
            }
            self.release_node(prev);
        }

        let next = region.neighbor_next;
        if next != NONE && !self.nodes[next as usize].is_used() {
            let next_region = self.nodes[next as usize];
            self.unfile_free_region(next);
            size += next_region.size();
            region.neighbor_next = next_region.neighbor_next;
            if region.neighbor_next != NONE {
                self.nodes[region.neighbor_next as usize].neighbor_prev = node;
            }
            self.release_node(next);
        }

        let merged = &mut self.nodes[node as usize];
        merged.offset = offset;
        merged.size_and_used = size;
        merged.neighbor_prev = region.neighbor_prev;
        merged.neighbor_next = region.neighbor_next;
        self.file_free_region(node);
    }

    /// Whether `node` is a region in use of exactly `size_units` at `offset_units`: the front's defence
    /// against a handle that does not describe this arena's current state.
    pub(crate) fn is_used_at(&self, node: u32, offset_units: u64, size_units: u64) -> bool {
        self.nodes
            .get(node as usize)
            .is_some_and(|region| region.is_used() && region.offset == offset_units && region.size() == size_units)
    }

    /// Every region in address order.
    pub(crate) fn extents(&self) -> impl Iterator<Item = CoreExtent> + '_ {
        let mut node = self.first_node;
        std::iter::from_fn(move || {
            if node == NONE {
                return None;
            }
            let region = &self.nodes[node as usize];
            node = region.neighbor_next;
            Some(CoreExtent { offset_units: region.offset, size_units: region.size(), used: region.is_used() })
        })
    }

    /// Bytes of address space reserved for the node pool.
    pub(crate) fn reserved_metadata_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>()
    }

    /// Bytes of the node pool touched so far (its high-water mark).
    pub(crate) fn touched_metadata_bytes(&self) -> usize {
        self.nodes.len() * std::mem::size_of::<Node>()
    }

    fn find_free_region(&self, size_units: u64) -> Option<u32> {
        let min_bin = bin_round_up(size_units);
        if min_bin <= LAST_BIN
            && let Some(bin) = self.first_non_empty_bin_from(min_bin)
        {
            return Some(self.bin_heads[bin as usize]);
        }
        // Bounded exact-fit scan of the bin that holds regions just below the rounded-up size. In the last bin
        // (regions beyond the bins' range) this is also what finds room for a request larger than any bin.
        let exact_bin = bin_round_down(size_units);
        let mut node = self.bin_heads[exact_bin as usize];
        for _ in 0..self.exact_fit_scan_limit {
            if node == NONE {
                break;
            }
            let region = &self.nodes[node as usize];
            if region.size() >= size_units {
                return Some(node);
            }
            node = region.bin_next;
        }
        None
    }

    fn first_non_empty_bin_from(&self, min_bin: u32) -> Option<u32> {
        let top = min_bin >> 3;
        let leaf = min_bin & 7;
        let leaf_mask = self.leaf_bitmaps[top as usize] & (0xFFu8 << leaf);
        if leaf_mask != 0 {
            return Some((top << 3) | leaf_mask.trailing_zeros());
        }
        let higher_tops = if top >= 31 { 0 } else { self.top_bitmap & (u32::MAX << (top + 1)) };
        if higher_tops == 0 {
            return None;
        }
        let top = higher_tops.trailing_zeros();
        Some((top << 3) | self.leaf_bitmaps[top as usize].trailing_zeros())
    }

    fn take_node(&mut self, offset: u64, size: u64) -> Result<u32, CoreError> {
        let fresh = Node {
            offset,
            size_and_used: size,
            bin_prev: NONE,
            bin_next: NONE,
            neighbor_prev: NONE,
            neighbor_next: NONE,
        };
        if self.released_nodes_head != NONE {
            let node = self.released_nodes_head;
            self.released_nodes_head = self.nodes[node as usize].bin_next;
            self.nodes[node as usize] = fresh;
            return Ok(node);
        }
        if self.nodes.len() >= self.node_capacity {
            return Err(CoreError::OutOfNodes);
        }
        // Within the capacity reserved in `new`: never reallocates.
        self.nodes.push(fresh);
        Ok((self.nodes.len() - 1) as u32)
    }

    fn release_node(&mut self, node: u32) {
        let released = &mut self.nodes[node as usize];
        released.size_and_used = 0;
        released.bin_next = self.released_nodes_head;
        self.released_nodes_head = node;
    }

    fn file_free_region(&mut self, node: u32) {
        let size = self.nodes[node as usize].size();
        let bin = bin_round_down(size);
        let head = self.bin_heads[bin as usize];
        {
            let region = &mut self.nodes[node as usize];
            region.bin_prev = NONE;
            region.bin_next = head;
        }
        if head != NONE {
            self.nodes[head as usize].bin_prev = node;
        }
        self.bin_heads[bin as usize] = node;
        self.leaf_bitmaps[(bin >> 3) as usize] |= 1 << (bin & 7);
        self.top_bitmap |= 1 << (bin >> 3);
        self.free_units += size;
        self.free_region_count += 1;
    }

    fn unfile_free_region(&mut self, node: u32) {
        let region = self.nodes[node as usize];
        let bin = bin_round_down(region.size());
        if region.bin_prev != NONE {
            self.nodes[region.bin_prev as usize].bin_next = region.bin_next;
        } else {
            self.bin_heads[bin as usize] = region.bin_next;
            if region.bin_next == NONE {
                let top = (bin >> 3) as usize;
                self.leaf_bitmaps[top] &= !(1 << (bin & 7));
                if self.leaf_bitmaps[top] == 0 {
                    self.top_bitmap &= !(1 << top);
                }
            }
        }
        if region.bin_next != NONE {
            self.nodes[region.bin_next as usize].bin_prev = region.bin_prev;
        }
        self.free_units -= region.size();
        self.free_region_count -= 1;
    }

    /// Walks every structure and panics on the first broken invariant. O(n); for tests and the
    /// `invariants` feature.
    pub(crate) fn assert_invariants(&self) {
        let mut expected_offset = 0;
        let mut previous: Option<CoreExtent> = None;
        let mut free_units = 0;
        let mut free_regions = 0;
        for extent in self.extents() {
            assert_eq!(extent.offset_units, expected_offset, "regions must tile the arena");
            assert!(extent.size_units > 0, "empty region");
            if let Some(previous) = previous {
                assert!(previous.used || extent.used, "two adjacent free regions were not merged");
            }
            if !extent.used {
                free_units += extent.size_units;
                free_regions += 1;
            }
            expected_offset += extent.size_units;
            previous = Some(extent);
        }
        assert_eq!(expected_offset, self.capacity_units, "regions must cover the arena");
        assert_eq!(free_units, self.free_units, "free unit counter");
        assert_eq!(free_regions, self.free_region_count, "free region counter");

        let mut filed_regions = 0;
        for bin in 0..BIN_COUNT as u32 {
            let non_empty = self.leaf_bitmaps[(bin >> 3) as usize] & (1 << (bin & 7)) != 0;
            assert_eq!(non_empty, self.bin_heads[bin as usize] != NONE, "leaf bitmap of bin {bin}");
            let mut node = self.bin_heads[bin as usize];
            let mut previous = NONE;
            while node != NONE {
                let region = &self.nodes[node as usize];
                assert!(!region.is_used(), "used region in bin {bin}");
                assert_eq!(bin_round_down(region.size()), bin, "region filed in the wrong bin");
                assert_eq!(region.bin_prev, previous, "broken bin list");
                filed_regions += 1;
                previous = node;
                node = region.bin_next;
            }
        }
        for top in 0..32 {
            assert_eq!(self.top_bitmap & (1 << top) != 0, self.leaf_bitmaps[top] != 0, "top bitmap bit {top}");
        }
        assert_eq!(filed_regions, self.free_region_count, "every free region is filed exactly once");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_exactly_and_merges_back_to_one_region() {
        let mut core = CoreAllocator::new(100, 64, 0);
        let a = core.allocate(30).unwrap();
        let b = core.allocate(30).unwrap();
        let c = core.allocate(40).unwrap();
        assert_eq!((a.1, b.1, c.1), (0, 30, 60));
        assert_eq!(core.allocate(1), Err(CoreError::NoSpace));
        core.assert_invariants();
        // Free the middle, then both sides: each free merges with the neighbours that are free.
        core.free(b.0);
        assert_eq!(core.free_region_count(), 1);
        core.free(a.0);
        assert_eq!(core.free_region_count(), 1);
        core.free(c.0);
        core.assert_invariants();
        assert_eq!(core.free_region_count(), 1);
        assert_eq!(core.largest_free_units(), 100);
    }

    #[test]
    fn offset_allocator_strands_an_exact_hole_and_the_scan_finds_it() {
        // 1098 units (a 4,497,408-byte block in 4 KiB units) is not a bin value.
        for (scan_limit, expect_reuse) in [(0, false), (4, true)] {
            // A 100-unit tail is too small to serve the request, so only the freed hole can.
            let mut core = CoreAllocator::new(1098 * 3 + 100, 64, scan_limit);
            let a = core.allocate(1098).unwrap();
            let _b = core.allocate(1098).unwrap();
            let _c = core.allocate(1098).unwrap();
            core.free(a.0);
            assert_eq!(core.allocate(1098).is_ok(), expect_reuse, "scan limit {scan_limit}");
            core.assert_invariants();
        }
    }

    #[test]
    fn allocating_from_the_end_leaves_the_start_free() {
        let mut core = CoreAllocator::new(100, 64, 0);
        let low = core.allocate(10).unwrap();
        let high = core.allocate_from_end(20).unwrap();
        assert_eq!((low.1, high.1), (0, 80));
        let extents: Vec<_> =
            core.extents().map(|extent| (extent.offset_units, extent.size_units, extent.used)).collect();
        assert_eq!(extents, vec![(0, 10, true), (10, 70, false), (80, 20, true)]);
        core.assert_invariants();
        core.free(high.0);
        core.free(low.0);
        core.assert_invariants();
        assert_eq!(core.largest_free_units(), 100);
    }

    #[test]
    fn node_pool_exhaustion_is_an_error_and_changes_nothing() {
        // One node for the initial region and one more: the first allocation needs a remainder node, the
        // second has none left.
        let mut core = CoreAllocator::new(100, 2, 4);
        let _a = core.allocate(10).unwrap();
        assert_eq!(core.allocate(10), Err(CoreError::OutOfNodes));
        core.assert_invariants();
        assert_eq!(core.free_units(), 90);
        // A request that takes the whole remaining region needs no new node.
        assert!(core.allocate(90).is_ok());
    }
}
