//! The version of a replicated upsert: `(epoch, sequence)`, assigned by the writer, compared by every
//! replica. A replica keeps the highest version it has stored and refuses an older one (`SUPERSEDED`), so
//! replicas that receive two writers' upserts in different orders keep the same one, and no replica ever
//! answers an older version than one it acknowledged.
//!
//! ```text
//!  0       8          16
//!  | epoch | sequence |
//!   epoch: the cluster epoch of the writer's view (an upsert under a newer membership wins)
//!   sequence: the writer's clock, microseconds since the Unix epoch shifted left 12 bits, in the low 12
//!     bits the writer's id; strictly increasing per writer even if its clock steps back
//! ```

/// Bytes of a version on the wire and in a record.
pub const VERSION_BYTES: usize = 16;

/// The version of an upserted object. Ordered by epoch, then sequence.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// The cluster epoch the writer routed by.
    pub epoch: u64,
    /// The writer's sequence within (and across) epochs.
    pub sequence: u64,
}

impl Version {
    /// Its 16 bytes.
    pub fn encode(&self) -> [u8; VERSION_BYTES] {
        let mut bytes = [0u8; VERSION_BYTES];
        bytes[..8].copy_from_slice(&self.epoch.to_le_bytes());
        bytes[8..].copy_from_slice(&self.sequence.to_le_bytes());
        bytes
    }

    /// The version in the first 16 bytes of `bytes`; `None` if there are fewer.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes = bytes.get(..VERSION_BYTES)?;
        let word = |at: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(word)
        };
        Some(Self { epoch: word(0), sequence: word(8) })
    }
}

/// Bits of a sequence that name the writer.
pub const WRITER_BITS: u32 = 12;

/// A writer's source of versions: its id and the last clock reading it used.
#[derive(Debug)]
pub struct VersionClock {
    writer: u64,
    last_micros: std::sync::atomic::AtomicU64,
}

impl VersionClock {
    /// A clock for writer `writer` (its low 12 bits are used: writers should pick it at random).
    pub fn new(writer: u64) -> Self {
        Self { writer: writer & ((1 << WRITER_BITS) - 1), last_micros: std::sync::atomic::AtomicU64::new(0) }
    }

    /// The next version under cluster epoch `epoch`: later than any this clock gave before.
    pub fn next(&self, epoch: u64) -> Version {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_micros() as u64);
        let micros = self.advance(now);
        Version { epoch, sequence: (micros << WRITER_BITS) | self.writer }
    }

    /// The microseconds to use given the clock reads `now`: `now`, or one past the last if the clock did not
    /// move on (or stepped back).
    fn advance(&self, now: u64) -> u64 {
        use std::sync::atomic::Ordering;
        let mut last = self.last_micros.load(Ordering::Relaxed);
        loop {
            let next = now.max(last + 1);
            match self.last_micros.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return next,
                Err(seen) => last = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_order_by_epoch_then_sequence_and_round_trip() {
        let older = Version { epoch: 5, sequence: u64::MAX };
        let newer = Version { epoch: 6, sequence: 1 };
        assert!(older < newer, "a newer epoch wins whatever the sequence");
        assert!(Version { epoch: 6, sequence: 2 } > newer);
        assert_eq!(Version::decode(&newer.encode()), Some(newer));
        assert_eq!(Version::decode(&[0u8; 15]), None);
    }

    #[test]
    fn a_clock_never_repeats_or_goes_back() {
        let clock = VersionClock::new(0xabcd);
        let mut last = clock.next(3);
        assert_eq!(last.sequence & 0xfff, 0xbcd, "the writer's id in the low bits");
        for _ in 0..10_000 {
            let next = clock.next(3);
            assert!(next > last, "{next:?} after {last:?}");
            last = next;
        }
        // A clock stepping back still moves forward.
        let stepped = clock.advance(1);
        assert!(stepped > last.sequence >> WRITER_BITS);
    }
}
