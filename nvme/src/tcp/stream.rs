//! PDUs on a socket: a reader that batches small PDUs out of one receive buffer and reads large data
//! straight into its destination, a writer that coalesces headers and small payloads into one send, and
//! an outbox through which many tasks of one executor hand PDUs to the connection's writer task.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::task::{Poll, Waker};

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;

use super::pdu::{
    COMMON_HEADER_BYTES, DIGEST_BYTES, Decoder, Digests, MAX_HEADER_STAGE_BYTES, PduError, PduHeader, ReceivedHeader,
    data_digest, encode_data_digest, encode_header, header_stage_len,
};

/// Why a connection stopped.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The socket failed.
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    /// The peer closed the connection at a PDU boundary.
    #[error("connection closed by the peer")]
    Closed,
    /// The peer sent a PDU that breaks the protocol (or terminated the connection).
    #[error(transparent)]
    Pdu(#[from] PduError),
}

/// Two streams on one socket (a `dup` of its descriptor), so that one task reads while another writes.
pub fn split_stream(stream: TcpStream) -> io::Result<(TcpStream, TcpStream)> {
    // SAFETY: `dup` has no memory-safety preconditions; it returns a new descriptor or -1.
    #[allow(unsafe_code)]
    let duplicate = unsafe { libc::dup(stream.as_raw_fd()) };
    if duplicate < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `duplicate` is a fresh descriptor of a connected TCP socket that nothing else owns.
    #[allow(unsafe_code)]
    let writer = unsafe { TcpStream::from_raw_fd(duplicate) };
    Ok((stream, writer))
}

const RECEIVE_BUFFER_BYTES: usize = 64 << 10;
/// Data longer than this is read straight into its destination instead of through the receive buffer.
const DIRECT_READ_BYTES: usize = 16 << 10;

/// Reads PDUs from a stream.
pub struct PduReader {
    stream: TcpStream,
    buffer: Box<[u8]>,
    start: usize,
    end: usize,
    /// The bounds and digests that received PDUs are checked against.
    pub decoder: Decoder,
    last_header: [u8; MAX_HEADER_STAGE_BYTES],
    last_header_len: usize,
}

impl PduReader {
    /// A reader over `stream` checking PDUs with `decoder`.
    pub fn new(stream: TcpStream, decoder: Decoder) -> Self {
        Self {
            stream,
            buffer: vec![0u8; RECEIVE_BUFFER_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            decoder,
            last_header: [0; MAX_HEADER_STAGE_BYTES],
            last_header_len: 0,
        }
    }

    fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Makes at least `count` (≤ the buffer) bytes available. `Ok(false)`: the peer closed before any.
    async fn fill(&mut self, count: usize) -> Result<bool, TransportError> {
        if self.buffered() >= count {
            return Ok(true);
        }
        if self.start + count > self.buffer.len() {
            self.buffer.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        while self.buffered() < count {
            let read = self.stream.read(&mut self.buffer[self.end..]).await?;
            if read == 0 {
                if self.buffered() == 0 {
                    return Ok(false);
                }
                return Err(TransportError::Io(io::ErrorKind::UnexpectedEof.into()));
            }
            self.end += read;
        }
        Ok(true)
    }

    /// Reads and checks the next PDU's header stage. Data, if any, must be consumed next with
    /// [`PduReader::read_data`] (or [`PduReader::skip_data`]).
    pub async fn read_header(&mut self) -> Result<ReceivedHeader, TransportError> {
        if !self.fill(COMMON_HEADER_BYTES).await? {
            return Err(TransportError::Closed);
        }
        let mut common = [0u8; COMMON_HEADER_BYTES];
        common.copy_from_slice(&self.buffer[self.start..self.start + COMMON_HEADER_BYTES]);
        self.remember_header(COMMON_HEADER_BYTES);
        let stage_len = header_stage_len(&self.decoder, &common)?;
        if !self.fill(stage_len).await? {
            return Err(TransportError::Closed);
        }
        self.remember_header(stage_len);
        let received = self.decoder.decode_header(&self.buffer[self.start..self.start + stage_len])?;
        self.start += stage_len;
        Ok(received)
    }

    fn remember_header(&mut self, len: usize) {
        let len = len.min(self.buffered());
        self.last_header[..len].copy_from_slice(&self.buffer[self.start..self.start + len]);
        self.last_header_len = len;
    }

    /// The bytes of the last header read (or partly read): what a TermReq sends back.
    pub fn last_header(&self) -> &[u8] {
        &self.last_header[..self.last_header_len]
    }

    /// Reads the PDU's data into `destination` (exactly its length) and checks its digest.
    pub async fn read_data(&mut self, header: &ReceivedHeader, destination: &mut [u8]) -> Result<(), TransportError> {
        debug_assert_eq!(destination.len(), header.data_len as usize);
        let from_buffer = destination.len().min(self.buffered());
        destination[..from_buffer].copy_from_slice(&self.buffer[self.start..self.start + from_buffer]);
        self.start += from_buffer;
        let rest = &mut destination[from_buffer..];
        if rest.len() > DIRECT_READ_BYTES {
            self.stream.read_exact(rest).await?;
        } else if !rest.is_empty() {
            if !self.fill(rest.len()).await? {
                return Err(TransportError::Io(io::ErrorKind::UnexpectedEof.into()));
            }
            rest.copy_from_slice(&self.buffer[self.start..self.start + rest.len()]);
            self.start += rest.len();
        }
        if header.data_digest {
            if !self.fill(DIGEST_BYTES).await? {
                return Err(TransportError::Io(io::ErrorKind::UnexpectedEof.into()));
            }
            let mut digest = [0u8; DIGEST_BYTES];
            digest.copy_from_slice(&self.buffer[self.start..self.start + DIGEST_BYTES]);
            self.start += DIGEST_BYTES;
            let received = u32::from_le_bytes(digest);
            let computed = data_digest(destination);
            if received != computed {
                return Err(PduError::DataDigest { received, computed }.into());
            }
        }
        Ok(())
    }

    /// Reads a small PDU's data (a TermReq's) into a new vector.
    pub async fn read_small_data(&mut self, header: &ReceivedHeader) -> Result<Vec<u8>, TransportError> {
        let mut data = vec![0u8; header.data_len as usize];
        self.read_data(header, &mut data).await?;
        Ok(data)
    }
}

/// Writes PDUs to a stream, coalescing small ones.
pub struct PduWriter {
    stream: TcpStream,
    batch: Vec<u8>,
    /// Digests in force.
    pub digests: Digests,
    /// The receiver's data alignment in bytes ((PDA + 1) * 4).
    pub data_alignment: usize,
}

/// Payloads up to this size are copied into the batch; larger ones are sent from their own memory.
const COPY_PAYLOAD_BYTES: usize = 8 << 10;
/// A batch is sent once it holds this much.
const BATCH_BYTES: usize = 128 << 10;

impl PduWriter {
    /// A writer over `stream`.
    pub fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            batch: Vec::with_capacity(BATCH_BYTES + COPY_PAYLOAD_BYTES),
            digests: Digests::default(),
            data_alignment: 4,
        }
    }

    /// Queues a PDU with `data`. Small PDUs stay in the batch until [`PduWriter::flush`]; a large payload
    /// is sent now, after the batch, without a copy.
    pub async fn send(&mut self, header: &PduHeader, data: &[u8]) -> io::Result<()> {
        encode_header(&mut self.batch, header, self.digests, data.len() as u32, self.data_alignment);
        if data.len() <= COPY_PAYLOAD_BYTES {
            self.batch.extend_from_slice(data);
            encode_data_digest(&mut self.batch, self.digests, data);
            if self.batch.len() >= BATCH_BYTES {
                self.flush().await?;
            }
            return Ok(());
        }
        self.flush().await?;
        self.stream.write_all(data).await?;
        encode_data_digest(&mut self.batch, self.digests, data);
        Ok(())
    }

    /// Sends what is batched.
    pub async fn flush(&mut self) -> io::Result<()> {
        if !self.batch.is_empty() {
            self.stream.write_all(&self.batch).await?;
            self.batch.clear();
        }
        Ok(())
    }

    /// Sends raw bytes (the TermReq's echoed header is data of the TermReq; this is for tests that need to
    /// put arbitrary bytes on the wire).
    pub async fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.flush().await?;
        self.stream.write_all(bytes).await
    }

    /// Shuts the socket down for writing (the peer reads end of stream).
    pub async fn close(&mut self) -> io::Result<()> {
        self.flush().await?;
        self.stream.shutdown(std::net::Shutdown::Both).await.map_err(Into::into)
    }
}

/// A queue from the tasks of one executor to a connection's writer task. Not `Send`: both ends live on
/// one executor, so a `RefCell` and a waker are all it takes.
pub struct Outbox<T> {
    items: RefCell<VecDeque<T>>,
    waiter: Cell<Option<Waker>>,
    closed: Cell<bool>,
}

impl<T> Default for Outbox<T> {
    fn default() -> Self {
        Self { items: RefCell::new(VecDeque::new()), waiter: Cell::new(None), closed: Cell::new(false) }
    }
}

impl<T> Outbox<T> {
    /// Queues an item and wakes the writer.
    pub fn push(&self, item: T) {
        self.items.borrow_mut().push_back(item);
        if let Some(waker) = self.waiter.take() {
            waker.wake();
        }
    }

    /// Wakes the writer for good: [`Outbox::take_all`] returns `false` once the queue is empty.
    pub fn close(&self) {
        self.closed.set(true);
        if let Some(waker) = self.waiter.take() {
            waker.wake();
        }
    }

    /// Waits until items are queued and moves all of them into `into`. `false`: closed and drained.
    pub async fn take_all(&self, into: &mut Vec<T>) -> bool {
        std::future::poll_fn(|context| {
            let mut items = self.items.borrow_mut();
            if !items.is_empty() {
                into.extend(items.drain(..));
                return Poll::Ready(true);
            }
            if self.closed.get() {
                return Poll::Ready(false);
            }
            self.waiter.set(Some(context.waker().clone()));
            Poll::Pending
        })
        .await
    }
}
