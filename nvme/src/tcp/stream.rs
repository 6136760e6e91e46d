//! PDUs on a socket: a reader that batches small PDUs out of one receive buffer and reads large data
//! straight into its destination, a writer that coalesces headers and small payloads into one send, and
//! an outbox through which many tasks of one executor hand PDUs to the connection's writer task.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
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

/// A connected socket, driven one of two ways:
/// - **reactor**: glommio's `TcpStream`; an idle connection costs nothing, the core sleeps in the kernel;
/// - **polled** (SPDK style): a non-blocking socket the task retries, yielding to the executor's other
///   tasks between tries, so the core does not sleep while the connection is open (or, on an executor
///   that sets [`park_idle_polled_sockets_after`], until it has been quiet that long). It saves the
///   reactor's wake-up on every PDU, which is most of a small I/O's latency, at the price of a busy core.
pub enum Socket {
    /// Through glommio's reactor.
    Reactor(TcpStream),
    /// Busy-polled with non-blocking system calls.
    Polled(std::net::TcpStream),
}

impl Socket {
    /// The descriptor (for shutting the connection down from elsewhere).
    pub fn raw_fd(&self) -> RawFd {
        match self {
            Socket::Reactor(stream) => stream.as_raw_fd(),
            Socket::Polled(stream) => stream.as_raw_fd(),
        }
    }

    /// Reads what is there (at least one byte; 0 at end of stream).
    pub async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Reactor(stream) => stream.read(buf).await,
            Socket::Polled(stream) => {
                let mut idle = IdleWatch::default();
                loop {
                    match (&*stream).read(buf) {
                        Ok(read) => return Ok(read),
                        Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                            if idle.too_long() {
                                return read_on_reactor(stream, buf).await;
                            }
                            idle_poll(idle.misses).await;
                        }
                        Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                        Err(error) => return Err(error),
                    }
                }
            }
        }
    }

    /// Fills `buf`.
    pub async fn read_exact(&mut self, mut buf: &mut [u8]) -> io::Result<()> {
        while !buf.is_empty() {
            let read = self.read(buf).await?;
            if read == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            buf = &mut buf[read..];
        }
        Ok(())
    }

    /// Writes all of `buf`.
    pub async fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Socket::Reactor(stream) => stream.write_all(buf).await,
            Socket::Polled(stream) => write_all_polled(stream, &mut [io::IoSlice::new(buf)]).await,
        }
    }

    /// Writes all of `bufs`, in order: one system call for many pieces on a polled socket (`writev`, at
    /// most `IOV_MAX` pieces a call); through the reactor, what the socket takes at once in one `sendmsg`
    /// that does not wait, then the rest piece by piece.
    pub async fn write_all_vectored(&mut self, mut bufs: &mut [io::IoSlice<'_>]) -> io::Result<()> {
        match self {
            Socket::Reactor(stream) => {
                // One send for a whole batch of replies where the socket has room: a send per piece (a
                // header, then its value) went out as a segment each (no Nagle), each a loopback delivery.
                let taken = send_without_waiting(stream.as_raw_fd(), &bufs[..bufs.len().min(IOV_MAX)])?;
                io::IoSlice::advance_slices(&mut bufs, taken);
                // Small pieces are gathered into one send; large ones go from their own memory.
                const GATHER_BELOW: usize = 16 << 10;
                let mut gathered = Vec::new();
                for buf in bufs.iter() {
                    if buf.len() < GATHER_BELOW {
                        gathered.extend_from_slice(buf);
                        continue;
                    }
                    if !gathered.is_empty() {
                        stream.write_all(&gathered).await?;
                        gathered.clear();
                    }
                    stream.write_all(buf).await?;
                }
                if !gathered.is_empty() {
                    stream.write_all(&gathered).await?;
                }
                Ok(())
            }
            Socket::Polled(stream) => write_all_polled(stream, bufs).await,
        }
    }

    /// Another descriptor of the same connection, for shutting it down from outside the tasks that read
    /// and write it: a shutdown wakes both, where dropping a descriptor would not end the connection.
    pub fn shutdown_handle(&self) -> io::Result<std::net::TcpStream> {
        let descriptor = duplicate(self.raw_fd())?;
        // SAFETY: `descriptor` is a fresh descriptor of a connected TCP socket that nothing else owns.
        #[allow(unsafe_code)]
        let stream = unsafe { std::net::TcpStream::from_raw_fd(descriptor) };
        Ok(stream)
    }

    /// Shuts the connection down both ways.
    pub async fn shutdown(&mut self) -> io::Result<()> {
        match self {
            Socket::Reactor(stream) => stream.shutdown(std::net::Shutdown::Both).await.map_err(Into::into),
            Socket::Polled(stream) => stream.shutdown(std::net::Shutdown::Both),
        }
    }
}

/// Most pieces one `writev` or `sendmsg` takes (Linux's `UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

/// Sends what the socket `fd` takes of `bufs` now, without waiting for room (whatever the descriptor's
/// flags) and without SIGPIPE; returns the bytes sent (0 when it has no room).
pub fn send_without_waiting(fd: RawFd, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
    if bufs.is_empty() {
        return Ok(0);
    }
    // SAFETY: a zeroed msghdr is valid; it points at `bufs` (IoSlice is ABI-compatible with iovec), which
    // outlive the call, and names no address or control data.
    #[allow(unsafe_code)]
    let sent = unsafe {
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        message.msg_iovlen = bufs.len();
        libc::sendmsg(fd, &message, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
    };
    if sent >= 0 {
        return Ok(sent as usize);
    }
    let error = io::Error::last_os_error();
    match error.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
        _ => Err(error),
    }
}

/// Writes all of `bufs` on a non-blocking socket, `writev` at most `IOV_MAX` pieces a call, polling while
/// the socket's buffer is full.
async fn write_all_polled(stream: &std::net::TcpStream, mut bufs: &mut [io::IoSlice<'_>]) -> io::Result<()> {
    let mut misses = 0u32;
    while !bufs.is_empty() {
        let batch = bufs.len().min(IOV_MAX);
        match (&*stream).write_vectored(&bufs[..batch]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => io::IoSlice::advance_slices(&mut bufs, written),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                misses += 1;
                idle_poll(misses).await;
            }
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Reads `stream` through glommio's reactor, for a polled socket that has waited longer than
/// [`park_idle_polled_sockets_after`] allows: the task then waits for input without running, so an
/// executor whose sockets are all idle parks. A duplicate descriptor, adopted for this one read, is armed
/// on the reactor's ring and closed after. While it waits it counts as reactor I/O in flight, so that the
/// executor's busy sockets give the reactor its turns ([`idle_poll`]) and its input is seen at once.
async fn read_on_reactor(stream: &std::net::TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    let descriptor = duplicate(stream.as_raw_fd())?;
    // SAFETY: a fresh descriptor of a connected TCP socket that nothing else owns; glommio closes it.
    #[allow(unsafe_code)]
    let mut reactor = unsafe { TcpStream::from_raw_fd(descriptor) };
    let _waiting = ReactorIo::start();
    reactor.read(buf).await
}

/// Marks a wait on this executor's reactor for as long as it lives, as `read_on_reactor` does.
pub fn reactor_wait() -> impl Drop {
    ReactorIo::start()
}

/// Counts a polled read's misses and says when it has waited longer than this executor lets a polled
/// socket spin ([`park_idle_polled_sockets_after`]). Reads the clock at the first miss and then once per
/// [`MISSES_PER_KERNEL_YIELD`] misses.
#[derive(Default)]
pub struct IdleWatch {
    /// Tries that found nothing.
    pub misses: u32,
    since: Option<std::time::Instant>,
}

impl IdleWatch {
    /// Counts a miss; true once the socket has been idle past the executor's limit.
    pub fn too_long(&mut self) -> bool {
        self.misses += 1;
        let Some(limit) = POLLED_IDLE_LIMIT.with(Cell::get) else {
            return false;
        };
        let since = *self.since.get_or_insert_with(std::time::Instant::now);
        self.misses.is_multiple_of(MISSES_PER_KERNEL_YIELD) && since.elapsed() >= limit
    }
}

thread_local! {
    static POLLED_IDLE_LIMIT: Cell<Option<std::time::Duration>> = const { Cell::new(None) };
}

/// Lets this executor's polled sockets that found nothing to read for `limit` wait on the reactor
/// instead (`None`, the default: they poll for as long as they are open, SPDK style). A polled
/// connection's client that goes quiet then costs nothing, and an executor whose connections are all
/// quiet sleeps; its next request pays one reactor wake-up.
pub fn park_idle_polled_sockets_after(limit: Option<std::time::Duration>) {
    POLLED_IDLE_LIMIT.with(|cell| cell.set(limit));
}

/// Polls between this many misses give the core to the kernel once (`sched_yield`).
const MISSES_PER_KERNEL_YIELD: u32 = 64;

/// What a polled socket does when it has nothing: let the executor's other tasks run, and every
/// [`MISSES_PER_KERNEL_YIELD`] misses let the kernel's own threads on this core run too. Without the
/// latter, work the kernel defers to `ksoftirqd` (TCP pacing under BBR, for one) waits for the scheduler
/// to preempt the spinning thread, several milliseconds, and every I/O in flight stalls with it.
///
/// While this executor has block I/O in flight through glommio's reactor ([`ReactorIo`]), every
/// [`MISSES_PER_REACTOR_POLL`] misses the task sleeps on a 1 µs timer instead of yielding: glommio reaps
/// I/O completions only once no task is runnable or the preempt timer fires (100 ms), and a polled socket
/// that only ever yields would keep its task runnable. Without I/O in flight it only yields, which keeps a
/// socket's latency at a few microseconds — except every [`MISSES_PER_BACKGROUND_POLL`] misses, so that the
/// reactor's other work (a listener's accept above all) waits about a millisecond, not the 100 ms preempt
/// timer: a busy-polled node took 80–100 ms to serve a client's new connection.
pub async fn idle_poll(misses: u32) {
    if misses.is_multiple_of(MISSES_PER_KERNEL_YIELD) {
        std::thread::yield_now();
    }
    let reactor_due =
        REACTOR_IO_IN_FLIGHT.with(std::cell::Cell::get) > 0 || misses.is_multiple_of(MISSES_PER_BACKGROUND_POLL);
    if misses.is_multiple_of(MISSES_PER_REACTOR_POLL) && reactor_due {
        glommio::timer::sleep(std::time::Duration::from_micros(1)).await;
    } else {
        futures_lite::future::yield_now().await;
    }
}

/// Polls between timer sleeps that let glommio's reactor reap completions.
const MISSES_PER_REACTOR_POLL: u32 = 8;
/// Polls between reactor turns when no block I/O is in flight (a multiple of the above).
const MISSES_PER_BACKGROUND_POLL: u32 = 1024;

thread_local! {
    static REACTOR_IO_IN_FLIGHT: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Marks a block I/O in flight on this executor's glommio reactor for as long as it lives.
pub(crate) struct ReactorIo;

impl ReactorIo {
    pub(crate) fn start() -> Self {
        REACTOR_IO_IN_FLIGHT.with(|count| count.set(count.get() + 1));
        ReactorIo
    }
}

impl Drop for ReactorIo {
    fn drop(&mut self) {
        REACTOR_IO_IN_FLIGHT.with(|count| count.set(count.get().saturating_sub(1)));
    }
}

/// Sets a socket's TCP congestion control algorithm (`TCP_CONGESTION`), e.g. `reno` or `cubic`. Pacing
/// algorithms (BBR, the default on some systems) spread a burst of responses over the estimated
/// bandwidth, which on loopback and fast fabrics caps a deep queue well below what the path carries.
pub fn set_congestion_control(fd: RawFd, algorithm: &str) -> io::Result<()> {
    // SAFETY: the pointer and length describe `algorithm`'s bytes, which outlive the call; the kernel only
    // reads them.
    #[allow(unsafe_code)]
    let result = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            algorithm.as_ptr().cast(),
            algorithm.len() as libc::socklen_t,
        )
    };
    if result < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

fn duplicate(fd: RawFd) -> io::Result<RawFd> {
    // SAFETY: `dup` has no memory-safety preconditions; it returns a new descriptor or -1.
    #[allow(unsafe_code)]
    let duplicate = unsafe { libc::dup(fd) };
    if duplicate < 0 { Err(io::Error::last_os_error()) } else { Ok(duplicate) }
}

/// Two sockets on one connection (`dup`s of its descriptor), so that one task reads while another
/// writes: both through glommio's reactor, or both polled.
pub fn split_stream(stream: TcpStream, polled: bool) -> io::Result<(Socket, Socket)> {
    if polled {
        let reader = duplicate(stream.as_raw_fd())?;
        // SAFETY: `reader` is a fresh descriptor of a connected TCP socket that nothing else owns.
        #[allow(unsafe_code)]
        let reader = unsafe { std::net::TcpStream::from_raw_fd(reader) };
        drop(stream);
        return split_polled(reader);
    }
    let writer = duplicate(stream.as_raw_fd())?;
    // SAFETY: `writer` is a fresh descriptor of a connected TCP socket that nothing else owns.
    #[allow(unsafe_code)]
    let writer = unsafe { TcpStream::from_raw_fd(writer) };
    Ok((Socket::Reactor(stream), Socket::Reactor(writer)))
}

/// One socket for a connection that one task both reads and writes: through glommio's reactor, or polled.
pub fn single_stream(stream: TcpStream, polled: bool) -> io::Result<Socket> {
    if !polled {
        return Ok(Socket::Reactor(stream));
    }
    let descriptor = duplicate(stream.as_raw_fd())?;
    // SAFETY: `descriptor` is a fresh descriptor of a connected TCP socket that nothing else owns.
    #[allow(unsafe_code)]
    let polled = unsafe { std::net::TcpStream::from_raw_fd(descriptor) };
    drop(stream);
    polled.set_nonblocking(true)?;
    Ok(Socket::Polled(polled))
}

/// Two polled sockets on one connected standard-library stream.
pub fn split_polled(stream: std::net::TcpStream) -> io::Result<(Socket, Socket)> {
    stream.set_nonblocking(true)?;
    let writer = stream.try_clone()?;
    Ok((Socket::Polled(stream), Socket::Polled(writer)))
}

const RECEIVE_BUFFER_BYTES: usize = 64 << 10;
/// Data longer than this is read straight into its destination instead of through the receive buffer.
const DIRECT_READ_BYTES: usize = 16 << 10;

/// Reads PDUs from a stream.
pub struct PduReader {
    stream: Socket,
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
    pub fn new(stream: Socket, decoder: Decoder) -> Self {
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
    stream: Socket,
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
    pub fn new(stream: Socket) -> Self {
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
            encode_data_digest(&mut self.batch, header, self.digests, data);
            if self.batch.len() >= BATCH_BYTES {
                self.flush().await?;
            }
            return Ok(());
        }
        self.flush().await?;
        self.stream.write_all(data).await?;
        encode_data_digest(&mut self.batch, header, self.digests, data);
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
        self.stream.shutdown().await
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte at `at` of piece `piece`.
    fn byte(piece: usize, at: usize) -> u8 {
        (at * 31 + piece * 7) as u8
    }

    /// Pieces of every size (a header's few bytes, values past the gathering threshold, one larger than the
    /// socket takes at once) arrive whole and in order through the reactor, however much of them the first
    /// `sendmsg` took, and a second write after a partial first one too.
    #[test]
    fn a_vectored_write_through_the_reactor_arrives_whole_and_in_order() {
        let sizes = [7usize, 20 << 10, 1, 3 << 20, 33, 64 << 10, 5];
        let pieces: Vec<Vec<u8>> =
            sizes.iter().enumerate().map(|(piece, &len)| (0..len).map(|at| byte(piece, at)).collect()).collect();
        let expected = [pieces.concat(), pieces.concat()].concat();
        glommio::LocalExecutorBuilder::default()
            .spawn(move || async move {
                let listener = glommio::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
                let address = listener.local_addr().expect("its address");
                let reader = std::thread::spawn(move || {
                    let mut stream = std::net::TcpStream::connect(address).expect("a connection");
                    // Not reading at first: the writer's socket fills and its first send is partial.
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    let mut received = Vec::new();
                    stream.read_to_end(&mut received).expect("the bytes");
                    received
                });
                let mut socket = Socket::Reactor(listener.accept().await.expect("the accept"));
                for _ in 0..2 {
                    let mut slices: Vec<io::IoSlice<'_>> = pieces.iter().map(|piece| io::IoSlice::new(piece)).collect();
                    socket.write_all_vectored(&mut slices).await.expect("the write");
                }
                socket.shutdown().await.expect("the shutdown");
                let received = reader.join().expect("the reader");
                assert_eq!(received.len(), expected.len());
                assert!(received == expected, "every byte in order");
            })
            .expect("executor")
            .join()
            .expect("the checks");
    }
}
