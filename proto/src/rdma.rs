//! Values moved by RDMA instead of the socket: the node RDMA-WRITEs a get's value into the client's
//! registered memory and RDMA-READs a put's value from it; requests and replies stay on the TCP connection,
//! which also carries the setup.
//!
//! ```text
//! HELLO request flag bit 1 (HELLO_OFFERS_RDMA): the client has an RDMA device.
//! HELLO reply flag bit 1 (HELLO_RDMA): the shard has one too and will connect a queue pair for this
//!   connection.
//! RDMA_CONNECT (opcode 14): one item, its key the client's endpoint (28 bytes):
//!  0         4     8     10    11  12
//!  | QP num  | PSN | LID | MTU | 0 | GID (16) |
//!   the reply item's data is the node's endpoint, in the same form; both sides then move their queue pairs
//!   to ready-to-send. Once per connection.
//! REGISTER (opcode 13) with flag bit 1 (REGISTER_REMOTE): one item, its key a span of the client's memory
//!   registered for remote read and write (16 bytes):
//!  0         8        12
//!  | address | length | rkey |
//!   the reply's object len is the region's id. REGISTER_RELEASE releases it as for shared memory.
//! GET or PUT item with ITEM_SHARED: its span (region, len, offset) names a region the connection
//!   registered as above, and the value moves by RDMA, as it moves by copy for shared memory: a get's
//!   reply item carries the value's crc32c and no data, a put's value is not in the body. A transfer that
//!   fails answers TRANSFER (15).
//! ```
//!
//! The node's queue pair grants no remote access and none of its memory is registered for any: the node
//! reads and writes client memory, never the reverse. A remote key is used only on the connection that
//! registered it, and the client's protection domain keeps it to that client's queue pairs.

/// HELLO request flag: the client has an RDMA device and can register memory for the node to reach.
pub const HELLO_OFFERS_RDMA: u16 = 1 << 1;
/// HELLO reply flag: the shard will connect a queue pair for this connection (RDMA_CONNECT).
pub const HELLO_RDMA: u16 = 1 << 1;
/// REGISTER item flag: the item's key is a span of the client's memory registered for RDMA.
pub const REGISTER_REMOTE: u16 = 1 << 1;
/// Bytes of an RDMA endpoint (an RDMA_CONNECT item's key, its reply's data).
pub const RDMA_ENDPOINT_BYTES: usize = 28;
/// Bytes of a registered span (a REGISTER_REMOTE item's key).
pub const RDMA_SPAN_BYTES: usize = 16;
