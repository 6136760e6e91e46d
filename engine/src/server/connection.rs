//! One client connection's socket and buffers: buffered reads of frame headers and small items, and
//! values read straight into their destination with their crc taken as the bytes arrive.

use std::io;
use std::rc::Rc;
use std::sync::Arc;

use strata_proto::{
    FrameHeader, Limits, Opcode, ProtoError, REQUEST_ITEM_BYTES, RequestItemHeader, SharedSpan, Status,
    decode_item_head, decode_request_body,
};

use super::ConnectionError;
use super::client_stream::ClientStream;
use super::shared_regions::SharedRegions;
use super::watch::{ConnectionWatch, on_socket};
use crate::peer_limits::{ConnectionSlot, PeerBudget};

/// Bytes of a connection's input buffer.
pub(super) const INPUT_BUFFER_BYTES: usize = 64 << 10;
/// A large value is received (and checksummed) in pieces of at most this many bytes.
const CRC_PIECE_BYTES: usize = 256 << 10;

/// An item's head read off the socket, owned: its header, its key and the names its links block gives.
pub(super) struct OwnedHead {
    pub(super) header: RequestItemHeader,
    pub(super) key: Vec<u8>,
    pub(super) version: Option<strata_proto::Version>,
    pub(super) parent: Option<Vec<u8>>,
    pub(super) group: Option<Vec<u8>>,
    /// Where a shared item's value lies in the client's memory.
    pub(super) shared: Option<SharedSpan>,
    /// Bytes it took.
    pub(super) len: usize,
}

/// A client connection.
pub(super) struct Connection {
    /// Dropped before the socket is closed (fields drop in order), so the sweeper never sees a reused fd.
    pub(super) watch: Rc<ConnectionWatch>,
    /// The connection's place under the node's and its tenant's connection limits.
    pub(super) slot: ConnectionSlot,
    /// Where partial-frame bytes are claimed.
    pub(super) peers: Arc<PeerBudget>,
    pub(super) stream: ClientStream,
    /// The memory a local connection registered (none over TCP: shared items are refused there).
    pub(super) shared: Option<SharedRegions>,
    /// The connection's queue pair and the memory its client registered for RDMA (RDMA_CONNECT).
    pub(super) rdma: Option<super::rdma::RdmaLink>,
    /// A TCP peer on the node's own host, to which the shard offers its Unix socket.
    pub(super) peer_on_host: bool,
    /// The client reads streamed replies (HELLO_ACCEPTS_STREAMED): a batch's items may go out as each is
    /// ready.
    pub(super) streamed_replies: bool,
    pub(super) input: Box<[u8]>,
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) output: Vec<u8>,
}

impl Connection {
    pub(super) fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Makes `len` (≤ the buffer) bytes available; `Ok(false)` if the peer closed before sending any.
    pub(super) async fn fill(&mut self, len: usize) -> io::Result<bool> {
        if self.buffered() >= len {
            return Ok(true);
        }
        if self.start + len > self.input.len() {
            self.input.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        while self.buffered() < len {
            let read = on_socket(&self.watch, self.stream.read(&mut self.input[self.end..])).await?;
            if read == 0 {
                if self.buffered() == 0 {
                    return Ok(false);
                }
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.end += read;
        }
        Ok(true)
    }

    /// Reads and decodes the body of a frame that must carry exactly one item (REGISTER, RDMA_CONNECT:
    /// each item hands the node a resource, and a batch would gain nothing): its header and its key. More
    /// items break the protocol (`what` names the frame in the error).
    pub(super) async fn read_one_item(
        &mut self,
        header: FrameHeader,
        what: &str,
    ) -> Result<(RequestItemHeader, Vec<u8>), ConnectionError> {
        if header.count != 1 {
            return Err(ConnectionError::Protocol(Status::Invalid, format!("{what} takes one item")));
        }
        let mut body = vec![0u8; header.body_len as usize];
        self.read_exact(&mut body).await?;
        let limits = Limits { max_batch_items: 1, ..Limits::default() };
        let items = decode_request_body(&header, &body, &limits)?;
        Ok((items[0].header, items[0].key.to_vec()))
    }

    pub(super) async fn read_exact(&mut self, destination: &mut [u8]) -> io::Result<()> {
        let from_buffer = destination.len().min(self.buffered());
        destination[..from_buffer].copy_from_slice(&self.input[self.start..self.start + from_buffer]);
        self.start += from_buffer;
        let rest = &mut destination[from_buffer..];
        if rest.is_empty() {
            return Ok(());
        }
        if rest.len() >= INPUT_BUFFER_BYTES / 2 {
            return on_socket(&self.watch, self.stream.read_exact(rest)).await;
        }
        if !self.fill(rest.len()).await? {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        rest.copy_from_slice(&self.input[self.start..self.start + rest.len()]);
        self.start += rest.len();
        Ok(())
    }

    /// Fills `destination` and returns the crc32c of its bytes, computed piece by piece as they arrive, while
    /// they are still in cache (a 4 MiB value checked after the fact would be read back from memory).
    pub(super) async fn read_exact_crc(&mut self, destination: &mut [u8]) -> io::Result<u32> {
        let from_buffer = destination.len().min(self.buffered());
        // Checked in the input buffer, which is in cache, before the copy: the destination (a DRAM slot) is
        // usually not, and reading it right after writing it waits for its lines to arrive, where the
        // copy's stores alone drain in the background.
        let received = &self.input[self.start..self.start + from_buffer];
        let mut crc = strata_proto::crc32c(received);
        destination[..from_buffer].copy_from_slice(received);
        self.start += from_buffer;
        let mut at = from_buffer;
        if destination.len() - at < INPUT_BUFFER_BYTES / 2 {
            self.read_exact(&mut destination[at..]).await?;
            return Ok(strata_proto::crc32c_append(crc, &destination[at..]));
        }
        while at < destination.len() {
            let end = destination.len().min(at + CRC_PIECE_BYTES);
            let read = on_socket(&self.watch, self.stream.read(&mut destination[at..end])).await?;
            if read == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            crc = strata_proto::crc32c_append(crc, &destination[at..at + read]);
            at += read;
        }
        Ok(crc)
    }

    /// Reads the head of the next `opcode` item (header, key, links block), which must lie within the
    /// `body_left` bytes left of the frame's body, and decodes it with the protocol's own decoder as its
    /// bytes arrive. `Ok(None)`: the body ends before the head does.
    pub(super) async fn read_item_head(
        &mut self,
        opcode: Opcode,
        limits: &Limits,
        body_left: u64,
    ) -> Result<Option<OwnedHead>, ConnectionError> {
        let mut want = REQUEST_ITEM_BYTES;
        loop {
            if (want as u64) <= body_left && !self.fill(want).await? {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
            }
            let window_len = (self.buffered() as u64).min(body_left) as usize;
            let window = &self.input[self.start..self.start + window_len];
            if let Some(head) = decode_item_head(window, opcode, limits)? {
                let owned = OwnedHead {
                    header: head.header,
                    key: head.key.to_vec(),
                    version: head.version,
                    parent: head.links.parent.map(<[u8]>::to_vec),
                    group: head.links.group.map(<[u8]>::to_vec),
                    shared: head.shared,
                    len: head.len,
                };
                self.start += head.len;
                return Ok(Some(owned));
            }
            if window_len as u64 == body_left {
                return Ok(None);
            }
            if window_len >= INPUT_BUFFER_BYTES {
                return Err(ProtoError::Field("an item head longer than the node's input buffer").into());
            }
            want = window_len + 1;
        }
    }

    pub(super) async fn skip(&mut self, mut len: u64) -> io::Result<()> {
        while len > 0 {
            if self.buffered() == 0 && !self.fill(1).await? {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let take = (self.buffered() as u64).min(len) as usize;
            self.start += take;
            len -= take as u64;
        }
        Ok(())
    }

    pub(super) async fn flush(&mut self) -> io::Result<()> {
        if !self.output.is_empty() {
            on_socket(&self.watch, self.stream.write_all(&self.output)).await?;
            self.output.clear();
        }
        Ok(())
    }
}
