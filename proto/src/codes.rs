//! The protocol's vocabulary: opcodes, statuses and the errors of its decoders, and the little-endian
//! reads every decoder shares.

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
    /// Where each key is stored: the reply's `object len` is the value's length and its `data crc` names
    /// the tiers that hold the object ([`LOCATED_IN_DRAM`], [`LOCATED_ON_NVME`]); no value is sent.
    Locate = 10,
    /// The node's view of its cluster: exactly one item (its key is not looked at), answered with the
    /// members as JSON in the reply's data (`data crc` its crc32c), or `NotFound` from a node that runs
    /// alone.
    Members = 11,
    /// The receiving shard's keys, a page at a time: exactly one item, whose `offset` is the cursor (0 to
    /// begin) and `value len` the most keys wanted (1 to [`MAX_SCAN_KEYS`]); its key is not looked at. The
    /// reply's data is the page's entries ([`scan`](crate::scan)), `data crc` their crc32c, and `object len`
    /// the cursor of the next page ([`SCAN_DONE`] after the last). A key stored for the whole scan is
    /// listed once; one put or removed during it may or may not be.
    Scan = 12,
    /// Registers shared memory with the shard, or releases it: exactly one item, on a connection over the
    /// node's Unix socket only (see [`shared`](crate::shared)). The memory (a sealed memfd) travels as
    /// `SCM_RIGHTS` with the frame's bytes; the reply's `object len` is the region's id, which items with
    /// [`ITEM_SHARED`](crate::ITEM_SHARED) name. With [`REGISTER_RELEASE`](crate::REGISTER_RELEASE) the item's
    /// `offset` names a region to release instead, and no memory travels.
    Register = 13,
    /// Connects an RDMA queue pair for this connection (see [`rdma`](crate::rdma)): one item whose key is
    /// the client's 28-byte endpoint; the reply item's data is the node's. Only after a HELLO reply that
    /// offered it ([`HELLO_RDMA`](crate::HELLO_RDMA)), once per connection.
    RdmaConnect = 14,
}

/// In a LOCATE reply's `data crc`: the object has a copy in DRAM.
pub const LOCATED_IN_DRAM: u32 = 1;
/// In a LOCATE reply's `data crc`: the object has a record on the NVMe tier.
pub const LOCATED_ON_NVME: u32 = 2;

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
            10 => Opcode::Locate,
            11 => Opcode::Members,
            12 => Opcode::Scan,
            13 => Opcode::Register,
            14 => Opcode::RdmaConnect,
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
            Opcode::Locate => "locate",
            Opcode::Members => "members",
            Opcode::Scan => "scan",
            Opcode::Register => "register",
            Opcode::RdmaConnect => "rdma_connect",
        }
    }

    /// Every opcode, in wire order.
    pub const ALL: [Opcode; 14] = [
        Opcode::Hello,
        Opcode::Put,
        Opcode::Get,
        Opcode::GetRange,
        Opcode::Exists,
        Opcode::Remove,
        Opcode::PrefixMatch,
        Opcode::RemoveMatching,
        Opcode::Subscribe,
        Opcode::Locate,
        Opcode::Members,
        Opcode::Scan,
        Opcode::Register,
        Opcode::RdmaConnect,
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
    /// A put's value did not match the checksum the client sent with it: damaged in transit, not stored. Or
    /// a shared get's copy in the client's memory did not match the value's (the client wrote it meanwhile).
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
    /// The request named an older cluster epoch than the node's, and under the node's the key lives
    /// elsewhere; nothing was done. The item's `object len` and `data crc` carry the node's epoch (low and
    /// high 32 bits): the client re-reads the members and retries once.
    Moved = 13,
    /// A versioned upsert older than (or the same as) the version the replica holds; the replica keeps its
    /// own. The write is ordered before the one held: nothing is lost that a reader should see.
    Superseded = 14,
    /// Moving the value over RDMA failed: the client's memory refused the access, or the connection's
    /// queue pair failed (its peer gone). Nothing was stored, and for a get nothing is to be trusted in
    /// the client's span; the connection's later RDMA items fail the same way.
    Transfer = 15,
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
            13 => Status::Moved,
            14 => Status::Superseded,
            15 => Status::Transfer,
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
            Status::Moved => "moved",
            Status::Superseded => "superseded",
            Status::Transfer => "transfer",
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
