//! The shard hash: which shard of a node owns a key. Clients compute it too (the Python package and any
//! other language), so it is a function anyone can write in five lines: FNV-1a, 64 bits, over the key's
//! bytes, modulo the number of shards. It is not the index's hash (the node hashes keys again, with a keyed
//! hash, for its tables), so the shard choice does not bias the bits the index uses.

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a, 64 bits.
pub fn fnv1a_64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET_BASIS, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME))
}

/// The shard (0-based) that owns `key` on a node of `shard_count` shards.
pub fn shard_of(key: &[u8], shard_count: u32) -> u32 {
    // One shard owns everything: no hash (FNV-1a takes a multiply per byte, ~25 ns for a 21-byte key, paid
    // by every item of a batch on the node and on the client).
    if shard_count <= 1 {
        return 0;
    }
    (fnv1a_64(key) % u64::from(shard_count)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        // From the FNV reference test suite (isthe.com/chongo/tech/comp/fnv).
        assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a_64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn shards_spread_keys_evenly() {
        let mut counts = [0u32; 4];
        for index in 0..40_000u32 {
            counts[shard_of(format!("block-{index}").as_bytes(), 4) as usize] += 1;
        }
        for count in counts {
            assert!((9_000..11_000).contains(&count), "{counts:?}");
        }
        assert_eq!(shard_of(b"anything", 1), 0);
        assert_eq!(shard_of(b"anything", 0), 0);
    }
}
