//! The frame header, opcodes, statuses and the whole-frame request decoder.
//!
//! ```text
//!  0       4   5   6       8               16      20      22      24              32      36      40
//!  | magic | v | op| flags | request id    | count | status| rsvd  | body length   | crc   | rsvd  |
//! ```
//! `crc` is the crc32c of bytes 0..32. `count` is the number of items in the body; `status` is zero in
//! requests and, in responses, the status of the frame as a whole (an item's own status is in its item
//! header).

use crate::items::{HelloRequest, Limits, REQUEST_ITEM_BYTES, RequestItemHeader};

/// Bytes of a frame header.
pub const FRAME_HEADER_BYTES: usize = 40;
/// `STKV`, little endian.
pub const MAGIC: u32 = u32::from_le_bytes(*b"STKV");
/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u8 = 1;

/// What a frame asks for. Every data opcode is a batch: a frame carries `count` items.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// Version and optional auth token; the reply carries the shard map and the node's bounds.
    Hello = 1,
    /// Store values. A key that is stored already is refused (`Exists`) unless the item asks for an upsert
    /// (`ITEM_UPSERT`), which makes a new version.
    Put = 2,
    /// Read whole values.
    Get = 3,
    /// Read `length` bytes at `offset` of each value.
    GetRange = 4,
    /// Is each key stored, and how long is its value.
    Exists = 5,
    /// Remove keys.
    Remove = 6,
    /// How many leading keys of each chain are stored: the items are chains' keys in chain order (`offset`
    /// names the chain); the shard looks keys up in order and stops at a chain's first miss, answering
    /// `NotFound` for it and every later key of that chain without looking them up.
    PrefixMatch = 7,
    /// Remove every key of the receiving shard that the item's key, a regular expression, matches
    /// anywhere (or every key, with `ITEM_MATCH_ALL`); the reply's `object len` counts the keys removed. A
    /// client sends it to every shard.
    RemoveMatching = 8,
    /// Turns the connection into a stream of the shard's events for keys that start with the item's key
    /// (every key, with `ITEM_MATCH_ALL`): the node sends frames of this opcode, `count` events each (see
    /// `events.rs`; `count` 0 is a heartbeat), until the connection closes.
    Subscribe = 9,
}

impl Opcode {
    /// Decodes an opcode byte.
    pub fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            1 => Opcode::Hello,
            2 => Opcode::Put,
            3 => Opcode::Get,
            4 => Opcode::GetRange,
            5 => Opcode::Exists,
            6 => Opcode::Remove,
            7 => Opcode::PrefixMatch,
            8 => Opcode::RemoveMatching,
            9 => Opcode::Subscribe,
            _ => return None,
        })
    }

    /// Its name in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Opcode::Hello => "hello",
            Opcode::Put => "put",
            Opcode::Get => "get",
            Opcode::GetRange => "get_range",
            Opcode::Exists => "exists",
            Opcode::Remove => "remove",
            Opcode::PrefixMatch => "prefix_match",
            Opcode::RemoveMatching => "remove_matching",
            Opcode::Subscribe => "subscribe",
        }
    }

    /// Every opcode, in wire order.
    pub const ALL: [Opcode; 9] = [
        Opcode::Hello,
        Opcode::Put,
        Opcode::Get,
        Opcode::GetRange,
        Opcode::Exists,
        Opcode::Remove,
        Opcode::PrefixMatch,
        Opcode::RemoveMatching,
        Opcode::Subscribe,
    ];
}

/// The status of an item (or, in a frame header, of the whole frame).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Status {
    /// Done; for a read, the value follows.
    Ok = 0,
    /// No such key (a miss: recompute it).
    NotFound = 1,
    /// The stored bytes failed their checksum; the copy was dropped and is never served.
    Checksum = 2,
    /// The storage device failed the read or write.
    Io = 3,
    /// No room in any tier (everything is pinned, leased or being written).
    NoSpace = 4,
    /// A key or value over the node's bounds.
    TooLarge = 5,
    /// A request the node cannot parse or does not support (unknown opcode, bad range, bad flags).
    Invalid = 6,
    /// A put's value did not match the checksum the client sent with it: damaged in transit, not stored.
    TransferChecksum = 7,
    /// The connection has not authenticated (HELLO with the node's token) and may not do this.
    Unauthenticated = 8,
    /// The client speaks a protocol version this node does not.
    Version = 9,
    /// The node is shutting down.
    ShuttingDown = 10,
    /// A put (not an upsert) of a key that is stored already; the stored version is kept.
    Exists = 11,
    /// Over a limit of the node (e.g. its bytes of pinned objects); nothing was stored.
    Quota = 12,
}

impl Status {
    /// Decodes a status; an unknown value is reported as `Invalid` by the caller.
    pub fn from_u16(value: u16) -> Option<Self> {
        Some(match value {
            0 => Status::Ok,
            1 => Status::NotFound,
            2 => Status::Checksum,
            3 => Status::Io,
            4 => Status::NoSpace,
            5 => Status::TooLarge,
            6 => Status::Invalid,
            7 => Status::TransferChecksum,
            8 => Status::Unauthenticated,
            9 => Status::Version,
            10 => Status::ShuttingDown,
            11 => Status::Exists,
            12 => Status::Quota,
            _ => return None,
        })
    }

    /// Its name in metrics and messages.
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::NotFound => "not_found",
            Status::Checksum => "checksum",
            Status::Io => "io",
            Status::NoSpace => "no_space",
            Status::TooLarge => "too_large",
            Status::Invalid => "invalid",
            Status::TransferChecksum => "transfer_checksum",
            Status::Unauthenticated => "unauthenticated",
            Status::Version => "version",
            Status::ShuttingDown => "shutting_down",
            Status::Exists => "exists",
            Status::Quota => "quota",
        }
    }
}

/// Why bytes are not a valid frame. Every variant means the stream can no longer be trusted (the
/// receiver answers if it can and closes the connection), except where the node answers per item.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// Fewer bytes than the structure needs.
    #[error("truncated: {needed} bytes needed, {available} available")]
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes there.
        available: usize,
    },
    /// Not a Strata frame.
    #[error("bad magic {0:#010x}")]
    Magic(u32),
    /// The header's crc32c does not match: the stream is out of step or damaged.
    #[error("frame header checksum mismatch")]
    HeaderChecksum,
    /// A protocol version this build does not speak.
    #[error("protocol version {0} is not supported (this build speaks {PROTOCOL_VERSION})")]
    Version(u8),
    /// An opcode this build does not know.
    #[error("unknown opcode {0}")]
    Opcode(u8),
    /// A status this build does not know.
    #[error("unknown status {0}")]
    Status(u16),
    /// More items than the bound, or zero items where one is needed.
    #[error("{count} items in one frame (bound: 1..={max})")]
    ItemCount {
        /// Items announced.
        count: u32,
        /// The bound.
        max: u32,
    },
    /// A body longer than the bound for its opcode.
    #[error("frame body of {len} bytes is over the bound of {max}")]
    BodyTooLong {
        /// Announced.
        len: u64,
        /// The bound.
        max: u64,
    },
    /// A key longer than the bound, or empty.
    #[error("key of {len} bytes (bound: 1..={max})")]
    KeyLength {
        /// Its length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// The items do not add up to the announced body length.
    #[error("items take {items} bytes but the body is {body}")]
    BodyMismatch {
        /// Bytes the items take.
        items: u64,
        /// The announced body length.
        body: u64,
    },
    /// A field holds a value no Strata build sends.
    #[error("invalid field: {0}")]
    Field(&'static str),
}

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
}

impl FrameHeader {
    /// A request header.
    pub fn request(opcode: Opcode, request_id: u64, count: u32, body_len: u64) -> Self {
        Self { opcode, flags: 0, request_id, count, status: Status::Ok, body_len }
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
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.body_len.to_le_bytes());
        let crc = crc32c::crc32c(&out[start..start + 32]);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
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
        if crc32c::crc32c(&bytes[..32]) != u32_at(bytes, 32) {
            return Err(ProtoError::HeaderChecksum);
        }
        if bytes[4] != PROTOCOL_VERSION {
            return Err(ProtoError::Version(bytes[4]));
        }
        let opcode = Opcode::from_u8(bytes[5]).ok_or(ProtoError::Opcode(bytes[5]))?;
        if u16_at(bytes, 22) != 0 || u32_at(bytes, 36) != 0 {
            return Err(ProtoError::Field("reserved bytes of the frame header"));
        }
        let status_value = u16_at(bytes, 20);
        let status = Status::from_u16(status_value).ok_or(ProtoError::Status(status_value))?;
        Ok(Self {
            opcode,
            flags: u16_at(bytes, 6),
            request_id: u64_at(bytes, 8),
            count: u32_at(bytes, 16),
            status,
            body_len: u64_at(bytes, 24),
        })
    }

    /// The bounds a node applies to a request header before reading its body: no frame flags (none are
    /// defined) and no status (replies carry one), an item count in `1..=max_batch_items`, and a body no
    /// longer than the opcode can need.
    pub fn check_request(&self, limits: &Limits) -> Result<(), ProtoError> {
        if self.flags != 0 {
            return Err(ProtoError::Field("frame flags (none are defined)"));
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

pub(crate) fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

pub(crate) fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

pub(crate) fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// One item of a decoded request frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestItem<'a> {
    /// Its header.
    pub header: RequestItemHeader,
    /// Its key.
    pub key: &'a [u8],
    /// What a put links it to.
    pub links: crate::Links<'a>,
    /// Its value (puts), else empty. For a progressive put: its parts with their headers, as sent (the
    /// framing is checked: the part lengths add up to the value length).
    pub value: &'a [u8],
}

/// A whole request frame decoded from memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestFrame<'a> {
    /// A HELLO.
    Hello(FrameHeader, HelloRequest),
    /// Any data opcode with its items.
    Items(FrameHeader, Vec<RequestItem<'a>>),
}

/// Decodes one request frame from `bytes` (header and body) with the same checks the node applies while
/// streaming: header, bounds, every item header, and that the items fill the body exactly.
pub fn decode_request_frame<'a>(bytes: &'a [u8], limits: &Limits) -> Result<RequestFrame<'a>, ProtoError> {
    let header = FrameHeader::decode(bytes)?;
    header.check_request(limits)?;
    let body = &bytes[FRAME_HEADER_BYTES..];
    if (body.len() as u64) < header.body_len {
        return Err(ProtoError::Truncated {
            needed: FRAME_HEADER_BYTES + header.body_len as usize,
            available: bytes.len(),
        });
    }
    let body = &body[..header.body_len as usize];
    if header.opcode == Opcode::Hello {
        return Ok(RequestFrame::Hello(header, HelloRequest::decode(body)?));
    }
    let mut items = Vec::with_capacity(header.count.min(1024) as usize);
    let mut at = 0usize;
    for _ in 0..header.count {
        let rest = &body[at..];
        let item = RequestItemHeader::decode(rest, header.opcode, limits)?;
        let key_end = REQUEST_ITEM_BYTES + item.key_len as usize;
        if rest.len() < key_end {
            return Err(ProtoError::BodyMismatch { items: (at + key_end) as u64, body: header.body_len });
        }
        let (links, links_len) = if header.opcode == Opcode::Put && item.has_links() {
            crate::Links::decode(&rest[key_end..], limits)?
        } else {
            (crate::Links::NONE, 0)
        };
        let value_at = key_end + links_len;
        let value_len = if header.opcode == Opcode::Put && item.is_progressive() {
            progressive_len(&rest[value_at..], item.value_len)?
        } else {
            item.body_value_len(header.opcode) as usize
        };
        let end = value_at + value_len;
        if rest.len() < end {
            return Err(ProtoError::BodyMismatch { items: (at + end) as u64, body: header.body_len });
        }
        items.push(RequestItem {
            header: item,
            key: &rest[REQUEST_ITEM_BYTES..key_end],
            links,
            value: &rest[value_at..end],
        });
        at += end;
    }
    if at as u64 != header.body_len {
        return Err(ProtoError::BodyMismatch { items: at as u64, body: header.body_len });
    }
    Ok(RequestFrame::Items(header, items))
}

/// Bytes a progressive value of `value_len` takes at the start of `bytes` (parts with their headers).
fn progressive_len(bytes: &[u8], value_len: u32) -> Result<usize, ProtoError> {
    let mut at = 0usize;
    let mut left = u64::from(value_len);
    while left > 0 {
        let (len, _) = crate::items::decode_part_header(bytes.get(at..).unwrap_or(&[]), left)?;
        left -= u64::from(len);
        at += crate::items::PART_HEADER_BYTES + len as usize;
        if at > bytes.len() {
            return Err(ProtoError::Truncated { needed: at, available: bytes.len() });
        }
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_lays_out_as_documented() {
        let header = FrameHeader {
            opcode: Opcode::GetRange,
            flags: 0,
            request_id: 0x0102_0304_0506_0708,
            count: 32,
            status: Status::NoSpace,
            body_len: 1 << 33,
        };
        let bytes = header.encode();
        assert_eq!(&bytes[0..4], b"STKV");
        assert_eq!(bytes[4], PROTOCOL_VERSION);
        assert_eq!(bytes[5], 4);
        assert_eq!(u64_at(&bytes, 8), 0x0102_0304_0506_0708);
        assert_eq!(u32_at(&bytes, 16), 32);
        assert_eq!(u16_at(&bytes, 20), 4);
        assert_eq!(u64_at(&bytes, 24), 1 << 33);
        assert_eq!(u32_at(&bytes, 32), crc32c::crc32c(&bytes[..32]));
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
        let flagged = FrameHeader { flags: 1, ..good };
        assert!(matches!(FrameHeader::decode(&flagged.encode()).map(|h| h.check_request(&limits)), Ok(Err(_))));
        let with_status = FrameHeader { status: Status::NotFound, ..good };
        assert!(matches!(with_status.check_request(&limits), Err(ProtoError::Field(_))));
        // Reserved bytes 22..24 and 36..40, with the crc made right again where it covers them.
        for at in [22, 23] {
            let mut bytes = good.encode();
            bytes[at] = 1;
            let crc = crc32c::crc32c(&bytes[..32]);
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
