//! On-disk formats of the NVMe tier, drawn in `docs/NVME_FORMAT.md`: the tier header of a namespace, the
//! region header, and the record. Every structure carries a crc32c, and every decoder is total (an error
//! for anything it does not recognise, never a panic), because it reads whatever a crash left behind.
//!
//! A record belongs to the region *generation* it was written in (`region_seq`): when a region is reused,
//! records of its previous generation that were not overwritten still carry valid checksums, and the
//! sequence number is what tells them apart, so they are never resurrected.

use strata_nvme::spec::{get_u16, get_u32, get_u64};

/// Bytes of a record header.
pub const RECORD_HEADER_BYTES: usize = 48;
/// Bytes of a region header (records start right after it).
pub const REGION_HEADER_BYTES: usize = 64;
/// Bytes of a tier header.
pub const TIER_HEADER_BYTES: usize = 64;
/// Records start at multiples of this.
pub const RECORD_ALIGN_BYTES: usize = 8;
/// Where the tier header sits in a namespace (block 0 holds the pool superblock).
pub const TIER_HEADER_OFFSET: u64 = 4096;
/// Where the first region starts.
pub const FIRST_REGION_OFFSET: u64 = 1 << 20;

const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"STRC");
/// Zero bytes that follow the last record of a region on the device: what tells the end of the records
/// from damage (see `docs/NVME_FORMAT.md`).
pub const END_MARK_BYTES: usize = 8;
const REGION_MAGIC: u32 = u32::from_le_bytes(*b"STRG");
const TIER_MAGIC: &[u8; 8] = b"STRATATR";
const TIER_VERSION: u32 = 2;

/// Record flag: a removal (no value).
pub const RECORD_TOMBSTONE: u16 = 1;
/// Record flag: the object is hard-pinned (restored pinned after a restart).
pub const RECORD_PINNED: u16 = 2;
/// Record flag: the object names a parent and/or a group: their 64-bit hashes (parent, then group, 0 for
/// none) follow the key, covered by the header crc, so links are restored after a restart.
pub const RECORD_LINKED: u16 = 4;
/// Record flag: the last record of a sealed region (header only, no key): the region was written whole.
pub const RECORD_SEAL: u16 = 8;
/// Record flag: an upsert's cluster version (16 bytes, `strata_proto::Version`) follows the key and the
/// links, covered by the header crc, so a replica still refuses older upserts after a restart.
pub const RECORD_VERSIONED: u16 = 16;
/// Record flags: bits 12-15 hold the replica count the object's put asked for (0: not said), restored
/// with it so that repairs after a restart still re-create that many copies.
pub const RECORD_REPLICAS_MASK: u16 = 0xf000;
/// Bytes of a linked record's links.
pub const RECORD_LINKS_BYTES: usize = 16;

/// Why bytes are not a structure of the tier.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// No magic: end of the records of a region, or an unformatted area.
    #[error("no magic")]
    NoMagic,
    /// The checksum does not match: torn or corrupt.
    #[error("checksum mismatch")]
    Checksum,
    /// Fewer bytes than the structure says it has.
    #[error("truncated")]
    Truncated,
    /// A field that no build writes.
    #[error("invalid field {0}")]
    Field(&'static str),
}

/// A record header.
///
/// ```text
///  0       4            8            16         24          28          32        34      36        40         44    48
///  | magic | header crc | region seq | key hash | value len | value crc | key len | flags | version | body crc | 0   |
///  then the key, then (RECORD_LINKED) parent hash u64 and group hash u64, then (RECORD_VERSIONED) the
///  upsert's version (epoch u64, sequence u64), then the value, then padding
/// ```
/// `header crc` covers bytes 8..48, seeded with the tier's format id (so that bytes stored as a value
/// cannot pass for a record of this tier); `body crc` covers the key, the links and the version. A header that passes
/// its own crc names its key (by hash) even when the key or the value behind it is damaged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    /// Generation of the region it was written in.
    pub region_seq: u64,
    /// The key's index hash (what recovery drops when the rest of the record is damaged).
    pub key_hash: u64,
    /// Bytes of value.
    pub value_len: u32,
    /// crc32c of the value.
    pub value_crc: u32,
    /// Bytes of key.
    pub key_len: u16,
    /// `RECORD_*` flags.
    pub flags: u16,
    /// The object's version.
    pub version: u32,
}

impl RecordHeader {
    /// Bytes the record takes in the region, padding included.
    pub fn record_len(&self) -> usize {
        (self.value_offset() + self.value_len as usize).next_multiple_of(RECORD_ALIGN_BYTES)
    }

    /// Bytes of links after the key (0 unless `RECORD_LINKED`).
    pub fn links_len(&self) -> usize {
        if self.flags & RECORD_LINKED != 0 { RECORD_LINKS_BYTES } else { 0 }
    }

    /// Bytes of version after the links (0 unless `RECORD_VERSIONED`).
    pub fn version_len(&self) -> usize {
        if self.flags & RECORD_VERSIONED != 0 { strata_proto::VERSION_BYTES } else { 0 }
    }

    /// Where the value starts, from the record's start: after the header, the key, the links and the
    /// version.
    pub fn value_offset(&self) -> usize {
        RECORD_HEADER_BYTES + usize::from(self.key_len) + self.links_len() + self.version_len()
    }

    /// The upsert's version in the bytes after the header (`covered`: key, links, version).
    pub fn cluster_version(&self, covered: &[u8]) -> Option<strata_proto::Version> {
        if self.version_len() == 0 {
            return None;
        }
        covered.get(usize::from(self.key_len) + self.links_len()..).and_then(strata_proto::Version::decode)
    }

    /// The seal record of a region of generation `region_seq`.
    pub fn seal(region_seq: u64) -> Self {
        Self { region_seq, key_hash: 0, value_len: 0, value_crc: 0, key_len: 0, flags: RECORD_SEAL, version: 0 }
    }

    /// The `(parent, group)` hashes in the bytes after the header (`covered`: key, then links).
    pub fn links(&self, covered: &[u8]) -> Option<(u64, u64)> {
        let at = usize::from(self.key_len);
        let links = covered.get(at..at + RECORD_LINKS_BYTES).filter(|_| self.links_len() > 0)?;
        Some((get_u64(links, 0), get_u64(links, 8)))
    }

    /// The bytes a linked record carries after its key.
    pub fn encode_links(parent: u64, group: u64) -> [u8; RECORD_LINKS_BYTES] {
        let mut links = [0u8; RECORD_LINKS_BYTES];
        links[..8].copy_from_slice(&parent.to_le_bytes());
        links[8..].copy_from_slice(&group.to_le_bytes());
        links
    }

    /// The header's bytes for the tier of `format_id`, given what follows it under the body crc: the
    /// key, then the links if linked, then the version if versioned.
    pub fn encode(&self, covered: &[u8], format_id: u64) -> [u8; RECORD_HEADER_BYTES] {
        debug_assert_eq!(covered.len(), self.value_offset() - RECORD_HEADER_BYTES, "key, links and version");
        let mut bytes = [0u8; RECORD_HEADER_BYTES];
        bytes[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.region_seq.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.key_hash.to_le_bytes());
        bytes[24..28].copy_from_slice(&self.value_len.to_le_bytes());
        bytes[28..32].copy_from_slice(&self.value_crc.to_le_bytes());
        bytes[32..34].copy_from_slice(&self.key_len.to_le_bytes());
        bytes[34..36].copy_from_slice(&self.flags.to_le_bytes());
        bytes[36..40].copy_from_slice(&self.version.to_le_bytes());
        bytes[40..44].copy_from_slice(&strata_proto::crc32c(covered).to_le_bytes());
        let crc = header_crc(&bytes, format_id);
        bytes[4..8].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Decodes the fixed header at the start of `bytes` (48 bytes are enough) and returns it with the
    /// crc its key and links must have. Total: any byte string gets a header or an error.
    pub fn decode_fixed(bytes: &[u8], format_id: u64) -> Result<(Self, u32), FormatError> {
        let fixed = bytes.get(..RECORD_HEADER_BYTES).ok_or(FormatError::Truncated)?;
        if get_u32(fixed, 0) != RECORD_MAGIC {
            return Err(FormatError::NoMagic);
        }
        if header_crc(fixed, format_id) != get_u32(fixed, 4) {
            return Err(FormatError::Checksum);
        }
        let header = Self {
            region_seq: get_u64(fixed, 8),
            key_hash: get_u64(fixed, 16),
            value_len: get_u32(fixed, 24),
            value_crc: get_u32(fixed, 28),
            key_len: get_u16(fixed, 32),
            flags: get_u16(fixed, 34),
            version: get_u32(fixed, 36),
        };
        if header.flags == RECORD_SEAL {
            if header.key_len != 0 || header.value_len != 0 {
                return Err(FormatError::Field("seal record length"));
            }
        } else if header.key_len == 0 {
            return Err(FormatError::Field("key length"));
        }
        let known =
            RECORD_TOMBSTONE | RECORD_PINNED | RECORD_LINKED | RECORD_VERSIONED | RECORD_SEAL | RECORD_REPLICAS_MASK;
        if header.flags & !known != 0 || (header.flags & RECORD_SEAL != 0 && header.flags != RECORD_SEAL) {
            return Err(FormatError::Field("record flags"));
        }
        if get_u32(fixed, 44) != 0 {
            return Err(FormatError::Field("reserved"));
        }
        Ok((header, get_u32(fixed, 40)))
    }

    /// Decodes a header from the start of `bytes`, which must also hold the key and the links (checked
    /// by the body crc).
    pub fn decode(bytes: &[u8], format_id: u64) -> Result<Self, FormatError> {
        let (header, body_crc) = Self::decode_fixed(bytes, format_id)?;
        let body = bytes.get(RECORD_HEADER_BYTES..header.value_offset()).ok_or(FormatError::Truncated)?;
        if strata_proto::crc32c(body) != body_crc {
            return Err(FormatError::Checksum);
        }
        Ok(header)
    }
}

/// The crc of a record header's bytes 8..48, seeded with the tier's format id.
fn header_crc(fixed: &[u8], format_id: u64) -> u32 {
    strata_proto::crc32c_append(strata_proto::crc32c(&format_id.to_le_bytes()), &fixed[8..RECORD_HEADER_BYTES])
}

/// A region header.
///
/// ```text
///  0       4     8            16      20          24             32            40    64
///  | magic | crc | region seq | shard | region id | format id    | epoch       | 0.. |
/// ```
/// `crc` covers bytes 8..64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionHeader {
    /// Generation: a per-shard counter, larger for newer regions.
    pub region_seq: u64,
    /// The shard that owns it.
    pub shard: u32,
    /// Its id within the shard.
    pub region_id: u32,
    /// The format of the tier it belongs to (a region of an earlier format is free).
    pub format_id: u64,
    /// The node start that wrote it.
    pub epoch: u64,
}

impl RegionHeader {
    /// The 64 bytes.
    pub fn encode(&self) -> [u8; REGION_HEADER_BYTES] {
        let mut bytes = [0u8; REGION_HEADER_BYTES];
        bytes[0..4].copy_from_slice(&REGION_MAGIC.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.region_seq.to_le_bytes());
        bytes[16..20].copy_from_slice(&self.shard.to_le_bytes());
        bytes[20..24].copy_from_slice(&self.region_id.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.format_id.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.epoch.to_le_bytes());
        let crc = strata_proto::crc32c(&bytes[8..]);
        bytes[4..8].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Decodes a header.
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        if bytes.len() < REGION_HEADER_BYTES {
            return Err(FormatError::Truncated);
        }
        if get_u32(bytes, 0) != REGION_MAGIC {
            return Err(FormatError::NoMagic);
        }
        if strata_proto::crc32c(&bytes[8..REGION_HEADER_BYTES]) != get_u32(bytes, 4) {
            return Err(FormatError::Checksum);
        }
        Ok(Self {
            region_seq: get_u64(bytes, 8),
            shard: get_u32(bytes, 16),
            region_id: get_u32(bytes, 20),
            format_id: get_u64(bytes, 24),
            epoch: get_u64(bytes, 32),
        })
    }
}

/// The tier header of a namespace, at [`TIER_HEADER_OFFSET`].
///
/// ```text
///  0            8         12    16       20         24            32             40             48      56
///  | STRATATR   | version | crc | shards | ns index | region bytes | first region | region count | format id |
///  56      64
///  | epoch |
/// ```
/// `crc` is over the 64 bytes with the crc field zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierHeader {
    /// Shards the regions are dealt to (region `r` of the pool belongs to shard `r % shards`).
    pub shard_count: u32,
    /// This namespace's index in the node's list.
    pub namespace_index: u32,
    /// Bytes per region.
    pub region_bytes: u64,
    /// Offset of region 0 in the namespace.
    pub first_region_offset: u64,
    /// Regions in the namespace.
    pub region_count: u64,
    /// Chosen at format time; regions and records of another format are not this tier's.
    pub format_id: u64,
    /// Incremented at every start of the node.
    pub epoch: u64,
}

impl TierHeader {
    /// The 64 bytes.
    pub fn encode(&self) -> [u8; TIER_HEADER_BYTES] {
        let mut bytes = [0u8; TIER_HEADER_BYTES];
        bytes[0..8].copy_from_slice(TIER_MAGIC);
        bytes[8..12].copy_from_slice(&TIER_VERSION.to_le_bytes());
        bytes[16..20].copy_from_slice(&self.shard_count.to_le_bytes());
        bytes[20..24].copy_from_slice(&self.namespace_index.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.region_bytes.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.first_region_offset.to_le_bytes());
        bytes[40..48].copy_from_slice(&self.region_count.to_le_bytes());
        bytes[48..56].copy_from_slice(&self.format_id.to_le_bytes());
        bytes[56..64].copy_from_slice(&self.epoch.to_le_bytes());
        let crc = strata_proto::crc32c(&bytes);
        bytes[12..16].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Decodes a header.
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        if bytes.len() < TIER_HEADER_BYTES {
            return Err(FormatError::Truncated);
        }
        if &bytes[0..8] != TIER_MAGIC {
            return Err(FormatError::NoMagic);
        }
        let mut copy = [0u8; TIER_HEADER_BYTES];
        copy.copy_from_slice(&bytes[..TIER_HEADER_BYTES]);
        copy[12..16].fill(0);
        if strata_proto::crc32c(&copy) != get_u32(bytes, 12) {
            return Err(FormatError::Checksum);
        }
        if get_u32(bytes, 8) != TIER_VERSION {
            return Err(FormatError::Field("tier format version"));
        }
        let header = Self {
            shard_count: get_u32(bytes, 16),
            namespace_index: get_u32(bytes, 20),
            region_bytes: get_u64(bytes, 24),
            first_region_offset: get_u64(bytes, 32),
            region_count: get_u64(bytes, 40),
            format_id: get_u64(bytes, 48),
            epoch: get_u64(bytes, 56),
        };
        if header.shard_count == 0 || header.region_bytes == 0 || !header.region_bytes.is_power_of_two() {
            return Err(FormatError::Field("geometry"));
        }
        Ok(header)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn structures_round_trip() {
        let record = RecordHeader { value_len: 100, ..record(0) };
        let mut bytes = record.encode(b"abc", FORMAT).to_vec();
        bytes.extend_from_slice(b"abc");
        assert_eq!(RecordHeader::decode(&bytes, FORMAT), Ok(record));
        assert_eq!(record.record_len(), (48 + 3 + 100usize).next_multiple_of(8));
        let region = RegionHeader { region_seq: 1, shard: 2, region_id: 3, format_id: 4, epoch: 5 };
        assert_eq!(RegionHeader::decode(&region.encode()), Ok(region));
        let tier = TierHeader {
            shard_count: 2,
            namespace_index: 0,
            region_bytes: 16 << 20,
            first_region_offset: FIRST_REGION_OFFSET,
            region_count: 255,
            format_id: 99,
            epoch: 3,
        };
        assert_eq!(TierHeader::decode(&tier.encode()), Ok(tier));
    }

    #[test]
    fn a_linked_record_carries_its_links_after_the_key_under_the_header_crc() {
        let record = record(RECORD_LINKED);
        let mut covered = b"abc".to_vec();
        covered.extend_from_slice(&RecordHeader::encode_links(11, 0));
        let mut bytes = record.encode(&covered, FORMAT).to_vec();
        bytes.extend_from_slice(&covered);
        assert_eq!(RecordHeader::decode(&bytes, FORMAT), Ok(record));
        assert_eq!(record.value_offset(), 48 + 3 + 16);
        assert_eq!(record.record_len(), (48 + 3 + 16 + 10usize).next_multiple_of(8));
        assert_eq!(record.links(&covered), Some((11, 0)));
        // A flipped bit in the links fails the body crc, yet the fixed header still names the key; a
        // header without the links is truncated.
        let mut damaged = bytes.clone();
        damaged[48 + 3] ^= 1;
        assert_eq!(RecordHeader::decode(&damaged, FORMAT), Err(FormatError::Checksum));
        assert_eq!(RecordHeader::decode_fixed(&damaged, FORMAT).map(|(header, _)| header.key_hash), Ok(77));
        assert_eq!(RecordHeader::decode(&bytes[..48 + 3], FORMAT), Err(FormatError::Truncated));
        let unlinked = RecordHeader { flags: 0, ..record };
        assert_eq!(unlinked.links(&covered), None);
    }

    #[test]
    fn a_versioned_record_carries_its_version_after_the_links() {
        let record = record(RECORD_LINKED | RECORD_VERSIONED);
        let version = strata_proto::Version { epoch: 4, sequence: 99 };
        let mut covered = b"abc".to_vec();
        covered.extend_from_slice(&RecordHeader::encode_links(11, 0));
        covered.extend_from_slice(&version.encode());
        let mut bytes = record.encode(&covered, FORMAT).to_vec();
        bytes.extend_from_slice(&covered);
        assert_eq!(RecordHeader::decode(&bytes, FORMAT), Ok(record));
        assert_eq!(record.value_offset(), 48 + 3 + 16 + 16);
        assert_eq!((record.links(&covered), record.cluster_version(&covered)), (Some((11, 0)), Some(version)));
        let mut damaged = bytes.clone();
        damaged[48 + 3 + 16] ^= 1;
        assert_eq!(RecordHeader::decode(&damaged, FORMAT), Err(FormatError::Checksum), "the version is under the crc");
        let unversioned = RecordHeader { flags: RECORD_LINKED, ..record };
        assert_eq!(unversioned.cluster_version(&covered), None);
    }

    #[test]
    fn a_record_with_another_key_fails_its_checksum() {
        let record = RecordHeader { value_len: 1, ..record(0) };
        let mut bytes = record.encode(b"abc", FORMAT).to_vec();
        bytes.extend_from_slice(b"abd");
        assert_eq!(RecordHeader::decode(&bytes, FORMAT), Err(FormatError::Checksum));
    }

    #[test]
    fn a_record_of_another_tier_or_with_a_flipped_header_byte_is_refused() {
        let mut bytes = record(0).encode(b"abc", FORMAT).to_vec();
        bytes.extend_from_slice(b"abc");
        assert_eq!(RecordHeader::decode(&bytes, FORMAT + 1), Err(FormatError::Checksum), "another tier's");
        for at in 0..RECORD_HEADER_BYTES {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x10;
            assert!(RecordHeader::decode_fixed(&damaged, FORMAT).is_err(), "flip at byte {at} passed");
        }
    }

    const FORMAT: u64 = 0x5eed;

    fn record(flags: u16) -> RecordHeader {
        RecordHeader { region_seq: 7, key_hash: 77, value_len: 10, value_crc: 9, key_len: 3, flags, version: 2 }
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = RecordHeader::decode(&bytes, FORMAT);
            let _ = RegionHeader::decode(&bytes);
            let _ = TierHeader::decode(&bytes);
        }
    }
}
