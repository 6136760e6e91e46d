//! The KV protocol server of one shard: one task per connection, frames handled in order (a client
//! pipelines by sending several frames before reading replies).
//!
//! Values stream: a put's value is read from the socket straight into its DRAM reservation, and a get's
//! value is sent from the DRAM segment (pinned) or from the NVMe read's buffers, without an intermediate
//! copy: a reply is one vectored write of the headers and every value's own memory.
//!
//! Bad input never takes the node down: a frame that breaks the protocol (bad magic or checksum, bounds,
//! items that do not fill the body) gets an error frame and the connection is closed, because the stream
//! can no longer be trusted; an item over a bound that the stream can skip (an oversized value) gets its
//! own status and the rest of the batch is served.
//!
//! [`ShardServer`] is the node-level context of one shard: the shard, its side of the mesh of shards
//! (`forward`), the event sender threads and the connections the stall sweeper watches. The shard itself
//! knows none of these.

mod client_stream;
mod connection;
mod get;
mod local_socket;
mod lookup;
mod put;
mod rdma;
mod register;
mod scan;
mod shared_regions;
mod subscribe;
mod watch;

use std::cell::RefCell;
use std::io;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::{Duration, Instant};

use glommio::net::TcpStream;
use strata_nvme::tcp::stream::single_stream;
use strata_proto::{
    FRAME_HEADER_BYTES, FrameHeader, HelloReply, HelloRequest, Opcode, ProtoError, RESPONSE_ITEM_BYTES,
    ResponseItemHeader, Status, decode_request_body,
};

use crate::event_sender::EventSenders;
use crate::forward::{ForwardOp, ForwardReply, Forwarder};
use crate::metrics::{add, is_error};
use crate::ownership::OwnershipCache;
use crate::peer_limits::PeerBudget;
use crate::shard::Shard;
use crate::tenants::Scope;
use client_stream::ClientStream;
use connection::{Connection, INPUT_BUFFER_BYTES};
pub(crate) use rdma::{RdmaDevice, open_device as open_rdma_device};
use watch::enlist;
pub use watch::{ConnectionWatch, close_connections, sweep_stalled_connections};

/// One shard as the node serves it: the shard and what lies around it.
pub struct ShardServer {
    /// The shard.
    pub shard: Rc<Shard>,
    /// Its side of the mesh: items for keys another shard owns go there.
    forwarder: Rc<Forwarder>,
    /// The node's threads that write event frames off the shards' cores.
    event_senders: Arc<EventSenders>,
    /// Where connections and partial-frame bytes are counted, node-wide.
    peers: Arc<PeerBudget>,
    /// The open client connections, for the stall sweeper.
    watches: RefCell<Vec<Weak<ConnectionWatch>>>,
    /// This shard's copy of the node's ownership in a cluster.
    ownership: OwnershipCache,
    /// The name of the shard's abstract Unix socket, offered to clients on the node's host (none: the
    /// shared-memory path is off or its socket could not be bound).
    local_socket: RefCell<Option<Vec<u8>>>,
    /// The shard's RDMA, offered to clients that have a device (none: no `--rdma-device`).
    rdma: Option<Rc<rdma::ShardRdma>>,
}

impl ShardServer {
    /// The context serving `shard`.
    pub fn new(
        shard: Rc<Shard>,
        forwarder: Rc<Forwarder>,
        event_senders: Arc<EventSenders>,
        peers: Arc<PeerBudget>,
    ) -> Rc<Self> {
        let ownership = OwnershipCache::new(shard.config.ownership.clone());
        Rc::new(Self {
            shard,
            forwarder,
            event_senders,
            peers,
            watches: RefCell::new(Vec::new()),
            ownership,
            local_socket: RefCell::new(None),
            rdma: None,
        })
    }

    /// The context serving `shard`, moving values by RDMA on `device` for clients that ask.
    pub(crate) fn with_rdma(
        shard: Rc<Shard>,
        forwarder: Rc<Forwarder>,
        (event_senders, peers): (Arc<EventSenders>, Arc<PeerBudget>),
        device: Option<&rdma::RdmaDevice>,
    ) -> Result<Rc<Self>, String> {
        let rdma = device.map(|device| rdma::ShardRdma::new(device, &shard)).transpose()?.map(Rc::new);
        let server = Self::new(shard, forwarder, event_senders, peers);
        let mut server = Rc::into_inner(server).ok_or("a fresh shard server has one owner")?;
        server.rdma = rdma;
        Ok(Rc::new(server))
    }

    /// Offers the shard's Unix socket, named `name`, to clients on the node's host.
    pub fn offer_local_socket(&self, name: Vec<u8>) {
        *self.local_socket.borrow_mut() = Some(name);
    }

    /// The answer for an item of `key` sent under cluster epoch `epoch`, when it is MOVED: the node does
    /// not own the key under its own, newer epoch (see `ownership.rs`).
    fn moved(&self, key: &[u8], epoch: u64) -> Option<ResponseItemHeader> {
        let node_epoch = self.ownership.moved(key, epoch)?;
        add(&self.shard.metrics.moved, 1);
        Some(ResponseItemHeader {
            status: Status::Moved,
            data_len: 0,
            data_crc: (node_epoch >> 32) as u32,
            object_len: node_epoch as u32,
        })
    }

    /// The shard that owns `key`, if not this one (the item is then forwarded).
    fn other_owner(&self, key: &[u8]) -> Option<u32> {
        let owner = strata_proto::shard_of(key, self.shard.shard_count);
        (owner != self.shard.id).then_some(owner)
    }

    /// Sends an item to the shard that owns its key and waits for the answer.
    async fn forward(&self, owner: u32, key: &[u8], op: ForwardOp) -> ForwardReply {
        add(&self.shard.metrics.forwarded, 1);
        self.forwarder.call(owner, key, op).await
    }
}

pub(crate) enum ConnectionError {
    /// The socket failed or the peer went away.
    Socket,
    /// The peer broke the protocol: answer with this status and close.
    Protocol(Status, String),
}

impl From<io::Error> for ConnectionError {
    fn from(_: io::Error) -> Self {
        ConnectionError::Socket
    }
}

impl From<ProtoError> for ConnectionError {
    fn from(error: ProtoError) -> Self {
        let status = match error {
            ProtoError::BodyTooLong { .. } | ProtoError::ItemCount { .. } | ProtoError::KeyLength { .. } => {
                Status::TooLarge
            }
            ProtoError::Version(_) => Status::Version,
            _ => Status::Invalid,
        };
        ConnectionError::Protocol(status, error.to_string())
    }
}

/// Serves one client connection over TCP until it closes or breaks the protocol; one past the node's
/// connection limit is told so (`Quota`) and closed.
pub async fn serve(server: Rc<ShardServer>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let peer_on_host = match (stream.peer_addr(), stream.local_addr()) {
        (Ok(peer), Ok(local)) => peer.ip().is_loopback() || peer.ip() == local.ip(),
        _ => false,
    };
    let Ok(socket) = single_stream(stream, server.shard.config.busy_poll) else { return };
    serve_stream(server, ClientStream::Tcp(socket), peer_on_host).await;
}

/// Serves one client connection over the shard's Unix socket: the same protocol, plus shared memory.
pub async fn serve_local(server: Rc<ShardServer>, stream: std::os::unix::net::UnixStream) {
    let Ok(socket) = local_socket::LocalSocket::new(stream, server.shard.config.busy_poll) else { return };
    serve_stream(server, ClientStream::Local(socket), false).await;
}

async fn serve_stream(server: Rc<ShardServer>, mut stream: ClientStream, peer_on_host: bool) {
    let shard = &server.shard;
    let peers = Arc::clone(&server.peers);
    let Some(slot) = peers.connect() else {
        add(&shard.metrics.connections_refused, 1);
        refuse_connection(shard, &mut stream).await;
        return;
    };
    add(&shard.metrics.connections, 1);
    let watch = Rc::new(ConnectionWatch::new(stream.raw_fd()));
    enlist(&server, &watch);
    let shared = matches!(stream, ClientStream::Local(_)).then(shared_regions::SharedRegions::default);
    let mut connection = Connection {
        watch,
        slot,
        peers,
        stream,
        shared,
        rdma: None,
        peer_on_host,
        streamed_replies: false,
        input: vec![0u8; INPUT_BUFFER_BYTES].into_boxed_slice(),
        start: 0,
        end: 0,
        output: Vec::with_capacity(64 << 10),
    };
    // An open node scopes nothing; a tenanted one waits for the HELLO that names the tenant.
    let mut scope = (!shard.tenancy().is_tenanted()).then(Scope::open);
    loop {
        match connection.fill(FRAME_HEADER_BYTES).await {
            Ok(true) => {}
            Ok(false) | Err(_) => break,
        }
        let started = Instant::now();
        let decoded = FrameHeader::decode(&connection.input[connection.start..connection.start + FRAME_HEADER_BYTES]);
        connection.start += FRAME_HEADER_BYTES;
        let outcome = match decoded {
            Err(error) => Err((None, ConnectionError::from(error))),
            Ok(header) => match in_frame(&server, &mut connection, header, &mut scope).await {
                Ok(counts) => {
                    let latency = started.elapsed().as_nanos() as u64;
                    shard.metrics.frame(header.opcode, u64::from(header.count), counts.0, counts.1, latency);
                    Ok(())
                }
                Err(error) => Err((Some(header), error)),
            },
        };
        let Err((header, error)) = outcome else { continue };
        if let ConnectionError::Protocol(status, _why) = error {
            add(&shard.metrics.protocol_errors, 1);
            let reply = FrameHeader {
                opcode: header.map_or(Opcode::Hello, |header| header.opcode),
                flags: 0,
                request_id: header.map_or(0, |header| header.request_id),
                count: 0,
                status,
                body_len: 0,
                epoch: 0,
            };
            connection.output.clear();
            reply.encode_into(&mut connection.output);
            // Watched too: a peer that reads nothing must not hold the connection open by its error frame.
            connection.watch.in_frame.set(true);
            let _ = connection.flush().await;
        }
        break;
    }
    let _ = connection.stream.shutdown().await;
    // Its slot is given back before it stops counting as open: a peer that waits for the count to fall
    // finds its place free.
    drop(connection);
    shard.metrics.connections.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
}

/// Tells a peer past the connection limit why it is closed: one error frame, sent within a bound of time
/// (a peer that reads nothing cannot hold the task), then the end of the stream.
async fn refuse_connection(shard: &Shard, stream: &mut ClientStream) {
    let refusal = FrameHeader {
        opcode: Opcode::Hello,
        flags: 0,
        request_id: 0,
        count: 0,
        status: Status::Quota,
        body_len: 0,
        epoch: 0,
    }
    .encode();
    let bound = shard.config.peers.frame_grace.max(Duration::from_millis(100));
    let _ = futures_lite::future::or(async { stream.write_all(&refusal).await.is_ok() }, async {
        glommio::timer::sleep(bound).await;
        false
    })
    .await;
    let _ = stream.shutdown().await;
}

/// Handles one frame, watched by the stall sweeper while it does.
async fn in_frame(
    server: &ShardServer,
    connection: &mut Connection,
    header: FrameHeader,
    scope: &mut Option<Scope>,
) -> Result<(u64, u64), ConnectionError> {
    connection.watch.frame.set(connection.watch.frame.get() + 1);
    connection.watch.in_frame.set(true);
    let result = handle_frame(server, connection, header, scope).await;
    connection.watch.in_frame.set(false);
    result
}

/// Handles one frame; returns (failed items, missed items).
async fn handle_frame(
    server: &ShardServer,
    connection: &mut Connection,
    header: FrameHeader,
    scope: &mut Option<Scope>,
) -> Result<(u64, u64), ConnectionError> {
    let shard = &server.shard;
    let limits = shard.config.limits;
    header.check_request(&limits)?;
    if header.opcode == Opcode::Hello {
        return handle_hello(server, connection, header, scope).await.map(|()| (0, 0));
    }
    let Some(scope) = scope.as_ref() else {
        add(&shard.metrics.auth_failures, 1);
        return Err(ConnectionError::Protocol(Status::Unauthenticated, "no HELLO with a tenant's token".into()));
    };
    if header.opcode == Opcode::Register {
        return register::handle_register(connection, header).await;
    }
    if header.opcode == Opcode::RdmaConnect {
        return rdma::handle_connect(server, connection, header).await;
    }
    if header.opcode == Opcode::Put {
        let statuses = put::handle_put(server, connection, header, scope).await?;
        return reply_statuses(connection, header, &statuses).await;
    }
    let mut body = vec![0u8; header.body_len as usize];
    connection.read_exact(&mut body).await?;
    // The protocol's own decoder (the one the fuzz target drives).
    let items = decode_request_body(&header, &body, &limits)?;
    let statuses = match header.opcode {
        Opcode::Get | Opcode::GetRange => return get::handle_get(server, connection, header, &items, scope).await,
        Opcode::Subscribe => return subscribe::handle_subscribe(server, connection, header, &items, scope).await,
        Opcode::Exists => lookup::exists(server, &items, scope, (false, header.epoch)).await,
        Opcode::Locate => lookup::locate(server, &items, scope, header.epoch).await,
        Opcode::PrefixMatch => lookup::exists(server, &items, scope, (true, header.epoch)).await,
        Opcode::RemoveMatching => lookup::remove_all_matching(server, &items, scope).await,
        Opcode::Members => return members(server, connection, header).await,
        Opcode::Scan => return scan::handle_scan(server, connection, header, &items, scope).await,
        _ => lookup::remove(server, &items, scope, header.epoch).await,
    };
    reply_statuses(connection, header, &statuses).await
}

/// Answers a MEMBERS frame (one item) with the members as the node last saw them (JSON, its crc32c in
/// `data crc`), or NOT_FOUND from a node that runs alone.
async fn members(
    server: &ShardServer,
    connection: &mut Connection,
    header: FrameHeader,
) -> Result<(u64, u64), ConnectionError> {
    // One item: each would carry a copy of the view, and a peer must not make the node build many.
    if header.count != 1 {
        return Err(ConnectionError::Protocol(Status::Invalid, "MEMBERS takes one item".into()));
    }
    let Some(view) = server.ownership.members() else {
        reply_one(connection, header, ResponseItemHeader::status(Status::NotFound), &[]).await?;
        return Ok((0, 1));
    };
    let json = view.members();
    let item = ResponseItemHeader {
        status: Status::Ok,
        data_len: json.len() as u32,
        data_crc: strata_proto::crc32c(json),
        object_len: json.len() as u32,
    };
    reply_one(connection, header, item, json).await.map(|()| (0, 0))
}

/// Answers a frame of one item with that item and its data.
async fn reply_one(
    connection: &mut Connection,
    header: FrameHeader,
    item: ResponseItemHeader,
    data: &[u8],
) -> Result<(), ConnectionError> {
    let reply = FrameHeader {
        opcode: header.opcode,
        flags: 0,
        request_id: header.request_id,
        count: 1,
        status: Status::Ok,
        body_len: (RESPONSE_ITEM_BYTES + data.len()) as u64,
        epoch: 0,
    };
    reply.encode_into(&mut connection.output);
    item.encode_into(&mut connection.output);
    connection.output.extend_from_slice(data);
    connection.flush().await?;
    Ok(())
}

/// Answers a frame whose items have a status each and no data; returns (failed items, missed items).
async fn reply_statuses(
    connection: &mut Connection,
    header: FrameHeader,
    statuses: &[ResponseItemHeader],
) -> Result<(u64, u64), ConnectionError> {
    let counts = count(statuses.iter().map(|item| item.status));
    let reply = FrameHeader {
        opcode: header.opcode,
        flags: 0,
        request_id: header.request_id,
        count: statuses.len() as u32,
        status: Status::Ok,
        body_len: (statuses.len() * RESPONSE_ITEM_BYTES) as u64,
        epoch: 0,
    };
    reply.encode_into(&mut connection.output);
    for item in statuses {
        item.encode_into(&mut connection.output);
    }
    connection.flush().await?;
    Ok(counts)
}

fn count(statuses: impl Iterator<Item = Status>) -> (u64, u64) {
    statuses.fold((0, 0), |(errors, misses), status| {
        (errors + u64::from(is_error(status)), misses + u64::from(status == Status::NotFound))
    })
}

async fn handle_hello(
    server: &ShardServer,
    connection: &mut Connection,
    header: FrameHeader,
    scope: &mut Option<Scope>,
) -> Result<(), ConnectionError> {
    let mut body = vec![0u8; header.body_len as usize];
    connection.read_exact(&mut body).await?;
    let hello = HelloRequest::decode(&body)?;
    let shard = &server.shard;
    let Some(tenant) = shard.tenancy().authenticate(&hello.token) else {
        add(&shard.metrics.auth_failures, 1);
        return Err(ConnectionError::Protocol(Status::Unauthenticated, "no tenant has this token".into()));
    };
    if !connection.slot.join_tenant(tenant.id) {
        add(&shard.metrics.connections_refused, 1);
        return Err(ConnectionError::Protocol(
            Status::Quota,
            format!("tenant {:?} has its limit of connections", tenant.name),
        ));
    }
    *scope = Some(tenant);
    connection.streamed_replies = hello.accepts_streamed;
    // The Unix socket is offered to a client that can use it, on this host, over TCP.
    let offered =
        if hello.offers_shared && connection.peer_on_host { server.local_socket.borrow().clone() } else { None };
    let reply = HelloReply {
        shard_count: shard.shard_count,
        shard_id: shard.id,
        base_port: shard.base_port,
        limits: shard.config.limits,
        shared_socket: offered.is_some(),
        // RDMA over a TCP connection whose client has a device, once per connection.
        rdma: hello.offers_rdma
            && server.rdma.is_some()
            && matches!(connection.stream, ClientStream::Tcp(_))
            && connection.rdma.is_none(),
        // Every shared copy is checked (`shared_regions::copy_into`); a client that knows the flag is told.
        checked_copies: offered.is_some() && hello.takes_checked_copies,
    };
    let mut body = Vec::with_capacity(strata_proto::HELLO_REPLY_BYTES + 2 + strata_proto::MAX_SOCKET_NAME_BYTES);
    reply.encode_into(&mut body);
    if let Some(name) = &offered {
        strata_proto::encode_socket_name(name, &mut body);
    }
    FrameHeader {
        opcode: Opcode::Hello,
        flags: 0,
        request_id: header.request_id,
        count: 1,
        status: Status::Ok,
        body_len: body.len() as u64,
        epoch: 0,
    }
    .encode_into(&mut connection.output);
    connection.output.extend_from_slice(&body);
    connection.flush().await?;
    Ok(())
}
