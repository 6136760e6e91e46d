//! One host queue (admin or I/O): its link to the controller (a TCP connection with its reader and writer
//! tasks, or an NVMe/RDMA queue pair with its completion task) and the table of commands in flight,
//! indexed by command ID.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::net::{Shutdown, SocketAddr};
use std::rc::{Rc, Weak};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use glommio::net::TcpStream;
use glommio::sync::Semaphore;

use super::NvmfError;
use crate::buffer::IoBuffer;
use crate::spec::{Command, Completion, SglDescriptor};
use crate::tcp::pdu::{Decoder, Digests, PduError, PduHeader};
use crate::tcp::{Outbox, PduReader, PduWriter, TransportError, set_congestion_control, split_polled, split_stream};

/// How long a polled queue's TCP connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What the writer task sends.
enum Outgoing {
    Command { command: Command, data: Option<Rc<IoBuffer>> },
    HostData { cid: u16, ttag: u16, offset: u32, len: u32, data: Rc<IoBuffer> },
}

/// A command in flight.
struct Pending {
    /// When it was queued: the deadline watch fails the queue once it waited the command timeout.
    since: Instant,
    /// Where C2HData goes (reads).
    read: Option<IoBuffer>,
    /// What R2Ts ask for (writes), shared with the writer while it sends.
    write: Option<Rc<IoBuffer>>,
    result: Option<Result<Completion, NvmfError>>,
    waker: Option<Waker>,
    /// The submitter went away (its future was dropped): free the CID when the completion comes.
    abandoned: bool,
    /// A C2HData PDU of this read failed its data digest: the command fails when it completes, and the
    /// connection stays up (the whole PDU was consumed, so the stream is in step).
    corrupt: Option<PduError>,
}

impl Pending {
    fn new(read: Option<IoBuffer>, write: Option<Rc<IoBuffer>>) -> Self {
        Self { since: Instant::now(), read, write, result: None, waker: None, abandoned: false, corrupt: None }
    }
}

struct State {
    pending: Vec<Option<Pending>>,
    free_cids: Vec<u16>,
}

/// The sizes agreed at connect time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QueueLimits {
    pub(crate) in_capsule_bytes: usize,
    pub(crate) max_h2c_data_bytes: u32,
}

/// What carries a queue's commands.
enum Link {
    /// The outbox's writer task and a reader task, over TCP; the stream is a descriptor of their connection
    /// for shutting it down when the queue fails, which wakes both wherever they wait.
    Tcp(std::net::TcpStream),
    #[cfg(feature = "rdma")]
    Rdma(super::rdma::RdmaLink),
}

/// A connected queue.
pub(crate) struct HostQueue {
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    link: Link,
    outbox: Outbox<Outgoing>,
    state: RefCell<State>,
    slots: Semaphore,
    limits: Cell<QueueLimits>,
    broken: RefCell<Option<String>>,
}

impl HostQueue {
    /// Opens a connection and exchanges ICReq / ICResp, each within `timeout` (zero: no limit); the tasks
    /// serving it run until it breaks, and a command that waits longer than `timeout` breaks it.
    pub(crate) async fn open(
        addr: SocketAddr,
        digests: Digests,
        entries: u16,
        polled: bool,
        congestion: Option<&str>,
        timeout: Duration,
    ) -> Result<Rc<Self>, NvmfError> {
        let opened =
            within(timeout, "NVMe/TCP connect and ICReq", Initialized::open(addr, digests, polled, congestion)).await?;
        let limits = QueueLimits { in_capsule_bytes: 8192, max_h2c_data_bytes: opened.max_h2c_data_bytes };
        let queue = Rc::new(Self::new(Link::Tcp(opened.shutdown), entries, limits));
        glommio::spawn_local(Self::write_loop(Rc::clone(&queue), opened.writer)).detach();
        glommio::spawn_local(Self::read_loop(Rc::clone(&queue), opened.reader)).detach();
        glommio::spawn_local(Self::watch_deadlines(Rc::downgrade(&queue), timeout)).detach();
        Ok(queue)
    }

    fn new(link: Link, entries: u16, limits: QueueLimits) -> Self {
        Self {
            link,
            outbox: Outbox::default(),
            state: RefCell::new(State {
                pending: (0..entries).map(|_| None).collect(),
                free_cids: (0..entries).rev().collect(),
            }),
            slots: Semaphore::new(u64::from(entries)),
            limits: Cell::new(limits),
            broken: RefCell::new(None),
        }
    }

    /// Connects queue `qid` over NVMe/RDMA (feature `rdma`); its completion task runs until it breaks.
    #[cfg(feature = "rdma")]
    pub(crate) fn open_rdma(
        addr: SocketAddr,
        qid: u16,
        entries: u16,
        timeout: Duration,
    ) -> Result<Rc<Self>, NvmfError> {
        let SocketAddr::V4(peer) = addr else {
            return Err(NvmfError::Rdma(format!("{addr}: NVMe/RDMA connects to IPv4 addresses")));
        };
        let (link, granted) = super::rdma::RdmaLink::connect(peer, qid, entries)?;
        let limits = QueueLimits { in_capsule_bytes: 0, max_h2c_data_bytes: u32::MAX };
        let queue = Rc::new(Self::new(Link::Rdma(link), granted, limits));
        glommio::spawn_local(super::rdma::RdmaLink::run(Rc::clone(&queue))).detach();
        glommio::spawn_local(Self::watch_deadlines(Rc::downgrade(&queue), timeout)).detach();
        Ok(queue)
    }

    /// Without feature `rdma`: a clear refusal.
    #[cfg(not(feature = "rdma"))]
    pub(crate) fn open_rdma(addr: SocketAddr, _qid: u16, _entries: u16, _: Duration) -> Result<Rc<Self>, NvmfError> {
        Err(NvmfError::Rdma(format!("{addr}: trtype=rdma needs a build with RDMA (cargo build --features rdma)")))
    }

    /// The queue's RDMA link, if it has one.
    #[cfg(feature = "rdma")]
    pub(crate) fn rdma_link(&self) -> Option<&super::rdma::RdmaLink> {
        match &self.link {
            Link::Rdma(link) => Some(link),
            Link::Tcp(_) => None,
        }
    }

    /// A response capsule for a command: a read's data is copied out of its staging buffer first.
    #[cfg(feature = "rdma")]
    pub(crate) fn complete_response(&self, completion: Completion) {
        if let Link::Rdma(link) = &self.link {
            let mut state = self.state.borrow_mut();
            if let Some(Some(Pending { read: Some(buffer), .. })) = state.pending.get_mut(usize::from(completion.cid)) {
                link.copy_out(completion.cid, buffer);
            }
        }
        self.complete(completion.cid, Ok(completion));
    }

    /// Fails the queue for `reason`.
    #[cfg(feature = "rdma")]
    pub(crate) fn fail(&self, reason: String) {
        self.fail_all(reason);
    }

    /// Sets how much data may travel in a capsule (the controller's IOCCSZ on I/O queues).
    pub(crate) fn set_in_capsule_bytes(&self, bytes: usize) {
        let mut limits = self.limits.get();
        limits.in_capsule_bytes = bytes;
        self.limits.set(limits);
    }

    /// Why the queue stopped, if it has.
    pub(crate) fn broken(&self) -> Option<String> {
        self.broken.borrow().clone()
    }

    /// Ends the connection (the reader and writer tasks end; commands in flight fail).
    pub(crate) fn close(&self) {
        self.fail_all("closed by the host".into());
    }

    /// Sends `command` with `write` data (in the capsule or on R2T) or a `read` buffer to fill, and waits
    /// for its completion. The buffer comes back in every case.
    pub(crate) async fn submit(
        &self,
        mut command: Command,
        write: Option<IoBuffer>,
        read: Option<IoBuffer>,
    ) -> (Result<Completion, NvmfError>, Option<IoBuffer>) {
        let Ok(_permit) = self.slots.acquire_permit(1).await else {
            return (Err(NvmfError::Disconnected("queue closed".into())), write.or(read));
        };
        if let Some(reason) = self.broken() {
            return (Err(NvmfError::Disconnected(reason)), write.or(read));
        }
        let Some(cid) = self.state.borrow_mut().free_cids.pop() else {
            return (Err(NvmfError::Protocol("no free command ID".into())), write.or(read));
        };
        command.cid = cid;
        #[cfg(feature = "rdma")]
        if let Link::Rdma(link) = &self.link {
            return self.submit_rdma(link, command, write, read).await;
        }
        let write = write.map(Rc::new);
        let mut in_capsule = None;
        if let Some(data) = &write {
            let len = data.len() as u32;
            if data.len() <= self.limits.get().in_capsule_bytes {
                command.sgl = SglDescriptor::in_capsule(len);
                in_capsule = Some(Rc::clone(data));
            } else {
                command.sgl = SglDescriptor::transport(len);
            }
        }
        if let Some(buffer) = &read {
            command.sgl = SglDescriptor::transport(buffer.len() as u32);
        }
        self.state.borrow_mut().pending[usize::from(cid)] = Some(Pending::new(read, write));
        self.outbox.push(Outgoing::Command { command, data: in_capsule });
        self.wait_for(cid).await
    }

    /// Over RDMA: the data is staged, the command SENT; a write's buffer comes back at once (its bytes were
    /// copied), a read's once the response says the controller wrote them.
    #[cfg(feature = "rdma")]
    async fn submit_rdma(
        &self,
        link: &super::rdma::RdmaLink,
        command: Command,
        write: Option<IoBuffer>,
        read: Option<IoBuffer>,
    ) -> (Result<Completion, NvmfError>, Option<IoBuffer>) {
        let cid = command.cid;
        let sent = match link.stage(cid, write.as_ref(), read.as_ref().map_or(0, IoBuffer::len)) {
            Ok(sgl) => {
                self.state.borrow_mut().pending[usize::from(cid)] = Some(Pending::new(read, None));
                link.send(&command, sgl).map_err(|error| {
                    let pending = self.state.borrow_mut().pending[usize::from(cid)].take();
                    (error, pending.and_then(|pending| pending.read))
                })
            }
            Err(error) => Err((error, read)),
        };
        if let Err((error, read)) = sent {
            self.state.borrow_mut().free_cids.push(cid);
            self.fail_all(error.to_string());
            return (Err(error), write.or(read));
        }
        let (result, read) = self.wait_for(cid).await;
        (result, write.or(read))
    }

    /// Waits for command `cid`'s completion; frees its ID and returns its buffer.
    async fn wait_for(&self, cid: u16) -> (Result<Completion, NvmfError>, Option<IoBuffer>) {
        let mut guard = Abandon { queue: self, cid, done: false };
        let result = std::future::poll_fn(|context| {
            let mut state = self.state.borrow_mut();
            let Some(pending) = state.pending[usize::from(cid)].as_mut() else {
                return Poll::Ready(Err(NvmfError::Disconnected("command table cleared".into())));
            };
            match pending.result.take() {
                Some(result) => Poll::Ready(result),
                None => {
                    pending.waker = Some(context.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await;
        guard.done = true;
        let pending = {
            let mut state = self.state.borrow_mut();
            let pending = state.pending[usize::from(cid)].take();
            state.free_cids.push(cid);
            pending
        };
        let Some(pending) = pending else { return (result, None) };
        let buffer = match (pending.read, pending.write) {
            (Some(read), _) => Some(read),
            (None, Some(mut write)) => {
                // The writer task may still hold the data for a moment after the controller answered.
                for _ in 0..1000 {
                    match Rc::try_unwrap(write) {
                        Ok(buffer) => return (result, Some(buffer)),
                        Err(shared) => write = shared,
                    }
                    futures_lite::future::yield_now().await;
                }
                let mut copy = IoBuffer::aligned(write.len(), 4096);
                copy.as_mut_slice().copy_from_slice(write.as_slice());
                Some(copy)
            }
            (None, None) => None,
        };
        (result, buffer)
    }

    fn complete(&self, cid: u16, result: Result<Completion, NvmfError>) {
        let mut state = self.state.borrow_mut();
        let Some(Some(pending)) = state.pending.get_mut(usize::from(cid)) else { return };
        if pending.abandoned {
            state.pending[usize::from(cid)] = None;
            state.free_cids.push(cid);
            return;
        }
        pending.result = Some(match (pending.corrupt.take(), result) {
            (Some(corrupt), Ok(_)) => Err(NvmfError::Transport(corrupt.into())),
            (_, result) => result,
        });
        if let Some(waker) = pending.waker.take() {
            waker.wake();
        }
    }

    fn fail_all(&self, reason: String) {
        if self.broken.borrow().is_some() {
            return;
        }
        *self.broken.borrow_mut() = Some(reason.clone());
        match &self.link {
            // The reader and the writer may wait on a connection that will never move again.
            Link::Tcp(connection) => {
                let _ = connection.shutdown(Shutdown::Both);
            }
            #[cfg(feature = "rdma")]
            Link::Rdma(link) => link.close(),
        }
        let cids: Vec<u16> = {
            let state = self.state.borrow();
            (0..state.pending.len() as u16).filter(|&cid| state.pending[usize::from(cid)].is_some()).collect()
        };
        for cid in cids {
            self.complete(cid, Err(NvmfError::Disconnected(reason.clone())));
        }
        self.outbox.close();
        self.slots.close();
    }

    /// Fails the queue once a command has waited `timeout` for its completion (a zero timeout: never), so
    /// that a controller, or a path to it, that stopped answering frees the host's commands: the device
    /// then reconnects and sends its block commands again. Ends with the queue.
    async fn watch_deadlines(queue: Weak<Self>, timeout: Duration) {
        if timeout.is_zero() {
            return;
        }
        // A command is caught at most one period (a quarter of the timeout, 1 s at most) past its deadline.
        let period = (timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        loop {
            glommio::timer::sleep(period).await;
            let Some(queue) = queue.upgrade() else { return };
            if queue.broken().is_some() {
                return;
            }
            let overdue = {
                let state = queue.state.borrow();
                state
                    .pending
                    .iter()
                    .flatten()
                    .any(|pending| pending.result.is_none() && pending.since.elapsed() >= timeout)
            };
            if overdue {
                queue.fail_all(format!("a command got no completion within {timeout:?}"));
                return;
            }
        }
    }

    async fn write_loop(queue: Rc<Self>, mut writer: PduWriter) {
        let mut items = Vec::new();
        while queue.outbox.take_all(&mut items).await {
            for item in items.drain(..) {
                let sent = match item {
                    Outgoing::Command { command, data } => {
                        let data = data.as_deref().map_or(&[][..], IoBuffer::as_slice);
                        writer.send(&PduHeader::Command(command), data).await
                    }
                    Outgoing::HostData { cid, ttag, offset, len, data } => {
                        let chunk = queue.limits.get().max_h2c_data_bytes;
                        let mut sent = Ok(());
                        let mut at = offset;
                        while at < offset + len && sent.is_ok() {
                            let this = chunk.min(offset + len - at);
                            let last = at + this == offset + len;
                            let header = PduHeader::HostData { cccid: cid, ttag, offset: at, last };
                            sent = writer.send(&header, &data.as_slice()[at as usize..(at + this) as usize]).await;
                            at += this;
                        }
                        sent
                    }
                };
                if let Err(error) = sent {
                    return queue.fail_all(format!("send: {error}"));
                }
            }
            if let Err(error) = writer.flush().await {
                return queue.fail_all(format!("send: {error}"));
            }
        }
        let _ = writer.close().await;
    }

    async fn read_loop(queue: Rc<Self>, mut reader: PduReader) {
        let reason = loop {
            if queue.broken.borrow().is_some() {
                return;
            }
            let got = reader.read_header().await;
            let received = match got {
                Ok(received) => received,
                Err(error) => break error,
            };
            let outcome = match received.header {
                PduHeader::Response(completion) => {
                    queue.complete(completion.cid, Ok(completion));
                    Ok(())
                }
                PduHeader::ControllerData { cccid, offset, last: _, success } => {
                    queue.receive_data(&mut reader, &received, cccid, offset, success).await
                }
                PduHeader::ReadyToTransfer { cccid, ttag, offset, len } => {
                    queue.send_requested(cccid, ttag, offset, len)
                }
                PduHeader::TermRequest { fes, fei, .. } => {
                    let _ = reader.read_small_data(&received).await;
                    Err(Decoder::term_error(fes, fei).into())
                }
                _ => Err(PduError::Sequence("a host-to-controller PDU from the controller").into()),
            };
            if let Err(error) = outcome {
                break error;
            }
        };
        queue.fail_all(reason.to_string());
    }

    async fn receive_data(
        &self,
        reader: &mut PduReader,
        received: &crate::tcp::ReceivedHeader,
        cid: u16,
        offset: u32,
        success: bool,
    ) -> Result<(), TransportError> {
        let taken =
            self.state.borrow_mut().pending.get_mut(usize::from(cid)).and_then(|slot| slot.as_mut()?.read.take());
        let Some(mut buffer) = taken else {
            return Err(PduError::InvalidField { offset: 8, what: "C2HData for no outstanding read" }.into());
        };
        let len = received.data_len;
        let fits = offset.checked_add(len).is_some_and(|end| end as usize <= buffer.len());
        let outcome = if fits {
            let range = offset as usize..(offset + len) as usize;
            reader.read_data(received, &mut buffer.as_mut_slice()[range]).await
        } else {
            Err(PduError::DataOutOfRange { offset, len, expected: buffer.len() as u32 }.into())
        };
        let (outcome, corrupt) = match outcome {
            Err(TransportError::Pdu(corrupt @ PduError::DataDigest { .. })) => (Ok(()), Some(corrupt)),
            outcome => (outcome, None),
        };
        if let Some(Some(pending)) = self.state.borrow_mut().pending.get_mut(usize::from(cid)) {
            pending.read = Some(buffer);
            pending.corrupt = pending.corrupt.take().or(corrupt);
        }
        outcome?;
        if success {
            self.complete(cid, Ok(Completion { cid, ..Completion::default() }));
        }
        Ok(())
    }

    fn send_requested(&self, cid: u16, ttag: u16, offset: u32, len: u32) -> Result<(), TransportError> {
        let data = self.state.borrow().pending.get(usize::from(cid)).and_then(|slot| slot.as_ref()?.write.clone());
        let Some(data) = data else {
            return Err(PduError::InvalidField { offset: 8, what: "R2T for no outstanding write" }.into());
        };
        if len == 0 || offset.checked_add(len).is_none_or(|end| end as usize > data.len()) {
            return Err(PduError::DataOutOfRange { offset, len, expected: data.len() as u32 }.into());
        }
        self.outbox.push(Outgoing::HostData { cid, ttag, offset, len, data });
        Ok(())
    }
}

/// A TCP connection after ICReq / ICResp, before its tasks start.
struct Initialized {
    reader: PduReader,
    writer: PduWriter,
    /// A descriptor to shut the connection down with ([`Link::Tcp`]).
    shutdown: std::net::TcpStream,
    /// The controller's MAXH2CDATA.
    max_h2c_data_bytes: u32,
}

impl Initialized {
    /// Connects and exchanges ICReq / ICResp.
    async fn open(
        addr: SocketAddr,
        digests: Digests,
        polled: bool,
        congestion: Option<&str>,
    ) -> Result<Self, NvmfError> {
        let (read_half, write_half) = if polled {
            // A blocking connect on the setup path: polling only matters once the queue carries I/O.
            let stream = std::net::TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
                .map_err(|source| NvmfError::Connect { addr, source })?;
            let _ = stream.set_nodelay(true);
            split_polled(stream).map_err(|source| NvmfError::Connect { addr, source })?
        } else {
            let stream =
                TcpStream::connect(addr).await.map_err(|error| NvmfError::Connect { addr, source: error.into() })?;
            let _ = stream.set_nodelay(true);
            split_stream(stream, false).map_err(|source| NvmfError::Connect { addr, source })?
        };
        if let Some(algorithm) = congestion {
            set_congestion_control(read_half.raw_fd(), algorithm).map_err(|error| {
                NvmfError::Protocol(format!("TCP congestion control {algorithm:?} refused by the kernel: {error}"))
            })?;
        }
        let shutdown = read_half.shutdown_handle().map_err(|source| NvmfError::Connect { addr, source })?;
        let decoder = Decoder { controller: false, digests: Digests::default(), max_data_bytes: 0 };
        let mut reader = PduReader::new(read_half, decoder);
        let mut writer = PduWriter::new(write_half);
        let request = PduHeader::InitRequest { pfv: 0, hpda: 0, digests, maxr2t: 0 };
        writer.send(&request, &[]).await.map_err(TransportError::from)?;
        writer.flush().await.map_err(TransportError::from)?;
        let response = reader.read_header().await?;
        let PduHeader::InitResponse { cpda, digests: granted, maxh2cdata, .. } = response.header else {
            return Err(NvmfError::Protocol(format!("expected ICResp, got {:?}", response.header.pdu_type())));
        };
        if granted != digests {
            return Err(NvmfError::Protocol(format!("asked for digests {digests:?}, controller enabled {granted:?}")));
        }
        writer.digests = digests;
        writer.data_alignment = (usize::from(cpda) + 1) * 4;
        reader.decoder.digests = digests;
        reader.decoder.max_data_bytes = u32::MAX;
        Ok(Self { reader, writer, shutdown, max_h2c_data_bytes: maxh2cdata })
    }
}

/// `future`'s outcome, or [`NvmfError::Timeout`] for `what` once `limit` passed (a zero limit: no limit).
async fn within<T>(
    limit: Duration,
    what: &'static str,
    future: impl Future<Output = Result<T, NvmfError>>,
) -> Result<T, NvmfError> {
    if limit.is_zero() {
        return future.await;
    }
    let expiry = async {
        glommio::timer::sleep(limit).await;
        Err(NvmfError::Timeout(what))
    };
    futures_lite::future::or(future, expiry).await
}

/// Marks a command abandoned when its submitter's future is dropped before the completion.
struct Abandon<'a> {
    queue: &'a HostQueue,
    cid: u16,
    done: bool,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut state = self.queue.state.borrow_mut();
        let finished = match state.pending.get_mut(usize::from(self.cid)) {
            Some(Some(pending)) if pending.result.is_some() => true,
            Some(Some(pending)) => {
                pending.abandoned = true;
                false
            }
            _ => false,
        };
        if finished {
            state.pending[usize::from(self.cid)] = None;
            state.free_cids.push(self.cid);
        }
    }
}
