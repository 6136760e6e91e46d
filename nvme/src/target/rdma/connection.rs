//! One NVMe/RDMA queue pair served on an executor: a task that reads its completions (commands received,
//! data moved, responses sent) and a task that turns what the command sets queue in the [`Outbox`] into
//! work requests: a response is a SEND, a read's data an RDMA WRITE to the host's Keyed SGL followed by the
//! response, a write's data an RDMA READ from it.
//!
//! Commands reach the command sets in the form a TCP queue gives them: a Keyed SGL is kept here by CID and
//! the command says "transport data" (`SglDescriptor::TRANSPORT`) of its length, and in-capsule data comes
//! as in-capsule data. An admin-queue command whose data comes from the host (Connect, in the first place)
//! has it read before the command runs, since those commands take their data with them; an I/O write asks
//! for it (`Queue::request_data`) as it does over TCP.
//!
//! [`Outbox`]: crate::tcp::Outbox

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::rc::{Rc, Weak};
use std::time::Duration;

use strata_transfer::verbs::{Access, CmRequest, Completion, CompletionQueue, QueuePair, RegisteredBuffer};
use strata_transfer::{RemoteSpan, TransferError};

use super::Accepted;
use super::staging::Staging;
use crate::buffer::IoBuffer;
use crate::rdma::KeyedSgl;
use crate::rdma::link::{self, POLL_BATCH, post_receive, received_slot};
use crate::spec::SglDescriptor;
use crate::spec::{COMMAND_BYTES, COMPLETION_BYTES, Command, Completion as Response, FABRICS_OPCODE, NvmeStatus};
use crate::target::connection::{ExecutorContext, Outgoing, Queue, Transport, dispatch};

/// Data direction bits of an opcode (and of a Fabrics command type): host to controller.
const HOST_TO_CONTROLLER: u8 = 0b01;

/// Work requests a queue of `entries` commands may have on its send queue: a response per command and
/// its data's READ or WRITE, with room for responses still in flight after their commands ended.
pub(super) fn send_queue_depth(entries: u32) -> u32 {
    3 * entries + 8
}

/// Response capsules in flight at most: a command's response may still be on the wire when the host,
/// having seen it, sends the next command.
fn response_slots(entries: u32) -> usize {
    2 * entries as usize + 8
}

/// A work request on the send queue, by the ID it was posted with.
enum Work {
    /// A response capsule from its slot, after the command's data where it returns some (an RDMA WRITE
    /// posted with it, unsignalled: the response's completion covers both).
    Response { slot: usize, data: Option<RegisteredBuffer> },
    /// A write's data read from the host, for transfer `ttag` of command `cid`.
    DataIn { staged: RegisteredBuffer, ttag: u16, cid: u16, len: usize },
    /// An admin command's data, read before it runs.
    Prefetch { staged: RegisteredBuffer, command: Box<Command>, len: usize },
}

impl Work {
    /// Send-queue entries it holds until its completion.
    fn requests(&self) -> u32 {
        match self {
            Work::Response { data: Some(_), .. } => 2,
            _ => 1,
        }
    }
}

/// A read's data, staged, and the host buffer it goes to.
struct DataOut {
    staged: RegisteredBuffer,
    len: usize,
    sgl: KeyedSgl,
}

/// One queue pair's state. Fields drop in order: the queue pair before every buffer it may be moving.
struct Link {
    pair: std::sync::Arc<QueuePair>,
    completions: CompletionQueue,
    queue: Rc<Queue>,
    receives: RegisteredBuffer,
    capsule_bytes: usize,
    responses: RefCell<RegisteredBuffer>,
    free_responses: RefCell<Vec<usize>>,
    staging: Staging,
    /// The host buffer of each command that has one, until its response.
    keyed: RefCell<HashMap<u16, KeyedSgl>>,
    work: RefCell<Vec<Option<Work>>>,
    free_work: RefCell<Vec<usize>>,
    /// Outgoing items waiting for send-queue room or a response slot, in order.
    waiting: RefCell<VecDeque<Outgoing>>,
    send_room: Cell<u32>,
    ended: Cell<bool>,
    /// The end of the socket pair the registry knows this queue by (`Queue::new`).
    _registered: UnixStream,
    /// Dropped last: destroying the id disconnects the host.
    _request: CmRequest,
}

/// Serves `accepted` until the host disconnects, breaks the protocol, or its controller is torn down.
pub(super) async fn serve(accepted: Accepted, ctx: Rc<ExecutorContext>) {
    let Ok((registered, watched)) = UnixStream::pair() else { return };
    let queue = Rc::new(Queue::new(ctx, registered.as_raw_fd(), Transport::Rdma));
    let link = match Link::new(accepted, Rc::clone(&queue), registered) {
        Ok(link) => Rc::new(link),
        Err(_) => return queue.leave(),
    };
    glommio::spawn_local(watch_teardown(watched, Rc::downgrade(&link))).detach();
    let timeout = queue.ctx.config.handshake_timeout;
    if !timeout.is_zero() {
        glommio::spawn_local(end_unless_connected(Rc::downgrade(&queue), Rc::downgrade(&link), timeout)).detach();
    }
    let sender = glommio::spawn_local(send_loop(Rc::clone(&link)));
    complete_loop(&link).await;
    queue.outbox.close();
    sender.await;
    queue.abandon_transfers();
    queue.leave();
    let _ = link.completions.take_events();
}

/// Ends the link when the registry shuts its socket down (the controller was torn down, or the target
/// stops), or when the link itself ended and closed it.
async fn watch_teardown(watched: UnixStream, link: Weak<Link>) {
    let Ok(mut watched) = crate::readiness::adopt(watched) else { return };
    let mut byte = [0u8; 1];
    let _ = futures_lite::AsyncReadExt::read(&mut watched, &mut byte).await;
    if let Some(link) = link.upgrade() {
        link.end();
    }
}

/// Ends `link` unless its queue connected (a Fabrics Connect that succeeded) within `timeout` of the
/// accept: a host that connects queue pairs and sends nothing holds no receives for ever.
async fn end_unless_connected(queue: Weak<Queue>, link: Weak<Link>, timeout: Duration) {
    glommio::timer::sleep(timeout).await;
    let silent = queue.upgrade().is_some_and(|queue| queue.connected().is_none());
    if let Some(link) = link.upgrade().filter(|_| silent) {
        link.end();
    }
}

async fn complete_loop(link: &Rc<Link>) {
    let mut done = Vec::with_capacity(POLL_BATCH);
    while !link.ended.get() {
        done.clear();
        if link::next(&link.completions, &mut done, POLL_BATCH).await.is_err() {
            link.end();
        }
        for completion in done.drain(..) {
            link.on_completion(completion);
        }
    }
}

async fn send_loop(link: Rc<Link>) {
    let mut items = Vec::new();
    while link.queue.outbox.take_all(&mut items).await {
        for item in items.drain(..) {
            link.send(item);
        }
        link.end_if_disconnected();
    }
}

impl Link {
    fn new(accepted: Accepted, queue: Rc<Queue>, registered: UnixStream) -> Result<Link, TransferError> {
        let Accepted { pair, completions, domain, receives, capsule_bytes, entries, request } = accepted;
        let slots = response_slots(u32::from(entries));
        let responses = RegisteredBuffer::new(&domain, slots * COMPLETION_BYTES, Access::Local)?;
        Ok(Link {
            pair,
            completions,
            queue,
            receives,
            capsule_bytes,
            responses: RefCell::new(responses),
            free_responses: RefCell::new((0..slots).rev().collect()),
            staging: Staging::new(domain),
            keyed: RefCell::new(HashMap::new()),
            work: RefCell::new(Vec::new()),
            free_work: RefCell::new(Vec::new()),
            waiting: RefCell::new(VecDeque::new()),
            send_room: Cell::new(send_queue_depth(u32::from(entries))),
            ended: Cell::new(false),
            _registered: registered,
            _request: request,
        })
    }

    /// Ends the link: the queue pair goes to the error state, which flushes what it holds.
    fn end(&self) {
        if !self.ended.replace(true) {
            let _ = self.pair.fail();
        }
    }

    fn on_completion(&self, completion: Completion) {
        let Ok(bytes) = completion.result else {
            // A flushed request means the link is already ending; any other failure ends it.
            return self.end();
        };
        if let Some(slot) = received_slot(&completion) {
            return self.on_capsule(slot, bytes as usize);
        }
        let taken = self.work.borrow_mut().get_mut(completion.work_request_id as usize).and_then(Option::take);
        let Some(work) = taken else { return self.end() };
        self.free_work.borrow_mut().push(completion.work_request_id as usize);
        self.send_room.set(self.send_room.get() + work.requests());
        match work {
            Work::Response { slot, data } => {
                self.free_responses.borrow_mut().push(slot);
                if let Some(staged) = data {
                    self.staging.give_back(staged);
                }
            }
            Work::DataIn { staged, ttag, cid, len } => {
                self.queue.finish_transfer(ttag, cid, |into| {
                    into.copy_from_slice(&staged.as_slice()[..len]);
                    Ok(())
                });
                self.staging.give_back(staged);
            }
            Work::Prefetch { staged, command, len } => {
                let mut data = self.queue.capsule_buffer(&command, len);
                data.as_mut_slice().copy_from_slice(&staged.as_slice()[..len]);
                self.staging.give_back(staged);
                self.run(*command, Some(Ok(data)));
            }
        }
        self.send_waiting();
        self.end_if_disconnected();
    }

    /// After a Disconnect command, ends the link once its last response is out.
    fn end_if_disconnected(&self) {
        if self.queue.closing() && self.waiting.borrow().is_empty() && self.work.borrow().iter().all(Option::is_none) {
            self.end();
        }
    }

    /// A command capsule arrived in receive `slot`: its command runs (after its data, for an admin
    /// command that takes data from the host), and the receive is posted again.
    fn on_capsule(&self, slot: usize, len: usize) {
        let at = slot * self.capsule_bytes;
        let capsule = &self.receives.as_slice()[at..at + len.min(self.capsule_bytes)];
        let Some(head) = capsule.first_chunk::<COMMAND_BYTES>() else { return self.end() };
        let mut command = Command::decode(head);
        let data = self.capsule_data(&mut command, &head[24..40], &capsule[COMMAND_BYTES..]);
        if post_receive(&self.pair, &self.receives, slot, self.capsule_bytes).is_err() {
            return self.end();
        }
        match data {
            CapsuleData::Ready(data) => self.run(command, data),
            CapsuleData::Fetch(sgl) => self.prefetch(command, sgl),
        }
    }

    /// The data a command carries, or where to fetch it from; a Keyed SGL (`sgl`: the command's bytes
    /// 24..40, which `Command` does not keep whole: its key overlaps the length field) is kept for the
    /// command's transfers and the command rewritten to say "transport data".
    fn capsule_data(&self, command: &mut Command, sgl: &[u8], in_capsule: &[u8]) -> CapsuleData {
        let length = command.sgl.length as usize;
        match command.sgl.identifier {
            SglDescriptor::IN_CAPSULE if length == 0 => CapsuleData::Ready(None),
            SglDescriptor::IN_CAPSULE if command.sgl.address != 0 => {
                CapsuleData::Ready(Some(Err(NvmeStatus::SGL_OFFSET_INVALID.with_dnr())))
            }
            SglDescriptor::IN_CAPSULE if length > in_capsule.len() => {
                CapsuleData::Ready(Some(Err(NvmeStatus::SGL_LENGTH_INVALID.with_dnr())))
            }
            SglDescriptor::IN_CAPSULE => {
                let mut data = self.queue.capsule_buffer(command, length);
                data.as_mut_slice().copy_from_slice(&in_capsule[..length]);
                CapsuleData::Ready(Some(Ok(data)))
            }
            _ => {
                let Ok(sgl) = KeyedSgl::decode(sgl) else {
                    return CapsuleData::Ready(Some(Err(NvmeStatus::SGL_TYPE_INVALID.with_dnr())));
                };
                command.sgl = SglDescriptor::transport(sgl.length);
                if sgl.length == 0 {
                    return CapsuleData::Ready(None);
                }
                if sgl.length > self.queue.ctx.config.max_transfer_bytes {
                    return CapsuleData::Ready(Some(Err(NvmeStatus::SGL_LENGTH_INVALID.with_dnr())));
                }
                self.keyed.borrow_mut().insert(command.cid, sgl);
                let admin = self.queue.connected().is_none_or(|connected| connected.qid == 0);
                if admin && data_from_host(command) { CapsuleData::Fetch(sgl) } else { CapsuleData::Ready(None) }
            }
        }
    }

    /// Hands a command to the command sets; a host that broke the queue's protocol loses the link.
    fn run(&self, command: Command, data: Option<Result<IoBuffer, NvmeStatus>>) {
        if dispatch(&self.queue, command, data).is_err() {
            self.end();
        }
    }

    /// Reads an admin command's data from the host, then runs it.
    fn prefetch(&self, mut command: Command, sgl: KeyedSgl) {
        let len = sgl.length as usize;
        let staged = match self.staging.take(len) {
            Ok(staged) => staged,
            Err(_) => return self.run(command, Some(Err(NvmeStatus::INTERNAL_ERROR))),
        };
        // The keyed SGL stays recorded until the response, which may invalidate its key.
        command.sgl = SglDescriptor::in_capsule(sgl.length);
        let work = Work::Prefetch { staged, command: Box::new(command), len };
        if self.post(work, |pair, id, staged| read_into(pair, id, staged, sgl, len)).is_err() {
            self.end();
        }
    }

    /// Sends `item`, or keeps it (and every later one) until there is room.
    fn send(&self, item: Outgoing) {
        if !self.waiting.borrow().is_empty() || !self.has_room_for(&item) {
            return self.waiting.borrow_mut().push_back(item);
        }
        self.send_now(item);
    }

    fn send_waiting(&self) {
        loop {
            let next = {
                let mut waiting = self.waiting.borrow_mut();
                match waiting.front() {
                    Some(item) if self.has_room_for(item) => waiting.pop_front(),
                    _ => None,
                }
            };
            let Some(item) = next else { return };
            self.send_now(item);
        }
    }

    fn has_room_for(&self, item: &Outgoing) -> bool {
        let (requests, responses) = match item {
            Outgoing::Response(_) => (1, 1),
            // Every command ends with a response here, with or without SQ flow control.
            Outgoing::Data { .. } => (2, 1),
            Outgoing::ReadyToTransfer { .. } | Outgoing::Terminate { .. } => (1, 0),
        };
        self.send_room.get() >= requests && self.free_responses.borrow().len() >= responses
    }

    fn send_now(&self, item: Outgoing) {
        let sent = match item {
            Outgoing::Response(response) => self.respond(response, None),
            Outgoing::Data { cid, data, response } => self.write_data(cid, data, response),
            Outgoing::ReadyToTransfer { cid, ttag, len } => self.read_data(cid, ttag, len),
            // Only a TCP stream's framing errors terminate; the link ends all the same.
            Outgoing::Terminate { .. } => return self.end(),
        };
        if sent.is_err() {
            self.end();
        }
    }

    /// SENDs a response capsule, after RDMA-WRITing the command's data where it has some; the command's
    /// host buffer is forgotten.
    fn respond(&self, response: Response, data: Option<DataOut>) -> Result<(), TransferError> {
        // The host asked for its key to be invalidated with the response: done as the response lands.
        let invalidate = self.keyed.borrow_mut().remove(&response.cid).filter(|sgl| sgl.invalidate).map(|sgl| sgl.key);
        let Some(slot) = self.free_responses.borrow_mut().pop() else {
            return Err(TransferError::SendQueueFull { capacity: self.send_room.get() });
        };
        let at = slot * COMPLETION_BYTES;
        self.responses.borrow_mut().as_mut_slice()[at..at + COMPLETION_BYTES].copy_from_slice(&response.encode());
        let message = self.responses.borrow().region().local_span(at as u64, COMPLETION_BYTES as u32)?;
        let (write, staged) = match data {
            Some(DataOut { staged, len, sgl }) => {
                (Some((staged.region().local_span(0, len as u32)?, remote(sgl, len))), Some(staged))
            }
            None => (None, None),
        };
        let id = self.reserve(Work::Response { slot, data: staged });
        // SAFETY: the slot and the staged data are held by the work record until the send's completion.
        #[allow(unsafe_code)]
        let posted = unsafe { self.pair.post_send_after_write(id as u64, write, message, invalidate) };
        self.posted(id, posted)
    }

    /// RDMA-WRITEs a read's data into the host's buffer, then its response.
    fn write_data(&self, cid: u16, data: IoBuffer, response: Option<Response>) -> Result<(), TransferError> {
        let response = response.unwrap_or_else(|| Response::new(cid, NvmeStatus::SUCCESS));
        let sgl = self.keyed.borrow().get(&cid).copied();
        let staged = sgl.and_then(|sgl| {
            let len = data.len().min(sgl.length as usize);
            let mut staged = self.staging.take(len).ok()?;
            staged.as_mut_slice()[..len].copy_from_slice(&data.as_slice()[..len]);
            Some(DataOut { staged, len, sgl })
        });
        self.queue.ctx.buffers.give(data);
        match staged {
            Some(out) => self.respond(response, Some(out)),
            // Nothing was written: the command fails rather than answer success over an empty buffer.
            None => self.respond(Response { status: NvmeStatus::DATA_TRANSFER_ERROR, ..response }, None),
        }
    }

    /// RDMA-READs a write's data from the host's buffer into transfer `ttag`.
    fn read_data(&self, cid: u16, ttag: u16, len: u32) -> Result<(), TransferError> {
        let sgl = self.keyed.borrow().get(&cid).copied().filter(|sgl| sgl.length == len);
        let staged = sgl.and_then(|_| self.staging.take(len as usize).ok());
        let (Some(sgl), Some(staged)) = (sgl, staged) else {
            self.queue.finish_transfer(ttag, cid, |_| Err(NvmeStatus::DATA_TRANSFER_ERROR));
            return Ok(());
        };
        let len = len as usize;
        self.post(Work::DataIn { staged, ttag, cid, len }, |pair, id, staged| read_into(pair, id, staged, sgl, len))
    }

    /// Records `work`, then posts its request with `post` (given the ID and the staged buffer).
    fn post(
        &self,
        work: Work,
        post: impl FnOnce(&QueuePair, u64, &RegisteredBuffer) -> Result<(), TransferError>,
    ) -> Result<(), TransferError> {
        let id = self.reserve(work);
        let posted = {
            let work = self.work.borrow();
            match &work[id] {
                Some(Work::DataIn { staged, .. } | Work::Prefetch { staged, .. }) => {
                    post(&self.pair, id as u64, staged)
                }
                _ => Ok(()),
            }
        };
        self.posted(id, posted)
    }

    fn reserve(&self, work: Work) -> usize {
        self.send_room.set(self.send_room.get().saturating_sub(work.requests()));
        let mut slab = self.work.borrow_mut();
        match self.free_work.borrow_mut().pop() {
            Some(id) => {
                slab[id] = Some(work);
                id
            }
            None => {
                slab.push(Some(work));
                slab.len() - 1
            }
        }
    }

    /// Undoes a reservation whose request was not posted.
    fn posted(&self, id: usize, posted: Result<(), TransferError>) -> Result<(), TransferError> {
        if posted.is_err() {
            if let Some(work) = self.work.borrow_mut()[id].take() {
                self.send_room.set(self.send_room.get() + work.requests());
            }
            self.free_work.borrow_mut().push(id);
        }
        posted
    }
}

/// A command's data: here (or why not), or in the host's memory behind a Keyed SGL.
enum CapsuleData {
    Ready(Option<Result<IoBuffer, NvmeStatus>>),
    Fetch(KeyedSgl),
}

/// Whether `command` moves data from the host to the controller.
fn data_from_host(command: &Command) -> bool {
    let direction = if command.opcode == FABRICS_OPCODE { command.fabrics_type() } else { command.opcode };
    direction & 0b11 == HOST_TO_CONTROLLER
}

fn remote(sgl: KeyedSgl, len: usize) -> RemoteSpan {
    RemoteSpan { address: sgl.address, length: len as u32, remote_key: sgl.key }
}

fn read_into(
    pair: &QueuePair,
    id: u64,
    staged: &RegisteredBuffer,
    sgl: KeyedSgl,
    len: usize,
) -> Result<(), TransferError> {
    let local = staged.region().local_span(0, len as u32)?;
    #[allow(unsafe_code)]
    // SAFETY: the staged buffer is held by the work request's record until its completion.
    unsafe {
        pair.post_read(id, local, remote(sgl, len))
    }
}
