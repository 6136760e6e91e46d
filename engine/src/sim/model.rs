//! What must remain: the simulation's record of every key's acknowledged state, and the values it writes.
//!
//! A value names its key and version in its first bytes and the rest is derived from both, so a read
//! that returns another key's bytes, another version's, or damaged bytes is told apart from the right one.
//!
//! A read is right when it returns the newest acknowledged version, or a version written after it whose
//! put failed or was cut off (its outcome is unknown), or a miss where a miss is allowed: the key was
//! never acknowledged as stored, a removal of it is acknowledged or under way, the node said it left (an
//! eviction or a cascade the events reported), or a crash took what was not yet durable. A version older
//! than the newest acknowledged one, or a key whose removal was acknowledged, is never right.

/// Bytes at the start of a value that name its key, version and length.
pub const VALUE_HEADER_BYTES: usize = 12;

/// The bytes of version `version` of key `key`, `len` bytes long (at least [`VALUE_HEADER_BYTES`]).
pub fn value_of(key: u32, version: u32, len: usize) -> Vec<u8> {
    let len = len.max(VALUE_HEADER_BYTES);
    let mut bytes = Vec::with_capacity(len);
    bytes.extend_from_slice(&key.to_le_bytes());
    bytes.extend_from_slice(&version.to_le_bytes());
    bytes.extend_from_slice(&(len as u32).to_le_bytes());
    let mut state = (u64::from(key) << 32 | u64::from(version)).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while bytes.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.push(state as u8);
    }
    bytes
}

/// The key and version whose whole value `bytes` are, if they are exactly that value.
pub fn identify(bytes: &[u8]) -> Option<(u32, u32)> {
    let word = |at: usize| bytes.get(at..at + 4).map(|word| u32::from_le_bytes([word[0], word[1], word[2], word[3]]));
    let (key, version, len) = (word(0)?, word(4)?, word(8)?);
    (len as usize == bytes.len() && value_of(key, version, bytes.len()) == bytes).then_some((key, version))
}

/// A version of a key: its number and its value's length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version {
    /// Its number (each put of a key writes a new one).
    pub number: u32,
    /// Its value's length.
    pub len: u32,
}

/// What the model knows of one key.
#[derive(Clone, Debug, Default)]
pub struct KeyState {
    /// The newest acknowledged version, or none (never stored, or its removal acknowledged).
    pub acked: Option<Version>,
    /// Whether that acknowledgement promised durability (a durable put, or a removal: both are synced).
    pub durable: bool,
    /// Versions written after it whose outcome is unknown (the put failed or was cut off by a crash).
    pub doubtful: Vec<Version>,
    /// A miss is allowed: the node said the key left, a removal of it is in doubt, or a crash may have
    /// taken it.
    pub may_miss: bool,
    /// Its acknowledged version is hard-pinned: nothing but a removal may take it.
    pub hard_pinned: bool,
}

impl KeyState {
    /// Whether `version` is one a read may return.
    pub fn allows(&self, version: u32) -> bool {
        self.acked.is_some_and(|acked| acked.number == version) || self.doubtful.iter().any(|v| v.number == version)
    }

    /// Whether a miss is allowed.
    pub fn allows_miss(&self) -> bool {
        self.acked.is_none() || self.may_miss
    }

    /// Whether the key may be stored at all (a put of it may answer EXISTS, a lookup may find it).
    pub fn may_exist(&self) -> bool {
        self.acked.is_some() || !self.doubtful.is_empty()
    }

    /// The versions a read may return.
    pub fn readable(&self) -> impl Iterator<Item = Version> + '_ {
        self.acked.iter().copied().chain(self.doubtful.iter().copied())
    }

    /// A put of `version` was acknowledged.
    pub fn put_acked(&mut self, version: Version, durable: bool, hard_pinned: bool) {
        *self = KeyState { acked: Some(version), durable, doubtful: Vec::new(), may_miss: false, hard_pinned };
    }

    /// A removal was acknowledged (its tombstone, if one was needed, is durable).
    pub fn remove_acked(&mut self) {
        *self = KeyState { durable: true, ..KeyState::default() };
    }

    /// A put of `version` failed or was cut off: it may or may not be stored.
    pub fn put_in_doubt(&mut self, version: Version) {
        self.doubtful.push(version);
    }

    /// A removal failed or was cut off: the key may be gone.
    pub fn remove_in_doubt(&mut self) {
        self.may_miss = true;
        self.hard_pinned = false;
    }

    /// The node reported that the key left (evicted, cascaded, dropped for damage).
    pub fn left(&mut self) {
        self.may_miss = true;
    }

    /// A crash: what was acknowledged without a promise of durability may be gone; and (`losses`) the
    /// shard's recovery reported damage, so anything may be.
    pub fn crashed(&mut self, losses: bool) {
        if !self.durable || losses {
            self.may_miss = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_identify_their_key_and_version_and_nothing_else() {
        let value = value_of(7, 3, 100);
        assert_eq!(identify(&value), Some((7, 3)));
        assert_eq!(identify(&value_of(7, 3, 1)).map(|(key, _)| key), Some(7), "short values are padded");
        let mut damaged = value.clone();
        damaged[50] ^= 1;
        assert_eq!(identify(&damaged), None);
        assert_eq!(identify(&value[..99]), None, "a truncated value");
        assert_ne!(value_of(7, 4, 100)[12..], value[12..], "another version's bytes differ");
    }

    #[test]
    fn a_superseded_version_is_never_allowed() {
        let mut key = KeyState::default();
        assert!(key.allows_miss() && !key.may_exist());
        key.put_acked(Version { number: 1, len: 10 }, true, false);
        key.put_in_doubt(Version { number: 2, len: 10 });
        assert!(key.allows(1) && key.allows(2) && !key.allows_miss());
        key.put_acked(Version { number: 3, len: 10 }, false, false);
        assert!(!key.allows(1) && !key.allows(2) && key.allows(3));
        key.crashed(false);
        assert!(key.allows_miss(), "a put not promised durable may be lost in a crash");
        key.remove_acked();
        key.crashed(false);
        assert!(!key.allows(3) && !key.may_exist(), "an acknowledged removal holds across a crash");
    }
}
