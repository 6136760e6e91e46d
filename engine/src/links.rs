//! Parents and groups: which objects leave the node when another does.
//!
//! A put may name a **parent** (the block its KV continues: a suffix without its prefix is useless) and a
//! **group** (blocks that are only useful together: the K and V halves, all layers of one block). When an
//! object leaves the node — evicted from its last tier, removed, dropped for a bad checksum — its children
//! and the rest of its group leave with it, and so on down the tree.
//!
//! The shard's [`LinkBook`] keeps, for this shard's linked objects only, the reverse edges that make this a
//! lookup rather than a scan: parent hash → this shard's children, group hash → this shard's members. Parents
//! and groups are named by the 64-bit index hash of their (tenant-scoped) key or name, so a child never has
//! to know where its parent lives: a parent on another shard is reached by telling every shard that holds
//! links "this hash left" (see `Shard::cascade`). An object that names nothing costs nothing here: its entry
//! has no `FLAG_LINKED` and no book entry.
//!
//! An object's NVMe record carries its links (see `record.rs`), so recovery rebuilds the book with the
//! index.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::index::index_hash;

/// "No parent" / "no group" in [`ObjectLinks`].
pub const NO_LINK: u64 = 0;

/// The hash that names a parent key or a group name (never [`NO_LINK`]).
pub fn link_hash(name: &[u8]) -> u64 {
    index_hash(name).max(1)
}

/// The hash an object is named by as a parent: its index hash, moved off [`NO_LINK`] like [`link_hash`].
pub fn parent_name(entry_hash: u64) -> u64 {
    entry_hash.max(1)
}

/// Counters, one per shard, of the linked objects each holds (cache-line apart: each is written by one
/// shard and read by the others). A departure is sent to the peers only if one of them holds links, so a
/// node that links nothing sends nothing.
pub struct LinkCounts(Vec<PaddedCounter>);

#[repr(align(64))]
#[derive(Default)]
struct PaddedCounter(AtomicU64);

impl LinkCounts {
    /// Counters for `shards` shards, all zero.
    pub fn new(shards: u32) -> Self {
        Self((0..shards).map(|_| PaddedCounter::default()).collect())
    }

    /// Shard `shard` now holds `count` linked objects.
    pub fn publish(&self, shard: u32, count: usize) {
        if let Some(counter) = self.0.get(shard as usize) {
            counter.0.store(count as u64, Ordering::Relaxed);
        }
    }

    /// Linked objects shard `shard` holds (as last published).
    pub fn of(&self, shard: u32) -> u64 {
        self.0.get(shard as usize).map_or(0, |counter| counter.0.load(Ordering::Relaxed))
    }

    /// Whether any shard but `me` holds linked objects.
    pub fn any_but(&self, me: u32) -> bool {
        (0..self.0.len() as u32).any(|shard| shard != me && self.of(shard) > 0)
    }
}

/// What one object names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObjectLinks {
    /// Its parent's hash, or [`NO_LINK`].
    pub parent: u64,
    /// Its group's hash, or [`NO_LINK`].
    pub group: u64,
}

impl ObjectLinks {
    /// Whether it names nothing.
    pub fn is_none(&self) -> bool {
        self.parent == NO_LINK && self.group == NO_LINK
    }
}

/// The book's record of one object: what it names and the next object of this shard that names the same
/// parent / group (intrusive lists: a parent usually has one child, so a list per parent would cost more
/// than the edge itself).
#[derive(Clone, Copy, Debug, Default)]
struct Node {
    links: ObjectLinks,
    next_sibling: u32,
    next_member: u32,
}

/// End of an intrusive list.
const END: u32 = u32::MAX;

/// Names are already uniform 64-bit hashes: the tables use them as they are (SipHash over them again
/// was a few percent of a linked put's CPU in `perf`).
#[derive(Default)]
struct NameHasher(u64);

impl Hasher for NameHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (the keys are `u64`); fold anything else in for completeness.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

type NameMap = HashMap<u64, u32, BuildHasherDefault<NameHasher>>;

/// One shard's links, by entry id.
///
/// Nodes are a dense vector indexed by entry id (24 bytes per id up to the highest linked one), and the
/// heads of the lists are two hash tables of 16-byte slots: about 60 bytes per linked object of a chain at
/// worst (just after a table doubled), nothing for a shard that links nothing.
#[derive(Default)]
pub struct LinkBook {
    nodes: Vec<Node>,
    first_child: NameMap,
    first_member: NameMap,
    linked: usize,
}

impl LinkBook {
    /// Records what object `id` names, replacing what it named before.
    pub fn link(&mut self, id: u32, links: ObjectLinks) {
        self.unlink(id);
        if links.is_none() {
            return;
        }
        let at = id as usize;
        if self.nodes.len() <= at {
            self.nodes.resize(at + 1, Node::default());
        }
        let mut node = Node { links, next_sibling: END, next_member: END };
        if links.parent != NO_LINK
            && let Some(head) = self.first_child.insert(links.parent, id)
        {
            node.next_sibling = head;
        }
        if links.group != NO_LINK
            && let Some(head) = self.first_member.insert(links.group, id)
        {
            node.next_member = head;
        }
        self.nodes[at] = node;
        self.linked += 1;
    }

    /// Forgets what object `id` named; returns it (`None` if it named nothing).
    pub fn unlink(&mut self, id: u32) -> Option<ObjectLinks> {
        let node = self.nodes.get(id as usize).copied().filter(|node| !node.links.is_none())?;
        if node.links.parent != NO_LINK {
            self.detach(node.links.parent, id, true);
        }
        if node.links.group != NO_LINK {
            self.detach(node.links.group, id, false);
        }
        self.nodes[id as usize] = Node::default();
        self.linked -= 1;
        Some(node.links)
    }

    fn next(&self, id: u32, siblings: bool) -> u32 {
        let node = &self.nodes[id as usize];
        if siblings { node.next_sibling } else { node.next_member }
    }

    fn set_next(&mut self, id: u32, siblings: bool, next: u32) {
        let node = &mut self.nodes[id as usize];
        if siblings {
            node.next_sibling = next;
        } else {
            node.next_member = next;
        }
    }

    /// Takes `id` out of the list of `name` (its siblings when `siblings`, else its group's members).
    fn detach(&mut self, name: u64, id: u32, siblings: bool) {
        let heads = if siblings { &mut self.first_child } else { &mut self.first_member };
        let Some(&head) = heads.get(&name) else { return };
        let next = self.next(id, siblings);
        if head == id {
            let heads = if siblings { &mut self.first_child } else { &mut self.first_member };
            if next == END {
                heads.remove(&name);
            } else {
                heads.insert(name, next);
            }
            return;
        }
        let mut at = head;
        while at != END {
            let after = self.next(at, siblings);
            if after == id {
                self.set_next(at, siblings, next);
                return;
            }
            at = after;
        }
    }

    fn list(&self, head: Option<&u32>, siblings: bool) -> Vec<u32> {
        let mut ids = Vec::new();
        let mut at = head.copied().unwrap_or(END);
        while at != END {
            ids.push(at);
            at = self.next(at, siblings);
        }
        ids
    }

    /// What object `id` names.
    pub fn of(&self, id: u32) -> Option<ObjectLinks> {
        self.nodes.get(id as usize).map(|node| node.links).filter(|links| !links.is_none())
    }

    /// This shard's objects that name `parent`.
    pub fn children_of(&self, parent: u64) -> Vec<u32> {
        self.list(self.first_child.get(&parent), true)
    }

    /// This shard's members of `group`.
    pub fn members_of(&self, group: u64) -> Vec<u32> {
        self.list(self.first_member.get(&group), false)
    }

    /// The groups with a member here.
    pub fn groups(&self) -> Vec<u64> {
        self.first_member.keys().copied().collect()
    }

    /// Whether any object here names a parent.
    #[cfg(test)]
    pub fn has_children(&self) -> bool {
        !self.first_child.is_empty()
    }

    /// Whether any object here is in a group.
    #[cfg(test)]
    pub fn has_members(&self) -> bool {
        !self.first_member.is_empty()
    }

    /// Linked objects.
    pub fn len(&self) -> usize {
        self.linked
    }

    /// Whether no object is linked.
    pub fn is_empty(&self) -> bool {
        self.linked == 0
    }

    /// Bytes the book takes, for the per-object overhead metric.
    #[cfg(test)]
    pub fn memory_bytes(&self) -> usize {
        // hashbrown: one slot and one control byte per bucket, buckets a power of two ≥ capacity × 8/7.
        let table = |capacity: usize| if capacity == 0 { 0 } else { (capacity * 8 / 7).next_power_of_two() * 17 };
        self.nodes.capacity() * size_of::<Node>()
            + table(self.first_child.capacity())
            + table(self.first_member.capacity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_and_members_are_found_without_a_scan_and_unlinking_leaves_nothing_behind() {
        let mut book = LinkBook::default();
        let (root, group) = (link_hash(b"root"), link_hash(b"block-7"));
        book.link(1, ObjectLinks { parent: root, group: NO_LINK });
        book.link(2, ObjectLinks { parent: root, group });
        book.link(3, ObjectLinks { parent: NO_LINK, group });
        assert_eq!(book.children_of(root), [2, 1]);
        assert_eq!(book.members_of(group), [3, 2]);
        assert!(book.has_children() && book.has_members());
        // Relinking replaces: 2 leaves the group and names 1 as its parent.
        book.link(2, ObjectLinks { parent: parent_name(99), group: NO_LINK });
        assert_eq!(book.children_of(root), [1]);
        assert_eq!(book.members_of(group), [3]);
        assert_eq!(book.children_of(parent_name(99)), [2]);
        assert_eq!(book.of(2), Some(ObjectLinks { parent: parent_name(99), group: NO_LINK }));
        for id in [1, 2, 3] {
            assert!(book.unlink(id).is_some());
        }
        assert!(book.unlink(3).is_none());
        assert!(book.is_empty() && !book.has_children() && !book.has_members());
        assert!(book.children_of(root).is_empty());
        assert_eq!(book.of(1), None);
    }

    #[test]
    fn any_member_of_a_long_list_can_leave() {
        let mut book = LinkBook::default();
        let root = link_hash(b"system prompt");
        for id in 0..6 {
            book.link(id, ObjectLinks { parent: root, group: NO_LINK });
        }
        for (leaving, left) in [(3, vec![5, 4, 2, 1, 0]), (5, vec![4, 2, 1, 0]), (0, vec![4, 2, 1])] {
            book.unlink(leaving);
            assert_eq!(book.children_of(root), left);
        }
        assert_eq!(book.len(), 3);
    }

    #[test]
    fn a_million_chained_blocks_cost_under_64_bytes_each_in_the_book() {
        // Each block names the one before it: the shape of a prefix chain. What the book adds to the index's
        // per-object cost for linked objects (unlinked ones add nothing).
        let mut book = LinkBook::default();
        for id in 0..1_000_000u32 {
            book.link(id, ObjectLinks { parent: parent_name(u64::from(id) + 7), group: NO_LINK });
        }
        let per_object = book.memory_bytes() as f64 / book.len() as f64;
        eprintln!("link book: {per_object:.1} bytes per linked object");
        assert!(per_object < 64.0, "{per_object} bytes per linked object");
    }
}
