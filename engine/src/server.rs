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

use std::cell::Cell;
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::{Duration, Instant};

use glommio::net::TcpStream;
use strata_nvme::tcp::stream::{Socket, single_stream};
use strata_proto::{
    FRAME_HEADER_BYTES, FrameHeader, HelloReply, HelloRequest, LINKS_HEADER_BYTES, Links, Opcode, PART_HEADER_BYTES,
    ProtoError, PutOptions, REQUEST_ITEM_BYTES, RESPONSE_ITEM_BYTES, RequestItemHeader, ResponseItemHeader, Status,
    decode_part_header,
};

use crate::event_sender::HandOffRefused;
use crate::forward::ForwardOp;
use crate::metrics::{add, is_error};
use crate::peer_limits::{ConnectionSlot, PartialClaim, PeerBudget, RateJudge};
use crate::shard::{DurablePoint, FillGuard, Prefetch, ReadData, ReadHit, Shard};
use crate::tenants::Scope;

/// The shard that owns `key`, if not this one (the item is then forwarded).
fn other_owner(shard: &Shard, key: &[u8]) -> Option<u32> {
    let owner = strata_proto::shard_of(key, shard.shard_count);
    (owner != shard.id).then_some(owner)
}

async fn forward(shard: &Rc<Shard>, owner: u32, key: &[u8], op: ForwardOp) -> crate::forward::ForwardReply {
    add(&shard.metrics.forwarded, 1);
    match shard.forwarder.get() {
        Some(forwarder) => forwarder.call(owner, key, op).await,
        None => crate::forward::ForwardReply::failed(Status::Invalid),
    }
}

const INPUT_BUFFER_BYTES: usize = 64 << 10;
/// A large value is received (and checksummed) in pieces of at most this many bytes.
const CRC_PIECE_BYTES: usize = 256 << 10;

enum ConnectionError {
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

/// What the shard's stall sweeper sees of one connection. A connection holds resources only in the middle
/// of a frame (a put's DRAM reservation, a reply's pinned buffers), so only then can a peer that stops
/// sending or reading hurt the others; between frames an idle connection costs nothing and stays open.
pub struct ConnectionWatch {
    fd: RawFd,
    /// A frame is being handled.
    in_frame: Cell<bool>,
    /// The handler is blocked on the socket (waiting for the peer's bytes or for room to send), as opposed to
    /// waiting for the node's own work (a device read, another shard, a progressive put's next part).
    on_socket: Cell<bool>,
    /// The number of the frame being handled (a new number tells the sweeper a new frame began).
    frame: Cell<u64>,
    /// The frame streams at the node's pace (a subscription): no minimum rate applies to it.
    streaming: Cell<bool>,
    /// The kernel's byte counters when the sweeper last saw them move, and when that was.
    seen: Cell<(u64, u64)>,
    still_since: Cell<Option<Instant>>,
    /// The sweeper's judgement of the frame's rate.
    rate: Cell<RateJudge>,
}

impl ConnectionWatch {
    /// The kernel's counts of bytes received from and acknowledged by the peer (TCP_INFO): progress at the
    /// wire, whatever the handler's calls look like. `None` if the socket cannot say (then it is never judged).
    fn wire_progress(&self) -> Option<(u64, u64)> {
        // SAFETY: `info` is a plain struct the kernel fills up to `len` bytes; `fd` is this connection's open
        // socket (the watch is dropped before the socket is closed, and the sweeper runs on the same thread).
        #[allow(unsafe_code)]
        unsafe {
            let mut info: libc::tcp_info = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
            let result =
                libc::getsockopt(self.fd, libc::IPPROTO_TCP, libc::TCP_INFO, (&raw mut info).cast(), &raw mut len);
            (result == 0).then_some((info.tcpi_bytes_received, info.tcpi_bytes_acked))
        }
    }
}

/// Awaits a socket operation, marked for the sweeper as waiting on the peer.
async fn on_socket<T>(watch: &ConnectionWatch, operation: impl Future<Output = T>) -> T {
    watch.on_socket.set(true);
    let result = operation.await;
    watch.on_socket.set(false);
    result
}

/// Shuts every open connection of the shard down (the node is stopping): their peers see the end of the
/// stream at once, instead of a socket held open by a task that the stopped executor never runs again.
pub fn close_connections(shard: &Shard) {
    for watch in shard.connection_watches.borrow().iter().filter_map(Weak::upgrade) {
        crate::sys::shutdown_socket(watch.fd);
    }
}

/// Closes the connections blocked on their peer mid-frame that either sat for `stall_timeout` with no byte
/// moving either way, or moved slower than the minimum transfer rate after the frame's grace
/// (`peer_limits`): shutting the socket down fails the handler's pending read or write, so the connection
/// ends through its usual path and frees what it held. One task per shard, one system call per connection
/// that is mid-frame per sweep; runs until the node stops.
pub async fn sweep_stalled_connections(shard: Weak<Shard>) {
    let Some(period) = shard.upgrade().and_then(|shard| sweep_period(&shard.config)) else { return };
    loop {
        glommio::timer::sleep(period).await;
        let Some(shard) = shard.upgrade() else { return };
        let now = Instant::now();
        shard.connection_watches.borrow_mut().retain(|watch| {
            let Some(watch) = watch.upgrade() else { return false };
            if let Some(verdict) = judge(&watch, &shard.config, now, period) {
                // Counted before the peer can see the connection end (a test reads the counter as soon as
                // its read returns; this thread may be preempted in between).
                add(
                    if verdict == Verdict::Stalled {
                        &shard.metrics.stalled_connections
                    } else {
                        &shard.metrics.slow_connections
                    },
                    1,
                );
                // Shut down, not closed: the connection's owner closes it.
                crate::sys::shutdown_socket(watch.fd);
                watch.still_since.set(None);
            }
            true
        });
    }
}

/// How often the sweeper looks, or `None` when neither a stall timeout nor a minimum rate is set.
fn sweep_period(config: &crate::EngineConfig) -> Option<Duration> {
    let stall = (!config.stall_timeout.is_zero()).then_some(config.stall_timeout);
    let rate = (config.peers.min_transfer_rate > 0).then_some(config.peers.frame_grace);
    let shortest = [stall, rate].into_iter().flatten().min()?;
    Some((shortest / 4).clamp(Duration::from_millis(10), Duration::from_secs(1)))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Stalled,
    TooSlow,
}

/// One sweep's look at one connection: whether to close it, and why.
fn judge(watch: &ConnectionWatch, config: &crate::EngineConfig, now: Instant, period: Duration) -> Option<Verdict> {
    if !(watch.in_frame.get() && watch.on_socket.get()) {
        watch.still_since.set(None);
        return None;
    }
    let progress = watch.wire_progress()?;
    let mut rate = watch.rate.get();
    let too_slow =
        !watch.streaming.get() && rate.too_slow(watch.frame.get(), progress.0 + progress.1, period, &config.peers);
    watch.rate.set(rate);
    let stalled = match watch.still_since.get() {
        Some(since) if progress == watch.seen.get() => {
            !config.stall_timeout.is_zero() && now.duration_since(since) >= config.stall_timeout
        }
        _ => {
            watch.seen.set(progress);
            watch.still_since.set(Some(now));
            false
        }
    };
    // A peer that moves nothing at all is stalled, whatever its rate says.
    if stalled {
        Some(Verdict::Stalled)
    } else if too_slow {
        Some(Verdict::TooSlow)
    } else {
        None
    }
}

struct Connection {
    /// Dropped before the socket is closed (fields drop in order), so the sweeper never sees a reused fd.
    watch: Rc<ConnectionWatch>,
    /// The connection's place under the node's and its tenant's connection limits.
    slot: ConnectionSlot,
    /// Where partial-frame bytes are claimed.
    peers: Arc<PeerBudget>,
    stream: Socket,
    input: Box<[u8]>,
    start: usize,
    end: usize,
    output: Vec<u8>,
}

impl Connection {
    fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Makes `len` (≤ the buffer) bytes available; `Ok(false)` if the peer closed before sending any.
    async fn fill(&mut self, len: usize) -> io::Result<bool> {
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

    async fn read_exact(&mut self, destination: &mut [u8]) -> io::Result<()> {
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
    async fn read_exact_crc(&mut self, destination: &mut [u8]) -> io::Result<u32> {
        let from_buffer = destination.len().min(self.buffered());
        // Checked in the input buffer, which is in cache, before the copy: the destination (a DRAM slot) is
        // usually not, and reading it right after writing it waits for its lines to arrive, where the
        // copy's stores alone drain in the background.
        let received = &self.input[self.start..self.start + from_buffer];
        let mut crc = crc32c::crc32c(received);
        destination[..from_buffer].copy_from_slice(received);
        self.start += from_buffer;
        let mut at = from_buffer;
        if destination.len() - at < INPUT_BUFFER_BYTES / 2 {
            self.read_exact(&mut destination[at..]).await?;
            return Ok(crc32c::crc32c_append(crc, &destination[at..]));
        }
        while at < destination.len() {
            let end = destination.len().min(at + CRC_PIECE_BYTES);
            let read = on_socket(&self.watch, self.stream.read(&mut destination[at..end])).await?;
            if read == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            crc = crc32c::crc32c_append(crc, &destination[at..at + read]);
            at += read;
        }
        Ok(crc)
    }

    async fn skip(&mut self, mut len: u64) -> io::Result<()> {
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

    async fn flush(&mut self) -> io::Result<()> {
        if !self.output.is_empty() {
            on_socket(&self.watch, self.stream.write_all(&self.output)).await?;
            self.output.clear();
        }
        Ok(())
    }
}

/// Serves one client connection until it closes or breaks the protocol; one past the node's connection
/// limit is told so (`Quota`) and closed.
pub async fn serve(shard: Rc<Shard>, peers: Arc<PeerBudget>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let Ok(mut stream) = single_stream(stream, shard.config.busy_poll) else { return };
    let Some(slot) = peers.connect() else {
        add(&shard.metrics.connections_refused, 1);
        refuse_connection(&shard, &mut stream).await;
        return;
    };
    add(&shard.metrics.connections, 1);
    let watch = Rc::new(ConnectionWatch {
        fd: stream.raw_fd(),
        in_frame: Cell::new(false),
        on_socket: Cell::new(false),
        frame: Cell::new(0),
        streaming: Cell::new(false),
        seen: Cell::new((0, 0)),
        still_since: Cell::new(None),
        rate: Cell::new(RateJudge::default()),
    });
    {
        // The sweeper prunes the list as it goes; without one (no stall timeout) it is pruned here whenever
        // its length reaches a power of two (a `Weak` keeps its allocation alive), at amortised O(1).
        let mut watches = shard.connection_watches.borrow_mut();
        if watches.len() >= 64 && watches.len().is_power_of_two() {
            watches.retain(|watch| watch.strong_count() > 0);
        }
        watches.push(Rc::downgrade(&watch));
    }
    let mut connection = Connection {
        watch,
        slot,
        peers,
        stream,
        input: vec![0u8; INPUT_BUFFER_BYTES].into_boxed_slice(),
        start: 0,
        end: 0,
        output: Vec::with_capacity(64 << 10),
    };
    // An open node scopes nothing; a tenanted one waits for the HELLO that names the tenant.
    let mut scope = (!shard.tenancy.is_tenanted()).then(Scope::open);
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
            Ok(header) => match in_frame(&shard, &mut connection, header, &mut scope).await {
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
async fn refuse_connection(shard: &Shard, stream: &mut Socket) {
    let refusal =
        FrameHeader { opcode: Opcode::Hello, flags: 0, request_id: 0, count: 0, status: Status::Quota, body_len: 0 }
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
    shard: &Rc<Shard>,
    connection: &mut Connection,
    header: FrameHeader,
    scope: &mut Option<Scope>,
) -> Result<(u64, u64), ConnectionError> {
    connection.watch.frame.set(connection.watch.frame.get() + 1);
    connection.watch.in_frame.set(true);
    let result = handle_frame(shard, connection, header, scope).await;
    connection.watch.in_frame.set(false);
    result
}

/// Handles one frame; returns (failed items, missed items).
async fn handle_frame(
    shard: &Rc<Shard>,
    connection: &mut Connection,
    header: FrameHeader,
    scope: &mut Option<Scope>,
) -> Result<(u64, u64), ConnectionError> {
    let limits = shard.config.limits;
    header.check_request(&limits)?;
    if header.opcode == Opcode::Hello {
        return handle_hello(shard, connection, header, scope).await.map(|()| (0, 0));
    }
    let Some(scope) = scope.as_ref() else {
        add(&shard.metrics.auth_failures, 1);
        return Err(ConnectionError::Protocol(Status::Unauthenticated, "no HELLO with a tenant's token".into()));
    };
    let statuses = match header.opcode {
        Opcode::Put => handle_put(shard, connection, header, scope).await?,
        _ => {
            let mut body = vec![0u8; header.body_len as usize];
            connection.read_exact(&mut body).await?;
            let items = parse_items(&body, header, &limits)?;
            match header.opcode {
                Opcode::Get | Opcode::GetRange => {
                    return handle_get(shard, connection, header, &body, &items, scope).await;
                }
                Opcode::Subscribe => return handle_subscribe(shard, connection, header, &body, &items, scope).await,
                Opcode::Exists | Opcode::PrefixMatch => {
                    // A prefix match looks keys up in order and stops at each chain's first miss: the rest
                    // of that chain is useless to the caller (a suffix without its prefix), so it is
                    // answered NOT_FOUND without a lookup.
                    let prefix = header.opcode == Opcode::PrefixMatch;
                    let mut broken_chains: std::collections::HashSet<u32> = std::collections::HashSet::new();
                    let mut statuses = Vec::with_capacity(items.len());
                    // Each key of this shard hashed once, and its index lines asked for one and two items
                    // ahead: a 1,000-key chain is otherwise a chain of misses.
                    let hashes = local_hashes(shard, scope, body_keys(&body, &items));
                    for (at, (item, key_at, key_len)) in items.iter().enumerate() {
                        prefetch_stages(shard, &hashes, at + 1, &[Prefetch::Entry, Prefetch::IndexSlot]);
                        let user_key = &body[*key_at..*key_at + *key_len];
                        if prefix && !broken_chains.is_empty() && broken_chains.contains(&item.offset) {
                            statuses.push(ResponseItemHeader::status(Status::NotFound));
                            continue;
                        }
                        // A prefix match is asked before the blocks are loaded: the blocks it finds are held
                        // for a read lease, so that the load that follows finds them still there.
                        let found = match hashes[at] {
                            Some(hash) => shard.exists_hashed(hash, prefix),
                            None => {
                                let owner = other_owner(shard, user_key).unwrap_or(shard.id);
                                let key = scope.scoped(user_key);
                                let reply = forward(shard, owner, &key, ForwardOp::Exists { lease: prefix }).await;
                                if reply.status == Status::Ok { Ok(reply.object_len) } else { Err(reply.status) }
                            }
                        };
                        if prefix && found.is_err() {
                            broken_chains.insert(item.offset);
                        }
                        statuses.push(match found {
                            Ok(len) => {
                                ResponseItemHeader { status: Status::Ok, data_len: 0, data_crc: 0, object_len: len }
                            }
                            Err(status) => ResponseItemHeader::status(status),
                        });
                    }
                    statuses
                }
                Opcode::RemoveMatching => {
                    let mut statuses = Vec::with_capacity(items.len());
                    for (item, key_at, key_len) in &items {
                        let pattern = &body[*key_at..*key_at + *key_len];
                        statuses.push(remove_matching(shard, item.flags, pattern, scope).await);
                    }
                    statuses
                }
                _ => {
                    let mut statuses = Vec::with_capacity(items.len());
                    for (_, key_at, key_len) in &items {
                        let user_key = &body[*key_at..*key_at + *key_len];
                        let key = scope.scoped(user_key);
                        let status = match other_owner(shard, user_key) {
                            None => shard.remove(&key).await.err().unwrap_or(Status::Ok),
                            Some(owner) => forward(shard, owner, &key, ForwardOp::Remove).await.status,
                        };
                        statuses.push(ResponseItemHeader::status(status));
                    }
                    statuses
                }
            }
        }
    };
    let counts = count(statuses.iter().map(|item| item.status));
    let reply = FrameHeader {
        opcode: header.opcode,
        flags: 0,
        request_id: header.request_id,
        count: statuses.len() as u32,
        status: Status::Ok,
        body_len: (statuses.len() * RESPONSE_ITEM_BYTES) as u64,
    };
    reply.encode_into(&mut connection.output);
    for item in &statuses {
        item.encode_into(&mut connection.output);
    }
    connection.flush().await?;
    Ok(counts)
}

/// The answer to one REMOVE_MATCHING item on this shard: the keys removed, or `Invalid` for a pattern that
/// is not a regular expression (or one too large to compile within a bound, so a pattern cannot make the
/// shard build an unbounded automaton).
async fn remove_matching(shard: &Rc<Shard>, flags: u16, pattern: &[u8], scope: &Scope) -> ResponseItemHeader {
    let matcher = if flags & strata_proto::ITEM_MATCH_ALL != 0 {
        None
    } else {
        let compiled = std::str::from_utf8(pattern).ok().and_then(|text| {
            regex::bytes::RegexBuilder::new(text).size_limit(1 << 20).dfa_size_limit(1 << 20).build().ok()
        });
        match compiled {
            Some(regex) => Some(regex),
            None => return ResponseItemHeader::status(Status::Invalid),
        }
    };
    let removed = shard.remove_matching(scope.prefix(), matcher.as_ref()).await;
    ResponseItemHeader { status: Status::Ok, data_len: 0, data_crc: 0, object_len: removed }
}

/// Bytes of events per frame sent to a subscriber (at most; one event may take it past).
const EVENT_FRAME_BYTES: usize = 256 << 10;
/// What a frame's buffer is allocated with: a full frame and the event that may take it past.
const EVENT_FRAME_CAPACITY: usize = FRAME_HEADER_BYTES + EVENT_FRAME_BYTES + 4096;
/// How long a woken subscriber waits for more events before it sends what it has.
const EVENT_GATHER: std::time::Duration = std::time::Duration::from_millis(2);
/// A subscriber with nothing to receive gets an empty frame this often, so a vanished one is noticed.
const EVENT_HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(1);

/// Streams the shard's events to the connection until it closes; the connection takes no more requests.
async fn handle_subscribe(
    shard: &Rc<Shard>,
    connection: &mut Connection,
    header: FrameHeader,
    body: &[u8],
    items: &[(RequestItemHeader, usize, usize)],
    scope: &Scope,
) -> Result<(u64, u64), ConnectionError> {
    let [(item, key_at, key_len)] = items else {
        return Err(ConnectionError::Protocol(Status::Invalid, "SUBSCRIBE takes one item".into()));
    };
    // A tenant sees only its own keys' events, with its prefix taken off again.
    let user_prefix: &[u8] =
        if item.flags & strata_proto::ITEM_MATCH_ALL == 0 { &body[*key_at..*key_at + *key_len] } else { &[] };
    let full_prefix = scope.scoped(user_prefix);
    let prefix = (!full_prefix.is_empty()).then_some(&full_prefix[..]);
    let strip = scope.prefix().len();
    let (subscription, mut cursor) = crate::events::Subscription::new(&shard.events);
    // Events flow at the node's pace, not the peer's: only the stall timeout applies to a subscription.
    connection.watch.streaming.set(true);
    // An empty frame says "subscribed": every event after the client has read it is delivered.
    let ready = FrameHeader {
        opcode: Opcode::Subscribe,
        flags: 0,
        request_id: header.request_id,
        count: 0,
        status: Status::Ok,
        body_len: 0,
    };
    on_socket(&connection.watch, connection.stream.write_all(&ready.encode())).await?;
    // Frames go to a thread of their own off the shard's core where the node has a CPU for it
    // (`crate::event_sender`); otherwise the shard writes them.
    let sender =
        shard.event_senders.start(connection.stream.raw_fd(), shard.config.stall_timeout, Arc::clone(&shard.metrics));
    // The frame's header and its events in one buffer, sent with one write: through the reactor a header
    // sent apart from a body of 16 KiB or more is a send of its own (`Socket::write_all_vectored`), and each
    // send on loopback costs the sending core the receiving side's TCP work and a wake-up of the subscriber.
    let mut frame = Vec::with_capacity(EVENT_FRAME_CAPACITY);
    loop {
        frame.clear();
        frame.resize(FRAME_HEADER_BYTES, 0);
        let (count, next) = shard.events.borrow_mut().read(cursor, prefix, strip, EVENT_FRAME_BYTES, &mut frame);
        cursor = next;
        if count == 0 {
            let woken = futures_lite::future::or(
                async {
                    subscription.changed(cursor).await;
                    true
                },
                async {
                    glommio::timer::sleep(EVENT_HEARTBEAT).await;
                    false
                },
            )
            .await;
            if woken {
                // Let events gather before sending: one frame (one system call) per millisecond or so
                // instead of one per put, at a millisecond of latency a router does not notice.
                glommio::timer::sleep(EVENT_GATHER).await;
                continue;
            }
        }
        let body_len = frame.len() - FRAME_HEADER_BYTES;
        let head = FrameHeader {
            opcode: Opcode::Subscribe,
            flags: 0,
            request_id: header.request_id,
            count,
            status: Status::Ok,
            body_len: body_len as u64,
        }
        .encode();
        frame[..FRAME_HEADER_BYTES].copy_from_slice(&head);
        match &sender {
            None => on_socket(&connection.watch, connection.stream.write_all(&frame)).await?,
            Some(sender) => {
                let mut pending = std::mem::replace(&mut frame, sender.buffer(EVENT_FRAME_CAPACITY));
                loop {
                    match sender.hand_off(pending) {
                        Ok(()) => break,
                        // The subscriber reads slower than frames come: its events wait in the log (which
                        // bounds them) while its thread drains the queue.
                        Err(HandOffRefused::Full(back)) => {
                            pending = back;
                            glommio::timer::sleep(EVENT_GATHER).await;
                        }
                        // The thread shut the connection down (the socket failed, or the subscriber stalled).
                        Err(HandOffRefused::Closed) => return Err(ConnectionError::Socket),
                    }
                }
            }
        }
        subscription.consumed(cursor);
        if count > 0 && body_len < EVENT_FRAME_BYTES / 2 {
            // Not backlogged: gather the next frame too, rather than sending whatever arrived during this
            // write (under a steady stream of puts that was a small frame, and a system call, per wake-up).
            glommio::timer::sleep(EVENT_GATHER).await;
        }
    }
}

fn count(statuses: impl Iterator<Item = Status>) -> (u64, u64) {
    statuses.fold((0, 0), |(errors, misses), status| {
        (errors + u64::from(is_error(status)), misses + u64::from(status == Status::NotFound))
    })
}

/// Splits a read-side body into (item header, key offset, key length).
fn parse_items(
    body: &[u8],
    header: FrameHeader,
    limits: &strata_proto::Limits,
) -> Result<Vec<(RequestItemHeader, usize, usize)>, ConnectionError> {
    let mut items = Vec::with_capacity(header.count as usize);
    let mut at = 0usize;
    for _ in 0..header.count {
        let item = RequestItemHeader::decode(&body[at.min(body.len())..], header.opcode, limits)?;
        let key_at = at + REQUEST_ITEM_BYTES;
        let key_len = usize::from(item.key_len);
        if key_at + key_len > body.len() {
            return Err(ProtoError::BodyMismatch { items: (key_at + key_len) as u64, body: body.len() as u64 }.into());
        }
        items.push((item, key_at, key_len));
        at = key_at + key_len;
    }
    if at != body.len() {
        return Err(ProtoError::BodyMismatch { items: at as u64, body: body.len() as u64 }.into());
    }
    Ok(items)
}

async fn handle_hello(
    shard: &Rc<Shard>,
    connection: &mut Connection,
    header: FrameHeader,
    scope: &mut Option<Scope>,
) -> Result<(), ConnectionError> {
    let mut body = vec![0u8; header.body_len as usize];
    connection.read_exact(&mut body).await?;
    let hello = HelloRequest::decode(&body)?;
    let Some(tenant) = shard.tenancy.authenticate(&hello.token) else {
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
    let reply = HelloReply {
        shard_count: shard.shard_count,
        shard_id: shard.id,
        base_port: shard.base_port,
        limits: shard.config.limits,
    };
    FrameHeader {
        opcode: Opcode::Hello,
        flags: 0,
        request_id: header.request_id,
        count: 1,
        status: Status::Ok,
        body_len: strata_proto::HELLO_REPLY_BYTES as u64,
    }
    .encode_into(&mut connection.output);
    reply.encode_into(&mut connection.output);
    connection.flush().await?;
    Ok(())
}

async fn handle_put(
    shard: &Rc<Shard>,
    connection: &mut Connection,
    header: FrameHeader,
    scope: &Scope,
) -> Result<Vec<ResponseItemHeader>, ConnectionError> {
    let limits = shard.config.limits;
    let mut statuses = Vec::with_capacity(header.count as usize);
    let mut consumed = 0u64;
    let mut durable: Vec<DurablePoint> = Vec::new();
    let mut durable_items: Vec<usize> = Vec::new();
    let mut item_bytes = [0u8; REQUEST_ITEM_BYTES];
    let mut ahead = VecDeque::with_capacity(3);
    for _ in 0..header.count {
        prefetch_next_puts(shard, connection, scope, &limits, &mut ahead);
        if consumed + REQUEST_ITEM_BYTES as u64 > header.body_len {
            return Err(ProtoError::BodyMismatch {
                items: consumed + REQUEST_ITEM_BYTES as u64,
                body: header.body_len,
            }
            .into());
        }
        connection.read_exact(&mut item_bytes).await?;
        let item = RequestItemHeader::decode(&item_bytes, Opcode::Put, &limits)?;
        let key_len = usize::from(item.key_len);
        consumed += (REQUEST_ITEM_BYTES + key_len) as u64 + u64::from(item.value_len);
        if consumed > header.body_len {
            return Err(ProtoError::BodyMismatch { items: consumed, body: header.body_len }.into());
        }
        let mut user_key = vec![0u8; key_len];
        connection.read_exact(&mut user_key).await?;
        let owner = other_owner(shard, &user_key);
        let key = scope.scoped_owned(user_key);
        let key_len = key.len();
        // A links block: the parent and the group, scoped like keys so that tenants never link across.
        let (parent, group) = if item.has_links() {
            let mut head = [0u8; LINKS_HEADER_BYTES];
            connection.read_exact(&mut head).await?;
            let (parent_len, group_len) = Links::decode_header(&head, &limits)?;
            consumed += (LINKS_HEADER_BYTES + parent_len + group_len) as u64;
            if consumed > header.body_len {
                return Err(ProtoError::BodyMismatch { items: consumed, body: header.body_len }.into());
            }
            let mut names = vec![0u8; parent_len + group_len];
            connection.read_exact(&mut names).await?;
            let scoped = |name: &[u8]| (!name.is_empty()).then(|| scope.scoped(name).into_owned());
            (scoped(&names[..parent_len]), scoped(&names[parent_len..]))
        } else {
            (None, None)
        };
        let links = Links { parent: parent.as_deref(), group: group.as_deref() };
        if u64::from(item.value_len) > limits.max_value_bytes {
            skip_value(connection, &item, &mut consumed, header.body_len).await?;
            statuses.push(ResponseItemHeader::status(Status::TooLarge));
            continue;
        }
        let mut options = PutOptions::decode(&item);
        let Ok(claim) = claim_arriving_value(shard, connection, scope, &item, key_len) else {
            add(&shard.metrics.partial_frame_refusals, 1);
            skip_value(connection, &item, &mut consumed, header.body_len).await?;
            statuses.push(ResponseItemHeader::status(Status::Quota));
            continue;
        };
        if let Some(owner) = owner {
            let mut value = vec![0u8; item.value_len as usize];
            let received = if item.is_progressive() {
                receive_parts(connection, &mut value, None, &mut consumed, header.body_len).await?
            } else {
                let crc = connection.read_exact_crc(&mut value).await?;
                (crc == item.value_crc).then_some(crc)
            };
            drop(claim);
            let status = if let Some(value_crc) = received {
                let op = ForwardOp::Put { value, value_crc, options, parent, group };
                forward(shard, owner, &key, op).await.status
            } else {
                Status::TransferChecksum
            };
            statuses.push(ResponseItemHeader::status(status));
            continue;
        }
        let total = key_len as u64 + u64::from(item.value_len);
        let reservation = match shard.admit_put(&key, item.value_len, &mut options).await {
            Ok(reservation) => reservation,
            Err(status) => {
                skip_value(connection, &item, &mut consumed, header.body_len).await?;
                statuses.push(ResponseItemHeader::status(status));
                continue;
            }
        };
        let bytes = reservation.bytes_mut(total as usize);
        bytes[..key_len].copy_from_slice(&key);
        // A progressive put is readable (GET_RANGE) as its parts arrive, until it commits; `_fill` ends that
        // when dropped, after the commit.
        let (value_crc, _fill) = if item.is_progressive() {
            let fill = reservation.open_for_reads(&key, item.value_len);
            match receive_parts(connection, &mut bytes[key_len..], fill.as_ref(), &mut consumed, header.body_len)
                .await?
            {
                Some(crc) => (crc, fill),
                None => {
                    statuses.push(ResponseItemHeader::status(Status::TransferChecksum));
                    continue;
                }
            }
        } else {
            if connection.read_exact_crc(&mut bytes[key_len..]).await? != item.value_crc {
                statuses.push(ResponseItemHeader::status(Status::TransferChecksum));
                continue;
            }
            (item.value_crc, None)
        };
        drop(claim);
        let status = match shard.commit_put(&key, reservation, item.value_len, value_crc, options, links).await {
            Ok(Some(point)) => {
                durable.push(point);
                durable_items.push(statuses.len());
                Status::Ok
            }
            Ok(None) => Status::Ok,
            Err(status) => status,
        };
        statuses.push(ResponseItemHeader::status(status));
    }
    if consumed != header.body_len {
        return Err(ProtoError::BodyMismatch { items: consumed, body: header.body_len }.into());
    }
    // One sync per region touched covers the whole batch (the last point of each region is the furthest).
    for (index, point) in durable.iter().enumerate() {
        let last_of_region = durable[index + 1..].iter().all(|later| later.region_key() != point.region_key());
        if last_of_region && let Err(status) = shard.sync(*point).await {
            for (item, other) in durable_items.iter().zip(&durable) {
                if other.region_key() == point.region_key() {
                    statuses[*item] = ResponseItemHeader::status(status);
                }
            }
        }
    }
    Ok(statuses)
}

/// Claims the bytes of a put item's key and value against the partial-frame caps while they arrive:
/// `Ok(None)` when the value is buffered already (nothing waits on the peer), `Err` past a cap.
fn claim_arriving_value(
    shard: &Shard,
    connection: &Connection,
    scope: &Scope,
    item: &RequestItemHeader,
    key_len: usize,
) -> Result<Option<PartialClaim>, ()> {
    if !item.is_progressive() && connection.buffered() as u64 >= u64::from(item.value_len) {
        return Ok(None);
    }
    let bytes = key_len as u64 + u64::from(item.value_len);
    connection.peers.claim(scope.id, bytes, &shard.metrics).map(Some).ok_or(())
}

/// Asks for the lines the next put items will touch, in stages (`Shard::prefetch`): the one at the
/// front of the connection's buffered input, the next and the one after. The index and the DRAM tier's
/// bookkeeping are far larger than the cache, so each put's lookups were otherwise misses in a row (the
/// table slot, the entry it names, the replaced object's slot); an item's processing takes longer than
/// a miss, so asked an item or two ahead they hit.
///
/// `ahead` carries, from one item to the next, the hash and length of the items already read ahead,
/// starting with the one at the front (each item is parsed and hashed once, not once per stage); this
/// call drops the front one, which the caller consumes next. Were it ever out of step, only the hints
/// would be wrong.
fn prefetch_next_puts(
    shard: &Shard,
    connection: &Connection,
    scope: &Scope,
    limits: &strata_proto::Limits,
    ahead: &mut VecDeque<(u64, usize)>,
) {
    let stages = [Prefetch::DramSlot, Prefetch::Entry, Prefetch::IndexSlot];
    let buffered = &connection.input[connection.start..connection.end];
    let mut at: usize = ahead.iter().map(|&(_, len)| len).sum();
    while ahead.len() < stages.len() {
        let Some((key, len)) = buffered.get(at..).and_then(|rest| buffered_put_item(rest, limits)) else { break };
        ahead.push_back((crate::index::index_hash(&scope.scoped(key)), len));
        at += len;
    }
    for (&(hash, _), stage) in ahead.iter().zip(stages) {
        shard.prefetch(hash, stage);
    }
    ahead.pop_front();
}

/// The keys of a read-side body's items, as the client sent them.
fn body_keys<'a>(
    body: &'a [u8],
    items: &'a [(RequestItemHeader, usize, usize)],
) -> impl Iterator<Item = &'a [u8]> + 'a {
    items.iter().map(|(_, key_at, key_len)| &body[*key_at..*key_at + *key_len])
}

/// Each key's index hash as this shard stores it, or `None` for a key another shard owns (forwarded).
fn local_hashes<'a>(shard: &Shard, scope: &Scope, user_keys: impl Iterator<Item = &'a [u8]>) -> Vec<Option<u64>> {
    user_keys
        .map(|user_key| {
            other_owner(shard, user_key).is_none().then(|| crate::index::index_hash(&scope.scoped(user_key)))
        })
        .collect()
}

/// Asks for one stage of lines for each of the items from `from` on: `stages[0]` (an operation's last
/// stage) for item `from`, `stages[1]` for the one after, and so on, so that each item gets its stages in
/// order over the calls before it runs (see `prefetch_next_puts`).
fn prefetch_stages(shard: &Shard, hashes: &[Option<u64>], from: usize, stages: &[Prefetch]) {
    for (ahead, &stage) in stages.iter().enumerate() {
        if let Some(Some(hash)) = hashes.get(from + ahead) {
            shard.prefetch(*hash, stage);
        }
    }
}

/// The key and the length of the put item at the front of `bytes`, if its header and key are there and it
/// is a plain one (no links block, not progressive).
fn buffered_put_item<'a>(bytes: &'a [u8], limits: &strata_proto::Limits) -> Option<(&'a [u8], usize)> {
    let item = RequestItemHeader::decode(bytes.get(..REQUEST_ITEM_BYTES)?, Opcode::Put, limits).ok()?;
    if item.has_links() || item.is_progressive() {
        return None;
    }
    let key = bytes.get(REQUEST_ITEM_BYTES..REQUEST_ITEM_BYTES + usize::from(item.key_len))?;
    Some((key, REQUEST_ITEM_BYTES + key.len() + item.value_len as usize))
}

/// Skips a refused put item's value: its bytes, or a progressive put's parts.
async fn skip_value(
    connection: &mut Connection,
    item: &RequestItemHeader,
    consumed: &mut u64,
    body_len: u64,
) -> Result<(), ConnectionError> {
    if !item.is_progressive() {
        connection.skip(u64::from(item.value_len)).await?;
        return Ok(());
    }
    let mut left = u64::from(item.value_len);
    while left > 0 {
        let (len, _) = read_part_header(connection, left, consumed, body_len).await?;
        connection.skip(u64::from(len)).await?;
        left -= u64::from(len);
    }
    Ok(())
}

/// Reads a progressive put's next part header, `(len, crc)`, with `left` bytes of value still to come.
async fn read_part_header(
    connection: &mut Connection,
    left: u64,
    consumed: &mut u64,
    body_len: u64,
) -> Result<(u32, u32), ConnectionError> {
    let mut head = [0u8; PART_HEADER_BYTES];
    connection.read_exact(&mut head).await?;
    let (len, crc) = decode_part_header(&head, left)?;
    *consumed += PART_HEADER_BYTES as u64;
    if *consumed > body_len {
        return Err(ProtoError::BodyMismatch { items: *consumed, body: body_len }.into());
    }
    Ok((len, crc))
}

/// Receives a progressive put's parts into `value`, each checked against its crc before its bytes become
/// readable through `fill`; returns the whole value's crc, or `None` if a part failed its crc (the remaining
/// parts are still consumed, so the stream stays in step).
async fn receive_parts(
    connection: &mut Connection,
    value: &mut [u8],
    fill: Option<&FillGuard>,
    consumed: &mut u64,
    body_len: u64,
) -> Result<Option<u32>, ConnectionError> {
    let mut at = 0usize;
    let mut crc = 0u32;
    let mut intact = true;
    while at < value.len() {
        let (len, part_crc) = read_part_header(connection, (value.len() - at) as u64, consumed, body_len).await?;
        let part = &mut value[at..at + len as usize];
        let received = connection.read_exact_crc(part).await?;
        at += len as usize;
        intact &= received == part_crc;
        if intact {
            crc = crc32c::crc32c_combine(crc, received, len as usize);
            if let Some(fill) = fill {
                fill.advance(at as u32);
            }
        }
    }
    Ok(intact.then_some(crc))
}

/// Reads one item of a GET / GET_RANGE frame, here or at the key's owner.
async fn read_item(
    shard: &Rc<Shard>,
    scope: &Scope,
    user_key: &[u8],
    range: Option<(u32, u32)>,
    wait: Duration,
) -> Result<ReadHit, Status> {
    let key = scope.scoped(user_key);
    match other_owner(shard, user_key) {
        None => shard.get(&key, range, wait).await,
        Some(owner) => {
            let reply = forward(shard, owner, &key, ForwardOp::Get(range, wait)).await;
            if reply.status == Status::Ok {
                Ok(ReadHit {
                    data_crc: reply.data_crc,
                    object_len: reply.object_len,
                    data: ReadData::Owned(reply.data),
                })
            } else {
                Err(reply.status)
            }
        }
    }
}

/// Runs `futures` together; their outputs in the order given.
async fn join_in_order<'a, T>(mut futures: Vec<Pin<Box<dyn Future<Output = T> + 'a>>>) -> Vec<T> {
    let mut outputs: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|context| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(context) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending { std::task::Poll::Pending } else { std::task::Poll::Ready(()) }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

async fn handle_get(
    shard: &Rc<Shard>,
    connection: &mut Connection,
    header: FrameHeader,
    body: &[u8],
    items: &[(RequestItemHeader, usize, usize)],
    scope: &Scope,
) -> Result<(u64, u64), ConnectionError> {
    let read = |(item, key_at, key_len): &(RequestItemHeader, usize, usize)| {
        let user_key = &body[*key_at..*key_at + *key_len];
        let range = (header.opcode == Opcode::GetRange).then_some((item.offset, item.value_len));
        read_item(shard, scope, user_key, range, item.wait())
    };
    let results: Vec<Result<ReadHit, Status>> = if items.iter().any(|(item, ..)| !item.wait().is_zero()) {
        // Items that may wait for their keys wait together: a batch of layers of several requests whose
        // prefills are still sending takes as long as the slowest, not the sum.
        join_in_order(items.iter().map(|item| Box::pin(read(item)) as Pin<Box<dyn Future<Output = _> + '_>>).collect())
            .await
    } else {
        // The lines each read will touch, asked for in stages up to three items ahead, for keys of this
        // shard: a batch of small reads is otherwise a chain of misses.
        let hashes = local_hashes(shard, scope, body_keys(body, items));
        let stages = [Prefetch::DramBytes, Prefetch::DramSlot, Prefetch::Entry, Prefetch::IndexSlot];
        let mut results = Vec::with_capacity(items.len());
        for (at, item) in items.iter().enumerate() {
            prefetch_stages(shard, &hashes, at, &stages);
            results.push(read(item).await);
        }
        results
    };
    let body_len: u64 = results
        .iter()
        .map(|result| RESPONSE_ITEM_BYTES as u64 + result.as_ref().map_or(0, |hit| hit.len() as u64))
        .sum();
    FrameHeader {
        opcode: header.opcode,
        flags: 0,
        request_id: header.request_id,
        count: results.len() as u32,
        status: Status::Ok,
        body_len,
    }
    .encode_into(&mut connection.output);
    // The reply goes out in one vectored write (a few, past IOV_MAX pieces): the headers from one buffer,
    // each value from its own memory (the DRAM segment, pinned, or the NVMe read's buffers), no copy.
    let mut heads: Vec<usize> = Vec::with_capacity(results.len());
    for result in &results {
        match result {
            Ok(hit) => ResponseItemHeader {
                status: Status::Ok,
                data_len: hit.len() as u32,
                data_crc: hit.data_crc,
                object_len: hit.object_len,
            }
            .encode_into(&mut connection.output),
            Err(status) => ResponseItemHeader::status(*status).encode_into(&mut connection.output),
        }
        heads.push(connection.output.len());
    }
    let output = std::mem::take(&mut connection.output);
    let mut pieces: Vec<io::IoSlice<'_>> = Vec::with_capacity(results.len() * 2 + 1);
    let mut head_start = 0usize;
    for (result, &head_end) in results.iter().zip(&heads) {
        pieces.push(io::IoSlice::new(&output[head_start..head_end]));
        head_start = head_end;
        if let Ok(hit) = result {
            pieces.extend(hit.slices().into_iter().filter(|slice| !slice.is_empty()).map(io::IoSlice::new));
        }
    }
    let written = on_socket(&connection.watch, connection.stream.write_all_vectored(&mut pieces)).await;
    drop(pieces);
    connection.output = output;
    connection.output.clear();
    written?;
    Ok(count(results.iter().map(|result| result.as_ref().map_or_else(|status| *status, |_| Status::Ok))))
}

#[cfg(test)]
mod tests {
    use strata_proto::{ITEM_LINKS, ITEM_PROGRESSIVE, Limits};

    use super::*;

    fn item(key: &[u8], value_len: u32, flags: u16, out: &mut Vec<u8>) {
        RequestItemHeader { key_len: key.len() as u16, value_len, flags, ..Default::default() }.encode_into(out);
        out.extend_from_slice(key);
        out.extend(std::iter::repeat_n(7u8, value_len as usize));
    }

    #[test]
    fn buffered_put_items_are_read_ahead_only_when_whole_and_plain() {
        let limits = Limits::default();
        let mut body = Vec::new();
        item(b"first", 64, 0, &mut body);
        let second_at = body.len();
        item(b"second-key", 3, 0, &mut body);
        assert_eq!(buffered_put_item(&body, &limits), Some((&b"first"[..], second_at)));
        assert_eq!(buffered_put_item(&body[second_at..], &limits), Some((&b"second-key"[..], body.len() - second_at)));
        // A key cut short by the end of the buffered input, a header cut short, nothing at all.
        assert_eq!(buffered_put_item(&body[second_at..second_at + REQUEST_ITEM_BYTES + 4], &limits), None);
        assert_eq!(buffered_put_item(&body[..REQUEST_ITEM_BYTES - 1], &limits), None);
        assert_eq!(buffered_put_item(&[], &limits), None);
        // Items whose length depends on more than their header: not read ahead.
        for flags in [ITEM_LINKS, ITEM_PROGRESSIVE] {
            let mut other = Vec::new();
            item(b"k", 8, flags, &mut other);
            assert_eq!(buffered_put_item(&other, &limits), None, "flags {flags:#x}");
        }
        // A header the decoder refuses (a key longer than the node allows) is not read ahead either.
        let mut long = Vec::new();
        RequestItemHeader { key_len: u16::MAX, value_len: 1, ..Default::default() }.encode_into(&mut long);
        let small = Limits { max_key_bytes: 16, ..Limits::default() };
        assert_eq!(buffered_put_item(&long, &small), None);
    }
}
