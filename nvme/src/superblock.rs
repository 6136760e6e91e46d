//! The pool superblock: block 0 of every namespace of a Strata pool says which pool it belongs to, its
//! place in the pool and the geometry it was formatted with, so that a namespace is never taken into
//! two pools by mistake and a node can check its pool description against the devices.
//!
//! Layout (little endian, 4096 bytes, the rest zero): magic `STRATAPL` (0..8), format version (8..12),
//! crc32c of the 4096 bytes with this field zero (12..16), pool UUID (16..32), namespace index (32..36),
//! namespace count (36..40), role (40..44), logical block bytes (48..56), capacity bytes (56..64),
//! formatted at, seconds since the Unix epoch (64..72), pool name (128..384, NUL padded).

use crate::spec::{get_u32, get_u64};

/// Bytes of the superblock (it occupies the first block, or the first 4 KiB of larger blocks' block 0).
pub const SUPERBLOCK_BYTES: usize = 4096;
const MAGIC: &[u8; 8] = b"STRATAPL";
const VERSION: u32 = 1;
const NAME_AT: usize = 128;
/// The longest pool name.
pub const POOL_NAME_MAX_BYTES: usize = 255;

/// What a namespace is for in its pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NamespaceRole {
    /// Holds the region log of the NVMe tier.
    Data,
}

/// A decoded superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSuperblock {
    /// The pool's name.
    pub pool_name: String,
    /// The pool's UUID.
    pub pool_uuid: [u8; 16],
    /// This namespace's index in the pool.
    pub index: u32,
    /// Namespaces in the pool when this one was formatted.
    pub count: u32,
    /// Its role.
    pub role: NamespaceRole,
    /// Logical block size it was formatted with.
    pub block_bytes: u64,
    /// Capacity it was formatted with.
    pub capacity_bytes: u64,
    /// When it was formatted (Unix seconds).
    pub formatted_at: u64,
}

/// Why block 0 is not a Strata superblock.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SuperblockError {
    /// No Strata magic: the namespace belongs to no pool (or holds something else).
    #[error("no Strata pool superblock")]
    NotFormatted,
    /// The magic is there but the checksum does not match: a torn or corrupted superblock.
    #[error("pool superblock checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum {
        /// Stored crc32c.
        stored: u32,
        /// Computed crc32c.
        computed: u32,
    },
    /// A format version this build does not read.
    #[error("pool superblock version {0} is not supported (this build reads version 1)")]
    Version(u32),
    /// A field holds a value no Strata build writes.
    #[error("pool superblock field {0} is invalid")]
    Invalid(&'static str),
}

/// Bytes read and written at block 0 of a device of this geometry: the superblock, or a whole block when
/// blocks are larger.
pub fn block0_len(geometry: &crate::device::Geometry) -> usize {
    (geometry.logical_block_bytes as usize).max(SUPERBLOCK_BYTES)
}

/// Reads `len` bytes at `offset` (both multiples of the device's block size).
pub async fn read_at(
    device: &impl crate::device::BlockDevice,
    offset: u64,
    len: usize,
) -> crate::error::BlockResult<crate::buffer::IoBuffer> {
    let (buffer, result) = device.read(device.alloc_buffer(len), offset).await;
    result.map(|()| buffer)
}

/// Writes `bytes`, zero padded to `len`, at `offset`, and makes them durable (a flush).
pub async fn write_padded(
    device: &impl crate::device::BlockDevice,
    offset: u64,
    bytes: &[u8],
    len: usize,
) -> crate::error::BlockResult<()> {
    let mut buffer = device.alloc_buffer(len);
    buffer.as_mut_slice().fill(0);
    buffer.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
    device.write(buffer, offset).await.1?;
    device.flush().await
}

/// Reads and decodes block 0: the device's I/O error, or what decoding found.
pub async fn read_superblock(
    device: &impl crate::device::BlockDevice,
) -> crate::error::BlockResult<Result<PoolSuperblock, SuperblockError>> {
    let buffer = read_at(device, 0, block0_len(&device.geometry())).await?;
    Ok(PoolSuperblock::decode(buffer.as_slice()))
}

/// Writes `bytes` (zero padded) as block 0 and makes it durable.
pub async fn write_block0(device: &impl crate::device::BlockDevice, bytes: &[u8]) -> crate::error::BlockResult<()> {
    write_padded(device, 0, bytes, block0_len(&device.geometry())).await
}

fn checksum(bytes: &[u8]) -> u32 {
    let mut copy = bytes[..SUPERBLOCK_BYTES].to_vec();
    copy[12..16].fill(0);
    crate::tcp::pdu::data_digest(&copy)
}

impl PoolSuperblock {
    /// The 4096 bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; SUPERBLOCK_BYTES];
        bytes[0..8].copy_from_slice(MAGIC);
        bytes[8..12].copy_from_slice(&VERSION.to_le_bytes());
        bytes[16..32].copy_from_slice(&self.pool_uuid);
        bytes[32..36].copy_from_slice(&self.index.to_le_bytes());
        bytes[36..40].copy_from_slice(&self.count.to_le_bytes());
        bytes[40..44].copy_from_slice(
            &(match self.role {
                NamespaceRole::Data => 1u32,
            })
            .to_le_bytes(),
        );
        bytes[48..56].copy_from_slice(&self.block_bytes.to_le_bytes());
        bytes[56..64].copy_from_slice(&self.capacity_bytes.to_le_bytes());
        bytes[64..72].copy_from_slice(&self.formatted_at.to_le_bytes());
        let name = self.pool_name.as_bytes();
        let len = name.len().min(POOL_NAME_MAX_BYTES);
        bytes[NAME_AT..NAME_AT + len].copy_from_slice(&name[..len]);
        let crc = checksum(&bytes);
        bytes[12..16].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Decodes block 0 (at least 4096 bytes).
    pub fn decode(bytes: &[u8]) -> Result<Self, SuperblockError> {
        if bytes.len() < SUPERBLOCK_BYTES || &bytes[0..8] != MAGIC {
            return Err(SuperblockError::NotFormatted);
        }
        let u32_at = |at: usize| get_u32(bytes, at);
        let u64_at = |at: usize| get_u64(bytes, at);
        let stored = u32_at(12);
        let computed = checksum(bytes);
        if stored != computed {
            return Err(SuperblockError::Checksum { stored, computed });
        }
        if u32_at(8) != VERSION {
            return Err(SuperblockError::Version(u32_at(8)));
        }
        let role = match u32_at(40) {
            1 => NamespaceRole::Data,
            _ => return Err(SuperblockError::Invalid("role")),
        };
        let name_field = &bytes[NAME_AT..NAME_AT + POOL_NAME_MAX_BYTES + 1];
        let end = name_field.iter().position(|&byte| byte == 0).ok_or(SuperblockError::Invalid("pool name"))?;
        let pool_name = std::str::from_utf8(&name_field[..end]).map_err(|_| SuperblockError::Invalid("pool name"))?;
        let mut pool_uuid = [0u8; 16];
        pool_uuid.copy_from_slice(&bytes[16..32]);
        Ok(Self {
            pool_name: pool_name.to_string(),
            pool_uuid,
            index: u32_at(32),
            count: u32_at(36),
            role,
            block_bytes: u64_at(48),
            capacity_bytes: u64_at(56),
            formatted_at: u64_at(64),
        })
    }
}

/// A UUID (version 4 layout) as its canonical text.
pub fn uuid_text(uuid: &[u8; 16]) -> String {
    let hex: String = uuid.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PoolSuperblock {
        PoolSuperblock {
            pool_name: "kv-pool".into(),
            pool_uuid: [0x42; 16],
            index: 1,
            count: 3,
            role: NamespaceRole::Data,
            block_bytes: 4096,
            capacity_bytes: 8 << 30,
            formatted_at: 1_796_000_000,
        }
    }

    #[test]
    fn superblocks_round_trip_and_refuse_damage() {
        let bytes = sample().encode();
        assert_eq!(&bytes[0..8], b"STRATAPL");
        assert_eq!(&bytes[128..135], b"kv-pool");
        assert_eq!(PoolSuperblock::decode(&bytes), Ok(sample()));
        let mut torn = bytes.clone();
        torn[60] ^= 1;
        assert!(matches!(PoolSuperblock::decode(&torn), Err(SuperblockError::Checksum { .. })));
        assert_eq!(PoolSuperblock::decode(&[0u8; 4096]), Err(SuperblockError::NotFormatted));
        assert_eq!(PoolSuperblock::decode(&bytes[..100]), Err(SuperblockError::NotFormatted));
        assert_eq!(uuid_text(&[0xab; 16]), "abababab-abab-abab-abab-abababababab");
    }
}
