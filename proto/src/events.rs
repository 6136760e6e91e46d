//! Cache events, in the vocabulary of vLLM's KV events: what a router needs to track which blocks a node
//! holds and where.
//!
//! ```text
//! event (24 bytes), then the key, then the parent key
//!  0      1      2    3        4           8         10           12     16            24
//!  | kind | from | to | reason | size      | key len | parent len | rsvd | sequence    |
//!   kind: 1 BLOCK_STORED (to: its tier, size: value bytes), 2 BLOCK_REMOVED (reason),
//!         3 TIER_CHANGED (from → to), 4 LAGGED (size: events missed; no key)
//!   tier: 0 none, 1 DRAM, 2 NVMe; reason: 1 removed, 2 evicted, 3 checksum, 4 storage error,
//!     5 cascaded (its parent or a member of its group left)
//!   sequence: the shard's event number (consecutive; a gap is announced by LAGGED)
//! ```

use crate::frame::{ProtoError, u16_at, u32_at, u64_at};

/// Bytes of an event header.
pub const EVENT_HEADER_BYTES: usize = 24;

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
        let (kind, from, to, reason, size, key, parent): (u8, Tier, Tier, u8, u32, &[u8], &[u8]) = match self {
            Event::BlockStored { key, parent, size, tier } => {
                (1, Tier::None, *tier, 0, *size, key, parent.as_deref().unwrap_or(&[]))
            }
            Event::BlockRemoved { key, reason } => (2, Tier::None, Tier::None, *reason as u8, 0, key, &[]),
            Event::TierChanged { key, from, to } => (3, *from, *to, 0, 0, key, &[]),
            Event::Lagged { missed } => (4, Tier::None, Tier::None, 0, *missed, &[], &[]),
        };
        encode_parts(out, [kind, from as u8, to as u8, reason], size, key, parent, sequence);
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
        if bytes.len() < EVENT_HEADER_BYTES {
            return Err(ProtoError::Truncated { needed: EVENT_HEADER_BYTES, available: bytes.len() });
        }
        let key_len = usize::from(u16_at(bytes, 8));
        let parent_len = usize::from(u16_at(bytes, 10));
        let total = EVENT_HEADER_BYTES + key_len + parent_len;
        if bytes.len() < total {
            return Err(ProtoError::Truncated { needed: total, available: bytes.len() });
        }
        let key = &bytes[EVENT_HEADER_BYTES..EVENT_HEADER_BYTES + key_len];
        let parent = &bytes[EVENT_HEADER_BYTES + key_len..total];
        let tier = |at: usize| Tier::from_u8(bytes[at]).ok_or(ProtoError::Field("event tier"));
        let size = u32_at(bytes, 4);
        let event = match bytes[0] {
            1 => EventRef::BlockStored { key, parent: (!parent.is_empty()).then_some(parent), size, tier: tier(2)? },
            2 => EventRef::BlockRemoved {
                key,
                reason: RemovalReason::from_u8(bytes[3]).ok_or(ProtoError::Field("event removal reason"))?,
            },
            3 => EventRef::TierChanged { key, from: tier(1)?, to: tier(2)? },
            4 => EventRef::Lagged { missed: size },
            _ => return Err(ProtoError::Field("event kind")),
        };
        Ok((event, u64_at(bytes, 16), total))
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

/// Appends an event from its parts (the node encodes straight from its own state without building an
/// [`Event`]): `codes` is `[kind, from, to, reason]`.
pub fn encode_parts(out: &mut Vec<u8>, codes: [u8; 4], size: u32, key: &[u8], parent: &[u8], sequence: u64) {
    // One reservation and one header copy: this runs once per observed put, on the shard's thread.
    let mut header = [0u8; EVENT_HEADER_BYTES];
    header[0..4].copy_from_slice(&codes);
    header[4..8].copy_from_slice(&size.to_le_bytes());
    header[8..10].copy_from_slice(&(key.len() as u16).to_le_bytes());
    header[10..12].copy_from_slice(&(parent.len() as u16).to_le_bytes());
    header[16..24].copy_from_slice(&sequence.to_le_bytes());
    out.reserve(EVENT_HEADER_BYTES + key.len() + parent.len());
    out.extend_from_slice(&header);
    out.extend_from_slice(key);
    out.extend_from_slice(parent);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_and_hostile_bytes_are_refused() {
        let events = [
            Event::BlockStored { key: b"k1".to_vec(), parent: Some(b"k0".to_vec()), size: 4096, tier: Tier::Dram },
            Event::BlockStored { key: b"k2".to_vec(), parent: None, size: 1, tier: Tier::Nvme },
            Event::BlockRemoved { key: b"k3".to_vec(), reason: RemovalReason::Checksum },
            Event::TierChanged { key: b"k4".to_vec(), from: Tier::Dram, to: Tier::Nvme },
            Event::Lagged { missed: 77 },
        ];
        let mut bytes = Vec::new();
        for (sequence, event) in events.iter().enumerate() {
            event.encode_into(sequence as u64 + 10, &mut bytes);
        }
        let mut at = 0;
        for (sequence, event) in events.iter().enumerate() {
            let (decoded, decoded_sequence, len) = Event::decode(&bytes[at..]).expect("decodes");
            assert_eq!(&decoded, event);
            assert_eq!(decoded_sequence, sequence as u64 + 10);
            at += len;
        }
        assert_eq!(at, bytes.len());
        assert!(Event::decode(&bytes[..30]).is_ok());
        assert!(Event::decode(&bytes[..25]).is_err(), "a key cut short");
        let mut bad = bytes.clone();
        bad[0] = 9;
        assert!(Event::decode(&bad).is_err());
        bad[0] = 1;
        bad[2] = 7;
        assert!(Event::decode(&bad).is_err());
    }
}
