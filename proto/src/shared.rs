//! Values moved through shared memory instead of the socket, for a client on the node's own host.
//!
//! ```text
//! HELLO request: the reserved u16 after the token length is flags; bit 0 (HELLO_OFFERS_SHARED): the
//!   client can move values through shared memory.
//!   Bit 3 (HELLO_TAKES_CHECKED_COPIES): the client takes the node's check of a shared get's copy.
//! HELLO reply (to an offer, from a peer on the node's host): the reserved u16 at byte 10 is flags; bit 0
//!   (HELLO_SHARED_SOCKET): after the 40 bytes, [name len u16][name], the abstract Unix socket of the
//!   shard that answered. The client opens it and speaks the same protocol there. Bit 2
//!   (HELLO_CHECKED_COPIES, to a client that takes them): every shared get answered OK was checked by the
//!   node in the client's memory, so the client need not check it again.
//! REGISTER (opcode 13, only on that socket): one item, its key one byte nobody reads; the memfd comes as
//!   SCM_RIGHTS with the frame's bytes; the reply's object len is the region's id. Flag bit 0
//!   (REGISTER_RELEASE): release region `offset` instead (no memfd).
//! GET or PUT item with flag bit 9 (ITEM_SHARED): a 16-byte span follows the key (a put's, after its
//!   version, before its links block):
//!  0        4       8
//!  | region | len   | offset |
//!   get: the node copies the value to `offset` of the region if it fits in `len` bytes (else TOO_LARGE,
//!     the value's length in `object len`); the reply item carries no data, `data len` 0, `object len`
//!     the bytes copied and `data crc` their crc32c, checked in the client's memory (by the node, which
//!     answers TRANSFER_CHECKSUM when the copy differs; by a client not told HELLO_CHECKED_COPIES);
//!   put: `len` equals `value len`; the value is at `offset` and not in the body; `value crc` is checked
//!     by the node on its own copy.
//! ```
//!
//! The node maps only memory a connection gave it, and only while that connection lives; a client never
//! maps the node's memory.

use crate::codes::{u32_at, u64_at};

/// GET / PUT item flag: the value is in a region of shared memory the connection registered, at the span
/// that follows the key, and not in the frame.
pub const ITEM_SHARED: u16 = 1 << 9;
/// Bytes of a shared item's span.
pub const SHARED_SPAN_BYTES: usize = 16;
/// HELLO request flag: the client can move values through shared memory.
pub const HELLO_OFFERS_SHARED: u16 = 1;
/// HELLO reply flag: the name of the shard's Unix socket follows the reply's 40 bytes.
pub const HELLO_SHARED_SOCKET: u16 = 1;
/// HELLO request flag: the client takes the node's check of a shared get's copy in its memory
/// ([`HELLO_CHECKED_COPIES`]) in place of its own.
pub const HELLO_TAKES_CHECKED_COPIES: u16 = 1 << 3;
/// HELLO reply flag, to a client that offered [`HELLO_TAKES_CHECKED_COPIES`]: the node checks every shared
/// get's copy against the value's crc32c in the client's memory.
pub const HELLO_CHECKED_COPIES: u16 = 1 << 2;
/// The longest name of an abstract Unix socket (`sun_path` less its leading NUL).
pub const MAX_SOCKET_NAME_BYTES: usize = 107;
/// REGISTER item flag: release the region named by the item's `offset`.
pub const REGISTER_RELEASE: u16 = 1;

/// Where a shared item's value lies in the client's registered memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SharedSpan {
    /// The region's id (the REGISTER reply's `object len`).
    pub region: u32,
    /// Bytes at `offset`: room for a get, the value's length for a put.
    pub len: u32,
    /// First byte in the region.
    pub offset: u64,
}

impl SharedSpan {
    /// Appends the 16 bytes.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.region.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
    }

    /// Decodes the 16 bytes at the start of `bytes`; `None` if fewer arrived.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes = bytes.get(..SHARED_SPAN_BYTES)?;
        Some(Self { region: u32_at(bytes, 0), len: u32_at(bytes, 4), offset: u64_at(bytes, 8) })
    }

    /// The span's end in its region, if it does not overflow.
    pub fn end(&self) -> Option<u64> {
        self.offset.checked_add(u64::from(self.len))
    }
}

/// Encodes the socket name a HELLO reply carries after its 40 bytes.
pub fn encode_socket_name(name: &[u8], out: &mut Vec<u8>) {
    let name = &name[..name.len().min(MAX_SOCKET_NAME_BYTES)];
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(name);
}

/// Decodes the socket name after a HELLO reply's 40 bytes: exactly `[len u16][name]`, 1 to
/// [`MAX_SOCKET_NAME_BYTES`] bytes.
pub fn decode_socket_name(bytes: &[u8]) -> Result<&[u8], crate::ProtoError> {
    if bytes.len() < 2 {
        return Err(crate::ProtoError::Truncated { needed: 2, available: bytes.len() });
    }
    let len = usize::from(crate::codes::u16_at(bytes, 0));
    if len == 0 || len > MAX_SOCKET_NAME_BYTES || bytes.len() != 2 + len {
        return Err(crate::ProtoError::Field("the name of a shard's Unix socket"));
    }
    Ok(&bytes[2..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_round_trips_and_knows_its_end() {
        let span = SharedSpan { region: 3, len: 4096, offset: 1 << 33 };
        let mut bytes = Vec::new();
        span.encode_into(&mut bytes);
        assert_eq!(bytes.len(), SHARED_SPAN_BYTES);
        assert_eq!(SharedSpan::decode(&bytes), Some(span));
        assert_eq!(SharedSpan::decode(&bytes[..15]), None);
        assert_eq!(span.end(), Some((1 << 33) + 4096));
        assert_eq!(SharedSpan { offset: u64::MAX, ..span }.end(), None);
    }

    #[test]
    fn a_socket_name_must_fill_its_bytes() {
        let mut bytes = Vec::new();
        encode_socket_name(b"strata-127.0.0.1:7600-0", &mut bytes);
        assert_eq!(decode_socket_name(&bytes), Ok(&b"strata-127.0.0.1:7600-0"[..]));
        assert!(decode_socket_name(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode_socket_name(&[0, 0]).is_err());
        let mut long = Vec::new();
        long.extend_from_slice(&200u16.to_le_bytes());
        long.extend(std::iter::repeat_n(b'x', 200));
        assert!(decode_socket_name(&long).is_err());
    }
}
