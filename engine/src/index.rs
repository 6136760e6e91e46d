//! A shard's object index: key hash → entry, in two flat structures sized for tens of millions of keys.
//!
//! - **Entries** live in a slab of fixed chunks (no doubling copy, no per-object heap allocation) and are
//!   named by a `u32` id. An [`Entry`] is 40 bytes.
//! - **The table** is open addressing with linear probing over 8-byte slots `(entry id, low 32 bits of the
//!   hash)`: a probe compares the tag without touching the entry, and removal shifts the cluster back, so
//!   there are no tombstones. It grows by doubling at 3/4 load: ≤ 16 bytes per object just after growing.
//!
//! The key itself is not in the index: like CacheLib's Navy, the index is keyed by a 64-bit keyed hash of
//! the key, and the key is stored with the object (in the DRAM segment and in the NVMe record) and compared
//! on every read, so a hash collision can cost a miss but never return another key's bytes. Two distinct
//! keys share a 64-bit hash with probability about n²/2⁶⁵ (3·10⁻⁶ for 10 million keys); when they do, the
//! newer put replaces the older one, which becomes a miss. `exists` answers from the index alone.

use std::hash::{BuildHasher, Hasher};

/// Entries per slab chunk.
const CHUNK_ENTRIES: usize = 16 * 1024;
const EMPTY_SLOT: u64 = u64::MAX;
/// Marks "no location" in [`Entry::nvme`] and [`Entry::dram`].
pub const NONE_U64: u64 = u64::MAX;
/// Marks "no DRAM copy".
pub const NONE_U32: u32 = u32::MAX;

/// Entry flag: the newest version is not yet on the NVMe tier (write-back, or write-through not flushed).
pub const FLAG_DIRTY: u16 = 1;
/// Entry flag: hit since it was last looked at by the DRAM clock (second chance).
pub const FLAG_REFERENCED: u16 = 2;
/// Entry flag: pinned hard, never evicted.
pub const FLAG_PINNED: u16 = 4;
/// Entry flag: pinned soft (its expiry is in the shard's pin book): evicted only when nothing else can be.
pub const FLAG_SOFT_PINNED: u16 = 8;
/// Entry flag: names a parent or a group (the shard's link book has its node).
pub const FLAG_LINKED: u16 = 16;
/// Entry flag: its NVMe record carries links after the key (so its value starts 16 bytes later).
pub const FLAG_RECORD_LINKED: u16 = 32;
/// Entry flag: an upsert with a cluster version (the shard's version book has it).
pub const FLAG_VERSIONED: u16 = 64;
/// Entry flag: its NVMe record carries that version after the key and links (its value starts 16 bytes
/// later).
pub const FLAG_RECORD_VERSIONED: u16 = 128;
/// Entry flags: bits 12-15 hold the replica count its put asked for in a cluster (0: not said), so that a
/// repair re-creates that many copies (what SCAN reports).
pub const FLAG_REPLICAS_SHIFT: u16 = 12;
/// The entry flags of the replica count.
pub const FLAG_REPLICAS_MASK: u16 = 0xf << FLAG_REPLICAS_SHIFT;

/// The replica count `entry`'s put asked for (0: not said).
pub fn replicas_of(entry: &Entry) -> u8 {
    (entry.flags >> FLAG_REPLICAS_SHIFT) as u8
}

/// The entry flags that say `replicas` (at most 15).
pub fn replica_flags(replicas: u8) -> u16 {
    u16::from(replicas.min(15)) << FLAG_REPLICAS_SHIFT
}

/// One object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The keyed 64-bit hash of the key.
    pub hash: u64,
    /// Location on the NVMe tier (region log), or [`NONE_U64`].
    pub nvme: u64,
    /// Slot of the DRAM copy in the shard's DRAM tier, or [`NONE_U32`].
    pub dram: u32,
    /// Bytes of value.
    pub value_len: u32,
    /// crc32c of the value.
    pub value_crc: u32,
    /// Version (counts puts of this key on this shard; the low 32 bits).
    pub version: u32,
    /// Tick of the last hit (0: never). A read lease lasts from it for the node's lease time, so the lease
    /// needs no field of its own.
    pub last_hit: u32,
    /// Bytes of key.
    pub key_len: u16,
    /// `FLAG_*`.
    pub flags: u16,
}

/// The keyed hash the index uses (SipHash-1-3 with fixed keys, mixed by std's `DefaultHasher`).
pub fn index_hash(key: &[u8]) -> u64 {
    let mut hasher = std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default().build_hasher();
    hasher.write(key);
    hasher.finish()
}

/// The index of one shard.
pub struct Index {
    chunks: Vec<Vec<Entry>>,
    free_ids: Vec<u32>,
    slots: Vec<u64>,
    len: usize,
}

impl Default for Index {
    fn default() -> Self {
        Self::new()
    }
}

/// Asks the CPU to bring `value`'s cache line in, without waiting for it.
pub fn prefetch<T>(value: &T) {
    prefetch_address(std::ptr::from_ref(value).cast::<u8>());
}

/// Asks the CPU to bring the cache line at `address` in, without waiting for it. Any address will do: a
/// prefetch reads nothing architecturally and never faults.
pub fn prefetch_address(address: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint with no architectural effect, valid for any address.
    #[allow(unsafe_code)]
    unsafe {
        core::arch::x86_64::_mm_prefetch(address.cast::<i8>(), core::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

fn slot_of(id: u32, hash: u64) -> u64 {
    (u64::from(id) << 32) | (hash & 0xffff_ffff)
}

impl Index {
    /// An empty index.
    pub fn new() -> Self {
        Self { chunks: Vec::new(), free_ids: Vec::new(), slots: vec![EMPTY_SLOT; 1024], len: 0 }
    }

    /// Objects indexed.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes the index takes (table, entry chunks, free list), for the per-object overhead metric.
    #[cfg(test)]
    pub fn memory_bytes(&self) -> usize {
        self.slots.capacity() * 8
            + self.chunks.iter().map(|chunk| chunk.capacity() * size_of::<Entry>()).sum::<usize>()
            + self.free_ids.capacity() * 4
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The entry of `hash`.
    pub fn find(&self, hash: u64) -> Option<u32> {
        let mask = self.mask();
        let mut at = (hash as usize) & mask;
        loop {
            let slot = self.slots[at];
            if slot == EMPTY_SLOT {
                return None;
            }
            let id = (slot >> 32) as u32;
            if slot & 0xffff_ffff == hash & 0xffff_ffff && self.get(id).hash == hash {
                return Some(id);
            }
            at = (at + 1) & mask;
        }
    }

    /// Starts loading the table slot where the probe for `hash` begins. A batch of puts asks for its next
    /// keys' lines ahead of time: the table and the entries are far larger than the cache, so each lookup
    /// is otherwise two misses in a row (the slot, then the entry it names).
    pub fn prefetch_slot(&self, hash: u64) {
        prefetch(&self.slots[(hash as usize) & self.mask()]);
    }

    /// Starts loading the entry that the first slot of `hash`'s probe names, if its tag matches (call it
    /// once that slot had time to arrive: [`Index::prefetch_slot`] an item earlier).
    pub fn prefetch_entry(&self, hash: u64) {
        let slot = self.slots[(hash as usize) & self.mask()];
        if slot != EMPTY_SLOT && slot & 0xffff_ffff == hash & 0xffff_ffff {
            prefetch(self.get((slot >> 32) as u32));
        }
    }

    /// The entry `id`.
    pub fn get(&self, id: u32) -> &Entry {
        &self.chunks[id as usize / CHUNK_ENTRIES][id as usize % CHUNK_ENTRIES]
    }

    /// The entry `id`, to change (its hash must not change).
    pub fn get_mut(&mut self, id: u32) -> &mut Entry {
        &mut self.chunks[id as usize / CHUNK_ENTRIES][id as usize % CHUNK_ENTRIES]
    }

    /// Adds an entry whose hash is not in the index yet; returns its id.
    pub fn insert(&mut self, entry: Entry) -> u32 {
        debug_assert!(self.find(entry.hash).is_none(), "inserting a hash that is indexed");
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let id = match self.free_ids.pop() {
            Some(id) => {
                *self.get_mut(id) = entry;
                id
            }
            None => {
                if self.chunks.last().is_none_or(|chunk| chunk.len() == CHUNK_ENTRIES) {
                    self.chunks.push(Vec::with_capacity(CHUNK_ENTRIES));
                }
                let chunk_index = self.chunks.len() - 1;
                let chunk = &mut self.chunks[chunk_index];
                chunk.push(entry);
                (chunk_index * CHUNK_ENTRIES + chunk.len() - 1) as u32
            }
        };
        self.place(slot_of(id, entry.hash));
        self.len += 1;
        id
    }

    fn place(&mut self, slot: u64) {
        let mask = self.mask();
        let mut at = (slot as usize) & mask;
        while self.slots[at] != EMPTY_SLOT {
            at = (at + 1) & mask;
        }
        self.slots[at] = slot;
    }

    fn grow(&mut self) {
        let doubled = vec![EMPTY_SLOT; self.slots.len() * 2];
        let old = std::mem::replace(&mut self.slots, doubled);
        for slot in old.into_iter().filter(|&slot| slot != EMPTY_SLOT) {
            self.place(slot);
        }
    }

    /// Removes entry `id`; returns it.
    pub fn remove(&mut self, id: u32) -> Entry {
        let entry = *self.get(id);
        let mask = self.mask();
        let mut hole = (entry.hash as usize) & mask;
        while self.slots[hole] >> 32 != u64::from(id) {
            hole = (hole + 1) & mask;
        }
        // Backward-shift deletion: move later members of the cluster into the hole when their home slot
        // is at or before it (cyclically), so every key stays reachable from its home without tombstones.
        let mut next = (hole + 1) & mask;
        while self.slots[next] != EMPTY_SLOT {
            let home = (self.slots[next] as usize) & mask;
            let distance_to_next = next.wrapping_sub(home) & mask;
            let distance_to_hole = hole.wrapping_sub(home) & mask;
            if distance_to_hole < distance_to_next {
                self.slots[hole] = self.slots[next];
                hole = next;
            }
            next = (next + 1) & mask;
        }
        self.slots[hole] = EMPTY_SLOT;
        self.free_ids.push(id);
        self.len -= 1;
        entry
    }

    /// How many ids were ever handed out: every live id is below it, so a scan by id covers
    /// `0..id_space()`. Ids are stable for an entry's life, where table positions move as it grows.
    pub fn id_space(&self) -> u32 {
        (self.chunks.len().saturating_sub(1) * CHUNK_ENTRIES + self.chunks.last().map_or(0, Vec::len)) as u32
    }

    /// The entry `id`, if it is live (a freed id keeps its last entry, which the table no longer names).
    pub fn live(&self, id: u32) -> Option<&Entry> {
        if id >= self.id_space() {
            return None;
        }
        let entry = self.get(id);
        (self.find(entry.hash) == Some(id)).then_some(entry)
    }

    /// Every live entry id (for scans at shutdown and in tests).
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.slots.iter().filter(|&&slot| slot != EMPTY_SLOT).map(|slot| (slot >> 32) as u32)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    fn entry(hash: u64, value_len: u32) -> Entry {
        Entry {
            hash,
            nvme: NONE_U64,
            dram: NONE_U32,
            value_len,
            value_crc: 0,
            version: 0,
            last_hit: 0,
            key_len: 1,
            flags: 0,
        }
    }

    #[test]
    fn an_entry_is_40_bytes() {
        assert_eq!(size_of::<Entry>(), 40);
    }

    proptest! {
        /// The index agrees with a HashMap model through random inserts and removes, including hashes that
        /// collide in the table (few distinct low bits) and that cluster and wrap around.
        #[test]
        fn index_matches_a_model(ops in proptest::collection::vec((any::<bool>(), 0u64..512, any::<u8>()), 1..3000)) {
            let mut index = Index::new();
            let mut model: HashMap<u64, u32> = HashMap::new();
            for (insert, key, len) in ops {
                // Spread the keys over the whole 64-bit space but keep low bits clustered.
                let hash = (key << 40) | (key % 7) | 0x3ff;
                match (insert, model.get(&hash)) {
                    (true, None) => {
                        index.insert(entry(hash, u32::from(len)));
                        model.insert(hash, u32::from(len));
                    }
                    (false, Some(_)) => {
                        let id = index.find(hash).expect("model says present");
                        prop_assert_eq!(index.remove(id).hash, hash);
                        model.remove(&hash);
                    }
                    _ => {}
                }
                prop_assert_eq!(index.len(), model.len());
            }
            for (hash, len) in &model {
                let id = index.find(*hash).expect("present");
                prop_assert_eq!(index.get(id).value_len, *len);
            }
            prop_assert_eq!(index.ids().count(), model.len());
        }
    }

    #[test]
    fn ten_million_objects_cost_under_64_bytes_each() {
        // The measurement point; 2^20 objects (just after a doubling, the worst load) is checked too.
        let mut index = Index::new();
        for key in 0..10_000_000u32 {
            index.insert(entry(index_hash(&key.to_le_bytes()), key));
            if key + 1 == 1 << 20 {
                let per_object = index.memory_bytes() as f64 / index.len() as f64;
                assert!(per_object < 64.0, "{per_object} bytes per object at 2^20 objects");
            }
        }
        let per_object = index.memory_bytes() as f64 / index.len() as f64;
        eprintln!("index: {per_object:.1} bytes per object for {} objects", index.len());
        assert!(per_object < 64.0, "{per_object} bytes per object");
        assert_eq!(index.get(index.find(index_hash(&77u32.to_le_bytes())).expect("found")).value_len, 77);
        assert_eq!(index.find(index_hash(b"absent")), None);
    }
}
