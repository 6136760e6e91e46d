//! The entries of a SCAN reply: for each key of the page, `[key len u16][value len u32][tiers u8][key]`,
//! little endian, back to back. The low 4 bits of `tiers` are a LOCATE reply's
//! ([`LOCATED_IN_DRAM`](crate::LOCATED_IN_DRAM), [`LOCATED_ON_NVME`](crate::LOCATED_ON_NVME)) and
//! [`SCAN_VERSIONED`]; the high 4 bits the replica count the key was put with (0: none given).

use crate::codes::{ProtoError, u16_at, u32_at};

/// The most keys one SCAN item may ask for.
pub const MAX_SCAN_KEYS: u32 = 1024;
/// A SCAN entry's tiers bit: the key was upserted with a version (a copy must compare versions).
pub const SCAN_VERSIONED: u32 = 4;
/// The cursor a SCAN reply carries after the shard's last page.
pub const SCAN_DONE: u32 = u32::MAX;
/// Bytes of an entry before its key.
pub const SCAN_ENTRY_HEAD_BYTES: usize = 7;

/// One key of a SCAN page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanEntry {
    /// The key, as its sender names it (a tenant's keys without the tenant's prefix).
    pub key: Vec<u8>,
    /// Bytes of its value.
    pub value_len: u32,
    /// The tiers that hold it.
    pub tiers: u32,
    /// How many nodes its put asked for (0: not said; the cluster's count applies).
    pub replicas: u8,
}

impl ScanEntry {
    /// Whether a copy is in DRAM: the node's recently used objects.
    pub fn in_dram(&self) -> bool {
        self.tiers & crate::LOCATED_IN_DRAM != 0
    }

    /// Whether the key was upserted with a version.
    pub fn versioned(&self) -> bool {
        self.tiers & SCAN_VERSIONED != 0
    }
}

/// Appends one entry. `key` must be at most `u16::MAX` bytes (keys are bounded far below); `tiers` takes 4
/// bits and `replicas` 4 (more is cut to 15).
pub fn encode_scan_entry(out: &mut Vec<u8>, key: &[u8], value_len: u32, tiers: u32, replicas: u8) {
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(&value_len.to_le_bytes());
    out.push((tiers as u8 & 0x0f) | replicas.min(15) << 4);
    out.extend_from_slice(key);
}

/// Decodes a page's entries; an entry cut short is an error, never a panic.
pub fn decode_scan_entries(mut bytes: &[u8]) -> Result<Vec<ScanEntry>, ProtoError> {
    let mut entries = Vec::new();
    while !bytes.is_empty() {
        if bytes.len() < SCAN_ENTRY_HEAD_BYTES {
            return Err(ProtoError::Truncated { needed: SCAN_ENTRY_HEAD_BYTES, available: bytes.len() });
        }
        let key_len = usize::from(u16_at(bytes, 0));
        let end = SCAN_ENTRY_HEAD_BYTES + key_len;
        if bytes.len() < end {
            return Err(ProtoError::Truncated { needed: end, available: bytes.len() });
        }
        entries.push(ScanEntry {
            key: bytes[SCAN_ENTRY_HEAD_BYTES..end].to_vec(),
            value_len: u32_at(bytes, 2),
            tiers: u32::from(bytes[6] & 0x0f),
            replicas: bytes[6] >> 4,
        });
        bytes = &bytes[end..];
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn any_bytes_decode_or_fail_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(entries) = decode_scan_entries(&bytes) {
                let mut again = Vec::new();
                for entry in &entries {
                    encode_scan_entry(&mut again, &entry.key, entry.value_len, entry.tiers, entry.replicas);
                }
                // Tiers and replicas travel as one byte: what decodes re-encodes to the same bytes.
                prop_assert_eq!(again, bytes);
            }
        }
    }

    #[test]
    fn entries_round_trip_and_a_cut_page_is_an_error() {
        let mut page = Vec::new();
        encode_scan_entry(&mut page, b"first", 4096, crate::LOCATED_IN_DRAM, 3);
        encode_scan_entry(&mut page, b"", 0, crate::LOCATED_ON_NVME, 0);
        let entries = decode_scan_entries(&page).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(
            (entries[0].key.as_slice(), entries[0].value_len, entries[0].in_dram(), entries[0].replicas),
            (&b"first"[..], 4096, true, 3)
        );
        assert!(!entries[1].in_dram() && entries[1].key.is_empty());
        for cut in 1..page.len() {
            if cut != SCAN_ENTRY_HEAD_BYTES + 5 {
                assert!(decode_scan_entries(&page[..cut]).is_err(), "a page cut at {cut}");
            }
        }
    }
}
