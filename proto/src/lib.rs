//! `strata-proto`: the KV wire protocol of a Strata node, in one place for the node and the client.
//!
//! Binary, little endian, length-prefixed frames over TCP. A frame is a 40-byte [`FrameHeader`] (with its
//! own crc32c, so a desynchronised stream is caught at the next frame) followed by `body_len` bytes: one
//! item per key, each a fixed item header, the key and (for a put) the value. Responses echo the request's
//! opcode and id and carry one status per item, so a batch never fails as a whole. The layout is drawn in
//! `docs/PROTOCOL.md`.
//!
//! Everything here is sans-I/O: encoders append to a `Vec<u8>`, decoders take byte slices and return
//! [`ProtoError`] for anything malformed or over a [`Limits`] bound. The node and the client stream the
//! values themselves (straight into a DRAM segment or a caller's buffer), so the decoders work item by item
//! and never need a whole frame in memory; [`decode_request_frame`] composes them for the fuzzer and tests.
//!
//! Modules build on each other in one direction: `codes` (opcodes, statuses, errors) → `limits` (sizes
//! and bounds) → `version` (an upsert's version), `frame` (the frame header) and `items` (item headers,
//! HELLO, links, parts) → `request` (item heads, bodies and frames).
#![deny(missing_docs, unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod checksum;
mod codes;
mod events;
mod frame;
mod hash;
mod items;
mod limits;
pub mod placement;
pub mod rdma;
mod request;
pub mod scan;
pub mod shared;
mod version;

pub use checksum::{crc32c, crc32c_append, crc32c_combine};
pub use codes::{LOCATED_IN_DRAM, LOCATED_ON_NVME, Opcode, PROTOCOL_VERSION, ProtoError, Status};
pub use events::{Event, EventRef, Keys, KeysIter, MAX_EVENT_KEYS, MIN_EVENT_BYTES, OpenEvent, RemovalReason, Tier};
pub use frame::{
    FRAME_EPOCH, FRAME_HEADER_BYTES, FRAME_STREAMED, FrameHeader, HELLO_ACCEPTS_STREAMED, MAGIC, MAX_FRAME_EPOCH,
};
pub use hash::{fnv1a_64, shard_of};
pub use items::{
    HelloReply, HelloRequest, ITEM_LINKS, ITEM_MATCH_ALL, ITEM_PIN_HARD, ITEM_PIN_SOFT, ITEM_PROGRESSIVE,
    ITEM_REPLICAS_SHIFT, ITEM_UPSERT, ITEM_VERSIONED, ITEM_WAIT, ITEM_WITH_VERSION, LINKS_HEADER_BYTES, Links,
    MAX_ITEM_REPLICAS, MAX_ITEM_WAIT_MS, PART_HEADER_BYTES, Pin, PutOptions, RequestItemHeader, ResponseItemHeader,
    WritePolicy, decode_part_header, encode_part_header,
};
pub use limits::{HELLO_REPLY_BYTES, Limits, MAX_TOKEN_BYTES, REQUEST_ITEM_BYTES, RESPONSE_ITEM_BYTES};
pub use rdma::{HELLO_OFFERS_RDMA, HELLO_RDMA, RDMA_ENDPOINT_BYTES, RDMA_SPAN_BYTES, REGISTER_REMOTE};
pub use request::{
    ItemHead, RequestFrame, RequestItem, decode_item_head, decode_request_body, decode_request_frame,
    max_item_head_bytes,
};
pub use scan::{MAX_SCAN_KEYS, SCAN_DONE, SCAN_VERSIONED};
pub use shared::{
    HELLO_CHECKED_COPIES, HELLO_OFFERS_SHARED, HELLO_SHARED_SOCKET, HELLO_TAKES_CHECKED_COPIES, ITEM_SHARED,
    MAX_SOCKET_NAME_BYTES, REGISTER_RELEASE, SHARED_SPAN_BYTES, SharedSpan, decode_socket_name, encode_socket_name,
};
pub use version::{VERSION_BYTES, Version, VersionClock, WRITER_BITS};
