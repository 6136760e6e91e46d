//! Item headers, HELLO bodies, write policies and the bounds.
//!
//! ```text
//! request item (16 bytes), then the key, then (put) the value:
//!  0         2       4           8           12          16
//!  | key len | flags | value len | value crc | offset    |
//!   flags (put): bits 0-1 write policy (0 node default, 1 write-through, 2 write-back, 3 durable),
//!     bit 2 upsert (replace a stored key), bit 3 hard pin, bit 4 soft pin, bit 5 links (a links block
//!     follows the key: see below), bit 6 progressive (the value comes as parts, see below), bit 8
//!     versioned (an upsert's 16-byte version follows the key, before any links block; see `version.rs`),
//!     bits 12-15 the put's replica count in a cluster (0: not said), kept with the object for repairs;
//!   flags (get): bit 7 wait (see ITEM_WAIT), bit 8 with version (the reply's data begins with the
//!     object's 16-byte version, zero for an object never upserted with one; data crc covers both);
//!   flags (remove_matching): bit 0 every key (the pattern is ignored); other opcodes: 0
//!   value len: put: bytes of value after the key; get_range: bytes wanted; else 0
//!   value crc: put: crc32c of the value (checked before storing); progressive put: 0; else 0
//!   offset: get_range: first byte wanted; put with a soft pin: its TTL in seconds (0: the node's
//!     default); prefix_match: the chain the key belongs to; else 0
//!
//! links block of a put (flag bit 5), between the key and the value; its bytes are not in value len:
//!  0            2           4
//!  | parent len | group len | parent key | group name |
//!   either may be 0 (none) but not both; each at most the longest key
//!
//! progressive put (flag bit 6): the value comes as parts, each readable by GET_RANGE once it arrived:
//!  0          4          8
//!  | part len | part crc | part bytes |   ... repeated until the part lens add up to value len
//!
//! response item (16 bytes), then (reads, status ok) data len bytes:
//!  0        2       4          8          12           16
//!  | status | rsvd  | data len | data crc | object len |
//!   data crc: crc32c of the bytes that follow (reads), so the client checks them end to end
//!   object len: length of the whole stored value (get, get_range, exists)
//! ```

use crate::codes::{Opcode, ProtoError, Status, u16_at, u32_at, u64_at};
use crate::frame::HELLO_ACCEPTS_STREAMED;
use crate::limits::{HELLO_REPLY_BYTES, Limits, MAX_TOKEN_BYTES, REQUEST_ITEM_BYTES, RESPONSE_ITEM_BYTES};
use crate::rdma::{HELLO_OFFERS_RDMA, HELLO_RDMA, REGISTER_REMOTE};
use crate::shared::{
    HELLO_CHECKED_COPIES, HELLO_OFFERS_SHARED, HELLO_SHARED_SOCKET, HELLO_TAKES_CHECKED_COPIES, ITEM_SHARED,
    REGISTER_RELEASE,
};
use crate::version::Version;

/// When a put is acknowledged and where it goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WritePolicy {
    /// Acknowledge once in DRAM; written to the NVMe tier in the background.
    #[default]
    WriteThrough,
    /// Acknowledge once in DRAM; written to the NVMe tier only when evicted from DRAM.
    WriteBack,
    /// Acknowledge once the NVMe write is durable.
    Durable,
}

impl WritePolicy {
    /// The two flag bits: `None` means "the node's default".
    pub fn to_flags(policy: Option<WritePolicy>) -> u16 {
        match policy {
            None => 0,
            Some(WritePolicy::WriteThrough) => 1,
            Some(WritePolicy::WriteBack) => 2,
            Some(WritePolicy::Durable) => 3,
        }
    }

    /// The policy named by flag bits 0-1.
    pub fn from_flags(flags: u16) -> Option<WritePolicy> {
        match flags & 3 {
            1 => Some(WritePolicy::WriteThrough),
            2 => Some(WritePolicy::WriteBack),
            3 => Some(WritePolicy::Durable),
            _ => None,
        }
    }

    /// Parses `write-through`, `write-back` or `durable`.
    pub fn parse(text: &str) -> Option<WritePolicy> {
        match text {
            "write-through" => Some(WritePolicy::WriteThrough),
            "write-back" => Some(WritePolicy::WriteBack),
            "durable" => Some(WritePolicy::Durable),
            _ => None,
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            WritePolicy::WriteThrough => "write-through",
            WritePolicy::WriteBack => "write-back",
            WritePolicy::Durable => "durable",
        }
    }
}

/// A request item header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestItemHeader {
    /// Bytes of key after the header.
    pub key_len: u16,
    /// Flags (write policy of a put).
    pub flags: u16,
    /// Put: value bytes; get_range: bytes wanted.
    pub value_len: u32,
    /// Put: crc32c of the value.
    pub value_crc: u32,
    /// Get_range: first byte.
    pub offset: u32,
}

/// Put item flag: replace the key's stored version (without it, a stored key answers `Exists`).
pub const ITEM_UPSERT: u16 = 1 << 2;
/// Put item flag: pin hard — never evicted, removed only by an explicit remove.
pub const ITEM_PIN_HARD: u16 = 1 << 3;
/// Put item flag: pin soft for `offset` seconds — evicted only when nothing else can be.
pub const ITEM_PIN_SOFT: u16 = 1 << 4;
/// Put item flag: a links block (parent key, group name) follows the key.
pub const ITEM_LINKS: u16 = 1 << 5;
/// Put item flag: the value comes as parts (`[len u32][crc u32][bytes]` each), readable as they arrive.
pub const ITEM_PROGRESSIVE: u16 = 1 << 6;
/// Get / get-range item flag: a key that is not stored yet is waited for — until a put of it commits or a
/// progressive put of it starts — for at most `value_crc` milliseconds (a read item carries no crc), at most
/// [`MAX_ITEM_WAIT_MS`]; then NOT_FOUND. For a reader that knows a writer is about to put the key (a decode
/// instance loading layers a prefill instance is still sending).
pub const ITEM_WAIT: u16 = 1 << 7;
/// Put item flag: the upsert carries a version (16 bytes after the key, before any links block). A replica
/// holding the key at this version or a newer one keeps what it holds and answers `SUPERSEDED`. Only with
/// [`ITEM_UPSERT`].
pub const ITEM_VERSIONED: u16 = 1 << 8;
/// Get item flag: the reply's data begins with the object's version (16 bytes; zero if it has none), so a
/// copy made from the read carries the version it read.
pub const ITEM_WITH_VERSION: u16 = 1 << 8;
/// Put item flags: where the put's replica count sits (bits 12-15; 0: not said).
pub const ITEM_REPLICAS_SHIFT: u16 = 12;
/// The most replicas a put's flags can say.
pub const MAX_ITEM_REPLICAS: u8 = 15;
/// The longest wait an item may ask for, ms.
pub const MAX_ITEM_WAIT_MS: u32 = 60_000;
/// Bytes of a progressive put's part header.
pub const PART_HEADER_BYTES: usize = 8;
const PUT_ITEM_FLAGS: u16 = 3
    | ITEM_UPSERT
    | ITEM_PIN_HARD
    | ITEM_PIN_SOFT
    | ITEM_LINKS
    | ITEM_PROGRESSIVE
    | ITEM_VERSIONED
    | ITEM_SHARED
    | (MAX_ITEM_REPLICAS as u16) << ITEM_REPLICAS_SHIFT;
/// Bytes of a links block's header.
pub const LINKS_HEADER_BYTES: usize = 4;
/// Remove-matching item flag: every key, whatever the pattern.
pub const ITEM_MATCH_ALL: u16 = 1;

/// How a put's object is pinned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Pin {
    /// Not pinned: evicted by the tiers' policy.
    #[default]
    None,
    /// Evicted only when nothing else can be, until the TTL (seconds; 0: the node's default) runs out.
    Soft {
        /// Seconds the pin lasts.
        ttl_seconds: u32,
    },
    /// Never evicted; removed only by an explicit remove.
    Hard,
}

/// What a put item asks besides its key and value: its flags and `offset` field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PutOptions {
    /// When the put is acknowledged (none: the node's default).
    pub policy: Option<WritePolicy>,
    /// Replace a stored version instead of refusing with `Exists`.
    pub upsert: bool,
    /// Pinning.
    pub pin: Pin,
    /// In a cluster, how many nodes store the put (0: the client's default; at most 15). The client sends
    /// the put to that many nodes, and says the count in the item (flag bits 12-15), so that repairs
    /// re-create that many copies.
    pub replicas: u8,
    /// An upsert's version ([`ITEM_VERSIONED`]): none for a put the node orders by arrival. A cluster
    /// client gives every upsert one.
    pub version: Option<Version>,
}

impl PutOptions {
    /// Upsert with the node's default policy and no pin.
    pub fn upsert() -> Self {
        Self { upsert: true, ..Self::default() }
    }

    /// The item header's `(flags, offset)`.
    pub fn encode(&self) -> (u16, u32) {
        let mut flags = WritePolicy::to_flags(self.policy);
        if self.upsert {
            flags |= ITEM_UPSERT;
        }
        if self.version.is_some() {
            flags |= ITEM_VERSIONED;
        }
        flags |= u16::from(self.replicas.min(MAX_ITEM_REPLICAS)) << ITEM_REPLICAS_SHIFT;
        match self.pin {
            Pin::None => (flags, 0),
            Pin::Soft { ttl_seconds } => (flags | ITEM_PIN_SOFT, ttl_seconds),
            Pin::Hard => (flags | ITEM_PIN_HARD, 0),
        }
    }

    /// The options of a put item header (its flags were checked by [`RequestItemHeader::decode`]) and the
    /// version its head carried.
    pub fn decode(header: &RequestItemHeader, version: Option<Version>) -> Self {
        let pin = if header.flags & ITEM_PIN_HARD != 0 {
            Pin::Hard
        } else if header.flags & ITEM_PIN_SOFT != 0 {
            Pin::Soft { ttl_seconds: header.offset }
        } else {
            Pin::None
        };
        Self {
            policy: WritePolicy::from_flags(header.flags),
            upsert: header.flags & ITEM_UPSERT != 0,
            pin,
            replicas: (header.flags >> ITEM_REPLICAS_SHIFT) as u8,
            version,
        }
    }
}

/// A progressive put's part header: `(len, crc)`.
pub fn encode_part_header(len: u32, crc: u32, out: &mut Vec<u8>) {
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
}

/// Decodes a part header, `(len, crc)`, with `left` bytes of the value still to come: a part is never empty
/// and never runs past the value.
pub fn decode_part_header(bytes: &[u8], left: u64) -> Result<(u32, u32), ProtoError> {
    if bytes.len() < PART_HEADER_BYTES {
        return Err(ProtoError::Truncated { needed: PART_HEADER_BYTES, available: bytes.len() });
    }
    let len = u32_at(bytes, 0);
    if len == 0 || u64::from(len) > left {
        return Err(ProtoError::Field("a progressive put's part length"));
    }
    Ok((len, u32_at(bytes, 4)))
}

/// What a put names besides its own key: the block it continues (its parent: when the parent leaves the
/// node, so does this block) and the group it belongs to (a group leaves the node as a whole).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Links<'a> {
    /// The parent's key.
    pub parent: Option<&'a [u8]>,
    /// The group's name.
    pub group: Option<&'a [u8]>,
}

impl<'a> Links<'a> {
    /// No links.
    pub const NONE: Links<'static> = Links { parent: None, group: None };

    /// A block continuing `parent`.
    pub fn parent(parent: &'a [u8]) -> Self {
        Self { parent: Some(parent), group: None }
    }

    /// A member of `group`.
    pub fn group(group: &'a [u8]) -> Self {
        Self { parent: None, group: Some(group) }
    }

    /// Whether every name it gives is 1 to `max_key_bytes` bytes long (the bound of keys).
    pub fn fits(&self, max_key_bytes: u32) -> bool {
        [self.parent, self.group]
            .into_iter()
            .flatten()
            .all(|name| !name.is_empty() && name.len() <= max_key_bytes as usize)
    }

    /// Whether it names nothing (no links block is sent).
    pub fn is_none(&self) -> bool {
        self.parent.is_none() && self.group.is_none()
    }

    /// Bytes of the links block (0 when it names nothing).
    pub fn encoded_len(&self) -> usize {
        if self.is_none() {
            return 0;
        }
        LINKS_HEADER_BYTES + self.parent.map_or(0, <[u8]>::len) + self.group.map_or(0, <[u8]>::len)
    }

    /// Appends the links block (nothing when it names nothing).
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        if self.is_none() {
            return;
        }
        let (parent, group) = (self.parent.unwrap_or(&[]), self.group.unwrap_or(&[]));
        out.extend_from_slice(&(parent.len() as u16).to_le_bytes());
        out.extend_from_slice(&(group.len() as u16).to_le_bytes());
        out.extend_from_slice(parent);
        out.extend_from_slice(group);
    }

    /// The lengths in a links block's header `(parent, group)`, checked against the bounds.
    pub fn decode_header(bytes: &[u8], limits: &Limits) -> Result<(usize, usize), ProtoError> {
        if bytes.len() < LINKS_HEADER_BYTES {
            return Err(ProtoError::Truncated { needed: LINKS_HEADER_BYTES, available: bytes.len() });
        }
        let (parent, group) = (usize::from(u16_at(bytes, 0)), usize::from(u16_at(bytes, 2)));
        let max = limits.max_key_bytes as usize;
        if parent > max || group > max {
            return Err(ProtoError::KeyLength { len: parent.max(group), max });
        }
        if parent == 0 && group == 0 {
            return Err(ProtoError::Field("a links block that names nothing"));
        }
        Ok((parent, group))
    }

    /// A whole links block at the start of `bytes`; returns it and its length.
    pub fn decode(bytes: &'a [u8], limits: &Limits) -> Result<(Self, usize), ProtoError> {
        let (parent_len, group_len) = Self::decode_header(bytes, limits)?;
        let total = LINKS_HEADER_BYTES + parent_len + group_len;
        if bytes.len() < total {
            return Err(ProtoError::Truncated { needed: total, available: bytes.len() });
        }
        let parent = &bytes[LINKS_HEADER_BYTES..LINKS_HEADER_BYTES + parent_len];
        let group = &bytes[LINKS_HEADER_BYTES + parent_len..total];
        let links =
            Self { parent: (!parent.is_empty()).then_some(parent), group: (!group.is_empty()).then_some(group) };
        Ok((links, total))
    }
}

impl RequestItemHeader {
    /// Whether a links block follows the key (puts).
    pub fn has_links(&self) -> bool {
        self.flags & ITEM_LINKS != 0
    }

    /// Whether a version follows the key (puts).
    pub fn has_version(&self) -> bool {
        self.flags & ITEM_VERSIONED != 0
    }

    /// Whether the value comes as parts (puts).
    pub fn is_progressive(&self) -> bool {
        self.flags & ITEM_PROGRESSIVE != 0
    }

    /// How long a read waits for a key not stored yet ([`ITEM_WAIT`]); zero without the flag.
    pub fn wait(&self) -> std::time::Duration {
        if self.flags & ITEM_WAIT == 0 {
            return std::time::Duration::ZERO;
        }
        std::time::Duration::from_millis(u64::from(self.value_crc))
    }

    /// Appends the 16 bytes.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.key_len.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.value_len.to_le_bytes());
        out.extend_from_slice(&self.value_crc.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
    }

    /// Decodes a header of an item of `opcode` and checks its key length. The value length of a put is
    /// not checked against the bound here: the node answers `TooLarge` for that item and skips its bytes.
    pub fn decode(bytes: &[u8], opcode: Opcode, limits: &Limits) -> Result<Self, ProtoError> {
        if bytes.len() < REQUEST_ITEM_BYTES {
            return Err(ProtoError::Truncated { needed: REQUEST_ITEM_BYTES, available: bytes.len() });
        }
        let header = Self {
            key_len: u16_at(bytes, 0),
            flags: u16_at(bytes, 2),
            value_len: u32_at(bytes, 4),
            value_crc: u32_at(bytes, 8),
            offset: u32_at(bytes, 12),
        };
        let key_len = usize::from(header.key_len);
        if key_len == 0 || key_len > limits.max_key_bytes as usize {
            return Err(ProtoError::KeyLength { len: key_len, max: limits.max_key_bytes as usize });
        }
        let known = match opcode {
            Opcode::Put => PUT_ITEM_FLAGS,
            Opcode::RemoveMatching | Opcode::Subscribe => ITEM_MATCH_ALL,
            Opcode::Get => ITEM_WAIT | ITEM_WITH_VERSION | ITEM_SHARED,
            Opcode::Register => REGISTER_RELEASE | REGISTER_REMOTE,
            Opcode::GetRange => ITEM_WAIT,
            _ => 0,
        };
        if header.flags & !known != 0 {
            return Err(ProtoError::Field("item flags"));
        }
        if opcode == Opcode::Put && header.flags & ITEM_PIN_HARD != 0 && header.flags & ITEM_PIN_SOFT != 0 {
            return Err(ProtoError::Field("a put pinned both hard and soft"));
        }
        if opcode == Opcode::Put && header.flags & ITEM_VERSIONED != 0 && header.flags & ITEM_UPSERT == 0 {
            return Err(ProtoError::Field("a version on a put that is not an upsert"));
        }
        if opcode == Opcode::Put && header.flags & ITEM_PROGRESSIVE != 0 && header.value_crc != 0 {
            return Err(ProtoError::Field("value crc of a progressive put (each part carries its own)"));
        }
        if opcode == Opcode::Put && header.flags & ITEM_PIN_SOFT == 0 && header.offset != 0 {
            return Err(ProtoError::Field("offset of a put that is not soft-pinned"));
        }
        if header.is_shared() && header.flags & (ITEM_PROGRESSIVE | ITEM_WITH_VERSION) != 0 {
            return Err(ProtoError::Field("a shared item that is progressive or asks for its version"));
        }
        if opcode == Opcode::Register && header.flags & REGISTER_RELEASE == 0 && header.offset != 0 {
            return Err(ProtoError::Field("offset of a REGISTER that releases nothing"));
        }
        if header.flags & ITEM_WAIT != 0 && header.value_crc > MAX_ITEM_WAIT_MS {
            return Err(ProtoError::Field("a read's wait (at most 60,000 ms)"));
        }
        // GET_RANGE's is the bytes wanted, SCAN's the keys wanted.
        if !matches!(opcode, Opcode::Put | Opcode::GetRange | Opcode::Scan) && header.value_len != 0 {
            return Err(ProtoError::Field("value length of an item that carries no value"));
        }
        Ok(header)
    }

    /// Whether the value is in the client's shared memory, at the span after the key ([`ITEM_SHARED`]).
    pub fn is_shared(&self) -> bool {
        self.flags & ITEM_SHARED != 0
    }

    /// Bytes of value that follow the item's head in the request body (none for a shared put).
    pub fn body_value_len(&self, opcode: Opcode) -> u64 {
        if opcode == Opcode::Put && !self.is_shared() { u64::from(self.value_len) } else { 0 }
    }
}

/// A response item header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseItemHeader {
    /// The item's status.
    pub status: Status,
    /// Bytes of data that follow.
    pub data_len: u32,
    /// crc32c of the data that follows.
    pub data_crc: u32,
    /// Length of the whole stored value.
    pub object_len: u32,
}

impl ResponseItemHeader {
    /// An item with a status and no data.
    pub fn status(status: Status) -> Self {
        Self { status, data_len: 0, data_crc: 0, object_len: 0 }
    }

    /// Appends the 16 bytes.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.status as u16).to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.data_len.to_le_bytes());
        out.extend_from_slice(&self.data_crc.to_le_bytes());
        out.extend_from_slice(&self.object_len.to_le_bytes());
    }

    /// Decodes the 16 bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, ProtoError> {
        if bytes.len() < RESPONSE_ITEM_BYTES {
            return Err(ProtoError::Truncated { needed: RESPONSE_ITEM_BYTES, available: bytes.len() });
        }
        let value = u16_at(bytes, 0);
        let status = Status::from_u16(value).ok_or(ProtoError::Status(value))?;
        if u16_at(bytes, 2) != 0 {
            return Err(ProtoError::Field("reserved bytes of a reply item"));
        }
        let header =
            Self { status, data_len: u32_at(bytes, 4), data_crc: u32_at(bytes, 8), object_len: u32_at(bytes, 12) };
        if status != Status::Ok && header.data_len != 0 {
            return Err(ProtoError::Field("data after a failed item"));
        }
        Ok(header)
    }
}

/// A HELLO request body: an optional auth token (`token_len` u16, flags u16, the token).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HelloRequest {
    /// The token; empty for none.
    pub token: Vec<u8>,
    /// The client can move values through shared memory ([`HELLO_OFFERS_SHARED`]).
    pub offers_shared: bool,
    /// The client has an RDMA device ([`HELLO_OFFERS_RDMA`]).
    pub offers_rdma: bool,
    /// The client reads streamed replies ([`HELLO_ACCEPTS_STREAMED`]).
    pub accepts_streamed: bool,
    /// The client takes the node's check of its shared gets' copies ([`HELLO_TAKES_CHECKED_COPIES`]).
    pub takes_checked_copies: bool,
}

impl HelloRequest {
    /// Appends the body.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.token.len() as u16).to_le_bytes());
        let flags = if self.offers_shared { HELLO_OFFERS_SHARED } else { 0 }
            | if self.offers_rdma { HELLO_OFFERS_RDMA } else { 0 }
            | if self.accepts_streamed { HELLO_ACCEPTS_STREAMED } else { 0 }
            | if self.takes_checked_copies { HELLO_TAKES_CHECKED_COPIES } else { 0 };
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&self.token);
    }

    /// Bytes of the body.
    pub fn encoded_len(&self) -> usize {
        4 + self.token.len()
    }

    /// Decodes a body, which must be exactly as long as it says.
    pub fn decode(body: &[u8]) -> Result<Self, ProtoError> {
        if body.len() < 4 {
            return Err(ProtoError::Truncated { needed: 4, available: body.len() });
        }
        let len = usize::from(u16_at(body, 0));
        if len > MAX_TOKEN_BYTES {
            return Err(ProtoError::Field("token length"));
        }
        // Every flag of a HELLO request is an offer the node may take or leave: one it does not know (a newer
        // client's) is left, and the reply says what was taken, so clients and nodes of different versions
        // still meet.
        let flags = u16_at(body, 2);
        if body.len() != 4 + len {
            return Err(ProtoError::BodyMismatch { items: (4 + len) as u64, body: body.len() as u64 });
        }
        Ok(Self {
            token: body[4..].to_vec(),
            offers_shared: flags & HELLO_OFFERS_SHARED != 0,
            offers_rdma: flags & HELLO_OFFERS_RDMA != 0,
            accepts_streamed: flags & HELLO_ACCEPTS_STREAMED != 0,
            takes_checked_copies: flags & HELLO_TAKES_CHECKED_COPIES != 0,
        })
    }
}

/// A HELLO reply body: the shard map and the node's bounds; with flag [`HELLO_SHARED_SOCKET`], the name of
/// the shard's Unix socket follows the 40 bytes (see [`shared`](crate::shared)).
///
/// ```text
///  0             4          8           10      12        16          20     24          32             40
///  | shard count | shard id | base port | flags | max key | max batch | rsvd | max value | max put body |
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloReply {
    /// Shards of the node; shard `i` listens on `base_port + i`.
    pub shard_count: u32,
    /// The shard that answered.
    pub shard_id: u32,
    /// Port of shard 0.
    pub base_port: u16,
    /// The node's bounds.
    pub limits: Limits,
    /// A socket name follows: the shard offers its shared-memory path to this client.
    pub shared_socket: bool,
    /// The shard will connect an RDMA queue pair for this connection ([`HELLO_RDMA`]).
    pub rdma: bool,
    /// The node checks shared gets' copies in the client's memory ([`HELLO_CHECKED_COPIES`]).
    pub checked_copies: bool,
}

impl HelloReply {
    /// Appends the 40 bytes.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.shard_count.to_le_bytes());
        out.extend_from_slice(&self.shard_id.to_le_bytes());
        out.extend_from_slice(&self.base_port.to_le_bytes());
        let flags = if self.shared_socket { HELLO_SHARED_SOCKET } else { 0 }
            | if self.rdma { HELLO_RDMA } else { 0 }
            | if self.checked_copies { HELLO_CHECKED_COPIES } else { 0 };
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&self.limits.max_key_bytes.to_le_bytes());
        out.extend_from_slice(&self.limits.max_batch_items.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.limits.max_value_bytes.to_le_bytes());
        out.extend_from_slice(&self.limits.max_put_body_bytes.to_le_bytes());
    }

    /// Decodes the 40 bytes (a socket name after them is decoded by
    /// [`decode_socket_name`](crate::decode_socket_name)).
    pub fn decode(body: &[u8]) -> Result<Self, ProtoError> {
        if body.len() != HELLO_REPLY_BYTES {
            return Err(ProtoError::Truncated { needed: HELLO_REPLY_BYTES, available: body.len() });
        }
        let flags = u16_at(body, 10);
        if flags & !(HELLO_SHARED_SOCKET | HELLO_RDMA | HELLO_CHECKED_COPIES) != 0 {
            return Err(ProtoError::Field("flags of a HELLO reply"));
        }
        let reply = Self {
            shard_count: u32_at(body, 0),
            shard_id: u32_at(body, 4),
            base_port: u16_at(body, 8),
            limits: Limits {
                max_key_bytes: u32_at(body, 12),
                max_batch_items: u32_at(body, 16),
                max_value_bytes: u64_at(body, 24),
                max_put_body_bytes: u64_at(body, 32),
            },
            shared_socket: flags & HELLO_SHARED_SOCKET != 0,
            rdma: flags & HELLO_RDMA != 0,
            checked_copies: flags & HELLO_CHECKED_COPIES != 0,
        };
        if reply.shard_count == 0 || reply.shard_id >= reply.shard_count {
            return Err(ProtoError::Field("shard map"));
        }
        if u32::from(reply.base_port) + reply.shard_count > 65_536 {
            return Err(ProtoError::Field("base port"));
        }
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{FRAME_HEADER_BYTES, FrameHeader};
    use crate::request::{RequestFrame, decode_request_frame};

    fn put_frame(items: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut body = Vec::new();
        for (key, value) in items {
            RequestItemHeader {
                key_len: key.len() as u16,
                flags: WritePolicy::to_flags(Some(WritePolicy::Durable)),
                value_len: value.len() as u32,
                value_crc: crate::crc32c(value),
                offset: 0,
            }
            .encode_into(&mut body);
            body.extend_from_slice(key);
            body.extend_from_slice(value);
        }
        let mut frame = Vec::new();
        FrameHeader::request(Opcode::Put, 9, items.len() as u32, body.len() as u64).encode_into(&mut frame);
        frame.extend_from_slice(&body);
        frame
    }

    #[test]
    fn a_put_batch_decodes_item_by_item() {
        let frame = put_frame(&[(b"k1", b"value one"), (b"key-2", b"")]);
        let Ok(RequestFrame::Items(header, items)) = decode_request_frame(&frame, &Limits::default()) else {
            panic!("not decoded");
        };
        assert_eq!(header.count, 2);
        assert_eq!(items[0].key, b"k1");
        assert_eq!(items[0].value, b"value one");
        assert_eq!(items[0].header.value_crc, crate::crc32c(b"value one"));
        assert_eq!(WritePolicy::from_flags(items[0].header.flags), Some(WritePolicy::Durable));
        assert_eq!(items[1].key, b"key-2");
        assert!(items[1].value.is_empty());
    }

    fn linked_put_frame(key: &[u8], links: Links<'_>, value: &[u8]) -> Vec<u8> {
        let mut body = Vec::new();
        RequestItemHeader {
            key_len: key.len() as u16,
            flags: ITEM_LINKS,
            value_len: value.len() as u32,
            value_crc: crate::crc32c(value),
            offset: 0,
        }
        .encode_into(&mut body);
        body.extend_from_slice(key);
        links.encode_into(&mut body);
        body.extend_from_slice(value);
        let mut frame = Vec::new();
        FrameHeader::request(Opcode::Put, 3, 1, body.len() as u64).encode_into(&mut frame);
        frame.extend_from_slice(&body);
        frame
    }

    #[test]
    fn a_links_block_sits_between_key_and_value_and_is_bounded() {
        let links = Links { parent: Some(b"block-0"), group: Some(b"layer-set") };
        assert_eq!(links.encoded_len(), LINKS_HEADER_BYTES + 7 + 9);
        let frame = linked_put_frame(b"block-1", links, b"kv bytes");
        let Ok(RequestFrame::Items(_, items)) = decode_request_frame(&frame, &Limits::default()) else {
            panic!("not decoded");
        };
        assert_eq!(items[0].key, b"block-1");
        assert_eq!(items[0].links, links);
        assert_eq!(items[0].value, b"kv bytes");
        // The layout: parent length, group length, parent, group, right after the key.
        let at = FRAME_HEADER_BYTES + REQUEST_ITEM_BYTES + 7;
        assert_eq!(&frame[at..at + 4], &[7, 0, 9, 0]);
        assert_eq!(&frame[at + 4..at + 11], b"block-0");

        let only_parent = linked_put_frame(b"b", Links::parent(b"a"), b"");
        let Ok(RequestFrame::Items(_, items)) = decode_request_frame(&only_parent, &Limits::default()) else {
            panic!("not decoded");
        };
        assert_eq!(items[0].links, Links::parent(b"a"));

        // An empty block, an over-long parent and a block running past the body are refused.
        let mut empty = linked_put_frame(b"b", Links::parent(b"a"), b"");
        empty[FRAME_HEADER_BYTES + REQUEST_ITEM_BYTES + 1] = 0;
        assert!(decode_request_frame(&empty, &Limits::default()).is_err());
        let tight = Limits { max_key_bytes: 4, ..Limits::default() };
        let long = linked_put_frame(b"b", Links::parent(b"parent"), b"");
        assert!(matches!(decode_request_frame(&long, &tight), Err(ProtoError::KeyLength { len: 6, max: 4 })));
        let mut overrun = linked_put_frame(b"b", Links::group(b"g"), b"");
        overrun[FRAME_HEADER_BYTES + REQUEST_ITEM_BYTES + 3] = 200;
        assert!(decode_request_frame(&overrun, &Limits::default()).is_err());
    }

    #[test]
    fn a_progressive_value_is_framed_in_parts_that_add_up_to_its_length() {
        let frame = |parts: &[&[u8]], value_len: u32, value_crc: u32| {
            let mut body = Vec::new();
            RequestItemHeader { key_len: 1, flags: ITEM_PROGRESSIVE, value_len, value_crc, offset: 0 }
                .encode_into(&mut body);
            body.push(b'k');
            for part in parts {
                encode_part_header(part.len() as u32, crate::crc32c(part), &mut body);
                body.extend_from_slice(part);
            }
            let mut frame = Vec::new();
            FrameHeader::request(Opcode::Put, 1, 1, body.len() as u64).encode_into(&mut frame);
            frame.extend_from_slice(&body);
            frame
        };
        let good = frame(&[b"layer0", b"layer-1"], 13, 0);
        let Ok(RequestFrame::Items(_, items)) = decode_request_frame(&good, &Limits::default()) else {
            panic!("not decoded");
        };
        assert_eq!(items[0].value.len(), 2 * PART_HEADER_BYTES + 13);
        assert_eq!(decode_part_header(items[0].value, 13), Ok((6, crate::crc32c(b"layer0"))));
        assert!(decode_part_header(items[0].value, 5).is_err(), "a part longer than what is left");
        // Parts longer or shorter than the value, an empty part, a whole-value crc: refused.
        assert!(decode_request_frame(&frame(&[b"layer0", b"layer-1"], 12, 0), &Limits::default()).is_err());
        assert!(decode_request_frame(&frame(&[b"layer0"], 13, 0), &Limits::default()).is_err());
        assert!(decode_request_frame(&frame(&[b"", b"layer0"], 6, 0), &Limits::default()).is_err());
        assert!(decode_request_frame(&frame(&[b"layer0"], 6, 7), &Limits::default()).is_err());
    }

    #[test]
    fn items_that_do_not_fill_the_body_are_refused() {
        let mut frame = put_frame(&[(b"k1", b"value one")]);
        frame.push(0);
        // Rewrite the header with a body one byte longer than the items.
        let body_len = (frame.len() - FRAME_HEADER_BYTES) as u64;
        let header = FrameHeader::request(Opcode::Put, 9, 1, body_len).encode();
        frame[..FRAME_HEADER_BYTES].copy_from_slice(&header);
        assert!(matches!(decode_request_frame(&frame, &Limits::default()), Err(ProtoError::BodyMismatch { .. })));
    }

    #[test]
    fn only_reads_may_wait_and_only_so_long() {
        let limits = Limits::default();
        let encoded = |flags: u16, value_crc: u32| {
            let mut bytes = Vec::new();
            RequestItemHeader { key_len: 3, flags, value_crc, ..Default::default() }.encode_into(&mut bytes);
            bytes
        };
        for opcode in [Opcode::Get, Opcode::GetRange] {
            let item = RequestItemHeader::decode(&encoded(ITEM_WAIT, 1500), opcode, &limits).unwrap();
            assert_eq!(item.wait(), std::time::Duration::from_millis(1500));
            let item = RequestItemHeader::decode(&encoded(0, 0), opcode, &limits).unwrap();
            assert_eq!(item.wait(), std::time::Duration::ZERO);
            let too_long = RequestItemHeader::decode(&encoded(ITEM_WAIT, MAX_ITEM_WAIT_MS + 1), opcode, &limits);
            assert!(matches!(too_long, Err(ProtoError::Field(_))), "{too_long:?}");
        }
        for opcode in [Opcode::Exists, Opcode::Remove, Opcode::PrefixMatch] {
            assert!(RequestItemHeader::decode(&encoded(ITEM_WAIT, 10), opcode, &limits).is_err(), "{opcode:?}");
        }
    }

    #[test]
    fn empty_and_long_keys_are_refused() {
        let limits = Limits { max_key_bytes: 4, ..Limits::default() };
        let mut bytes = Vec::new();
        RequestItemHeader { key_len: 5, ..Default::default() }.encode_into(&mut bytes);
        assert!(matches!(RequestItemHeader::decode(&bytes, Opcode::Get, &limits), Err(ProtoError::KeyLength { .. })));
        bytes.clear();
        RequestItemHeader::default().encode_into(&mut bytes);
        assert!(matches!(RequestItemHeader::decode(&bytes, Opcode::Get, &limits), Err(ProtoError::KeyLength { .. })));
    }

    #[test]
    fn hello_bodies_round_trip() {
        let reply = HelloReply {
            shard_count: 3,
            shard_id: 2,
            base_port: 7600,
            limits: Limits::default(),
            shared_socket: true,
            rdma: false,
            checked_copies: false,
        };
        let mut body = Vec::new();
        reply.encode_into(&mut body);
        assert_eq!(body.len(), HELLO_REPLY_BYTES);
        assert_eq!(HelloReply::decode(&body), Ok(reply));
        let with_rdma = HelloReply { rdma: true, ..reply };
        let mut rdma_body = Vec::new();
        with_rdma.encode_into(&mut rdma_body);
        assert_eq!(rdma_body[10], 3, "both flags");
        assert_eq!(HelloReply::decode(&rdma_body), Ok(with_rdma));
        let checked = HelloReply { checked_copies: true, ..reply };
        let mut checked_body = Vec::new();
        checked.encode_into(&mut checked_body);
        assert_eq!(checked_body[10], 5, "the socket and checked copies");
        assert_eq!(HelloReply::decode(&checked_body), Ok(checked));
        body[10] = 8;
        assert_eq!(HelloReply::decode(&body), Err(ProtoError::Field("flags of a HELLO reply")));
        let request = HelloRequest {
            token: b"secret".to_vec(),
            offers_shared: true,
            offers_rdma: true,
            accepts_streamed: true,
            takes_checked_copies: true,
        };
        let mut body = Vec::new();
        request.encode_into(&mut body);
        assert_eq!(body.len(), request.encoded_len());
        assert_eq!(body[2], 15, "both offers, streamed replies and checked copies");
        assert_eq!(HelloRequest::decode(&body), Ok(request));
        body[2] = 0x80 | 1;
        let offers_shared_only = HelloRequest { token: b"secret".to_vec(), offers_shared: true, ..Default::default() };
        assert_eq!(HelloRequest::decode(&body), Ok(offers_shared_only), "an offer the node does not know is left");
        let bad = HelloReply { shard_id: 3, ..reply };
        let mut body = Vec::new();
        bad.encode_into(&mut body);
        assert!(HelloReply::decode(&body).is_err());
    }

    #[test]
    fn response_items_round_trip_and_refuse_data_after_a_failure() {
        let item = ResponseItemHeader { status: Status::Ok, data_len: 10, data_crc: 5, object_len: 20 };
        let mut bytes = Vec::new();
        item.encode_into(&mut bytes);
        assert_eq!(ResponseItemHeader::decode(&bytes), Ok(item));
        bytes[3] = 1;
        assert!(ResponseItemHeader::decode(&bytes).is_err(), "reserved bytes");
        let mut bytes = Vec::new();
        ResponseItemHeader { status: Status::NotFound, ..item }.encode_into(&mut bytes);
        assert!(ResponseItemHeader::decode(&bytes).is_err());
    }
}
