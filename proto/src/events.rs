//! Cache events, in the vocabulary of vLLM's KV events: what a router needs to track which blocks a node
//! holds and where.
//!
//! ```text
//! event: four bytes, then two or three LEB128 varints, the parent key, then the keys (each after its length)
//!  byte 0     bits 0-2 kind: 1 BLOCK_STORED, 2 BLOCK_REMOVED, 3 TIER_CHANGED, 4 LAGGED
//!             bit 3 a parent key follows (BLOCK_STORED only)
//!             bit 4 chained (BLOCK_STORED only): each key after the first names the key before it as its
//!               parent, the first names the parent key (vLLM's `block_hashes`); without it, every key
//!               names the parent key (or none)
//!             bits 5-7 zero
//!  byte 1     BLOCK_STORED: its tier; BLOCK_REMOVED: the reason; TIER_CHANGED: from << 4 | to; LAGGED: 0
//!  bytes 2-3  key count, u16 little-endian: BLOCK_STORED and BLOCK_REMOVED 1 to 65,535, TIER_CHANGED 1,
//!             LAGGED 0
//!  varint     sequence: the shard's event number (consecutive; a gap is announced by LAGGED)
//!  varint     size: BLOCK_STORED value bytes of each key, LAGGED events missed, otherwise 0 (at most
//!             u32::MAX)
//!  varint     parent len, only with bit 3 (1 to 65,535), then the parent key
//!  count x    varint key len (at most 65,535), then the key
//!   tier: 0 none, 1 DRAM, 2 NVMe; reason: 1 removed, 2 evicted, 3 checksum, 4 storage error,
//!     5 cascaded (its parent or a member of its group left)
//! ```
//!
//! *Decision:* an event names several keys, as the issue's `BlockStored {keys, ...}` and vLLM's events do.
//! A shard grows its newest event by one key while no subscriber has read it (same kind, size, tier and
//! parent relation), so a run of puts costs each key its length and bytes (22 bytes for a 21-byte key)
//! instead of a whole event (29). The count is a fixed two bytes, not a varint, so that growing an event
//! rewrites it in place; the keys come last so that a key is appended, not inserted.
//!
//! *Decision:* varints rather than a fixed 24-byte header. An observed put costs the node its event's bytes
//! twice on loopback (the send and, on the same core, the receive side's TCP work): ~0.9 ns a byte in
//! `perf`, about as much as the event log itself. The sequence stays absolute, not a delta, so an event
//! decodes on its own and a frame is any run of the log.

use crate::codes::ProtoError;

/// The fewest bytes an event takes (a LAGGED event with one-byte varints).
pub const MIN_EVENT_BYTES: usize = 6;

/// Keys an event names at most (its count is two bytes).
pub const MAX_EVENT_KEYS: usize = u16::MAX as usize;

/// Bytes an event's fixed part and varints take at most (4 + 10 + 5 + 3).
const MAX_EVENT_HEAD_BYTES: usize = 22;

const KIND_MASK: u8 = 0x07;
const HAS_PARENT: u8 = 0x08;
const CHAINED: u8 = 0x10;

/// A tier of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    /// In no tier (not stored).
    None = 0,
    /// The DRAM tier.
    Dram = 1,
    /// The NVMe tier.
    Nvme = 2,
}

impl Tier {
    fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            0 => Tier::None,
            1 => Tier::Dram,
            2 => Tier::Nvme,
            _ => return None,
        })
    }
}

/// Why a block left the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RemovalReason {
    /// Removed by a client.
    Removed = 1,
    /// Evicted to make room.
    Evicted = 2,
    /// Its stored bytes failed their checksum (dropped, never served).
    Checksum = 3,
    /// The storage device failed.
    StorageError = 4,
    /// Its parent, or another member of its group, left the node.
    Cascaded = 5,
}

impl RemovalReason {
    fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            1 => RemovalReason::Removed,
            2 => RemovalReason::Evicted,
            3 => RemovalReason::Checksum,
            4 => RemovalReason::StorageError,
            5 => RemovalReason::Cascaded,
            _ => return None,
        })
    }
}

/// One event of a shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Blocks were stored (puts or upserts), all of `size` bytes in `tier`.
    BlockStored {
        /// Their keys, at least one.
        keys: Vec<Vec<u8>>,
        /// The key the first names as its parent; without `chained`, the key every one names.
        parent: Option<Vec<u8>>,
        /// Each key after the first names the key before it as its parent (a chain of prefix blocks).
        chained: bool,
        /// Bytes of value of each.
        size: u32,
        /// The tier they landed in.
        tier: Tier,
    },
    /// Blocks left the node.
    BlockRemoved {
        /// Their keys, at least one.
        keys: Vec<Vec<u8>>,
        /// Why.
        reason: RemovalReason,
    },
    /// A block's fastest tier changed (evicted from DRAM to NVMe, promoted from NVMe to DRAM).
    TierChanged {
        /// Its key.
        key: Vec<u8>,
        /// The tier it was served from.
        from: Tier,
        /// The tier it is served from now.
        to: Tier,
    },
    /// The subscriber fell behind (or the shard lost track of blocks it cannot name): `missed` events are
    /// gone, so its view of the shard may be wrong — resync.
    Lagged {
        /// Events missed.
        missed: u32,
    },
}

impl Event {
    /// Appends the event with sequence number `sequence`. An event with no key, or more than
    /// [`MAX_EVENT_KEYS`], is the caller's bug: the keys past the limit are left out, and an event left with
    /// none does not decode.
    pub fn encode_into(&self, sequence: u64, out: &mut Vec<u8>) {
        match self {
            Event::BlockStored { keys, parent, chained, size, tier } => {
                let event = OpenEvent::block_stored(out, sequence, parent.as_deref(), *size, *tier);
                for key in keys {
                    event.push_key(out, key);
                }
                if *chained {
                    event.set_chained(out);
                }
            }
            Event::BlockRemoved { keys, reason } => {
                let event = OpenEvent::block_removed(out, sequence, *reason);
                for key in keys {
                    event.push_key(out, key);
                }
            }
            Event::TierChanged { key, from, to } => {
                EventRef::TierChanged { key, from: *from, to: *to }.encode_into(sequence, out)
            }
            Event::Lagged { missed } => EventRef::Lagged { missed: *missed }.encode_into(sequence, out),
        }
    }

    /// Decodes one event from the front of `bytes`; returns it, its sequence number and its length.
    pub fn decode(bytes: &[u8]) -> Result<(Event, u64, usize), ProtoError> {
        let (event, sequence, len) = EventRef::decode(bytes)?;
        Ok((event.to_event(), sequence, len))
    }

    /// The blocks it reports on: its keys (none for LAGGED).
    pub fn blocks(&self) -> usize {
        match self {
            Event::BlockStored { keys, .. } | Event::BlockRemoved { keys, .. } => keys.len(),
            Event::TierChanged { .. } => 1,
            Event::Lagged { .. } => 0,
        }
    }

    /// A BLOCK_STORED event's blocks, each key with the parent it names (nothing for other kinds): what a
    /// router enters in its table, chain or not.
    pub fn stored_blocks(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> + '_ {
        let (keys, parent, chained) = match self {
            Event::BlockStored { keys, parent, chained, .. } => (&keys[..], parent.as_deref(), *chained),
            _ => (&[][..], None, false),
        };
        with_parents(keys.iter().map(Vec::as_slice), parent, chained)
    }
}

/// Each key with the parent it names: `parent`, or in a chain the key before it (the first names `parent`).
fn with_parents<'a>(
    keys: impl Iterator<Item = &'a [u8]>,
    parent: Option<&'a [u8]>,
    chained: bool,
) -> impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> {
    let mut before = parent;
    keys.map(move |key| {
        let named = before;
        if chained {
            before = Some(key);
        }
        (key, named)
    })
}

/// The keys of an event, borrowed from its encoding (checked when the event was decoded).
#[derive(Clone, Copy)]
pub struct Keys<'a> {
    count: usize,
    /// `count` times a varint length and that many bytes.
    encoded: &'a [u8],
}

impl<'a> Keys<'a> {
    /// How many.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The keys in order.
    pub fn iter(&self) -> KeysIter<'a> {
        KeysIter { left: self.count, rest: self.encoded }
    }

    /// The first key (an event that names keys names at least one).
    pub fn first(&self) -> Option<&'a [u8]> {
        self.iter().next()
    }
}

impl<'a> IntoIterator for Keys<'a> {
    type Item = &'a [u8];
    type IntoIter = KeysIter<'a>;

    fn into_iter(self) -> KeysIter<'a> {
        self.iter()
    }
}

impl PartialEq for Keys<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.count == other.count && self.iter().eq(other.iter())
    }
}

impl Eq for Keys<'_> {}

impl std::fmt::Debug for Keys<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_list().entries(self.iter().map(String::from_utf8_lossy)).finish()
    }
}

/// The keys of a [`Keys`], in order.
pub struct KeysIter<'a> {
    left: usize,
    rest: &'a [u8],
}

impl<'a> Iterator for KeysIter<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        let mut at = 0;
        // Checked at decode: this neither fails nor runs past the keys.
        let len = varint(self.rest, &mut at, u64::from(u16::MAX)).ok()? as usize;
        let key = self.rest.get(at..at + len)?;
        self.rest = &self.rest[at + len..];
        self.left -= 1;
        Some(key)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

/// An [`Event`] whose keys are borrowed from the frame it came in: what a consumer that only looks at an
/// event (a router hashing its keys into its own table) decodes, at no allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventRef<'a> {
    /// See [`Event::BlockStored`].
    BlockStored {
        /// Their keys.
        keys: Keys<'a>,
        /// The key the first names as its parent; without `chained`, the key every one names.
        parent: Option<&'a [u8]>,
        /// Each key after the first names the key before it as its parent.
        chained: bool,
        /// Bytes of value of each.
        size: u32,
        /// The tier they landed in.
        tier: Tier,
    },
    /// See [`Event::BlockRemoved`].
    BlockRemoved {
        /// Their keys.
        keys: Keys<'a>,
        /// Why.
        reason: RemovalReason,
    },
    /// See [`Event::TierChanged`].
    TierChanged {
        /// Its key.
        key: &'a [u8],
        /// The tier it was served from.
        from: Tier,
        /// The tier it is served from now.
        to: Tier,
    },
    /// See [`Event::Lagged`].
    Lagged {
        /// Events missed.
        missed: u32,
    },
}

impl<'a> EventRef<'a> {
    /// Decodes one event from the front of `bytes`, borrowing its keys; returns it, its sequence number and
    /// its length.
    pub fn decode(bytes: &'a [u8]) -> Result<(EventRef<'a>, u64, usize), ProtoError> {
        if bytes.len() < MIN_EVENT_BYTES {
            return Err(ProtoError::Truncated { needed: MIN_EVENT_BYTES, available: bytes.len() });
        }
        let (kind, codes) = (bytes[0], bytes[1]);
        let count = usize::from(u16::from_le_bytes([bytes[2], bytes[3]]));
        if kind & !(KIND_MASK | HAS_PARENT | CHAINED) != 0 {
            return Err(ProtoError::Field("event kind"));
        }
        let (has_parent, chained) = (kind & HAS_PARENT != 0, kind & CHAINED != 0);
        let mut at = 4;
        let sequence = varint(bytes, &mut at, u64::MAX)?;
        let size = varint(bytes, &mut at, u64::from(u32::MAX))? as u32;
        let parent = if has_parent {
            let len = varint(bytes, &mut at, u64::from(u16::MAX))? as usize;
            if len == 0 {
                return Err(ProtoError::Field("event parent"));
            }
            Some(take(bytes, &mut at, len)?)
        } else {
            None
        };
        // Bounded: at most 65,535 keys, each at least its one-byte length.
        let keys_at = at;
        for _ in 0..count {
            let len = varint(bytes, &mut at, u64::from(u16::MAX))? as usize;
            take(bytes, &mut at, len)?;
        }
        let keys = Keys { count, encoded: &bytes[keys_at..at] };
        let tier = |code: u8| Tier::from_u8(code).ok_or(ProtoError::Field("event tier"));
        let plain = !has_parent && !chained;
        let event = match kind & KIND_MASK {
            1 if count > 0 => EventRef::BlockStored { keys, parent, chained, size, tier: tier(codes)? },
            2 if plain && count > 0 => EventRef::BlockRemoved {
                keys,
                reason: RemovalReason::from_u8(codes).ok_or(ProtoError::Field("event removal reason"))?,
            },
            3 if plain && count == 1 => EventRef::TierChanged {
                key: keys.first().unwrap_or_default(),
                from: tier(codes >> 4)?,
                to: tier(codes & 0x0f)?,
            },
            4 if plain && count == 0 && codes == 0 => EventRef::Lagged { missed: size },
            _ => return Err(ProtoError::Field("event kind")),
        };
        Ok((event, sequence, at))
    }

    /// Appends the event with sequence number `sequence`.
    pub fn encode_into(&self, sequence: u64, out: &mut Vec<u8>) {
        match *self {
            EventRef::BlockStored { keys, parent, chained, size, tier } => {
                let event = OpenEvent::block_stored(out, sequence, parent, size, tier);
                event.push_encoded(out, keys);
                if chained {
                    event.set_chained(out);
                }
            }
            EventRef::BlockRemoved { keys, reason } => {
                OpenEvent::block_removed(out, sequence, reason).push_encoded(out, keys);
            }
            EventRef::TierChanged { key, from, to } => {
                OpenEvent::begin(out, 3, (from as u8) << 4 | to as u8, sequence, 0, None).push_key(out, key);
            }
            EventRef::Lagged { missed } => {
                OpenEvent::begin(out, 4, 0, sequence, missed, None);
            }
        }
    }

    /// A BLOCK_STORED event's blocks, each key with the parent it names (nothing for other kinds).
    pub fn stored_blocks(&self) -> impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + use<'a> {
        let (keys, parent, chained) = match *self {
            EventRef::BlockStored { keys, parent, chained, .. } => (keys.iter(), parent, chained),
            _ => (KeysIter { left: 0, rest: &[] }, None, false),
        };
        with_parents(keys, parent, chained)
    }

    /// The blocks it reports on: its keys (none for LAGGED).
    pub fn blocks(&self) -> usize {
        match self {
            EventRef::BlockStored { keys, .. } | EventRef::BlockRemoved { keys, .. } => keys.len(),
            EventRef::TierChanged { .. } => 1,
            EventRef::Lagged { .. } => 0,
        }
    }

    /// The owned event.
    pub fn to_event(&self) -> Event {
        let owned = |keys: Keys<'_>| keys.iter().map(<[u8]>::to_vec).collect();
        match *self {
            EventRef::BlockStored { keys, parent, chained, size, tier } => {
                Event::BlockStored { keys: owned(keys), parent: parent.map(<[u8]>::to_vec), chained, size, tier }
            }
            EventRef::BlockRemoved { keys, reason } => Event::BlockRemoved { keys: owned(keys), reason },
            EventRef::TierChanged { key, from, to } => Event::TierChanged { key: key.to_vec(), from, to },
            EventRef::Lagged { missed } => Event::Lagged { missed },
        }
    }
}

/// An event being written at the end of a buffer: its head, then its keys one at a time (a shard grows its
/// newest event while no subscriber has read it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenEvent {
    start: usize,
}

impl OpenEvent {
    /// Starts a BLOCK_STORED event at the end of `out` (an empty parent is no parent). It has no key yet,
    /// and does not decode until it has one.
    pub fn block_stored(out: &mut Vec<u8>, sequence: u64, parent: Option<&[u8]>, size: u32, tier: Tier) -> Self {
        Self::begin(out, 1, tier as u8, sequence, size, parent)
    }

    /// Starts a BLOCK_REMOVED event at the end of `out`. It has no key yet, and does not decode until it
    /// has one.
    pub fn block_removed(out: &mut Vec<u8>, sequence: u64, reason: RemovalReason) -> Self {
        Self::begin(out, 2, reason as u8, sequence, 0, None)
    }

    fn begin(out: &mut Vec<u8>, kind: u8, codes: u8, sequence: u64, size: u32, parent: Option<&[u8]>) -> Self {
        // An empty parent is no parent (its length would be 0, which decoding refuses).
        let parent = parent.filter(|parent| !parent.is_empty());
        // One reservation and one head copy: this runs for each observed put that starts an event, on the
        // shard's thread.
        let mut head = [0u8; MAX_EVENT_HEAD_BYTES];
        head[0] = kind | if parent.is_some() { HAS_PARENT } else { 0 };
        head[1] = codes;
        let mut at = 4;
        put_varint(&mut head, &mut at, sequence);
        put_varint(&mut head, &mut at, u64::from(size));
        if let Some(parent) = parent {
            put_varint(&mut head, &mut at, parent.len() as u64);
        }
        let parent = parent.unwrap_or(&[]);
        let start = out.len();
        out.reserve(at + parent.len());
        out.extend_from_slice(&head[..at]);
        out.extend_from_slice(parent);
        Self { start }
    }

    /// Where it starts in its buffer.
    #[inline]
    pub fn start(&self) -> usize {
        self.start
    }

    /// Keys it names so far.
    #[inline]
    pub fn keys(&self, out: &[u8]) -> usize {
        usize::from(u16::from_le_bytes([out[self.start + 2], out[self.start + 3]]))
    }

    /// Appends `key` (at most 65,535 bytes; longer is cut) to it, the last event in `out`; false, and
    /// nothing appended, when it names [`MAX_EVENT_KEYS`] already.
    #[inline]
    pub fn push_key(&self, out: &mut Vec<u8>, key: &[u8]) -> bool {
        let count = self.keys(out);
        if count >= MAX_EVENT_KEYS {
            return false;
        }
        let key = &key[..key.len().min(usize::from(u16::MAX))];
        out.reserve(3 + key.len());
        if key.len() < 0x80 {
            // The usual key: a one-byte length.
            out.push(key.len() as u8);
        } else {
            let mut len = [0u8; 3];
            let mut at = 0;
            put_varint(&mut len, &mut at, key.len() as u64);
            out.extend_from_slice(&len[..at]);
        }
        out.extend_from_slice(key);
        self.set_keys(out, count + 1);
        true
    }

    /// Appends keys already encoded (from a decoded event), as many as fit under [`MAX_EVENT_KEYS`].
    fn push_encoded(&self, out: &mut Vec<u8>, keys: Keys<'_>) {
        let count = self.keys(out);
        if count + keys.len() <= MAX_EVENT_KEYS {
            out.extend_from_slice(keys.encoded);
            self.set_keys(out, count + keys.len());
        } else {
            for key in keys {
                self.push_key(out, key);
            }
        }
    }

    #[inline]
    fn set_keys(&self, out: &mut [u8], count: usize) {
        out[self.start + 2..self.start + 4].copy_from_slice(&(count as u16).to_le_bytes());
    }

    /// Marks it chained: each key after the first names the key before it as its parent (BLOCK_STORED).
    #[inline]
    pub fn set_chained(&self, out: &mut [u8]) {
        out[self.start] |= CHAINED;
    }
}

/// The `len` bytes at `at`, moving `at` past them.
fn take<'a>(bytes: &'a [u8], at: &mut usize, len: usize) -> Result<&'a [u8], ProtoError> {
    let end = *at + len;
    let taken = bytes.get(*at..end).ok_or(ProtoError::Truncated { needed: end, available: bytes.len() })?;
    *at = end;
    Ok(taken)
}

/// Appends `value` as an unsigned LEB128 varint at `at` (`buffer` has room: callers size it for the
/// largest).
fn put_varint(buffer: &mut [u8], at: &mut usize, mut value: u64) {
    while value >= 0x80 {
        buffer[*at] = (value as u8) | 0x80;
        value >>= 7;
        *at += 1;
    }
    buffer[*at] = value as u8;
    *at += 1;
}

/// Reads an unsigned LEB128 varint at `at`, refusing one that is cut short, longer than ten bytes, or
/// above `max`.
fn varint(bytes: &[u8], at: &mut usize, max: u64) -> Result<u64, ProtoError> {
    let mut value = 0u64;
    // Bounded: ten bytes carry 64 bits.
    for index in 0..10 {
        let Some(&byte) = bytes.get(*at) else {
            return Err(ProtoError::Truncated { needed: *at + 1, available: bytes.len() });
        };
        *at += 1;
        let bits = u64::from(byte & 0x7f);
        if index == 9 && bits > 1 {
            return Err(ProtoError::Field("event varint"));
        }
        value |= bits << (7 * index);
        if byte & 0x80 == 0 {
            return if value <= max { Ok(value) } else { Err(ProtoError::Field("event varint")) };
        }
    }
    Err(ProtoError::Field("event varint"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<Vec<u8>> {
        names.iter().map(|name| name.as_bytes().to_vec()).collect()
    }

    #[test]
    fn every_kind_round_trips_and_hostile_bytes_are_refused() {
        let events = [
            Event::BlockStored {
                keys: keys(&["k1"]),
                parent: Some(b"k0".to_vec()),
                chained: false,
                size: 4096,
                tier: Tier::Dram,
            },
            Event::BlockStored {
                keys: keys(&["c1", "c2", "c3"]),
                parent: Some(b"c0".to_vec()),
                chained: true,
                size: u32::MAX,
                tier: Tier::Nvme,
            },
            Event::BlockStored { keys: keys(&["s1", "s2"]), parent: None, chained: false, size: 1, tier: Tier::Dram },
            Event::BlockRemoved { keys: keys(&["k3", "k4"]), reason: RemovalReason::Checksum },
            Event::TierChanged { key: b"k5".to_vec(), from: Tier::Dram, to: Tier::Nvme },
            Event::Lagged { missed: 77 },
            Event::BlockStored {
                keys: vec![vec![7; 65_535]],
                parent: Some(vec![8; 65_535]),
                chained: false,
                size: 0,
                tier: Tier::Dram,
            },
        ];
        let sequences = [0, 127, 128, 1 << 35, 5, u64::MAX - 1, u64::MAX];
        let mut bytes = Vec::new();
        for (event, sequence) in events.iter().zip(sequences) {
            event.encode_into(sequence, &mut bytes);
        }
        let mut at = 0;
        for (event, sequence) in events.iter().zip(sequences) {
            let (decoded, decoded_sequence, len) = Event::decode(&bytes[at..]).expect("decodes");
            assert_eq!(&decoded, event);
            assert_eq!(decoded_sequence, sequence);
            // Re-encoded from its borrowed form, it is the same bytes.
            let mut again = Vec::new();
            EventRef::decode(&bytes[at..]).expect("decodes").0.encode_into(sequence, &mut again);
            assert_eq!(again, &bytes[at..at + len]);
            at += len;
        }
        assert_eq!(at, bytes.len());
        // The first event: kind, tier, one key, sequence 0, size 4096 (two bytes), the parent, the key.
        let first = [0x09, 1, 1, 0, 0, 0x80, 0x20, 2, b'k', b'0', 2, b'k', b'1'];
        assert_eq!(&bytes[..first.len()], &first);
        for cut in 0..first.len() {
            assert!(Event::decode(&bytes[..cut]).is_err(), "the first event cut to {cut} bytes");
        }
        let refused = |change: &dyn Fn(&mut Vec<u8>)| {
            let mut bad = first.to_vec();
            change(&mut bad);
            Event::decode(&bad).is_err()
        };
        assert!(refused(&|bad| bad[0] = 0x0d), "an unknown kind");
        assert!(refused(&|bad| bad[0] |= 0x40), "a reserved bit");
        assert!(refused(&|bad| bad[1] = 7), "an unknown tier");
        assert!(refused(&|bad| bad[0] = 0x0a), "a parent on BLOCK_REMOVED");
        assert!(refused(&|bad| bad[0] = 0x12), "a chained BLOCK_REMOVED");
        assert!(refused(&|bad| bad[7] = 0), "a parent flag with an empty parent");
        assert!(refused(&|bad| bad[2] = 0), "a BLOCK_STORED of no key");
        assert!(refused(&|bad| bad[2] = 2), "a count past the keys there are");
        // A varint that never ends, one past 64 bits, a size past u32, a key longer than 65,535 bytes.
        assert!(Event::decode(&[1, 1, 1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]).is_err());
        assert!(
            Event::decode(&[1, 1, 1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0]).is_err()
        );
        assert!(Event::decode(&[1, 1, 1, 0, 0, 0x80, 0x80, 0x80, 0x80, 0x10, 0]).is_err());
        assert!(Event::decode(&[1, 1, 1, 0, 0, 0, 0x80, 0x80, 0x04]).is_err());
        assert!(Event::decode(&[4, 0, 1, 0, 0, 5, 1, b'k']).is_err(), "LAGGED with a key");
        assert!(Event::decode(&[3, 0x12, 2, 0, 0, 0, 1, b'a', 1, b'b']).is_err(), "TIER_CHANGED of two keys");
        // The smallest event.
        assert_eq!(
            Event::decode(&[4, 0, 0, 0, 3, 5]).expect("LAGGED"),
            (Event::Lagged { missed: 5 }, 3, MIN_EVENT_BYTES)
        );
    }

    #[test]
    fn an_open_event_grows_by_a_key_at_a_time_to_its_limit() {
        let key = b"strata-bench/3/123456";
        let mut bytes = vec![0xee; 3];
        let event = OpenEvent::block_stored(&mut bytes, 10_000_000, None, 64, Tier::Dram);
        assert_eq!(event.start(), 3);
        assert!(EventRef::decode(&bytes[3..]).is_err(), "no key yet");
        assert!(event.push_key(&mut bytes, key));
        // A typical event: four bytes, a four-byte sequence, size, key length, key.
        assert_eq!(bytes.len() - 3, 4 + 4 + 1 + 1 + key.len());
        assert!(event.push_key(&mut bytes, b"second"));
        assert_eq!(bytes.len() - 3, 4 + 4 + 1 + 1 + key.len() + 1 + 6, "a further key costs its length and bytes");
        event.set_chained(&mut bytes);
        let (decoded, sequence, len) = EventRef::decode(&bytes[3..]).expect("decodes");
        assert_eq!((sequence, len), (10_000_000, bytes.len() - 3));
        let EventRef::BlockStored { keys, parent: None, chained: true, size: 64, tier: Tier::Dram } = decoded else {
            panic!("{decoded:?}");
        };
        assert_eq!(keys.iter().collect::<Vec<_>>(), [&key[..], b"second"]);
        assert_eq!(decoded.blocks(), 2);
        assert_eq!(decoded.stored_blocks().collect::<Vec<_>>(), [(&key[..], None), (&b"second"[..], Some(&key[..]))]);
        let siblings = Event::BlockStored {
            keys: vec![b"a".to_vec(), b"b".to_vec()],
            parent: Some(b"p".to_vec()),
            chained: false,
            size: 1,
            tier: Tier::Dram,
        };
        assert_eq!(
            siblings.stored_blocks().collect::<Vec<_>>(),
            [(&b"a"[..], Some(&b"p"[..])), (&b"b"[..], Some(&b"p"[..]))]
        );
        assert_eq!(Event::Lagged { missed: 1 }.stored_blocks().count(), 0);
        // Full at 65,535 keys: the next one is refused and nothing is written.
        let mut full = Vec::new();
        let event = OpenEvent::block_removed(&mut full, 1, RemovalReason::Evicted);
        for _ in 0..MAX_EVENT_KEYS {
            assert!(event.push_key(&mut full, b"k"));
        }
        let len = full.len();
        assert!(!event.push_key(&mut full, b"k"));
        assert_eq!(full.len(), len);
        let (decoded, _, _) = EventRef::decode(&full).expect("decodes");
        assert_eq!(decoded.blocks(), MAX_EVENT_KEYS);
        assert_eq!(EventRef::Lagged { missed: 1 }.blocks(), 0);
    }
}
