//! The NVMe/RDMA transport binding of the target: hosts connect through RDMA_CM (the connection's private
//! data says which queue and how deep), commands arrive as SEND capsules into posted receives, the
//! controller moves their data with RDMA READ and WRITE through the host's Keyed SGL, and every command ends
//! with a response capsule SENT back.
//!
//! One thread runs the RDMA_CM listener: it accepts a connection (queue pair, completion queue and receives
//! made and posted first, as the binding requires before the accept), then hands it to the target's
//! executors in turn, waking each through a socket pair its task awaits. The connection is then served on
//! that executor like a TCP one ([`connection`]), through the same command sets. The listener also hears
//! of connections that ended (the host disconnected): their queue pairs are moved to the error state, which
//! flushes their receives and ends their tasks. A connection whose queue has not connected (a Fabrics
//! Connect that succeeded) within the target's `handshake_timeout` is ended the same way.

mod connection;
mod staging;

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddrV4;
use std::os::unix::net::UnixStream;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use strata_transfer::TransferError;
use strata_transfer::verbs::{
    Access, CmEvent, CmListener, CmRequest, CompletionQueue, Device, ProtectionDomain, QueuePair, QueuePairOptions,
    RegisteredBuffer,
};

use super::TargetError;
use super::connection::ExecutorContext;
use crate::rdma::cm::{ConnectAccept, ConnectRequest, RejectStatus, encode_reject};
use crate::rdma::link::{READS_IN_FLIGHT, post_receive};
use crate::spec::COMMAND_BYTES;

/// How long an accepted connection may take to be established.
const ESTABLISH_WAIT: Duration = Duration::from_secs(10);
/// How often the listener looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(200);
/// Queues served at once: each pins its receives (a command capsule and in-capsule data per entry, 2 MiB
/// at the defaults) and a completion queue, so hosts are refused (No Resources) beyond it.
const QUEUES_MAX: usize = 256;

/// A connection accepted by the listener, on its way to an executor.
pub(crate) struct Accepted {
    /// Declared first: dropped (destroyed) before the buffers it may still be moving bytes of.
    pair: Arc<QueuePair>,
    completions: CompletionQueue,
    domain: ProtectionDomain,
    /// One receive per command the host may have in flight, `capsule_bytes` each, all posted.
    receives: RegisteredBuffer,
    capsule_bytes: usize,
    entries: u16,
    /// Dropped last: destroying the id disconnects the host.
    request: CmRequest,
}

/// Where the listener hands connections to one executor.
pub(crate) struct Handoff {
    sender: mpsc::Sender<Accepted>,
    wake: UnixStream,
}

/// What an executor keeps to take its connections.
pub(crate) struct Intake {
    receiver: mpsc::Receiver<Accepted>,
    wake: UnixStream,
}

/// A handoff and the intake an executor takes it through.
pub(crate) fn channel() -> std::io::Result<(Handoff, Intake)> {
    let (sender, receiver) = mpsc::channel();
    let (ours, theirs) = UnixStream::pair()?;
    Ok((Handoff { sender, wake: ours }, Intake { receiver, wake: theirs }))
}

/// Serves the connections handed to this executor until the listener is gone.
pub(crate) async fn serve_intake(intake: Intake, ctx: Rc<ExecutorContext>) {
    let Intake { receiver, wake } = intake;
    let Ok(mut wake) = crate::readiness::adopt(wake) else { return };
    let mut bytes = [0u8; 64];
    loop {
        while let Ok(accepted) = receiver.try_recv() {
            glommio::spawn_local(connection::serve(accepted, Rc::clone(&ctx))).detach();
        }
        match futures_lite::AsyncReadExt::read(&mut wake, &mut bytes).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// The running listener.
pub(crate) struct RdmaListener {
    thread: JoinHandle<()>,
    stop: Arc<AtomicBool>,
}

impl RdmaListener {
    /// Stops listening. Call once the executors ended: the connections' ids report on the listener's
    /// channel, which must outlive them.
    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.join();
    }
}

/// Listens on `address` and hands each accepted connection to the next of `executors`.
pub(crate) fn listen(
    address: SocketAddrV4,
    config: &super::TargetConfig,
    executors: Vec<Handoff>,
) -> Result<RdmaListener, TargetError> {
    let listener = CmListener::bind(address).map_err(|error| TargetError::Listen {
        addr: address.into(),
        source: std::io::Error::other(format!("RDMA_CM: {error}")),
    })?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut accepter = Accepter {
        listener,
        executors,
        next: 0,
        devices: HashMap::new(),
        pairs: HashMap::new(),
        queue_entries: config.queue_entries,
        capsule_bytes: COMMAND_BYTES + config.in_capsule_data_bytes as usize,
    };
    let stopping = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name("strata-target-rdma-cm".into())
        .spawn(move || {
            while !stopping.load(Ordering::SeqCst) {
                match accepter.listener.next(STOP_POLL) {
                    Ok(Some(event)) => accepter.on_event(event),
                    Ok(None) => {}
                    // The channel failed: nothing more will be heard on it.
                    Err(_) => break,
                }
            }
            // Connections in the executors' channels would outlive the listener: the executors ended.
            accepter.executors.clear();
        })
        .map_err(|error| TargetError::Executor(error.to_string()))?;
    Ok(RdmaListener { thread, stop })
}

/// The listener thread's state.
struct Accepter {
    listener: CmListener,
    executors: Vec<Handoff>,
    next: usize,
    /// Devices (with a protection domain each) opened by name, as requests arrive on them.
    devices: HashMap<String, (Device, ProtectionDomain)>,
    /// The queue pair of each live connection, by its request's token.
    pairs: HashMap<usize, Weak<QueuePair>>,
    queue_entries: u16,
    capsule_bytes: usize,
}

impl Accepter {
    fn on_event(&mut self, event: CmEvent) {
        match event {
            CmEvent::Request(request) => self.on_request(request),
            CmEvent::Disconnected(token) => {
                if let Some(pair) = self.pairs.remove(&token).and_then(|pair| pair.upgrade()) {
                    let _ = pair.fail();
                }
            }
        }
    }

    /// Accepts `request` and hands it to the next executor, or rejects it.
    fn on_request(&mut self, request: CmRequest) {
        let token = request.token();
        self.pairs.retain(|_, pair| pair.strong_count() > 0);
        if self.pairs.len() >= QUEUES_MAX {
            let _ = self.listener.reject(&request, &encode_reject(RejectStatus::NoResources));
            return;
        }
        match self.establish(request) {
            Ok(accepted) => {
                self.pairs.insert(token, Arc::downgrade(&accepted.pair));
                let count = self.executors.len();
                let executor = &mut self.executors[self.next % count];
                self.next += 1;
                // An executor that is gone drops the connection, which disconnects the host.
                if executor.sender.send(accepted).is_ok() {
                    let _ = executor.wake.write(&[1]);
                }
            }
            Err((request, status)) => {
                let _ = self.listener.reject(&request, &encode_reject(status));
            }
        }
    }

    /// The queue pair, completion queue and posted receives of `request`'s queue, then the accept. A local
    /// failure is told to the host as No Resources, and to the operator on stderr.
    fn establish(&mut self, request: CmRequest) -> Result<Accepted, (CmRequest, RejectStatus)> {
        let connect = match ConnectRequest::decode(&request.private_data, self.queue_entries) {
            Ok(connect) => connect,
            Err(status) => return Err((request, status)),
        };
        match self.make_queue(&request, connect) {
            Ok((pair, completions, domain, receives)) => {
                let entries = connect.commands_in_flight();
                let capsule_bytes = self.capsule_bytes;
                Ok(Accepted { pair, completions, domain, receives, capsule_bytes, entries, request })
            }
            Err(error) => {
                eprintln!("strata target: an NVMe/RDMA queue was refused: {error}");
                Err((request, RejectStatus::NoResources))
            }
        }
    }
}

/// What a queue is made of before it is handed off.
type QueueParts = (Arc<QueuePair>, CompletionQueue, ProtectionDomain, RegisteredBuffer);

impl Accepter {
    /// The device the request arrived on, opened once.
    fn device(&mut self, request: &CmRequest) -> Result<(Device, ProtectionDomain), TransferError> {
        let Some(name) = request.device_name() else {
            return Err(TransferError::NoDevices);
        };
        if let Some(opened) = self.devices.get(&name) {
            return Ok(opened.clone());
        }
        let device = Device::open(&name)?;
        let domain = ProtectionDomain::new(&device)?;
        self.devices.insert(name, (device.clone(), domain.clone()));
        Ok((device, domain))
    }

    /// Makes the queue, posts a receive per command and accepts. Sends are a response per command plus its
    /// data's RDMA READ or WRITE, twice over (a response's SEND may still be in flight when the host,
    /// having seen it, sends the next command).
    fn make_queue(&mut self, request: &CmRequest, connect: ConnectRequest) -> Result<QueueParts, TransferError> {
        let (device, domain) = self.device(request)?;
        let entries = u32::from(connect.commands_in_flight());
        let options = QueuePairOptions {
            send_queue_depth: connection::send_queue_depth(entries),
            receive_queue_depth: entries,
            ..QueuePairOptions::default()
        };
        let completions = CompletionQueue::new(&device, options.send_queue_depth + entries)?;
        let pair = QueuePair::new(&domain, &completions, options)?;
        let receives = RegisteredBuffer::new(&domain, entries as usize * self.capsule_bytes, Access::Local)?;
        for slot in 0..entries as usize {
            post_receive(&pair, &receives, slot, self.capsule_bytes)?;
        }
        let accept = ConnectAccept { controller_receive_queue_size: entries as u16 };
        self.listener.accept(request, &pair, (&accept.encode(), READS_IN_FLIGHT), ESTABLISH_WAIT)?;
        Ok((Arc::new(pair), completions, domain, receives))
    }
}
