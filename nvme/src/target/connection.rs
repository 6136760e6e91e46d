//! One TCP connection = one queue pair, served on the executor that accepted it: the IC exchange, a
//! reader loop that decodes PDUs and dispatches commands, and a writer task that sends what the command
//! tasks queue in the connection's [`Outbox`].

use std::cell::RefCell;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::{Duration, Instant};

use glommio::channels::local_channel::{self, LocalSender};
use glommio::net::TcpStream;

use super::TargetConfig;
use super::admin;
use super::buffers::BufferPool;
use super::io;
use super::registry::{Controller, QueueCounters, Shared};
use super::reservations::Reservations;
use crate::any_device::AnyDevice;
use crate::buffer::IoBuffer;
use crate::device::BlockDevice;
use crate::spec::{Command, Completion, ConnectData, FABRICS_OPCODE, FabricsType, IoOpcode, NvmeStatus, SglDescriptor};
use crate::tcp::pdu::{Decoder, FatalError, MAX_TERM_DATA_BYTES, PduError, PduHeader};
use crate::tcp::{Outbox, PduReader, PduWriter, TransportError, set_congestion_control, split_stream};

/// What one executor of the target holds.
pub(crate) struct ExecutorContext {
    pub(crate) shared: Arc<Shared>,
    pub(crate) config: Arc<TargetConfig>,
    /// Per subsystem (same indices as `shared.subsystems`), its namespaces opened on this executor.
    pub(crate) devices: Vec<Vec<Rc<AnyDevice>>>,
    /// The address the target listens on (for the discovery log).
    pub(crate) listen: SocketAddr,
    /// Recycled buffers for RAM namespaces and control data.
    pub(crate) buffers: BufferPool,
}

impl ExecutorContext {
    /// A data buffer for `device`: the device's own (registered memory for files) or a recycled one.
    pub(crate) fn buffer_for(&self, device: &AnyDevice, len: usize) -> IoBuffer {
        match device {
            AnyDevice::Memory(_) => self.buffers.take(len),
            other => other.alloc_buffer(len),
        }
    }
}

/// What the writer task sends.
pub(crate) enum Outgoing {
    Response(Completion),
    /// C2HData, then the response (`None`: SUCCESS flag on the data, no response, SQ flow control off).
    Data {
        cid: u16,
        data: IoBuffer,
        response: Option<Completion>,
    },
    ReadyToTransfer {
        cid: u16,
        ttag: u16,
        len: u32,
    },
    Terminate {
        error: FatalError,
        fei: u32,
        header: Vec<u8>,
    },
}

/// The queue this connection became with Connect.
#[derive(Clone, Copy)]
pub(crate) struct Connected {
    pub(crate) cntlid: u16,
    pub(crate) subsystem: usize,
    pub(crate) qid: u16,
    pub(crate) entries: u32,
    pub(crate) sqflow_disabled: bool,
    /// The host's Host Identifier (Connect data): who its reservations belong to.
    pub(crate) host_id: [u8; 16],
}

/// A write waiting for its data (R2T sent).
struct Transfer {
    cid: u16,
    buffer: Option<IoBuffer>,
    received: u32,
    /// An H2CData PDU of this transfer failed its data digest: the rest is still received, to keep the
    /// stream in step, and the command then fails with Transient Transport Error.
    corrupt: bool,
    done: LocalSender<Result<IoBuffer, NvmeStatus>>,
}

pub(crate) struct QueueState {
    pub(crate) connected: Option<Connected>,
    outstanding: HashSet<u16>,
    transfers: Vec<Option<Transfer>>,
    sq_head: u16,
    close_after_flush: bool,
    held_async_events: usize,
}

/// The transport binding a queue pair is carried by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    Tcp,
    /// Data moves by RDMA READ and WRITE and every command ends with a response capsule: there is no
    /// SUCCESS flag on data, so SQ flow control off changes nothing but the SQ head.
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    Rdma,
}

/// A queue pair.
pub(crate) struct Queue {
    pub(crate) ctx: Rc<ExecutorContext>,
    pub(crate) outbox: Outbox<Outgoing>,
    pub(crate) state: RefCell<QueueState>,
    pub(crate) counters: Arc<QueueCounters>,
    /// What the registry shuts down to end this queue (the socket; a socket pair's end for RDMA).
    fd: RawFd,
    transport: Transport,
}

/// A command's outcome for its response capsule.
pub(crate) struct Reply {
    pub(crate) status: NvmeStatus,
    pub(crate) dw0: u32,
    /// Dword 1 (the high half of an 8-byte property).
    pub(crate) dw1: u32,
    /// Data to send to the host before the response.
    pub(crate) data: Option<Vec<u8>>,
}

impl Reply {
    pub(crate) fn status(status: NvmeStatus) -> Self {
        Self { status, dw0: 0, dw1: 0, data: None }
    }

    pub(crate) fn success(dw0: u32) -> Self {
        Self { status: NvmeStatus::SUCCESS, dw0, dw1: 0, data: None }
    }

    pub(crate) fn data(data: Vec<u8>) -> Self {
        Self { status: NvmeStatus::SUCCESS, dw0: 0, dw1: 0, data: Some(data) }
    }
}

impl Queue {
    /// A queue not yet connected, known to the registry by `fd`.
    pub(crate) fn new(ctx: Rc<ExecutorContext>, fd: RawFd, transport: Transport) -> Queue {
        ctx.shared.registry().connections.insert(fd);
        Queue {
            ctx,
            outbox: Outbox::default(),
            state: RefCell::new(QueueState {
                connected: None,
                outstanding: HashSet::new(),
                transfers: Vec::new(),
                sq_head: 0,
                close_after_flush: false,
                held_async_events: 0,
            }),
            counters: Arc::new(QueueCounters::default()),
            fd,
            transport,
        }
    }

    pub(crate) fn transport(&self) -> Transport {
        self.transport
    }

    /// Whether the host asked to close (Disconnect): the queue ends once its responses are out.
    pub(crate) fn closing(&self) -> bool {
        self.state.borrow().close_after_flush
    }

    /// Leaves the registry: an admin queue takes its controller down, an I/O queue leaves it. Called before
    /// `fd` closes, so no one shuts down a reused number.
    pub(crate) fn leave(&self) {
        let mut registry = self.ctx.shared.registry();
        registry.connections.remove(&self.fd);
        if let Some(connected) = self.connected() {
            if connected.qid == 0 {
                registry.tear_down(connected.cntlid);
            } else if let Some(controller) = registry.controllers.get_mut(&connected.cntlid) {
                controller.queues.remove(&connected.qid);
            }
        }
    }

    pub(crate) fn connected(&self) -> Option<Connected> {
        self.state.borrow().connected
    }

    /// Ends a command: its response, with the SQ head, and the CID free again.
    pub(crate) fn respond(&self, cid: u16, status: NvmeStatus, dw0: u32) {
        let completion = self.completion(cid, status, dw0);
        self.outbox.push(Outgoing::Response(completion));
    }

    /// Asynchronous Event Requests this queue holds.
    pub(crate) fn held_async_events(&self) -> usize {
        self.state.borrow().held_async_events
    }

    /// Holds one more Asynchronous Event Request (its CID stays outstanding).
    pub(crate) fn hold_async_event(&self) {
        self.state.borrow_mut().held_async_events += 1;
    }

    fn completion(&self, cid: u16, status: NvmeStatus, dw0: u32) -> Completion {
        let mut state = self.state.borrow_mut();
        state.outstanding.remove(&cid);
        let sq_id = state.connected.map_or(0, |connected| connected.qid);
        Completion { dw0, dw1: 0, sq_head: state.sq_head, sq_id, cid, status }
    }

    /// Ends a command that returns data: C2HData, then the response or the SUCCESS flag.
    pub(crate) fn respond_with_data(&self, command: &Command, mut data: IoBuffer) {
        let wanted = command.sgl.length as usize;
        if command.sgl.identifier != SglDescriptor::TRANSPORT {
            return self.respond(command.cid, NvmeStatus::SGL_TYPE_INVALID.with_dnr(), 0);
        }
        data.truncate(wanted);
        let sqflow_disabled = self.connected().is_some_and(|connected| connected.sqflow_disabled);
        let completion = self.completion(command.cid, NvmeStatus::SUCCESS, 0);
        if data.is_empty() {
            return self.outbox.push(Outgoing::Response(completion));
        }
        let response = (!sqflow_disabled || self.transport == Transport::Rdma).then_some(completion);
        self.outbox.push(Outgoing::Data { cid: command.cid, data, response });
    }

    pub(crate) fn reply(&self, command: &Command, reply: Reply) {
        match reply.data {
            Some(data) if reply.status.is_success() => self.respond_with_data(command, IoBuffer::from_vec(data)),
            _ => {
                let mut completion = self.completion(command.cid, reply.status, reply.dw0);
                completion.dw1 = reply.dw1;
                self.outbox.push(Outgoing::Response(completion));
            }
        }
    }

    /// Asks the host for a write's data; the returned channel yields the filled buffer.
    pub(crate) fn request_data(
        &self,
        cid: u16,
        buffer: IoBuffer,
    ) -> local_channel::LocalReceiver<Result<IoBuffer, NvmeStatus>> {
        let (done, receiver) = local_channel::new_bounded(1);
        let len = buffer.len() as u32;
        let mut state = self.state.borrow_mut();
        let transfer = Transfer { cid, buffer: Some(buffer), received: 0, corrupt: false, done };
        let ttag = match state.transfers.iter().position(Option::is_none) {
            Some(free) => {
                state.transfers[free] = Some(transfer);
                free
            }
            None => {
                state.transfers.push(Some(transfer));
                state.transfers.len() - 1
            }
        };
        self.outbox.push(Outgoing::ReadyToTransfer { cid, ttag: ttag as u16, len });
        receiver
    }

    /// A buffer for `len` bytes of `command`'s data: the namespace's own kind for a write, so that it goes
    /// to the device as it is.
    pub(crate) fn capsule_buffer(&self, command: &Command, len: usize) -> IoBuffer {
        match self.device(command.nsid) {
            Some(device) if command.opcode == IoOpcode::Write as u8 => self.ctx.buffer_for(&device, len),
            _ => IoBuffer::aligned(len, 8),
        }
    }

    /// Ends the transfer `ttag` of command `cid` at once: `fill` writes its whole buffer (or says why it
    /// could not), and the command gets the buffer. `false`: no such transfer is waiting.
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub(crate) fn finish_transfer(
        &self,
        ttag: u16,
        cid: u16,
        fill: impl FnOnce(&mut [u8]) -> Result<(), NvmeStatus>,
    ) -> bool {
        let taken = {
            let mut state = self.state.borrow_mut();
            match state.transfers.get_mut(usize::from(ttag)) {
                Some(slot) if slot.as_ref().is_some_and(|transfer| transfer.cid == cid) => slot.take(),
                _ => None,
            }
        };
        let Some(Transfer { buffer: Some(mut buffer), done, .. }) = taken else { return false };
        let delivered = fill(buffer.as_mut_slice()).map(|()| buffer);
        // The command task is waiting on the other end; if it is gone, the data has nowhere to go.
        let _ = done.try_send(delivered);
        true
    }

    /// Drops the transfers still waiting for data: the connection ended, and their commands end with it.
    pub(crate) fn abandon_transfers(&self) {
        self.state.borrow_mut().transfers.clear();
    }

    /// Records an error in the controller's error log.
    pub(crate) fn log_error(&self, command: &Command, status: NvmeStatus) {
        let Some(connected) = self.connected() else { return };
        let mut registry = self.ctx.shared.registry();
        if let Some(controller) = registry.controllers.get_mut(&connected.cntlid) {
            controller.record_error(connected.qid, command.cid, status, command.slba(), command.nsid);
        }
    }

    /// The namespace's logical block size and capacity in bytes.
    pub(crate) fn namespace_format(&self, nsid: u32) -> Option<(u64, u64)> {
        let subsystem = &self.ctx.shared.subsystems[self.connected()?.subsystem];
        let info = subsystem.namespaces.get((nsid as usize).checked_sub(1)?)?;
        Some((info.block_bytes, info.capacity_bytes))
    }

    /// Namespace `nsid`'s reservation, and the Host Identifier this queue acts for.
    pub(crate) fn reservations(&self, nsid: u32) -> Option<(&Reservations, [u8; 16])> {
        let connected = self.connected()?;
        let subsystem = &self.ctx.shared.subsystems[connected.subsystem];
        let info = subsystem.namespaces.get((nsid as usize).checked_sub(1)?)?;
        Some((&info.reservations, connected.host_id))
    }

    pub(crate) fn device(&self, nsid: u32) -> Option<Rc<AnyDevice>> {
        let subsystem = self.connected()?.subsystem;
        let index = (nsid as usize).checked_sub(1)?;
        self.ctx.devices.get(subsystem)?.get(index).cloned()
    }
}

/// Serves one accepted connection until it closes, the host terminates it, or its controller is torn
/// down. Errors end this connection only.
pub(crate) async fn serve(stream: TcpStream, ctx: Rc<ExecutorContext>) {
    let _ = stream.set_nodelay(true);
    let polled = !ctx.config.busy_poll.is_zero();
    let Ok((read_half, write_half)) = split_stream(stream, polled) else { return };
    let fd = read_half.raw_fd();
    if let Some(algorithm) = &ctx.config.tcp_congestion {
        // Checked at start-up on the listener; a failure here leaves the default, which still works.
        let _ = set_congestion_control(fd, algorithm);
    }
    let queue = Rc::new(Queue::new(Rc::clone(&ctx), fd, Transport::Tcp));
    let timeout = ctx.config.handshake_timeout;
    if !timeout.is_zero() {
        let Ok(connection) = read_half.shutdown_handle() else { return };
        glommio::spawn_local(close_unless_connected(Rc::downgrade(&queue), connection, timeout)).detach();
    }
    let decoder = Decoder { controller: true, digests: Default::default(), max_data_bytes: 0 };
    let mut reader = PduReader::new(read_half, decoder);
    let mut writer = PduWriter::new(write_half);
    if initialize(&mut reader, &mut writer, &ctx.config).await.is_ok() {
        let writer_task = glommio::spawn_local(write_loop(Rc::clone(&queue), writer));
        read_loop(&queue, &mut reader).await;
        queue.outbox.close();
        writer_task.await;
    }
    queue.abandon_transfers();
    // Before the socket closes (when the streams drop).
    queue.leave();
}

/// Shuts `connection` down unless its queue connected within `timeout` of the accept. The watch keeps a
/// descriptor of its own, so a connection that ended before cannot have its number reused under it.
async fn close_unless_connected(queue: Weak<Queue>, connection: std::net::TcpStream, timeout: Duration) {
    glommio::timer::sleep(timeout).await;
    if queue.upgrade().is_some_and(|queue| queue.connected().is_none()) {
        let _ = connection.shutdown(std::net::Shutdown::Both);
    }
}

/// ICReq → ICResp: digests as the host asks (both supported), no padding needed for our data (CPDA 0).
async fn initialize(
    reader: &mut PduReader,
    writer: &mut PduWriter,
    config: &TargetConfig,
) -> Result<(), TransportError> {
    let received = match reader.read_header().await {
        Ok(received) => received,
        Err(TransportError::Pdu(error)) => {
            terminate(writer, &error, reader.last_header()).await;
            return Err(error.into());
        }
        Err(error) => return Err(error),
    };
    let PduHeader::InitRequest { hpda, digests, .. } = received.header else {
        let error = PduError::Sequence("the first PDU must be ICReq");
        terminate(writer, &error, reader.last_header()).await;
        return Err(error.into());
    };
    let response = PduHeader::InitResponse { pfv: 0, cpda: 0, digests, maxh2cdata: config.max_h2c_data_bytes };
    writer.send(&response, &[]).await?;
    writer.flush().await?;
    writer.digests = digests;
    writer.data_alignment = (usize::from(hpda) + 1) * 4;
    reader.decoder.digests = digests;
    reader.decoder.max_data_bytes = config.max_h2c_data_bytes.max(config.in_capsule_data_bytes);
    Ok(())
}

async fn terminate(writer: &mut PduWriter, error: &PduError, header: &[u8]) {
    if let Some((fes, fei)) = error.term_request() {
        let header = &header[..header.len().min(MAX_TERM_DATA_BYTES)];
        let _ = writer.send(&PduHeader::TermRequest { from_host: false, fes: fes as u16, fei }, header).await;
    }
    let _ = writer.close().await;
}

async fn write_loop(queue: Rc<Queue>, mut writer: PduWriter) {
    let mut items = Vec::new();
    while queue.outbox.take_all(&mut items).await {
        for item in items.drain(..) {
            let sent = match item {
                Outgoing::Response(completion) => writer.send(&PduHeader::Response(completion), &[]).await,
                Outgoing::Data { cid, data, response } => {
                    let header =
                        PduHeader::ControllerData { cccid: cid, offset: 0, last: true, success: response.is_none() };
                    let sent = writer.send(&header, data.as_slice()).await;
                    queue.ctx.buffers.give(data);
                    match response {
                        Some(completion) if sent.is_ok() => writer.send(&PduHeader::Response(completion), &[]).await,
                        _ => sent,
                    }
                }
                Outgoing::ReadyToTransfer { cid, ttag, len } => {
                    writer.send(&PduHeader::ReadyToTransfer { cccid: cid, ttag, offset: 0, len }, &[]).await
                }
                Outgoing::Terminate { error, fei, header } => {
                    let _ = writer
                        .send(&PduHeader::TermRequest { from_host: false, fes: error as u16, fei }, &header)
                        .await;
                    let _ = writer.close().await;
                    return;
                }
            };
            if sent.is_err() {
                return;
            }
        }
        if writer.flush().await.is_err() {
            return;
        }
        if queue.closing() {
            let _ = writer.close().await;
            return;
        }
    }
    let _ = writer.flush().await;
}

async fn read_loop(queue: &Rc<Queue>, reader: &mut PduReader) {
    loop {
        if queue.closing() {
            return;
        }
        let got = reader.read_header().await;
        let outcome = match got {
            Ok(received) => match received.header {
                PduHeader::Command(command) => {
                    receive_command(queue, reader, command, received.data_len, &received).await
                }
                PduHeader::HostData { cccid, ttag, offset, last: _ } => {
                    receive_host_data(queue, reader, cccid, ttag, offset, &received).await
                }
                PduHeader::TermRequest { .. } => return,
                _ => Err(PduError::Sequence("a controller-to-host PDU from the host").into()),
            },
            Err(error) => Err(error),
        };
        match outcome {
            Ok(()) => {}
            Err(TransportError::Pdu(error)) => {
                if let Some((fes, fei)) = error.term_request() {
                    let header = reader.last_header();
                    let header = header[..header.len().min(MAX_TERM_DATA_BYTES)].to_vec();
                    queue.outbox.push(Outgoing::Terminate { error: fes, fei, header });
                }
                return;
            }
            Err(_) => return,
        }
    }
}

async fn receive_command(
    queue: &Rc<Queue>,
    reader: &mut PduReader,
    command: Command,
    data_len: u32,
    received: &crate::tcp::ReceivedHeader,
) -> Result<(), TransportError> {
    let data = if data_len > 0 {
        if data_len > queue.ctx.config.in_capsule_data_bytes.max(ConnectData::BYTES as u32) {
            return Err(
                PduError::DataLimitExceeded { len: data_len, limit: queue.ctx.config.in_capsule_data_bytes }.into()
            );
        }
        let mut buffer = queue.capsule_buffer(&command, data_len as usize);
        match reader.read_data(received, buffer.as_mut_slice()).await {
            Ok(()) => Some(Ok(buffer)),
            Err(TransportError::Pdu(PduError::DataDigest { .. })) => Some(Err(NvmeStatus::TRANSIENT_TRANSPORT_ERROR)),
            Err(error) => return Err(error),
        }
    } else {
        None
    };
    dispatch(queue, command, data).map_err(|what| PduError::Sequence(what).into())
}

/// Runs a command that arrived on `queue`, with its in-capsule data (or the status its transfer failed
/// with): accounts the SQ and its CID, then hands it to the fabrics, admin or I/O command set. `Err`: the
/// host broke the queue's protocol (more commands than entries), which ends the connection.
pub(crate) fn dispatch(
    queue: &Rc<Queue>,
    command: Command,
    data: Option<Result<IoBuffer, NvmeStatus>>,
) -> Result<(), &'static str> {
    {
        let mut state = queue.state.borrow_mut();
        let entries = state.connected.map_or(32, |connected| connected.entries);
        state.sq_head = ((u32::from(state.sq_head) + 1) % entries) as u16;
        if state.outstanding.len() as u32 >= entries {
            return Err("more commands outstanding than the queue has entries");
        }
        if !state.outstanding.insert(command.cid) {
            drop(state);
            queue
                .outbox
                .push(Outgoing::Response(Completion::new(command.cid, NvmeStatus::COMMAND_ID_CONFLICT.with_dnr())));
            return Ok(());
        }
    }
    let data = match data.transpose() {
        Ok(data) => data,
        Err(status) => {
            queue.respond(command.cid, status, 0);
            return Ok(());
        }
    };
    if command.opcode == FABRICS_OPCODE {
        fabrics_command(queue, &command, data);
        return Ok(());
    }
    let Some(connected) = queue.connected() else {
        queue.respond(command.cid, NvmeStatus::COMMAND_SEQUENCE_ERROR.with_dnr(), 0);
        return Ok(());
    };
    if connected.qid == 0 {
        admin::command(queue, &command, data);
    } else {
        glommio::spawn_local(io::command(Rc::clone(queue), command, data)).detach();
    }
    Ok(())
}

async fn receive_host_data(
    queue: &Rc<Queue>,
    reader: &mut PduReader,
    cccid: u16,
    ttag: u16,
    offset: u32,
    received: &crate::tcp::ReceivedHeader,
) -> Result<(), TransportError> {
    let taken = {
        let mut state = queue.state.borrow_mut();
        match state.transfers.get_mut(usize::from(ttag)) {
            Some(slot) if slot.as_ref().is_some_and(|transfer| transfer.cid == cccid) => slot.take(),
            _ => None,
        }
    };
    let Some(mut transfer) = taken else {
        return Err(PduError::InvalidField { offset: 10, what: "H2CData for no outstanding R2T" }.into());
    };
    let Some(mut buffer) = transfer.buffer.take() else {
        return Err(PduError::Sequence("H2CData for a completed transfer").into());
    };
    let expected = buffer.len() as u32;
    let len = received.data_len;
    if offset != transfer.received || offset.checked_add(len).is_none_or(|end| end > expected) {
        return Err(PduError::DataOutOfRange { offset, len, expected }.into());
    }
    let range = offset as usize..(offset + len) as usize;
    match reader.read_data(received, &mut buffer.as_mut_slice()[range]).await {
        Ok(()) => {}
        Err(TransportError::Pdu(PduError::DataDigest { .. })) => transfer.corrupt = true,
        Err(error) => return Err(error),
    }
    transfer.received += len;
    if transfer.received == expected {
        let delivered = if transfer.corrupt { Err(NvmeStatus::TRANSIENT_TRANSPORT_ERROR) } else { Ok(buffer) };
        // The command task is waiting on the other end; if it is gone, the data has nowhere to go.
        let _ = transfer.done.try_send(delivered);
    } else {
        transfer.buffer = Some(buffer);
        queue.state.borrow_mut().transfers[usize::from(ttag)] = Some(transfer);
    }
    Ok(())
}

fn fabrics_command(queue: &Rc<Queue>, command: &Command, data: Option<IoBuffer>) {
    match FabricsType::from_byte(command.fabrics_type()) {
        Some(FabricsType::Connect) => {
            let reply = connect(queue, command, data);
            queue.respond(command.cid, reply.status, reply.dw0);
        }
        Some(FabricsType::PropertyGet | FabricsType::PropertySet) => match queue.connected() {
            Some(connected) if connected.qid == 0 => {
                let reply = admin::property(queue, command, connected);
                queue.reply(command, reply);
            }
            Some(_) => queue.respond(command.cid, NvmeStatus::INVALID_FIELD.with_dnr(), 0),
            None => queue.respond(command.cid, NvmeStatus::COMMAND_SEQUENCE_ERROR.with_dnr(), 0),
        },
        Some(FabricsType::Disconnect) => {
            queue.respond(command.cid, NvmeStatus::SUCCESS, 0);
            queue.state.borrow_mut().close_after_flush = true;
        }
        None => queue.respond(command.cid, NvmeStatus::INVALID_OPCODE.with_dnr(), 0),
    }
}

/// Invalid Parameter Offset and Attribute of a Connect response (NVMe-oF 1.1, figure 21): bit 16 says
/// whether the offset is into the data (1) or the command (0).
fn invalid_parameter(in_data: bool, offset: u32) -> u32 {
    (u32::from(in_data) << 16) | offset
}

fn connect(queue: &Rc<Queue>, command: &Command, data: Option<IoBuffer>) -> Reply {
    if queue.connected().is_some() {
        return Reply::status(NvmeStatus::COMMAND_SEQUENCE_ERROR.with_dnr());
    }
    let recfmt = command.cdw(10) & 0xffff;
    let qid = (command.cdw(10) >> 16) as u16;
    let sqsize = command.cdw(11) & 0xffff;
    let cattr = (command.cdw(11) >> 16) & 0xff;
    let kato_ms = command.cdw(12);
    if recfmt != 0 {
        return Reply {
            dw0: invalid_parameter(false, 40),
            ..Reply::status(NvmeStatus::CONNECT_INCOMPATIBLE_FORMAT.with_dnr())
        };
    }
    let Some(connect_data) = data.as_ref().and_then(|data| ConnectData::decode(data.as_slice())) else {
        return Reply::status(NvmeStatus::SGL_LENGTH_INVALID.with_dnr());
    };
    let config = &queue.ctx.config;
    if sqsize == 0 || sqsize >= u32::from(config.queue_entries) {
        return Reply {
            dw0: invalid_parameter(false, 44),
            ..Reply::status(NvmeStatus::CONNECT_INVALID_PARAMETERS.with_dnr())
        };
    }
    let shared = &queue.ctx.shared;
    let Some(subsystem) = shared.subsystems.iter().position(|subsystem| subsystem.nqn == connect_data.subnqn) else {
        return Reply {
            dw0: invalid_parameter(true, 256),
            ..Reply::status(NvmeStatus::CONNECT_INVALID_PARAMETERS.with_dnr())
        };
    };
    let info = &shared.subsystems[subsystem];
    // The discovery subsystem is open to every host; an NVM subsystem only to those on its list.
    if !info.discovery && !info.allows(&connect_data.hostnqn) {
        return Reply {
            dw0: invalid_parameter(true, 512),
            ..Reply::status(NvmeStatus::CONNECT_INVALID_HOST.with_dnr())
        };
    }
    let mut registry = shared.registry();
    let cntlid = if qid == 0 {
        let Some(cntlid) = registry.allocate_cntlid() else {
            return Reply::status(NvmeStatus::CONNECT_CONTROLLER_BUSY);
        };
        registry.controllers.insert(
            cntlid,
            Controller {
                subsystem,
                hostnqn: connect_data.hostnqn.clone(),
                host_id: connect_data.host_id,
                cc: 0,
                csts: 0,
                kato_ms,
                last_keep_alive: Instant::now(),
                io_queues_granted: 0,
                async_event_config: 0,
                queues: [(0, queue.fd)].into_iter().collect(),
                errors: Default::default(),
                error_count: 0,
            },
        );
        cntlid
    } else {
        let cntlid = connect_data.cntlid;
        let valid = registry.controllers.get(&cntlid).filter(|controller| {
            controller.subsystem == subsystem
                && controller.hostnqn == connect_data.hostnqn
                && controller.host_id == connect_data.host_id
                && controller.ready()
        });
        let Some(controller) = valid else {
            return Reply {
                dw0: invalid_parameter(true, 16),
                ..Reply::status(NvmeStatus::CONNECT_INVALID_PARAMETERS.with_dnr())
            };
        };
        if info.discovery || qid > controller.io_queues_granted.max(1) || controller.queues.contains_key(&qid) {
            return Reply {
                dw0: invalid_parameter(false, 42),
                ..Reply::status(NvmeStatus::CONNECT_INVALID_PARAMETERS.with_dnr())
            };
        }
        if let Some(controller) = registry.controllers.get_mut(&cntlid) {
            controller.queues.insert(qid, queue.fd);
        }
        registry.counters[subsystem].push(Arc::clone(&queue.counters));
        cntlid
    };
    drop(registry);
    if qid == 0 && kato_ms > 0 {
        // Spawned with the registry unlocked: glommio may run a new task before `spawn_local` returns.
        glommio::spawn_local(watch_keep_alive(Arc::clone(shared), cntlid)).detach();
    }
    queue.state.borrow_mut().connected = Some(Connected {
        cntlid,
        subsystem,
        qid,
        entries: sqsize + 1,
        sqflow_disabled: cattr & (1 << 2) != 0,
        host_id: connect_data.host_id,
    });
    Reply::success(u32::from(cntlid))
}

/// Tears the controller down when no Keep Alive arrives within its KATO; ends when the controller does.
pub(crate) async fn watch_keep_alive(shared: Arc<Shared>, cntlid: u16) {
    loop {
        let wait = {
            let mut registry = shared.registry();
            let Some(controller) = registry.controllers.get(&cntlid) else { return };
            let kato = Duration::from_millis(u64::from(controller.kato_ms));
            if kato.is_zero() {
                return;
            }
            let elapsed = controller.last_keep_alive.elapsed();
            if elapsed > kato {
                registry.tear_down(cntlid);
                return;
            }
            kato - elapsed
        };
        glommio::timer::sleep(wait + Duration::from_millis(10)).await;
    }
}
