//! Values moved by RDMA for a client that registered its memory (`strata_proto::rdma`): the node
//! RDMA-WRITEs a get's value into the client's span and RDMA-READs a put's value out of it, and the TCP
//! connection carries only the requests, the replies and the setup.
//!
//! - [`ShardRdma`]: a shard's protection domain and its DRAM segment registered for local access, so a
//!   value in DRAM is written straight from its slot (the read's pin is the lease that keeps the bytes in
//!   place until the write completes). Values read from the NVMe tier or from another shard go through a
//!   registered staging buffer of the connection.
//! - [`RdmaLink`]: one connection's queue pair, completion queue, the spans the client registered, and the
//!   staging buffer. A work request that fails (a key the client's memory refused, a peer gone) fails its
//!   item with `Transfer`; the queue pair is then in the error state and every later RDMA item of the
//!   connection fails the same way, while other connections go on.
//! - Completions are awaited on the shard's reactor, through the completion channel's descriptor
//!   (`completions.rs`), or busy-polled on a `--busy-poll` node.
//!
//! Built with feature `rdma`; without it the types are uninhabited (`absent.rs`): a node never offers RDMA,
//! and `--rdma-device` is refused at start with the feature's name.

#[cfg(not(feature = "rdma"))]
mod absent;
#[cfg(feature = "rdma")]
mod completions;
#[cfg(feature = "rdma")]
mod link;
#[cfg(feature = "rdma")]
mod shard;

#[cfg(not(feature = "rdma"))]
pub(crate) use absent::{RdmaDevice, RdmaLink, ShardRdma, open_device};
#[cfg(feature = "rdma")]
pub(crate) use link::RdmaLink;
#[cfg(feature = "rdma")]
pub(crate) use shard::{RdmaDevice, ShardRdma, open_device};

use strata_proto::{FrameHeader, RDMA_ENDPOINT_BYTES, ResponseItemHeader, SharedSpan, Status};

use super::client_stream::ClientStream;
use super::connection::Connection;
use super::{ConnectionError, ShardServer, reply_one};

/// One get's value to write into the client's memory: its span there, and the value's bytes in order.
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
pub(crate) struct Transfer<'a> {
    pub(crate) span: SharedSpan,
    pub(crate) pieces: Vec<&'a [u8]>,
}

/// RDMA_CONNECT: connects a queue pair to the client's endpoint (the item's key) and answers with the
/// node's. Refused (`Invalid`) over the Unix socket, on a node without RDMA, and a second time.
pub(super) async fn handle_connect(
    server: &ShardServer,
    connection: &mut Connection,
    header: FrameHeader,
) -> Result<(u64, u64), ConnectionError> {
    let (_, endpoint) = connection.read_one_item(header, "RDMA_CONNECT").await?;
    let usable = matches!(connection.stream, ClientStream::Tcp(_)) && connection.rdma.is_none();
    let connected = match server.rdma.as_ref() {
        Some(rdma) if usable && endpoint.len() == RDMA_ENDPOINT_BYTES => rdma.connect(&endpoint),
        _ => Err(Status::Invalid),
    };
    match connected {
        Ok((link, endpoint)) => {
            connection.rdma = Some(link);
            let item = ResponseItemHeader {
                status: Status::Ok,
                data_len: endpoint.len() as u32,
                data_crc: strata_proto::crc32c(&endpoint),
                object_len: endpoint.len() as u32,
            };
            reply_one(connection, header, item, &endpoint).await.map(|()| (0, 0))
        }
        Err(status) => reply_one(connection, header, ResponseItemHeader::status(status), &[]).await.map(|()| (1, 0)),
    }
}
