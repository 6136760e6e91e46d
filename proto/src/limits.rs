//! The sizes of the fixed structures and the node's bounds.

use crate::codes::Opcode;

/// Bytes of a request item header.
pub const REQUEST_ITEM_BYTES: usize = 16;
/// Bytes of a response item header.
pub const RESPONSE_ITEM_BYTES: usize = 16;
/// Bytes of a HELLO reply body.
pub const HELLO_REPLY_BYTES: usize = 40;
/// The longest auth token.
pub const MAX_TOKEN_BYTES: usize = 256;

/// The node's bounds, sent in the HELLO reply so a client can refuse early what the node would refuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest key.
    pub max_key_bytes: u32,
    /// Longest value.
    pub max_value_bytes: u64,
    /// Most items in one frame.
    pub max_batch_items: u32,
    /// Longest body of a put frame (all its keys and values).
    pub max_put_body_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_key_bytes: 1024, max_value_bytes: 256 << 20, max_batch_items: 1024, max_put_body_bytes: 1 << 30 }
    }
}

impl Limits {
    /// The longest body a request of `opcode` may announce.
    pub fn max_body_bytes(&self, opcode: Opcode) -> u64 {
        match opcode {
            Opcode::Hello => (4 + MAX_TOKEN_BYTES) as u64,
            Opcode::Put => self.max_put_body_bytes,
            // A shared get's span follows its key.
            _ => {
                u64::from(self.max_batch_items)
                    * ((REQUEST_ITEM_BYTES + crate::shared::SHARED_SPAN_BYTES) as u64 + u64::from(self.max_key_bytes))
            }
        }
    }
}
