//! The frame header.
//!
//! ```text
//!  0       4   5   6       8               16      20      22      24              32      36      40
//!  | magic | v | op| flags | request id    | count | status| rsvd  | body length   | crc   | rsvd  |
//! ```
//! `crc` is the crc32c of bytes 0..32. `count` is the number of items in the body; `status` is zero in
//! requests and, in responses, the status of the frame as a whole (an item's own status is in its item
//! header). A request of a cluster client sets flag [`FRAME_EPOCH`] and carries its cluster epoch, 48
//! bits: the low 32 in bytes 36..40, the high 16 in bytes 22..24. A reply with flag [`FRAME_STREAMED`] has
//! body length 0: its `count` items follow one by one, each item header telling its data's length, sent as
//! each is ready (only to a client that accepted it in HELLO, [`HELLO_ACCEPTS_STREAMED`]).

use crate::codes::{Opcode, PROTOCOL_VERSION, ProtoError, Status, u16_at, u32_at, u64_at};
use crate::limits::Limits;

/// Bytes of a frame header.
pub const FRAME_HEADER_BYTES: usize = 40;
/// Frame flag: the request carries the client's cluster epoch (see the module's header).
pub const FRAME_EPOCH: u16 = 1;
/// Reply flag: the body's length was not known when the header went out (body length 0); the body is
/// `count` reply items, each followed by its `data len` bytes, sent in request order as each is ready.
pub const FRAME_STREAMED: u16 = 1 << 1;
/// HELLO request flag: the client reads replies with [`FRAME_STREAMED`].
pub const HELLO_ACCEPTS_STREAMED: u16 = 1 << 2;
/// The largest epoch a frame carries.
pub const MAX_FRAME_EPOCH: u64 = (1 << 48) - 1;

/// `STKV`, little endian.
pub const MAGIC: u32 = u32::from_le_bytes(*b"STKV");

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// The opcode.
    pub opcode: Opcode,
    /// Reserved for per-frame options; zero today.
    pub flags: u16,
    /// Chosen by the client, echoed by the node.
    pub request_id: u64,
    /// Items in the body.
    pub count: u32,
    /// Status of the frame (responses).
    pub status: Status,
    /// Bytes after the header.
    pub body_len: u64,
    /// The client's cluster epoch (requests with [`FRAME_EPOCH`]; 0: none, a client of one node).
    pub epoch: u64,
}

impl FrameHeader {
    /// A request header.
    pub fn request(opcode: Opcode, request_id: u64, count: u32, body_len: u64) -> Self {
        Self { opcode, flags: 0, request_id, count, status: Status::Ok, body_len, epoch: 0 }
    }

    /// The same header carrying cluster epoch `epoch` (0: none; at most [`MAX_FRAME_EPOCH`], above it is
    /// cut to it).
    pub fn with_epoch(self, epoch: u64) -> Self {
        let epoch = epoch.min(MAX_FRAME_EPOCH);
        let flags = if epoch == 0 { self.flags & !FRAME_EPOCH } else { self.flags | FRAME_EPOCH };
        Self { flags, epoch, ..self }
    }

    /// Appends the 40 bytes.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.push(PROTOCOL_VERSION);
        out.push(self.opcode as u8);
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.request_id.to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&(self.status as u16).to_le_bytes());
        out.extend_from_slice(&((self.epoch >> 32) as u16).to_le_bytes());
        out.extend_from_slice(&self.body_len.to_le_bytes());
        let crc = crate::crc32c(&out[start..start + 32]);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&(self.epoch as u32).to_le_bytes());
    }

    /// The 40 bytes.
    pub fn encode(&self) -> [u8; FRAME_HEADER_BYTES] {
        let mut out = Vec::with_capacity(FRAME_HEADER_BYTES);
        self.encode_into(&mut out);
        let mut bytes = [0u8; FRAME_HEADER_BYTES];
        bytes.copy_from_slice(&out);
        bytes
    }

    /// Decodes and checks a header: magic, checksum, version, opcode and status. Bounds that depend on the
    /// opcode are checked by [`FrameHeader::check_request`].
    pub fn decode(bytes: &[u8]) -> Result<Self, ProtoError> {
        if bytes.len() < FRAME_HEADER_BYTES {
            return Err(ProtoError::Truncated { needed: FRAME_HEADER_BYTES, available: bytes.len() });
        }
        let magic = u32_at(bytes, 0);
        if magic != MAGIC {
            return Err(ProtoError::Magic(magic));
        }
        if crate::crc32c(&bytes[..32]) != u32_at(bytes, 32) {
            return Err(ProtoError::HeaderChecksum);
        }
        if bytes[4] != PROTOCOL_VERSION {
            return Err(ProtoError::Version(bytes[4]));
        }
        let opcode = Opcode::from_u8(bytes[5]).ok_or(ProtoError::Opcode(bytes[5]))?;
        let flags = u16_at(bytes, 6);
        let epoch = if flags & FRAME_EPOCH != 0 {
            let epoch = u64::from(u32_at(bytes, 36)) | u64::from(u16_at(bytes, 22)) << 32;
            if epoch == 0 {
                return Err(ProtoError::Field("an epoch flag with no epoch"));
            }
            epoch
        } else if u16_at(bytes, 22) != 0 || u32_at(bytes, 36) != 0 {
            return Err(ProtoError::Field("reserved bytes of the frame header"));
        } else {
            0
        };
        let status_value = u16_at(bytes, 20);
        let status = Status::from_u16(status_value).ok_or(ProtoError::Status(status_value))?;
        Ok(Self {
            opcode,
            flags,
            request_id: u64_at(bytes, 8),
            count: u32_at(bytes, 16),
            status,
            body_len: u64_at(bytes, 24),
            epoch,
        })
    }

    /// The bounds a node applies to a request header before reading its body: no frame flag but
    /// [`FRAME_EPOCH`] and no status (replies carry one), an item count in `1..=max_batch_items`, and a
    /// body no longer than the opcode can need.
    pub fn check_request(&self, limits: &Limits) -> Result<(), ProtoError> {
        if self.flags & !FRAME_EPOCH != 0 {
            return Err(ProtoError::Field("frame flags (only bit 0, the epoch, is defined)"));
        }
        if self.status != Status::Ok {
            return Err(ProtoError::Field("status of a request (only replies carry one)"));
        }
        let max_items = if self.opcode == Opcode::Hello { 1 } else { limits.max_batch_items };
        if self.count == 0 || self.count > max_items {
            return Err(ProtoError::ItemCount { count: self.count, max: max_items });
        }
        let max = limits.max_body_bytes(self.opcode);
        if self.body_len > max {
            return Err(ProtoError::BodyTooLong { len: self.body_len, max });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codes::{u16_at, u32_at, u64_at};

    #[test]
    fn header_round_trips_and_lays_out_as_documented() {
        let header = FrameHeader {
            opcode: Opcode::GetRange,
            flags: 0,
            request_id: 0x0102_0304_0506_0708,
            count: 32,
            status: Status::NoSpace,
            body_len: 1 << 33,
            epoch: 0,
        };
        let bytes = header.encode();
        assert_eq!(&bytes[0..4], b"STKV");
        assert_eq!(bytes[4], PROTOCOL_VERSION);
        assert_eq!(bytes[5], 4);
        assert_eq!(u64_at(&bytes, 8), 0x0102_0304_0506_0708);
        assert_eq!(u32_at(&bytes, 16), 32);
        assert_eq!(u16_at(&bytes, 20), 4);
        assert_eq!(u64_at(&bytes, 24), 1 << 33);
        assert_eq!(u32_at(&bytes, 32), crate::crc32c(&bytes[..32]));
        assert_eq!(FrameHeader::decode(&bytes), Ok(header));
    }

    #[test]
    fn a_flipped_bit_anywhere_in_the_checked_bytes_is_refused() {
        let bytes = FrameHeader::request(Opcode::Get, 7, 1, 20).encode();
        for bit in 0..32 * 8 {
            let mut damaged = bytes;
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(FrameHeader::decode(&damaged).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn reserved_bytes_flags_and_a_status_in_a_request_are_refused() {
        let limits = Limits::default();
        let good = FrameHeader::request(Opcode::Get, 7, 1, 20);
        assert_eq!(good.check_request(&limits), Ok(()));
        let flagged = FrameHeader { flags: 2, ..good };
        assert!(matches!(FrameHeader::decode(&flagged.encode()).map(|h| h.check_request(&limits)), Ok(Err(_))));
        let with_status = FrameHeader { status: Status::NotFound, ..good };
        assert!(matches!(with_status.check_request(&limits), Err(ProtoError::Field(_))));
        // Reserved bytes 22..24 and 36..40, with the crc made right again where it covers them.
        for at in [22, 23] {
            let mut bytes = good.encode();
            bytes[at] = 1;
            let crc = crate::crc32c(&bytes[..32]);
            bytes[32..36].copy_from_slice(&crc.to_le_bytes());
            assert!(matches!(FrameHeader::decode(&bytes), Err(ProtoError::Field(_))), "byte {at}");
        }
        for at in 36..40 {
            let mut bytes = good.encode();
            bytes[at] = 0x80;
            assert!(matches!(FrameHeader::decode(&bytes), Err(ProtoError::Field(_))), "byte {at}");
        }
    }

    #[test]
    fn a_cluster_request_carries_its_epoch() {
        let limits = Limits::default();
        let header = FrameHeader::request(Opcode::Put, 9, 1, 40).with_epoch(0x1234_8765_4321);
        assert_eq!(header.flags, FRAME_EPOCH);
        let bytes = header.encode();
        assert_eq!(u32_at(&bytes, 36), 0x8765_4321);
        assert_eq!(u16_at(&bytes, 22), 0x1234);
        assert_eq!(FrameHeader::decode(&bytes), Ok(header));
        assert_eq!(header.check_request(&limits), Ok(()));
        assert_eq!(header.with_epoch(u64::MAX).epoch, MAX_FRAME_EPOCH);
        assert_eq!(header.with_epoch(0), FrameHeader::request(Opcode::Put, 9, 1, 40));
    }

    #[test]
    fn request_bounds_are_checked_per_opcode() {
        let limits = Limits::default();
        assert!(FrameHeader::request(Opcode::Get, 1, 0, 0).check_request(&limits).is_err());
        let too_many = FrameHeader::request(Opcode::Get, 1, limits.max_batch_items + 1, 10);
        assert!(matches!(too_many.check_request(&limits), Err(ProtoError::ItemCount { .. })));
        let long_get = FrameHeader::request(Opcode::Get, 1, 1, limits.max_body_bytes(Opcode::Get) + 1);
        assert!(matches!(long_get.check_request(&limits), Err(ProtoError::BodyTooLong { .. })));
        let big_put = FrameHeader::request(Opcode::Put, 1, 1, limits.max_value_bytes);
        assert!(big_put.check_request(&limits).is_ok());
    }
}
