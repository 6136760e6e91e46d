//! The Keyed SGL Data Block descriptor (type 4): a host buffer by address, length and remote key, which the
//! controller RDMA-READs (a write's data) or RDMA-WRITEs (a read's data), in bytes 24..40 of a command.
//!
//! ```text
//!  0         8          11      15
//!  | address | length u24 | key u32 | identifier: type 4 (bits 7:4), subtype 0 address / 0xF invalidate key |
//! ```

/// A Keyed SGL Data Block descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyedSgl {
    /// The host buffer's first byte (as the host's registration addresses it).
    pub address: u64,
    /// Bytes (at most 2^24 − 1).
    pub length: u32,
    /// The host registration's remote key.
    pub key: u32,
    /// The host asks the controller to invalidate `key` with its response (SEND with Invalidate).
    pub invalidate: bool,
}

/// Why 16 bytes are not a Keyed SGL Data Block descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SglError {
    /// Fewer than 16 bytes.
    #[error("an SGL descriptor is 16 bytes, {0} given")]
    Short(usize),
    /// Another descriptor type (in-capsule data, a segment …).
    #[error("SGL descriptor type {0:#x}, not a Keyed Data Block (4)")]
    NotKeyed(u8),
    /// A subtype other than Address (0) or Invalidate Key (0xF).
    #[error("Keyed Data Block subtype {0:#x}")]
    Subtype(u8),
    /// A length that does not fit 24 bits.
    #[error("a keyed length of {0} bytes (24 bits at most)")]
    Length(u32),
}

/// Descriptor type of a Keyed SGL Data Block.
const KEYED_DATA_BLOCK: u8 = 0x4;
const SUBTYPE_ADDRESS: u8 = 0x0;
const SUBTYPE_INVALIDATE: u8 = 0xf;

impl KeyedSgl {
    /// Bytes of a descriptor.
    pub const BYTES: usize = 16;
    /// The longest buffer one descriptor names.
    pub const MAX_LENGTH: u32 = (1 << 24) - 1;

    /// The 16 bytes; `Length` past 24 bits.
    pub fn encode(&self) -> Result<[u8; Self::BYTES], SglError> {
        if self.length > Self::MAX_LENGTH {
            return Err(SglError::Length(self.length));
        }
        let mut bytes = [0u8; Self::BYTES];
        bytes[0..8].copy_from_slice(&self.address.to_le_bytes());
        bytes[8..11].copy_from_slice(&self.length.to_le_bytes()[..3]);
        bytes[11..15].copy_from_slice(&self.key.to_le_bytes());
        let subtype = if self.invalidate { SUBTYPE_INVALIDATE } else { SUBTYPE_ADDRESS };
        bytes[15] = KEYED_DATA_BLOCK << 4 | subtype;
        Ok(bytes)
    }

    /// Reads a descriptor (a command's bytes 24..40).
    pub fn decode(bytes: &[u8]) -> Result<KeyedSgl, SglError> {
        let bytes = bytes.get(..Self::BYTES).ok_or(SglError::Short(bytes.len()))?;
        let (kind, subtype) = (bytes[15] >> 4, bytes[15] & 0xf);
        if kind != KEYED_DATA_BLOCK {
            return Err(SglError::NotKeyed(kind));
        }
        if subtype != SUBTYPE_ADDRESS && subtype != SUBTYPE_INVALIDATE {
            return Err(SglError::Subtype(subtype));
        }
        let mut address = [0u8; 8];
        address.copy_from_slice(&bytes[0..8]);
        Ok(KeyedSgl {
            address: u64::from_le_bytes(address),
            length: u32::from_le_bytes([bytes[8], bytes[9], bytes[10], 0]),
            key: u32::from_le_bytes([bytes[11], bytes[12], bytes[13], bytes[14]]),
            invalidate: subtype == SUBTYPE_INVALIDATE,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_round_trips_in_the_layout_of_the_specification() {
        let sgl = KeyedSgl { address: 0x0000_7f12_3456_7000, length: 0x02_0000, key: 0xdead_beef, invalidate: false };
        let bytes = sgl.encode().expect("fits");
        assert_eq!(&bytes[8..11], &[0x00, 0x00, 0x02], "the length in three bytes");
        assert_eq!(&bytes[11..15], &[0xef, 0xbe, 0xad, 0xde], "then the key");
        assert_eq!(bytes[15], 0x40, "type 4, subtype address");
        assert_eq!(KeyedSgl::decode(&bytes), Ok(sgl));
        let invalidate = KeyedSgl { invalidate: true, ..sgl };
        assert_eq!(invalidate.encode().expect("fits")[15], 0x4f);
        assert_eq!(KeyedSgl::decode(&invalidate.encode().expect("fits")), Ok(invalidate));
    }

    #[test]
    fn other_descriptors_and_bad_fields_are_refused() {
        let bytes = KeyedSgl { address: 1, length: 4096, key: 7, invalidate: false }.encode().expect("fits");
        assert_eq!(KeyedSgl::decode(&bytes[..15]), Err(SglError::Short(15)));
        let mut transport = bytes;
        transport[15] = 0x5a;
        assert_eq!(KeyedSgl::decode(&transport), Err(SglError::NotKeyed(5)));
        let mut subtype = bytes;
        subtype[15] = 0x41;
        assert_eq!(KeyedSgl::decode(&subtype), Err(SglError::Subtype(1)));
        let long = KeyedSgl { address: 1, length: 1 << 24, key: 7, invalidate: false };
        assert_eq!(long.encode(), Err(SglError::Length(1 << 24)));
        let longest = KeyedSgl { length: KeyedSgl::MAX_LENGTH, ..long };
        assert_eq!(KeyedSgl::decode(&longest.encode().expect("fits")).map(|sgl| sgl.length), Ok(KeyedSgl::MAX_LENGTH));
    }
}
