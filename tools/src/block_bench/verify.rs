//! `verify=crc32c`: every block written carries a header naming what it is, so every read can check it.
//!
//! Block layout (little-endian), `bs` bytes:
//!
//! ```text
//!  0        4        8                16               24       28       32                    bs
//!  +--------+--------+----------------+----------------+--------+--------+---------------------+
//!  | "STRV" | crc32c | offset (u64)   | generation u64 | bs u32 | job u32| payload (seeded)    |
//!  +--------+--------+----------------+----------------+--------+--------+---------------------+
//! ```
//!
//! `crc32c` covers bytes 8..bs (everything after itself). The generation counts the job's writes, so a
//! block that reads back an older, intact version (a lost or torn write) is caught by the writer, which
//! knows which generation it last wrote there. The payload is derived from (offset, generation), so a block
//! copied to the wrong place does not pass either: the offset field would not match.

/// Bytes of the header.
pub const HEADER_BYTES: usize = 32;
const MAGIC: &[u8; 4] = b"STRV";

/// Why a block failed verification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MismatchKind {
    /// No header: the block was never written with verify, or was overwritten by something else.
    BadMagic,
    /// The header names another block size.
    BadLength,
    /// The header names another offset: a misdirected write or read.
    WrongOffset {
        /// The offset the header names.
        found: u64,
    },
    /// The checksum does not match: a torn or corrupted block.
    Checksum,
    /// Intact, but an older version than this job last wrote: a lost write.
    StaleGeneration {
        /// The generation found.
        found: u64,
        /// The generation written last.
        expected: u64,
    },
}

impl std::fmt::Display for MismatchKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MismatchKind::BadMagic => write!(f, "no verify header"),
            MismatchKind::BadLength => write!(f, "header names another block size"),
            MismatchKind::WrongOffset { found } => write!(f, "header names offset {found}"),
            MismatchKind::Checksum => write!(f, "crc32c mismatch"),
            MismatchKind::StaleGeneration { found, expected } => {
                write!(f, "stale block: generation {found}, expected {expected}")
            }
        }
    }
}

/// Fills `block` as the verify header and payload of `(offset, generation)`.
pub fn fill_block(block: &mut [u8], offset: u64, generation: u64, job: u32) {
    let len = block.len();
    block[0..4].copy_from_slice(MAGIC);
    block[8..16].copy_from_slice(&offset.to_le_bytes());
    block[16..24].copy_from_slice(&generation.to_le_bytes());
    block[24..28].copy_from_slice(&(len as u32).to_le_bytes());
    block[28..32].copy_from_slice(&job.to_le_bytes());
    // xorshift64* keyed by the block's identity: cheap, and different for every (offset, generation).
    let mut state = (offset ^ generation.rotate_left(32) ^ 0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in block[HEADER_BYTES..].chunks_mut(8) {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let word = state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    let crc = strata_proto::crc32c(&block[8..]);
    block[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// Checks a block read at `offset`; `expected_generation` is the generation this job last wrote there, if it
/// knows one. Returns the block's generation.
pub fn check_block(block: &[u8], offset: u64, expected_generation: Option<u64>) -> Result<u64, MismatchKind> {
    if block.len() < HEADER_BYTES || &block[0..4] != MAGIC {
        return Err(MismatchKind::BadMagic);
    }
    let read_u64 = |range: std::ops::Range<usize>| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&block[range]);
        u64::from_le_bytes(bytes)
    };
    let mut len_bytes = [0u8; 4];
    len_bytes.copy_from_slice(&block[24..28]);
    if u32::from_le_bytes(len_bytes) as usize != block.len() {
        return Err(MismatchKind::BadLength);
    }
    let mut crc_bytes = [0u8; 4];
    crc_bytes.copy_from_slice(&block[4..8]);
    if strata_proto::crc32c(&block[8..]) != u32::from_le_bytes(crc_bytes) {
        return Err(MismatchKind::Checksum);
    }
    let found_offset = read_u64(8..16);
    if found_offset != offset {
        return Err(MismatchKind::WrongOffset { found: found_offset });
    }
    let generation = read_u64(16..24);
    if let Some(expected) = expected_generation
        && generation != expected
    {
        return Err(MismatchKind::StaleGeneration { found: generation, expected });
    }
    Ok(generation)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filled_block_verifies_and_every_corruption_is_caught() {
        let mut block = vec![0u8; 4096];
        fill_block(&mut block, 8192, 3, 0);
        assert_eq!(check_block(&block, 8192, Some(3)), Ok(3));
        assert_eq!(check_block(&block, 8192, None), Ok(3));
        assert_eq!(check_block(&block, 4096, None), Err(MismatchKind::WrongOffset { found: 8192 }));
        assert_eq!(check_block(&block, 8192, Some(4)), Err(MismatchKind::StaleGeneration { found: 3, expected: 4 }));
        for position in [8, 100, 4095] {
            let mut corrupted = block.clone();
            corrupted[position] ^= 1;
            assert_eq!(check_block(&corrupted, 8192, None), Err(MismatchKind::Checksum), "flip at {position}");
        }
        // A torn block: the second half still holds another version.
        let mut other = vec![0u8; 4096];
        fill_block(&mut other, 8192, 2, 0);
        let mut torn = block.clone();
        torn[2048..].copy_from_slice(&other[2048..]);
        assert_eq!(check_block(&torn, 8192, None), Err(MismatchKind::Checksum));
        assert_eq!(check_block(&vec![0u8; 4096], 0, None), Err(MismatchKind::BadMagic));
        assert_eq!(check_block(&block[..2048], 8192, None), Err(MismatchKind::BadLength));
    }

    #[test]
    fn payloads_differ_per_offset_and_generation() {
        let mut a = vec![0u8; 512];
        let mut b = vec![0u8; 512];
        fill_block(&mut a, 0, 1, 0);
        fill_block(&mut b, 0, 2, 0);
        assert_ne!(a[HEADER_BYTES..], b[HEADER_BYTES..]);
        fill_block(&mut b, 512, 1, 0);
        assert_ne!(a[HEADER_BYTES..], b[HEADER_BYTES..]);
    }
}
