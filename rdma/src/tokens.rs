//! The plain tokens that cross the wire for RDMA: where a queue pair is ([`Endpoint`]), and a span of a
//! peer's registered memory ([`RemoteSpan`]). Both are little-endian and of fixed length, decoded with their
//! bounds checked, so a peer's bytes never reach a verbs call unchecked.

use crate::TransferError;

/// The path MTU a queue pair uses: the verbs' `ibv_mtu` codes 1..=5 (256 B … 4 KiB).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PathMtu(u8);

impl PathMtu {
    /// 4 KiB, the largest.
    pub const MAX: PathMtu = PathMtu(5);

    /// The MTU of verbs code `code`, if it is one.
    pub fn from_code(code: u8) -> Option<PathMtu> {
        (1..=5).contains(&code).then_some(PathMtu(code))
    }

    /// The verbs code (`IBV_MTU_256` = 1 … `IBV_MTU_4096` = 5).
    pub fn code(self) -> u8 {
        self.0
    }

    /// Bytes per packet.
    pub fn bytes(self) -> u32 {
        128 << self.0
    }
}

/// What one side of a reliable connection tells the other so that both connect their queue pairs: sent
/// over the TCP connection that also carries requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The queue pair's number (24 bits).
    pub queue_pair_number: u32,
    /// The first packet sequence number it sends (24 bits).
    pub packet_sequence_number: u32,
    /// The port's LID (InfiniBand; 0 on RoCE).
    pub local_id: u16,
    /// The largest MTU its port runs.
    pub mtu: PathMtu,
    /// The GID its packets come from (RoCE: the address of the port's network interface).
    pub gid: [u8; 16],
}

const TWENTY_FOUR_BITS: u32 = (1 << 24) - 1;

impl Endpoint {
    /// Bytes on the wire: queue pair number u32, PSN u32, LID u16, MTU code u8, a zero byte, GID.
    pub const ENCODED_LEN: usize = 28;

    /// The wire form.
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut bytes = [0u8; Self::ENCODED_LEN];
        bytes[0..4].copy_from_slice(&self.queue_pair_number.to_le_bytes());
        bytes[4..8].copy_from_slice(&self.packet_sequence_number.to_le_bytes());
        bytes[8..10].copy_from_slice(&self.local_id.to_le_bytes());
        bytes[10] = self.mtu.code();
        bytes[12..28].copy_from_slice(&self.gid);
        bytes
    }

    /// Reads the wire form, refusing a short one, numbers wider than 24 bits and unknown MTU codes.
    pub fn decode(bytes: &[u8]) -> Result<Endpoint, TransferError> {
        let malformed = |reason: String| TransferError::Malformed { what: "RDMA endpoint", reason };
        let Some(bytes) = bytes.get(..Self::ENCODED_LEN) else {
            return Err(malformed(format!("{} bytes, {} needed", bytes.len(), Self::ENCODED_LEN)));
        };
        let word = |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let (queue_pair_number, packet_sequence_number) = (word(0), word(4));
        if queue_pair_number > TWENTY_FOUR_BITS || packet_sequence_number > TWENTY_FOUR_BITS {
            return Err(malformed(format!(
                "queue pair {queue_pair_number:#x} or PSN {packet_sequence_number:#x} wider than 24 bits"
            )));
        }
        let mtu = PathMtu::from_code(bytes[10]).ok_or_else(|| malformed(format!("MTU code {}", bytes[10])))?;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&bytes[12..28]);
        Ok(Endpoint {
            queue_pair_number,
            packet_sequence_number,
            local_id: u16::from_le_bytes([bytes[8], bytes[9]]),
            mtu,
            gid,
        })
    }
}

/// A span of a peer's registered memory, as the peer states it: the node reads or writes these bytes with
/// one RDMA READ or WRITE. The remote key is only ever used on the queue pair of the connection that
/// registered it (the peer's protection domain enforces the rest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteSpan {
    /// Virtual address of the first byte, in the peer's registration.
    pub address: u64,
    /// Bytes.
    pub length: u32,
    /// The registration's remote key.
    pub remote_key: u32,
}

impl RemoteSpan {
    /// Bytes on the wire: address u64, length u32, remote key u32.
    pub const ENCODED_LEN: usize = 16;

    /// The wire form.
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut bytes = [0u8; Self::ENCODED_LEN];
        bytes[0..8].copy_from_slice(&self.address.to_le_bytes());
        bytes[8..12].copy_from_slice(&self.length.to_le_bytes());
        bytes[12..16].copy_from_slice(&self.remote_key.to_le_bytes());
        bytes
    }

    /// Reads the wire form, refusing a short one and a span that wraps the address space.
    pub fn decode(bytes: &[u8]) -> Result<RemoteSpan, TransferError> {
        let malformed = |reason: String| TransferError::Malformed { what: "remote span", reason };
        let Some(bytes) = bytes.get(..Self::ENCODED_LEN) else {
            return Err(malformed(format!("{} bytes, {} needed", bytes.len(), Self::ENCODED_LEN)));
        };
        let mut address = [0u8; 8];
        address.copy_from_slice(&bytes[0..8]);
        let span = RemoteSpan {
            address: u64::from_le_bytes(address),
            length: u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]),
            remote_key: u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]),
        };
        if span.address.checked_add(u64::from(span.length)).is_none() {
            return Err(malformed(format!("{} bytes at {:#x} wrap the address space", span.length, span.address)));
        }
        Ok(span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint() -> Endpoint {
        Endpoint {
            queue_pair_number: 0x00ab_cdef,
            packet_sequence_number: 0x0012_3456,
            local_id: 7,
            mtu: PathMtu::MAX,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 15],
        }
    }

    #[test]
    fn endpoint_round_trips_and_has_a_fixed_layout() {
        let bytes = endpoint().encode();
        assert_eq!(&bytes[0..4], &[0xef, 0xcd, 0xab, 0x00]);
        assert_eq!(bytes[10], 5);
        assert_eq!(bytes[11], 0);
        assert_eq!(Endpoint::decode(&bytes).expect("decodes"), endpoint());
        assert_eq!(PathMtu::MAX.bytes(), 4096);
    }

    #[test]
    fn endpoint_refuses_short_wide_and_unknown_fields() {
        let bytes = endpoint().encode();
        assert!(Endpoint::decode(&bytes[..27]).is_err());
        let mut wide = bytes;
        wide[3] = 1;
        assert!(Endpoint::decode(&wide).is_err(), "a queue pair number past 24 bits");
        let mut wide_psn = bytes;
        wide_psn[7] = 0x80;
        assert!(Endpoint::decode(&wide_psn).is_err(), "a PSN past 24 bits");
        for code in [0u8, 6, 255] {
            let mut mtu = bytes;
            mtu[10] = code;
            assert!(Endpoint::decode(&mtu).is_err(), "MTU code {code}");
        }
    }

    #[test]
    fn remote_span_round_trips_and_refuses_wrapping() {
        let span = RemoteSpan { address: 0x7f00_0000_1000, length: 1 << 20, remote_key: 0xdead_beef };
        assert_eq!(RemoteSpan::decode(&span.encode()).expect("decodes"), span);
        assert!(RemoteSpan::decode(&span.encode()[..15]).is_err());
        let wrapping = RemoteSpan { address: u64::MAX - 10, length: 11, remote_key: 1 };
        assert!(RemoteSpan::decode(&wrapping.encode()).is_err());
        let last_byte = RemoteSpan { address: u64::MAX - 10, length: 10, remote_key: 1 };
        assert_eq!(RemoteSpan::decode(&last_byte.encode()).expect("decodes"), last_byte);
    }
}
