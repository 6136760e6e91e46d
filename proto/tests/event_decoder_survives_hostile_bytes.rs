//! The event decoder (a client's side of SUBSCRIBE) never panics and never claims more bytes than it was
//! given, whatever the node sends; events the node encodes always decode to what was encoded, sequence
//! included.

use proptest::prelude::*;
use strata_proto::{Event, EventRef, RemovalReason, Tier};

fn tier(code: u8) -> Tier {
    [Tier::None, Tier::Dram, Tier::Nvme][usize::from(code % 3)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        if let Ok((event, _, len)) = EventRef::decode(&bytes) {
            prop_assert!(len <= bytes.len());
            // Its keys, checked at decode, all come out.
            if let EventRef::BlockStored { keys, .. } | EventRef::BlockRemoved { keys, .. } = event {
                prop_assert_eq!(keys.iter().count(), keys.len());
            }
        }
    }

    #[test]
    fn encoded_events_decode_to_what_was_encoded(
        kind in 0u8..4,
        keys in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..80), 1..6),
        chained in any::<bool>(),
        parent in proptest::option::of(proptest::collection::vec(any::<u8>(), 1..80)),
        size in any::<u32>(),
        codes in (0u8..3, 0u8..3, 1u8..=5),
        sequence in any::<u64>(),
        trailing in proptest::collection::vec(any::<u8>(), 0..8),
    ) {
        let reasons = [
            RemovalReason::Removed,
            RemovalReason::Evicted,
            RemovalReason::Checksum,
            RemovalReason::StorageError,
            RemovalReason::Cascaded,
        ];
        let event = match kind {
            0 => Event::BlockStored { keys: keys.clone(), parent, chained, size, tier: tier(codes.0) },
            1 => Event::BlockRemoved { keys: keys.clone(), reason: reasons[usize::from(codes.2 - 1)] },
            2 => Event::TierChanged { key: keys[0].clone(), from: tier(codes.0), to: tier(codes.1) },
            _ => Event::Lagged { missed: size },
        };
        let mut bytes = Vec::new();
        event.encode_into(sequence, &mut bytes);
        let encoded = bytes.len();
        bytes.extend_from_slice(&trailing);
        let (decoded, decoded_sequence, len) =
            Event::decode(&bytes).map_err(|error| TestCaseError::fail(error.to_string()))?;
        prop_assert_eq!(decoded, event);
        prop_assert_eq!(decoded_sequence, sequence);
        prop_assert_eq!(len, encoded, "the trailing bytes belong to the next event");
        // Cut anywhere short of its end, it is refused, not misread.
        for cut in 0..encoded {
            prop_assert!(EventRef::decode(&bytes[..cut]).is_err());
        }
    }
}
