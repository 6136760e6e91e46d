//! Cache events, in the vocabulary of vLLM's KV events: what a router needs to track which blocks a node
//! holds and where.
//!
//! ```text
//! event: two bytes, then three or four LEB128 varints, then the key, then the parent key
//!  byte 0   bits 0-2 kind: 1 BLOCK_STORED, 2 BLOCK_REMOVED, 3 TIER_CHANGED, 4 LAGGED
//!           bit 3 a parent key follows (BLOCK_STORED only); bits 4-7 zero
//!  byte 1   BLOCK_STORED: its tier; BLOCK_REMOVED: the reason; TIER_CHANGED: from << 4 | to; LAGGED: 0
//!  varint   sequence: the shard's event number (consecutive; a gap is announced by LAGGED)
//!  varint   size: BLOCK_STORED value bytes, LAGGED events missed, otherwise 0 (at most u32::MAX)
//!  varint   key len (at most 65,535; 0 for LAGGED)
//!  varint   parent len, only with bit 3 (1 to 65,535)
//!   tier: 0 none, 1 DRAM, 2 NVMe; reason: 1 removed, 2 evicted, 3 checksum, 4 storage error,
//!     5 cascaded (its parent or a member of its group left)
//! ```
//!
//! *Decision:* varints rather than a fixed 24-byte header. An observed put costs the node its event's bytes
//! twice on loopback (the send and, on the same core, the receive side's TCP work): ~0.9 ns a byte in
//! `perf`, about as much as the event log itself. A typical event (a 21-byte key like strata-bench's, a
//! small size, a sequence under 2^28) takes 29 bytes instead of 45. The sequence stays absolute, not a
//! delta, so an event decodes on its own and a frame is any run of the log.

use crate::frame::ProtoError;

/// The fewest bytes an event takes (a LAGGED event with one-byte varints).
pub const MIN_EVENT_BYTES: usize = 5;

/// Bytes an event's fixed part and varints take at most (2 + 10 + 5 + 3 + 3).
const MAX_EVENT_HEAD_BYTES: usize = 23;

const HAS_PARENT: u8 = 0x08;

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
    /// A block was stored (a put or an upsert).
    BlockStored {
        /// Its key.
        key: Vec<u8>,
        /// The key it names as its parent, if any.
        parent: Option<Vec<u8>>,
        /// Bytes of value.
        size: u32,
        /// The tier it landed in.
        tier: Tier,
    },
    /// A block left the node.
    BlockRemoved {
        /// Its key.
        key: Vec<u8>,
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
    /// Appends the event with sequence number `sequence`.
    pub fn encode_into(&self, sequence: u64, out: &mut Vec<u8>) {
        self.as_ref().encode_into(sequence, out);
    }

    /// The event with its keys borrowed.
    pub fn as_ref(&self) -> EventRef<'_> {
        match self {
            Event::BlockStored { key, parent, size, tier } => {
                EventRef::BlockStored { key, parent: parent.as_deref(), size: *size, tier: *tier }
            }
            Event::BlockRemoved { key, reason } => EventRef::BlockRemoved { key, reason: *reason },
            Event::TierChanged { key, from, to } => EventRef::TierChanged { key, from: *from, to: *to },
            Event::Lagged { missed } => EventRef::Lagged { missed: *missed },
        }
    }

    /// Decodes one event from the front of `bytes`; returns it, its sequence number and its length.
    pub fn decode(bytes: &[u8]) -> Result<(Event, u64, usize), ProtoError> {
        let (event, sequence, len) = EventRef::decode(bytes)?;
        Ok((event.to_event(), sequence, len))
    }
}

/// An [`Event`] whose keys are borrowed from the frame it came in: what a consumer that only looks at an
/// event (a router hashing its keys into its own table) decodes, at no allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventRef<'a> {
    /// See [`Event::BlockStored`].
    BlockStored {
        /// Its key.
        key: &'a [u8],
        /// The key it names as its parent, if any.
        parent: Option<&'a [u8]>,
        /// Bytes of value.
        size: u32,
        /// The tier it landed in.
        tier: Tier,
    },
    /// See [`Event::BlockRemoved`].
    BlockRemoved {
        /// Its key.
        key: &'a [u8],
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
        if kind & !(HAS_PARENT | 0x07) != 0 {
            return Err(ProtoError::Field("event kind"));
        }
        let has_parent = kind & HAS_PARENT != 0;
        let mut at = 2;
        let sequence = varint(bytes, &mut at, u64::MAX)?;
        let size = varint(bytes, &mut at, u64::from(u32::MAX))? as u32;
        let key_len = varint(bytes, &mut at, u64::from(u16::MAX))? as usize;
        let parent_len = if has_parent { varint(bytes, &mut at, u64::from(u16::MAX))? as usize } else { 0 };
        let total = at + key_len + parent_len;
        if bytes.len() < total {
            return Err(ProtoError::Truncated { needed: total, available: bytes.len() });
        }
        let key = &bytes[at..at + key_len];
        let parent = &bytes[at + key_len..total];
        let tier = |code: u8| Tier::from_u8(code).ok_or(ProtoError::Field("event tier"));
        let event = match kind & 0x07 {
            1 if !has_parent || parent_len > 0 => {
                EventRef::BlockStored { key, parent: has_parent.then_some(parent), size, tier: tier(codes)? }
            }
            2 if !has_parent => EventRef::BlockRemoved {
                key,
                reason: RemovalReason::from_u8(codes).ok_or(ProtoError::Field("event removal reason"))?,
            },
            3 if !has_parent => EventRef::TierChanged { key, from: tier(codes >> 4)?, to: tier(codes & 0x0f)? },
            4 if !has_parent && key_len == 0 && codes == 0 => EventRef::Lagged { missed: size },
            _ => return Err(ProtoError::Field("event kind")),
        };
        Ok((event, sequence, total))
    }

    /// Appends the event with sequence number `sequence` (the node encodes straight from its own state, with
    /// borrowed keys).
    pub fn encode_into(&self, sequence: u64, out: &mut Vec<u8>) {
        let (kind, codes, size, key, parent): (u8, u8, u32, &[u8], Option<&[u8]>) = match *self {
            EventRef::BlockStored { key, parent, size, tier } => (1, tier as u8, size, key, parent),
            EventRef::BlockRemoved { key, reason } => (2, reason as u8, 0, key, None),
            EventRef::TierChanged { key, from, to } => (3, (from as u8) << 4 | to as u8, 0, key, None),
            EventRef::Lagged { missed } => (4, 0, missed, &[], None),
        };
        // An empty parent is no parent (the length varint would say 0, which decoding refuses).
        let parent = parent.filter(|parent| !parent.is_empty());
        // One reservation and one head copy: this runs once per observed put, on the shard's thread.
        let mut head = [0u8; MAX_EVENT_HEAD_BYTES];
        head[0] = kind | if parent.is_some() { HAS_PARENT } else { 0 };
        head[1] = codes;
        let mut at = 2;
        put_varint(&mut head, &mut at, sequence);
        put_varint(&mut head, &mut at, u64::from(size));
        put_varint(&mut head, &mut at, key.len() as u64);
        if let Some(parent) = parent {
            put_varint(&mut head, &mut at, parent.len() as u64);
        }
        let parent = parent.unwrap_or(&[]);
        out.reserve(at + key.len() + parent.len());
        out.extend_from_slice(&head[..at]);
        out.extend_from_slice(key);
        out.extend_from_slice(parent);
    }

    /// Its key (none for LAGGED).
    pub fn key(&self) -> Option<&'a [u8]> {
        match *self {
            EventRef::BlockStored { key, .. }
            | EventRef::BlockRemoved { key, .. }
            | EventRef::TierChanged { key, .. } => Some(key),
            EventRef::Lagged { .. } => None,
        }
    }

    /// The event with the first `strip` bytes of its keys taken off (a tenant's prefix).
    pub fn stripped(&self, strip: usize) -> EventRef<'a> {
        let cut = |key: &'a [u8]| &key[strip.min(key.len())..];
        match *self {
            EventRef::BlockStored { key, parent, size, tier } => {
                EventRef::BlockStored { key: cut(key), parent: parent.map(cut), size, tier }
            }
            EventRef::BlockRemoved { key, reason } => EventRef::BlockRemoved { key: cut(key), reason },
            EventRef::TierChanged { key, from, to } => EventRef::TierChanged { key: cut(key), from, to },
            EventRef::Lagged { missed } => EventRef::Lagged { missed },
        }
    }

    /// The owned event.
    pub fn to_event(&self) -> Event {
        match *self {
            EventRef::BlockStored { key, parent, size, tier } => {
                Event::BlockStored { key: key.to_vec(), parent: parent.map(<[u8]>::to_vec), size, tier }
            }
            EventRef::BlockRemoved { key, reason } => Event::BlockRemoved { key: key.to_vec(), reason },
            EventRef::TierChanged { key, from, to } => Event::TierChanged { key: key.to_vec(), from, to },
            EventRef::Lagged { missed } => Event::Lagged { missed },
        }
    }
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

    #[test]
    fn every_kind_round_trips_and_hostile_bytes_are_refused() {
        let events = [
            Event::BlockStored { key: b"k1".to_vec(), parent: Some(b"k0".to_vec()), size: 4096, tier: Tier::Dram },
            Event::BlockStored { key: b"k2".to_vec(), parent: None, size: u32::MAX, tier: Tier::Nvme },
            Event::BlockRemoved { key: b"k3".to_vec(), reason: RemovalReason::Checksum },
            Event::TierChanged { key: b"k4".to_vec(), from: Tier::Dram, to: Tier::Nvme },
            Event::Lagged { missed: 77 },
            Event::BlockStored { key: vec![7; 65_535], parent: Some(vec![8; 65_535]), size: 0, tier: Tier::Dram },
        ];
        let sequences = [0, 127, 128, 1 << 35, u64::MAX - 1, u64::MAX];
        let mut bytes = Vec::new();
        for (event, sequence) in events.iter().zip(sequences) {
            event.encode_into(sequence, &mut bytes);
        }
        let mut at = 0;
        for (event, sequence) in events.iter().zip(sequences) {
            let (decoded, decoded_sequence, len) = Event::decode(&bytes[at..]).expect("decodes");
            assert_eq!(&decoded, event);
            assert_eq!(decoded_sequence, sequence);
            at += len;
        }
        assert_eq!(at, bytes.len());
        // The first event: kind, tier, sequence 0, size 4096 (two bytes), key len, parent len, two keys.
        assert_eq!(&bytes[..11], &[0x09, 1, 0, 0x80, 0x20, 2, 2, b'k', b'1', b'k', b'0']);
        for cut in 0..11 {
            assert!(Event::decode(&bytes[..cut]).is_err(), "the first event cut to {cut} bytes");
        }
        let first = bytes[..11].to_vec();
        let refused = |change: &dyn Fn(&mut Vec<u8>)| {
            let mut bad = first.clone();
            change(&mut bad);
            Event::decode(&bad).is_err()
        };
        assert!(refused(&|bad| bad[0] = 0x0d), "an unknown kind");
        assert!(refused(&|bad| bad[0] |= 0x40), "a reserved bit");
        assert!(refused(&|bad| bad[1] = 7), "an unknown tier");
        assert!(refused(&|bad| bad[0] = 0x0a), "a parent on BLOCK_REMOVED");
        assert!(refused(&|bad| bad[6] = 0), "a parent flag with an empty parent");
        // A varint that never ends, one past 64 bits, a size past u32, a key longer than 65,535 bytes.
        assert!(Event::decode(&[1, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0]).is_err());
        assert!(Event::decode(&[1, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0]).is_err());
        assert!(Event::decode(&[1, 1, 0, 0x80, 0x80, 0x80, 0x80, 0x10, 0]).is_err());
        assert!(Event::decode(&[1, 1, 0, 0, 0x80, 0x80, 0x04]).is_err());
        assert!(Event::decode(&[4, 0, 0, 5, 1, b'k']).is_err(), "LAGGED with a key");
        // The smallest event.
        assert_eq!(Event::decode(&[4, 0, 3, 5, 0]).expect("LAGGED"), (Event::Lagged { missed: 5 }, 3, MIN_EVENT_BYTES));
    }

    #[test]
    fn a_typical_event_is_29_bytes_and_a_stripped_one_loses_its_prefix() {
        let key = b"strata-bench/3/123456";
        let mut bytes = Vec::new();
        let stored = EventRef::BlockStored { key, parent: None, size: 64, tier: Tier::Dram };
        stored.encode_into(10_000_000, &mut bytes);
        assert_eq!(bytes.len(), 2 + 4 + 1 + 1 + key.len());
        let tenant = EventRef::BlockStored { key: b"t1/k", parent: Some(b"t1/p"), size: 1, tier: Tier::Nvme };
        assert_eq!(
            tenant.stripped(3),
            EventRef::BlockStored { key: b"k", parent: Some(b"p"), size: 1, tier: Tier::Nvme }
        );
        assert_eq!(tenant.key(), Some(&b"t1/k"[..]));
        assert_eq!(EventRef::Lagged { missed: 1 }.key(), None);
    }
}
