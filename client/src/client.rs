//! The blocking client.

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use strata_proto::{
    FRAME_HEADER_BYTES, FRAME_STREAMED, FrameHeader, HELLO_REPLY_BYTES, HelloReply, HelloRequest, ITEM_LINKS,
    ITEM_PROGRESSIVE, ITEM_WAIT, ITEM_WITH_VERSION, Limits, Links, MAX_ITEM_WAIT_MS, Opcode, PART_HEADER_BYTES,
    PutOptions, REQUEST_ITEM_BYTES, RESPONSE_ITEM_BYTES, RequestItemHeader, ResponseItemHeader, Status, VERSION_BYTES,
    Version, encode_part_header, shard_of,
};

use crate::error::ClientError;

/// How a client connects.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Token for the node's HELLO (none for an open node).
    pub token: Option<Vec<u8>>,
    /// Every read and write on a connection fails after this long without progress.
    pub timeout: Duration,
    /// Check the crc32c of every value received (the node sends it with the bytes).
    pub verify_checksums: bool,
    /// Busy-poll a reply for this long before sleeping in the kernel: saves the wake-up (tens of
    /// microseconds on a virtual machine) on every call that is answered within it, at the price of a busy
    /// core. None: always sleep.
    pub spin_before_block: Option<Duration>,
    /// Offer the shared-memory path in HELLO: a node on this host then names its Unix socket, and values
    /// of a [`SharedBuffer`](crate::SharedBuffer) move by one copy on the node instead of over TCP.
    pub shared_memory: bool,
    /// Offer RDMA in HELLO, on this device (as `ibv_devices` names it): the values of an `RdmaBuffer` then
    /// move by RDMA (needs feature `rdma`; a node without a device, or a build without it, uses TCP).
    pub rdma_device: Option<String>,
    /// Accept streamed replies in HELLO: a batch of gets whose items the node reads from its NVMe tier is
    /// sent item by item as each is ready, in order, instead of once the last one is read.
    pub streamed_replies: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            token: None,
            timeout: Duration::from_secs(30),
            verify_checksums: true,
            spin_before_block: None,
            shared_memory: true,
            rdma_device: None,
            streamed_replies: true,
        }
    }
}

/// Pieces at most this long are copied into one send; longer values are written from the caller's memory.
const COALESCE_BYTES: usize = 16 << 10;

/// The read side of a connection: optionally busy-polls (non-blocking reads) before blocking.
///
/// The reader and the writer share one open file description, so the non-blocking flag is shared too: the
/// writer switches it back (`blocking`) before it writes.
pub(crate) struct SpinReader {
    stream: TcpStream,
    spin: Option<Duration>,
    nonblocking: bool,
}

impl SpinReader {
    fn blocking(&mut self) -> std::io::Result<()> {
        if self.nonblocking {
            self.stream.set_nonblocking(false)?;
            self.nonblocking = false;
        }
        Ok(())
    }
}

impl Read for SpinReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let Some(spin) = self.spin else { return self.stream.read(buf) };
        if !self.nonblocking {
            self.stream.set_nonblocking(true)?;
            self.nonblocking = true;
        }
        let polled = spin_for(spin, || match self.stream.read(buf) {
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => None,
            other => Some(other),
        });
        if let Some(result) = polled {
            return result;
        }
        self.blocking()?;
        self.stream.read(buf)
    }
}

/// Tries `attempt` (a non-blocking read: `None` while nothing is there) until it answers or `spin` has
/// passed (`None` then). Every 1024 tries the kernel's own threads on this core get to run: loopback and NIC
/// work deferred to ksoftirqd (delivering the very reply awaited here) would otherwise wait for the
/// scheduler to preempt the spinning thread, milliseconds later.
pub(crate) fn spin_for<T>(spin: Duration, mut attempt: impl FnMut() -> Option<T>) -> Option<T> {
    let started = std::time::Instant::now();
    for tries in 1u32.. {
        if let Some(answer) = attempt() {
            return Some(answer);
        }
        if started.elapsed() >= spin {
            break;
        }
        if tries.is_multiple_of(1024) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    None
}

pub(crate) struct ShardConnection {
    pub(crate) reader: BufReader<SpinReader>,
    pub(crate) writer: TcpStream,
    output: Vec<u8>,
    /// The shard's Unix socket, if its HELLO offered the shared-memory path.
    pub(crate) local_socket: Option<Vec<u8>>,
    /// The shard offered to connect an RDMA queue pair (its HELLO's `rdma`).
    pub(crate) rdma_offered: bool,
    /// The shard checks its shared gets' copies in this client's memory (its HELLO's `checked_copies`).
    pub(crate) checked_copies: bool,
}

impl ShardConnection {
    pub(crate) fn open(addr: SocketAddr, options: &ClientOptions) -> Result<(Self, HelloReply), ClientError> {
        let stream = TcpStream::connect_timeout(&addr, options.timeout)
            .map_err(|error| ClientError::Connection(format!("connecting to {addr}: {error}")))?;
        let io = |error: std::io::Error| ClientError::from_io(&error);
        stream.set_nodelay(true).map_err(io)?;
        stream.set_read_timeout(Some(options.timeout)).map_err(io)?;
        stream.set_write_timeout(Some(options.timeout)).map_err(io)?;
        let writer = stream.try_clone().map_err(io)?;
        let reader = SpinReader { stream, spin: options.spin_before_block, nonblocking: false };
        let mut connection = Self {
            reader: BufReader::with_capacity(64 << 10, reader),
            writer,
            output: Vec::new(),
            local_socket: None,
            rdma_offered: false,
            checked_copies: false,
        };
        let hello = HelloRequest {
            token: options.token.clone().unwrap_or_default(),
            offers_shared: options.shared_memory,
            offers_rdma: options.rdma_device.is_some() && strata_transfer::RDMA_BUILT,
            accepts_streamed: options.streamed_replies,
            takes_checked_copies: options.shared_memory,
        };
        FrameHeader::request(Opcode::Hello, 0, 1, hello.encoded_len() as u64).encode_into(&mut connection.output);
        hello.encode_into(&mut connection.output);
        connection.flush().map_err(io)?;
        let header = connection.read_header(Opcode::Hello, 0)?;
        if header.status != Status::Ok {
            return Err(ClientError::from_status(header.status));
        }
        let longest = HELLO_REPLY_BYTES + 2 + strata_proto::MAX_SOCKET_NAME_BYTES;
        if header.body_len < HELLO_REPLY_BYTES as u64 || header.body_len > longest as u64 {
            return Err(ClientError::Protocol(format!("HELLO reply of {} bytes", header.body_len)));
        }
        let mut body = vec![0u8; header.body_len as usize];
        connection.reader.read_exact(&mut body).map_err(io)?;
        let protocol = |error: strata_proto::ProtoError| ClientError::Protocol(error.to_string());
        let reply = HelloReply::decode(&body[..HELLO_REPLY_BYTES]).map_err(protocol)?;
        connection.rdma_offered = reply.rdma;
        connection.checked_copies = reply.checked_copies;
        let trailer = &body[HELLO_REPLY_BYTES..];
        match (reply.shared_socket, trailer.is_empty()) {
            (true, _) => {
                connection.local_socket = Some(strata_proto::decode_socket_name(trailer).map_err(protocol)?.to_vec())
            }
            (false, true) => {}
            (false, false) => return Err(ClientError::Protocol("bytes after a HELLO reply".into())),
        }
        Ok((connection, reply))
    }

    pub(crate) fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if bytes.len() < COALESCE_BYTES {
            self.output.extend_from_slice(bytes);
            return Ok(());
        }
        self.flush()?;
        self.writer.write_all(bytes)
    }

    pub(crate) fn flush(&mut self) -> std::io::Result<()> {
        self.reader.get_mut().blocking()?;
        if !self.output.is_empty() {
            self.writer.write_all(&self.output)?;
            self.output.clear();
        }
        Ok(())
    }

    /// Reads a reply header and checks it answers `opcode` / `request_id`.
    pub(crate) fn read_header(&mut self, opcode: Opcode, request_id: u64) -> Result<FrameHeader, ClientError> {
        let mut bytes = [0u8; FRAME_HEADER_BYTES];
        self.reader.read_exact(&mut bytes).map_err(|error| ClientError::from_io(&error))?;
        let header = FrameHeader::decode(&bytes).map_err(|error| ClientError::Protocol(error.to_string()))?;
        if header.request_id != request_id || (header.opcode != opcode && header.status == Status::Ok) {
            return Err(ClientError::Protocol(format!(
                "reply {} to request {} ({:?} for {opcode:?})",
                header.request_id, request_id, header.opcode
            )));
        }
        Ok(header)
    }

    /// Sends a frame of one item (`item`, and a one-byte key the node does not look at) and reads its
    /// one reply item and data (at most `max_data` bytes, crc checked); an item status other than OK or
    /// NOT_FOUND is an error.
    pub(crate) fn ask_one(
        &mut self,
        opcode: Opcode,
        request_id: u64,
        item: RequestItemHeader,
        max_data: u32,
    ) -> Result<(ResponseItemHeader, Vec<u8>), ClientError> {
        self.ask_one_keyed(opcode, request_id, (item, b"*"), max_data)
    }

    /// [`ShardConnection::ask_one`] with `key` as the item's key (a token the opcode carries there).
    pub(crate) fn ask_one_keyed(
        &mut self,
        opcode: Opcode,
        request_id: u64,
        (item, key): (RequestItemHeader, &[u8]),
        max_data: u32,
    ) -> Result<(ResponseItemHeader, Vec<u8>), ClientError> {
        let io = |error: std::io::Error| ClientError::from_io(&error);
        let mut frame = Vec::new();
        let body_len = (REQUEST_ITEM_BYTES + key.len()) as u64;
        FrameHeader::request(opcode, request_id, 1, body_len).encode_into(&mut frame);
        RequestItemHeader { key_len: key.len() as u16, ..item }.encode_into(&mut frame);
        frame.extend_from_slice(key);
        self.send(&frame).map_err(io)?;
        self.flush().map_err(io)?;
        let header = self.read_header(opcode, request_id)?;
        if header.status != Status::Ok {
            return Err(ClientError::from_status(header.status));
        }
        let reply = self.read_item()?;
        if reply.status != Status::Ok && reply.status != Status::NotFound {
            return Err(ClientError::from_status(reply.status));
        }
        if reply.data_len > max_data {
            return Err(ClientError::Protocol(format!("a {} answer of {} bytes", opcode.name(), reply.data_len)));
        }
        let mut data = vec![0u8; reply.data_len as usize];
        self.reader.read_exact(&mut data).map_err(io)?;
        if strata_proto::crc32c(&data) != reply.data_crc {
            return Err(ClientError::Checksum);
        }
        Ok((reply, data))
    }

    pub(crate) fn read_item(&mut self) -> Result<ResponseItemHeader, ClientError> {
        let mut bytes = [0u8; RESPONSE_ITEM_BYTES];
        self.reader.read_exact(&mut bytes).map_err(|error| ClientError::from_io(&error))?;
        ResponseItemHeader::decode(&bytes).map_err(|error| ClientError::Protocol(error.to_string()))
    }
}

/// A value read with the version it was upserted with (none: never upserted with one).
pub type VersionedValue = (Vec<u8>, Option<Version>);

/// One key of a batch.
pub(crate) struct Item<'a> {
    pub(crate) key: &'a [u8],
    /// A put's value, as the pieces it is sent from in order (one per layer, say).
    pub(crate) value: &'a [&'a [u8]],
    /// get_range: (offset, length); prefix_match: (chain, 0).
    range: (u32, u32),
    /// A put's parent and group.
    links: Links<'a>,
    /// get / get_range: how long the node waits for a key not stored yet, ms (0: not at all).
    wait_ms: u32,
    /// get: the reply's data begins with the object's version ([`strata_proto::ITEM_WITH_VERSION`]).
    with_version: bool,
}

impl<'a> Item<'a> {
    /// An item of `key` alone: no value, range, links, wait or version (what most opcodes send).
    fn of(key: &'a [u8]) -> Self {
        Self { key, value: &[], range: (0, 0), links: Links::NONE, wait_ms: 0, with_version: false }
    }
}

impl Item<'_> {
    fn value_len(&self) -> usize {
        self.value.iter().map(|part| part.len()).sum()
    }
}

impl Item<'_> {
    /// Whether the item fits the node's bounds.
    fn check(&self, limits: &Limits) -> Result<(), ClientError> {
        if self.key.is_empty() || self.key.len() > limits.max_key_bytes as usize {
            return Err(ClientError::TooLarge(format!(
                "key of {} bytes (1..={})",
                self.key.len(),
                limits.max_key_bytes
            )));
        }
        if !self.links.fits(limits.max_key_bytes) {
            return Err(ClientError::TooLarge(format!(
                "parent or group name of 1..={} bytes expected",
                limits.max_key_bytes
            )));
        }
        let value_len = self.value_len();
        if value_len as u64 > limits.max_value_bytes {
            return Err(ClientError::TooLarge(format!(
                "value of {value_len} bytes (bound {})",
                limits.max_value_bytes
            )));
        }
        Ok(())
    }
}

/// A batch in [`Client::exchange`]: what is sent, the frames each peer has still to send, and the one
/// in flight on each.
struct Batch<'a, 'i> {
    opcode: Opcode,
    /// The cluster epoch its frames carry.
    epoch: u64,
    items: &'a [Item<'i>],
    sends: &'a [(usize, usize)],
    options: PutOptions,
    frames: &'a mut [std::collections::VecDeque<Vec<usize>>],
    in_flight: &'a mut [Option<(u64, Vec<usize>)>],
}

/// Where a read's bytes go.
pub(crate) enum Sink<'a, 'b, 'c> {
    /// Nowhere (exists, remove, put).
    None,
    /// A new vector per key.
    Vectors(&'a mut [Option<Vec<u8>>]),
    /// The caller's buffers.
    Buffers(&'a mut [&'b mut [u8]]),
    /// Several buffers per key, filled in order (one per layer, say).
    Parts(&'a mut [&'c mut [&'b mut [u8]]]),
}

/// One put of [`Client::batch_put_blocks`]: a value (sent from one or more buffers in order) and what it
/// links to.
#[derive(Clone, Copy, Debug)]
pub struct BlockPut<'a> {
    /// Its key.
    pub key: &'a [u8],
    /// Its value, as the pieces it is sent from (one per layer, say).
    pub parts: &'a [&'a [u8]],
    /// Its parent (when the parent leaves the node, so does this block) and group (a group leaves as a
    /// whole).
    pub links: Links<'a>,
}

/// A put in progress, sent part by part: see [`Client::put_progressive`].
pub struct ProgressivePut {
    connection: ShardConnection,
    request_id: u64,
    part_lens: Vec<u32>,
    sent: usize,
}

impl ProgressivePut {
    /// Sends the next part (its length must be the one announced); the node makes it readable on arrival.
    pub fn send_part(&mut self, part: &[u8]) -> Result<(), ClientError> {
        let Some(&expected) = self.part_lens.get(self.sent) else {
            return Err(ClientError::Invalid(format!("all {} parts were sent", self.part_lens.len())));
        };
        if part.len() != expected as usize {
            return Err(ClientError::Invalid(format!(
                "part {} has {} bytes, {expected} announced",
                self.sent,
                part.len()
            )));
        }
        let io = |error: std::io::Error| ClientError::from_io(&error);
        encode_part_header(expected, strata_proto::crc32c(part), &mut self.connection.output);
        self.connection.send(part).map_err(io)?;
        self.connection.flush().map_err(io)?;
        self.sent += 1;
        Ok(())
    }

    /// Parts sent so far.
    pub fn parts_sent(&self) -> usize {
        self.sent
    }

    /// Parts announced.
    pub fn part_count(&self) -> usize {
        self.part_lens.len()
    }

    /// Waits for the node's answer once every part is sent: stored, or why not.
    pub fn finish(mut self) -> Result<(), ClientError> {
        if self.sent != self.part_lens.len() {
            return Err(ClientError::Invalid(format!("{} of {} parts sent", self.sent, self.part_lens.len())));
        }
        let header = self.connection.read_header(Opcode::Put, self.request_id)?;
        if header.status != Status::Ok {
            return Err(ClientError::from_status(header.status));
        }
        if header.count != 1 || header.body_len != RESPONSE_ITEM_BYTES as u64 {
            return Err(ClientError::Protocol(format!("{} replies to one put", header.count)));
        }
        let item = self.connection.read_item()?;
        if item.status == Status::Ok { Ok(()) } else { Err(ClientError::from_status(item.status)) }
    }
}

/// A byte range of a stored value: `(key, offset, length)`, for gathers and scatters.
pub type KeyRange<'a> = (&'a [u8], u32, u32);

/// What one key's reply said.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ItemReply {
    pub(crate) data_len: u32,
    pub(crate) object_len: u32,
    /// The reply's `data crc` field: the value's crc32c, or (LOCATE) the tiers that hold the object.
    pub(crate) data_crc: u32,
    /// How many replicas stored a put (1 on one node).
    pub(crate) stored: u32,
}

/// Where a key is stored on its node (LOCATE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    /// The value's length.
    pub len: u32,
    /// A copy is in the node's DRAM.
    pub in_dram: bool,
    /// A record is on the node's NVMe tier.
    pub on_nvme: bool,
}

/// A shard this client sends to, and its connection once open.
pub(crate) struct Peer {
    pub(crate) addr: SocketAddr,
    /// Its node's id in a cluster; empty for a client of one node.
    pub(crate) node: std::sync::Arc<str>,
    /// Its index among its node's shards, and how many its node has: a HELLO that says otherwise means
    /// the node is not the one this peer was learnt from.
    pub(crate) shard: u32,
    pub(crate) shard_count: u32,
    pub(crate) connection: Option<ShardConnection>,
    /// Its connection over the shard's Unix socket, once a shared buffer was used with it.
    pub(crate) local: Option<crate::shared::LocalConnection>,
    /// Its RDMA queue pair and the buffers registered with it, once an RDMA buffer was used with it.
    #[cfg(feature = "rdma")]
    pub(crate) rdma: Option<crate::rdma::RdmaPeer>,
}

impl Peer {
    pub(crate) fn new(addr: SocketAddr, node: std::sync::Arc<str>, shard: u32, shard_count: u32) -> Self {
        Peer {
            addr,
            node,
            shard,
            shard_count,
            connection: None,
            local: None,
            #[cfg(feature = "rdma")]
            rdma: None,
        }
    }
}

/// A client of one node, or of a cluster ([`Client::connect_cluster`]). Not `Sync`: use one per thread
/// (connections are cheap), or wrap it.
pub struct Client {
    pub(crate) options: ClientOptions,
    /// The first node's HELLO: its bounds hold for every node of a cluster.
    pub(crate) hello: HelloReply,
    /// Every shard this client sends to: the node's, or every serving node's in a cluster.
    pub(crate) peers: Vec<Peer>,
    /// Where keys live in a cluster; none: on one node's shards, by `shard_of`.
    pub(crate) cluster: Option<Box<crate::cluster::Routing>>,
    /// The cluster epoch every request frame carries (0: none, a client of one node).
    pub(crate) frame_epoch: u64,
    pub(crate) next_request_id: u64,
    /// This client's RDMA device and protection domain (`ClientOptions::rdma_device`), or why there is none.
    #[cfg(feature = "rdma")]
    pub(crate) rdma: Result<crate::rdma::ClientRdma, String>,
}

impl Client {
    /// Connects to the node at `addr` (any shard's port), learns its shard map and opens one connection per
    /// shard.
    pub fn connect(addr: impl ToSocketAddrs, options: ClientOptions) -> Result<Self, ClientError> {
        let addr = addr
            .to_socket_addrs()
            .map_err(|error| ClientError::Connection(error.to_string()))?
            .next()
            .ok_or_else(|| ClientError::Connection("the address resolves to nothing".into()))?;
        let (first, hello) = ShardConnection::open(addr, &options)?;
        let peers = (0..hello.shard_count)
            .map(|shard| {
                let addr = SocketAddr::new(addr.ip(), hello.base_port + shard as u16);
                Peer::new(addr, "".into(), shard, hello.shard_count)
            })
            .collect();
        let mut client = Self {
            #[cfg(feature = "rdma")]
            rdma: crate::rdma::ClientRdma::open(&options),
            options,
            hello,
            peers,
            cluster: None,
            frame_epoch: 0,
            next_request_id: 1,
        };
        client.peers[hello.shard_id as usize].connection = Some(first);
        for shard in 0..hello.shard_count {
            client.connection(shard as usize)?;
        }
        Ok(client)
    }

    /// A fresh request id.
    pub(crate) fn next_id(&mut self) -> u64 {
        self.next_request_id += 1;
        self.next_request_id
    }

    /// Shards this client reaches: the node's, or every serving node's in a cluster.
    pub fn shard_count(&self) -> u32 {
        self.peers.len() as u32
    }

    /// The node's bounds.
    pub fn limits(&self) -> Limits {
        self.hello.limits
    }

    /// Subscribes to the events for keys that start with `prefix` (all keys for `None`) of every shard
    /// this client reaches: one dedicated connection per shard, each read by a thread of its own (see
    /// [`EventStream`]), each event tagged with its node and shard. In a cluster it covers the nodes
    /// serving at the client's last call (or its connection): subscribe again when
    /// [`Client::cluster_epoch`] moves.
    pub fn subscribe_events(&self, prefix: Option<&[u8]>) -> Result<crate::EventStream, ClientError> {
        let sources: Vec<(SocketAddr, std::sync::Arc<str>, u32)> =
            self.peers.iter().map(|peer| (peer.addr, std::sync::Arc::clone(&peer.node), peer.shard)).collect();
        crate::EventStream::open(&sources, &self.options, prefix)
    }

    /// Peer `index`'s connection, opened (and checked against the shard map) if it is not open.
    pub(crate) fn connection(&mut self, index: usize) -> Result<&mut ShardConnection, ClientError> {
        let peer = self.peers.get_mut(index).ok_or_else(|| ClientError::Connection("no such shard".into()))?;
        if peer.connection.is_none() {
            let (connection, hello) = ShardConnection::open(peer.addr, &self.options)?;
            if hello.shard_count != peer.shard_count || hello.shard_id != peer.shard {
                return Err(ClientError::Protocol(format!("the shard map of {} changed", peer.addr)));
            }
            peer.connection = Some(connection);
        }
        peer.connection.as_mut().ok_or_else(|| ClientError::Connection("no connection".into()))
    }

    // ---- single keys --------------------------------------------------------------------------------

    /// Stores `value` under `key` with the node's default write policy; a key that is stored already is
    /// left as it is and answers [`ClientError::Exists`] (see [`Client::upsert`]).
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), ClientError> {
        self.put_with(key, value, PutOptions::default())
    }

    /// Stores `value` under `key`, replacing a stored version (readers of the old one finish with it).
    pub fn upsert(&mut self, key: &[u8], value: &[u8]) -> Result<(), ClientError> {
        self.put_with(key, value, PutOptions::upsert())
    }

    /// Stores `value` under `key` with `options` (write policy, upsert, pin).
    pub fn put_with(&mut self, key: &[u8], value: &[u8], options: PutOptions) -> Result<(), ClientError> {
        one(self.batch_put_with(&[(key, value)], options))
    }

    /// Stores `value` under `key`, naming its parent and/or group: when the parent leaves the node (evicted
    /// from its last tier, removed), so does this block and, in turn, its own children; a group leaves as a
    /// whole. Hard-pinned blocks stay.
    pub fn put_linked(
        &mut self,
        key: &[u8],
        value: &[u8],
        links: Links<'_>,
        options: PutOptions,
    ) -> Result<(), ClientError> {
        one(self.batch_put_blocks(&[BlockPut { key, parts: &[value], links }], options))
    }

    /// Starts a put of `key` whose value is sent part by part (`part_lens` bytes each, in order) as the parts
    /// become ready — a prefill's layers as they are computed. The node makes each part readable by
    /// [`Client::get_range_into`] as soon as it arrived and passed its checksum, so a reader of a key with
    /// no stored version waits for, and gets, the first layers before the last are sent; the key becomes
    /// visible to `get`, `exists` and prefix match when the put completes ([`ProgressivePut::finish`]).
    ///
    /// The put owns the shard's connection while it lasts (the client opens another if it needs the shard
    /// meanwhile); dropping it unfinished closes that connection and the node drops the partial object.
    pub fn put_progressive(
        &mut self,
        key: &[u8],
        part_lens: &[u32],
        links: Links<'_>,
        options: PutOptions,
    ) -> Result<ProgressivePut, ClientError> {
        let limits = self.hello.limits;
        let value_len: u64 = part_lens.iter().map(|&len| u64::from(len)).sum();
        if key.is_empty() || key.len() > limits.max_key_bytes as usize || !links.fits(limits.max_key_bytes) {
            return Err(ClientError::TooLarge(format!("key or name of 1..={} bytes expected", limits.max_key_bytes)));
        }
        let options = self.versioned(options);
        let version = options.version.map(|version| version.encode());
        let body_len = (REQUEST_ITEM_BYTES + key.len() + version.map_or(0, |version| version.len())) as u64
            + links.encoded_len() as u64
            + value_len
            + (part_lens.len() * PART_HEADER_BYTES) as u64;
        if value_len > limits.max_value_bytes || body_len > limits.max_put_body_bytes {
            return Err(ClientError::TooLarge(format!(
                "value of {value_len} bytes (bound {})",
                limits.max_value_bytes
            )));
        }
        if part_lens.is_empty() || part_lens.contains(&0) {
            return Err(ClientError::Invalid("a progressive put has at least one part, none empty".into()));
        }
        let peer = self.primary_peer(key)?;
        self.connection(peer)?;
        let mut connection =
            self.peers[peer].connection.take().ok_or_else(|| ClientError::Connection("no connection".into()))?;
        let request_id = self.next_id();
        let (flags, offset) = options.encode();
        let flags = flags | ITEM_PROGRESSIVE | if links.is_none() { 0 } else { ITEM_LINKS };
        FrameHeader::request(Opcode::Put, request_id, 1, body_len)
            .with_epoch(self.frame_epoch)
            .encode_into(&mut connection.output);
        RequestItemHeader { key_len: key.len() as u16, flags, value_len: value_len as u32, value_crc: 0, offset }
            .encode_into(&mut connection.output);
        let io = |error: std::io::Error| ClientError::from_io(&error);
        connection.send(key).map_err(io)?;
        if let Some(version) = &version {
            connection.output.extend_from_slice(version);
        }
        links.encode_into(&mut connection.output);
        connection.flush().map_err(io)?;
        Ok(ProgressivePut { connection, request_id, part_lens: part_lens.to_vec(), sent: 0 })
    }

    /// Stores one value sent from several buffers in order (e.g. one per layer) under `key`.
    pub fn put_parts(&mut self, key: &[u8], parts: &[&[u8]], options: PutOptions) -> Result<(), ClientError> {
        one(self.batch_put_parts(&[(key, parts)], options))
    }

    /// Reads `key`'s value into several buffers in order (e.g. one per layer), straight from the socket;
    /// returns the value's length. The buffers together must hold the value.
    pub fn get_into_parts(&mut self, key: &[u8], parts: &mut [&mut [u8]]) -> Result<usize, ClientError> {
        let mut per_key = [parts];
        one(self.batch_get_into_parts(&[key], &mut per_key))
    }

    /// How many leading keys of `chain` are stored: one frame to each shard that owns some of them, sent
    /// to all shards before any reply is read; each shard stops at its first miss.
    pub fn prefix_match(&mut self, chain: &[&[u8]]) -> Result<usize, ClientError> {
        one(self.batch_prefix_match(&[chain]))
    }

    /// Reads `key`'s value.
    pub fn get(&mut self, key: &[u8]) -> Result<Vec<u8>, ClientError> {
        one(self.batch_get(&[key]))
    }

    /// Reads `key`'s value into `buffer`, straight from the socket; returns its length.
    pub fn get_into(&mut self, key: &[u8], buffer: &mut [u8]) -> Result<usize, ClientError> {
        self.get_into_waiting(key, buffer, Duration::ZERO)
    }

    /// Reads `buffer.len()` bytes at `offset` of `key`'s value into `buffer`.
    pub fn get_range_into(&mut self, key: &[u8], offset: u32, buffer: &mut [u8]) -> Result<usize, ClientError> {
        self.get_range_into_waiting(key, offset, buffer, Duration::ZERO)
    }

    /// [`get_range_into`](Self::get_range_into) of a key that may not be stored yet: the node waits up to
    /// `wait` (at most 60 s, in whole milliseconds) for a put of it to commit or a progressive put of it to
    /// start (then for the range's bytes), and answers `NotFound` if none did. For a reader that knows a
    /// writer is about to send the key, e.g. a decode instance loading the layers a prefill instance is
    /// still computing, instead of retrying.
    pub fn get_range_into_waiting(
        &mut self,
        key: &[u8],
        offset: u32,
        buffer: &mut [u8],
        wait: Duration,
    ) -> Result<usize, ClientError> {
        let len = u32::try_from(buffer.len()).map_err(|_| ClientError::TooLarge("range over 4 GiB".into()))?;
        let wait_ms = self.wait_millis(wait)?;
        let items = [Item { range: (offset, len), wait_ms, ..Item::of(key) }];
        let mut buffers = [buffer];
        let replies = self.run(Opcode::GetRange, &items, PutOptions::default(), Sink::Buffers(&mut buffers));
        one(replies).map(|reply| reply.data_len as usize)
    }

    /// A read's wait in the protocol's milliseconds (a positive wait under 1 ms counts as 1). It must end
    /// before the connection's own timeout would give up on the reply.
    fn wait_millis(&self, wait: Duration) -> Result<u32, ClientError> {
        if wait.is_zero() {
            return Ok(0);
        }
        let millis = wait.as_millis().max(1);
        if millis > u128::from(MAX_ITEM_WAIT_MS) || wait >= self.options.timeout {
            return Err(ClientError::Invalid(format!(
                "a read waits less than the client's timeout ({:?}) and at most {MAX_ITEM_WAIT_MS} ms, not {wait:?}",
                self.options.timeout
            )));
        }
        Ok(millis as u32)
    }

    /// [`get_into`](Self::get_into) of a key that may not be stored yet, waiting for it as
    /// [`get_range_into_waiting`](Self::get_range_into_waiting) does (a progressive put: until it ends).
    pub fn get_into_waiting(&mut self, key: &[u8], buffer: &mut [u8], wait: Duration) -> Result<usize, ClientError> {
        let wait_ms = self.wait_millis(wait)?;
        let items = [Item { wait_ms, ..Item::of(key) }];
        let mut buffers = [buffer];
        let replies = self.run(Opcode::Get, &items, PutOptions::default(), Sink::Buffers(&mut buffers));
        one(replies).map(|reply| reply.data_len as usize)
    }

    /// Gathers byte ranges of several keys into one buffer, back to back in the order given (e.g. the KV
    /// head slices a decode rank needs from the shards of several prefill ranks): one GET_RANGE frame per
    /// shard, all in flight together. `destination` must be at least the sum of the lengths; a result per
    /// range (its length), so a failed range leaves its bytes of `destination` unspecified and the caller
    /// recomputes exactly that piece.
    pub fn gather_into(&mut self, ranges: &[KeyRange<'_>], destination: &mut [u8]) -> Vec<Result<usize, ClientError>> {
        self.gather_into_waiting(ranges, destination, Duration::ZERO)
    }

    /// [`gather_into`](Self::gather_into) from keys that may not be stored yet: each range waits up to
    /// `wait` for its key (see [`get_range_into_waiting`](Self::get_range_into_waiting)), and a shard waits
    /// for all of its ranges together, so the gather takes as long as the slowest key, not the sum.
    pub fn gather_into_waiting(
        &mut self,
        ranges: &[KeyRange<'_>],
        destination: &mut [u8],
        wait: Duration,
    ) -> Vec<Result<usize, ClientError>> {
        let wait_ms = match self.wait_millis(wait) {
            Ok(wait_ms) => wait_ms,
            Err(error) => return ranges.iter().map(|_| Err(error.clone())).collect(),
        };
        let total: u64 = ranges.iter().map(|range| u64::from(range.2)).sum();
        if total > destination.len() as u64 {
            let error = ClientError::BufferTooSmall { needed: total as usize, available: destination.len() };
            return ranges.iter().map(|_| Err(error.clone())).collect();
        }
        let items: Vec<Item<'_>> =
            ranges.iter().map(|&(key, offset, len)| Item { range: (offset, len), wait_ms, ..Item::of(key) }).collect();
        let mut buffers: Vec<&mut [u8]> = Vec::with_capacity(ranges.len());
        let mut rest = destination;
        for range in ranges {
            let (piece, tail) = rest.split_at_mut(range.2 as usize);
            buffers.push(piece);
            rest = tail;
        }
        self.run(Opcode::GetRange, &items, PutOptions::default(), Sink::Buffers(&mut buffers))
            .into_iter()
            .map(|result| result.map(|reply| reply.data_len as usize))
            .collect()
    }

    /// The matching scatter on write: stores consecutive pieces of `source` as whole values of the keys
    /// given, in order (`(key, length)`); a result per key.
    pub fn scatter_put(
        &mut self,
        source: &[u8],
        pieces: &[(&[u8], usize)],
        options: PutOptions,
    ) -> Vec<Result<(), ClientError>> {
        let total: usize = pieces.iter().map(|piece| piece.1).sum();
        if total > source.len() {
            let error = ClientError::BufferTooSmall { needed: total, available: source.len() };
            return pieces.iter().map(|_| Err(error.clone())).collect();
        }
        let mut items: Vec<(&[u8], &[u8])> = Vec::with_capacity(pieces.len());
        let mut at = 0;
        for &(key, len) in pieces {
            items.push((key, &source[at..at + len]));
            at += len;
        }
        self.batch_put_with(&items, options)
    }

    /// Whether `key` is stored.
    pub fn exists(&mut self, key: &[u8]) -> Result<bool, ClientError> {
        one(self.batch_exists(&[key]))
    }

    /// The length of `key`'s value.
    pub fn get_size(&mut self, key: &[u8]) -> Result<u64, ClientError> {
        let items = [Item::of(key)];
        one(self.run(Opcode::Exists, &items, PutOptions::default(), Sink::None))
            .map(|reply| u64::from(reply.object_len))
    }

    /// Removes `key`.
    pub fn remove(&mut self, key: &[u8]) -> Result<(), ClientError> {
        one(self.batch_remove(&[key]))
    }

    // ---- batches ------------------------------------------------------------------------------------

    /// Stores every `(key, value)` (stored keys answer [`ClientError::Exists`]); a result per key.
    pub fn batch_put(&mut self, items: &[(&[u8], &[u8])]) -> Vec<Result<(), ClientError>> {
        self.batch_put_with(items, PutOptions::default())
    }

    /// Stores every `(key, value)`, replacing stored versions; a result per key.
    pub fn batch_upsert(&mut self, items: &[(&[u8], &[u8])]) -> Vec<Result<(), ClientError>> {
        self.batch_put_with(items, PutOptions::upsert())
    }

    /// Stores every `(key, value)` with `options`; a result per key.
    pub fn batch_put_with(&mut self, items: &[(&[u8], &[u8])], options: PutOptions) -> Vec<Result<(), ClientError>> {
        self.batch_put_replicas(items, options).into_iter().map(|result| result.map(|_| ())).collect()
    }

    /// Stores every `(key, value)` with `options`; per key, how many replicas stored it (1 on one node). In
    /// a cluster a put succeeds once `min_replicas` of its replicas stored it or had it already (when none
    /// stored it, every one had it: [`ClientError::Exists`]).
    pub fn batch_put_replicas(
        &mut self,
        items: &[(&[u8], &[u8])],
        options: PutOptions,
    ) -> Vec<Result<usize, ClientError>> {
        let values: Vec<&[u8]> = items.iter().map(|(_, value)| *value).collect();
        let items: Vec<Item<'_>> = items
            .iter()
            .zip(&values)
            .map(|((key, _), value)| Item { value: std::slice::from_ref(value), ..Item::of(key) })
            .collect();
        self.run(Opcode::Put, &items, options, Sink::None)
            .into_iter()
            .map(|result| result.map(|reply| reply.stored as usize))
            .collect()
    }

    /// Stores every `(key, parts)`: each value sent from several buffers in order; a result per key.
    pub fn batch_put_parts(
        &mut self,
        items: &[(&[u8], &[&[u8]])],
        options: PutOptions,
    ) -> Vec<Result<(), ClientError>> {
        let items: Vec<Item<'_>> = items.iter().map(|(key, parts)| Item { value: parts, ..Item::of(key) }).collect();
        self.run(Opcode::Put, &items, options, Sink::None).into_iter().map(|result| result.map(|_| ())).collect()
    }

    /// Stores every block (value, parent, group) with `options`; a result per key. A serving engine's
    /// batch put after prefill: each block names the one before it in its chain.
    pub fn batch_put_blocks(&mut self, blocks: &[BlockPut<'_>], options: PutOptions) -> Vec<Result<(), ClientError>> {
        let items: Vec<Item<'_>> =
            blocks.iter().map(|block| Item { value: block.parts, links: block.links, ..Item::of(block.key) }).collect();
        self.run(Opcode::Put, &items, options, Sink::None).into_iter().map(|result| result.map(|_| ())).collect()
    }

    /// Reads every key into its list of buffers, filled in order; a result (the value's length) per key.
    pub fn batch_get_into_parts(
        &mut self,
        keys: &[&[u8]],
        parts: &mut [&mut [&mut [u8]]],
    ) -> Vec<Result<usize, ClientError>> {
        if parts.len() != keys.len() {
            return keys
                .iter()
                .map(|_| Err(ClientError::Invalid("one list of buffers per key is needed".into())))
                .collect();
        }
        let items = key_items(keys);
        self.run(Opcode::Get, &items, PutOptions::default(), Sink::Parts(parts))
            .into_iter()
            .map(|result| result.map(|reply| reply.data_len as usize))
            .collect()
    }

    /// How many leading keys of each chain are stored; a result per chain. One frame per shard carries the
    /// keys of every chain it owns, so the whole batch costs one round trip per shard.
    pub fn batch_prefix_match(&mut self, chains: &[&[&[u8]]]) -> Vec<Result<usize, ClientError>> {
        let mut items = Vec::with_capacity(chains.iter().map(|chain| chain.len()).sum());
        for (chain_index, chain) in chains.iter().enumerate() {
            for key in chain.iter() {
                items.push(Item { range: (chain_index as u32, 0), ..Item::of(key) });
            }
        }
        let replies = self.run(Opcode::PrefixMatch, &items, PutOptions::default(), Sink::None);
        let mut replies = replies.into_iter();
        chains
            .iter()
            .map(|chain| {
                let mut matched: Result<usize, ClientError> = Ok(0);
                let mut counting = true;
                for reply in replies.by_ref().take(chain.len()) {
                    if !counting {
                        continue;
                    }
                    match reply {
                        Ok(_) => matched = matched.map(|count| count + 1),
                        Err(ClientError::NotFound) => counting = false,
                        Err(error) => {
                            matched = Err(error);
                            counting = false;
                        }
                    }
                }
                matched
            })
            .collect()
    }

    /// Reads every key; a result per key (duplicates are each filled).
    pub fn batch_get(&mut self, keys: &[&[u8]]) -> Vec<Result<Vec<u8>, ClientError>> {
        let items = key_items(keys);
        let mut vectors: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
        let replies = self.run(Opcode::Get, &items, PutOptions::default(), Sink::Vectors(&mut vectors));
        replies
            .into_iter()
            .zip(vectors)
            .map(|(reply, vector)| reply.and_then(|_| vector.ok_or_else(|| ClientError::Protocol("no data".into()))))
            .collect()
    }

    /// Reads every key with the version it was upserted with (none: never upserted with one); a result per
    /// key. What a copy of a key to another node sends, so that the copy replaces only older versions.
    pub fn batch_get_versioned(&mut self, keys: &[&[u8]]) -> Vec<Result<VersionedValue, ClientError>> {
        let items: Vec<Item<'_>> =
            key_items(keys).into_iter().map(|item| Item { with_version: true, ..item }).collect();
        let mut vectors: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
        let replies = self.run(Opcode::Get, &items, PutOptions::default(), Sink::Vectors(&mut vectors));
        replies
            .into_iter()
            .zip(vectors)
            .map(|(reply, vector)| {
                let mut bytes = reply.and_then(|_| vector.ok_or_else(|| ClientError::Protocol("no data".into())))?;
                let version = Version::decode(&bytes)
                    .ok_or_else(|| ClientError::Protocol("a versioned read shorter than its version".into()))?;
                bytes.drain(..VERSION_BYTES);
                Ok((bytes, (version != Version::default()).then_some(version)))
            })
            .collect()
    }

    /// Reads every key into its buffer, straight from the socket; a result (the value's length) per key.
    pub fn batch_get_into(&mut self, keys: &[&[u8]], buffers: &mut [&mut [u8]]) -> Vec<Result<usize, ClientError>> {
        if buffers.len() != keys.len() {
            return keys.iter().map(|_| Err(ClientError::Invalid("one buffer per key is needed".into()))).collect();
        }
        let items = key_items(keys);
        self.run(Opcode::Get, &items, PutOptions::default(), Sink::Buffers(buffers))
            .into_iter()
            .map(|result| result.map(|reply| reply.data_len as usize))
            .collect()
    }

    /// Whether each key is stored; a result per key.
    pub fn batch_exists(&mut self, keys: &[&[u8]]) -> Vec<Result<bool, ClientError>> {
        self.run(Opcode::Exists, &key_items(keys), PutOptions::default(), Sink::None)
            .into_iter()
            .map(|result| match result {
                Ok(_) => Ok(true),
                Err(ClientError::NotFound) => Ok(false),
                Err(error) => Err(error),
            })
            .collect()
    }

    /// Where each key is stored: its value's length and the tiers that hold it; a result per key.
    pub fn batch_locate(&mut self, keys: &[&[u8]]) -> Vec<Result<Location, ClientError>> {
        self.run(Opcode::Locate, &key_items(keys), PutOptions::default(), Sink::None)
            .into_iter()
            .map(|result| {
                result.map(|reply| Location {
                    len: reply.object_len,
                    in_dram: reply.data_crc & strata_proto::LOCATED_IN_DRAM != 0,
                    on_nvme: reply.data_crc & strata_proto::LOCATED_ON_NVME != 0,
                })
            })
            .collect()
    }

    /// Removes every stored key that `pattern` (a regular expression, Rust `regex` syntax) matches
    /// anywhere; returns how many were removed. Sent to every shard (each scans its own objects: an
    /// administrative operation, linear in the node's objects).
    pub fn remove_matching(&mut self, pattern: &str) -> Result<u64, ClientError> {
        self.broadcast_removal(pattern.as_bytes(), 0)
    }

    /// Removes every stored key; returns how many.
    pub fn remove_all(&mut self) -> Result<u64, ClientError> {
        self.broadcast_removal(b"*", u32::from(strata_proto::ITEM_MATCH_ALL))
    }

    fn broadcast_removal(&mut self, pattern: &[u8], flags: u32) -> Result<u64, ClientError> {
        let items = [Item { range: (flags, 0), ..Item::of(pattern) }];
        self.sync_membership();
        let shards = self.peers.len();
        let one_send = [(0, 0)];
        let mut sent = Vec::with_capacity(shards);
        for shard in 0..shards {
            let request_id = self.next_id();
            let connection = self.connection(shard)?;
            let sending = send_frame(
                connection,
                (Opcode::RemoveMatching, 0),
                request_id,
                &items,
                (&one_send, &[0]),
                PutOptions::default(),
            );
            if let Err(error) = sending {
                self.peers[shard].connection = None;
                return Err(ClientError::from_io(&error));
            }
            sent.push(request_id);
        }
        let mut removed = 0u64;
        let mut first_error = None;
        for (shard, request_id) in sent.into_iter().enumerate() {
            let mut results = vec![Err(ClientError::Protocol("no reply".into()))];
            let received = self.receive(
                shard,
                Opcode::RemoveMatching,
                request_id,
                (&one_send, &[0]),
                &mut Sink::None,
                &mut results,
            );
            if let Err(error) = received {
                self.peers[shard].connection = None;
                first_error.get_or_insert(error);
                continue;
            }
            match results.pop() {
                Some(Ok(reply)) => removed += u64::from(reply.object_len),
                Some(Err(error)) => {
                    first_error.get_or_insert(error);
                }
                None => {}
            }
        }
        first_error.map_or(Ok(removed), Err)
    }

    /// Removes every key; a result per key.
    pub fn batch_remove(&mut self, keys: &[&[u8]]) -> Vec<Result<(), ClientError>> {
        self.run(Opcode::Remove, &key_items(keys), PutOptions::default(), Sink::None)
            .into_iter()
            .map(|result| result.map(|_| ()))
            .collect()
    }

    // ---- the one implementation ----------------------------------------------------------------------

    /// Sends every item to the shard that owns its key (in a cluster: to its replicas, see
    /// `cluster.rs`) and collects a reply per item.
    fn run(
        &mut self,
        opcode: Opcode,
        items: &[Item<'_>],
        options: PutOptions,
        mut sink: Sink<'_, '_, '_>,
    ) -> Vec<Result<ItemReply, ClientError>> {
        if self.cluster.is_some() {
            return self.run_in_cluster(opcode, items, options, &mut sink);
        }
        let shards = self.hello.shard_count;
        let sends: Vec<(usize, usize)> =
            items.iter().enumerate().map(|(index, item)| (index, shard_of(item.key, shards) as usize)).collect();
        self.exchange(opcode, items, &sends, options, &mut sink)
    }

    /// Sends each `(item, peer)` of `sends`, split into frames per peer (within the node's bounds), keeps
    /// one frame in flight per peer, and collects a reply per send.
    pub(crate) fn exchange(
        &mut self,
        opcode: Opcode,
        items: &[Item<'_>],
        sends: &[(usize, usize)],
        options: PutOptions,
        sink: &mut Sink<'_, '_, '_>,
    ) -> Vec<Result<ItemReply, ClientError>> {
        // An empty message does not allocate: a 1,000-key call should not make 1,000 strings it then drops.
        let mut results: Vec<Result<ItemReply, ClientError>> =
            (0..sends.len()).map(|_| Err(ClientError::Protocol(String::new()))).collect();
        let limits = self.hello.limits;
        let mut frames: Vec<std::collections::VecDeque<Vec<usize>>> = vec![Default::default(); self.peers.len()];
        let mut frame_bytes = vec![0u64; frames.len()];
        for (send, &(index, peer)) in sends.iter().enumerate() {
            let item = &items[index];
            if let Err(error) = item.check(&limits) {
                results[send] = Err(error);
                continue;
            }
            let bytes = (REQUEST_ITEM_BYTES + item.key.len() + item.links.encoded_len() + item.value_len()) as u64;
            let queue = &mut frames[peer];
            let full = queue.back().is_none_or(|frame| {
                frame.len() as u32 >= limits.max_batch_items
                    || (opcode == Opcode::Put && frame_bytes[peer] + bytes > limits.max_put_body_bytes)
            });
            if full {
                queue.push_back(Vec::new());
                frame_bytes[peer] = 0;
            }
            frame_bytes[peer] += bytes;
            if let Some(frame) = queue.back_mut() {
                frame.push(send);
            }
        }
        // Send the first frame of every peer, then read replies peer by peer, sending each peer's next
        // frame as soon as its previous reply is in.
        let mut in_flight: Vec<Option<(u64, Vec<usize>)>> = vec![None; frames.len()];
        let epoch = self.frame_epoch;
        let mut batch = Batch { opcode, epoch, items, sends, options, frames: &mut frames, in_flight: &mut in_flight };
        for peer in 0..batch.frames.len() {
            self.send_next(peer, &mut batch, &mut results);
        }
        loop {
            let mut progressed = false;
            for peer in 0..batch.frames.len() {
                let Some((request_id, indices)) = batch.in_flight[peer].take() else { continue };
                progressed = true;
                if let Err(error) = self.receive(peer, opcode, request_id, (sends, &indices), sink, &mut results) {
                    self.peers[peer].connection = None;
                    for &send in indices.iter().chain(batch.frames[peer].iter().flatten()) {
                        results[send] = Err(error.clone());
                    }
                    batch.frames[peer].clear();
                    continue;
                }
                self.send_next(peer, &mut batch, &mut results);
            }
            if !progressed {
                break;
            }
        }
        for result in &mut results {
            if matches!(result, Err(ClientError::Protocol(message)) if message.is_empty()) {
                *result = Err(ClientError::Protocol("no reply".into()));
            }
        }
        results
    }

    /// Sends `peer`'s next frame of `batch`; a frame that cannot be sent fails its items, and the next is
    /// tried on a new connection.
    fn send_next(&mut self, peer: usize, batch: &mut Batch<'_, '_>, results: &mut [Result<ItemReply, ClientError>]) {
        while let Some(indices) = batch.frames[peer].pop_front() {
            let request_id = self.next_id();
            let sent = self.connection(peer).and_then(|connection| {
                let frame = (batch.opcode, batch.epoch);
                send_frame(connection, frame, request_id, batch.items, (batch.sends, &indices), batch.options)
                    .map_err(|error| ClientError::from_io(&error))
            });
            match sent {
                Ok(()) => {
                    batch.in_flight[peer] = Some((request_id, indices));
                    return;
                }
                Err(error) => {
                    self.peers[peer].connection = None;
                    for &send in &indices {
                        results[send] = Err(error.clone());
                    }
                }
            }
        }
    }

    /// Reads the reply to the frame of `indices` (into `sends`) on `peer`: a result per send, values into
    /// the sink at their items' places.
    fn receive(
        &mut self,
        peer: usize,
        opcode: Opcode,
        request_id: u64,
        (sends, indices): (&[(usize, usize)], &[usize]),
        sink: &mut Sink<'_, '_, '_>,
        results: &mut [Result<ItemReply, ClientError>],
    ) -> Result<(), ClientError> {
        let verify = self.options.verify_checksums;
        let connection = self.connection(peer)?;
        let header = connection.read_header(opcode, request_id)?;
        if header.status != Status::Ok {
            return Err(ClientError::from_status(header.status));
        }
        if header.count as usize != indices.len() {
            return Err(ClientError::Protocol(format!("{} replies to {} items", header.count, indices.len())));
        }
        // A streamed reply (FRAME_STREAMED) gives no body length: each item's data is bounded by the
        // longest value the node stores instead.
        let streamed = header.flags & FRAME_STREAMED != 0;
        if streamed && header.body_len != 0 {
            return Err(ClientError::Protocol("a streamed reply with a body length".into()));
        }
        let longest_data = self.hello.limits.max_value_bytes + VERSION_BYTES as u64;
        let mut body_read = 0u64;
        for &send in indices {
            let index = sends[send].0;
            let connection = self.connection(peer)?;
            let item = connection.read_item()?;
            body_read += RESPONSE_ITEM_BYTES as u64 + u64::from(item.data_len);
            if streamed && u64::from(item.data_len) > longest_data {
                return Err(ClientError::Protocol(format!("a streamed reply item of {} bytes", item.data_len)));
            }
            if !streamed && body_read > header.body_len {
                return Err(ClientError::Protocol("reply items overrun the body".into()));
            }
            if item.status == Status::Moved {
                let epoch = u64::from(item.object_len) | u64::from(item.data_crc) << 32;
                results[send] = Err(ClientError::Moved { epoch });
                continue;
            }
            if item.status != Status::Ok {
                results[send] = Err(ClientError::from_status(item.status));
                continue;
            }
            let data_len = item.data_len as usize;
            let io = |error: std::io::Error| ClientError::from_io(&error);
            let received = match sink {
                Sink::None => {
                    if data_len != 0 {
                        return Err(ClientError::Protocol("data in a reply that carries none".into()));
                    }
                    None
                }
                Sink::Vectors(vectors) => {
                    let mut data = vec![0u8; data_len];
                    connection.reader.read_exact(&mut data).map_err(io)?;
                    let crc = strata_proto::crc32c(&data);
                    vectors[index] = Some(data);
                    Some(crc)
                }
                Sink::Buffers(buffers) => {
                    let buffer = &mut buffers[index];
                    if buffer.len() < data_len {
                        std::io::copy(&mut (&mut connection.reader).take(data_len as u64), &mut std::io::sink())
                            .map_err(io)?;
                        results[send] = Err(ClientError::BufferTooSmall { needed: data_len, available: buffer.len() });
                        continue;
                    }
                    connection.reader.read_exact(&mut buffer[..data_len]).map_err(io)?;
                    Some(if verify { strata_proto::crc32c(&buffer[..data_len]) } else { item.data_crc })
                }
                Sink::Parts(per_key) => {
                    let parts = &mut per_key[index];
                    let available: usize = parts.iter().map(|part| part.len()).sum();
                    if available < data_len {
                        std::io::copy(&mut (&mut connection.reader).take(data_len as u64), &mut std::io::sink())
                            .map_err(io)?;
                        results[send] = Err(ClientError::BufferTooSmall { needed: data_len, available });
                        continue;
                    }
                    let mut crc = 0u32;
                    let mut left = data_len;
                    for part in parts.iter_mut() {
                        let take = left.min(part.len());
                        connection.reader.read_exact(&mut part[..take]).map_err(io)?;
                        if verify {
                            crc = strata_proto::crc32c_append(crc, &part[..take]);
                        }
                        left -= take;
                        if left == 0 {
                            break;
                        }
                    }
                    Some(if verify { crc } else { item.data_crc })
                }
            };
            results[send] = match received {
                Some(crc) if verify && crc != item.data_crc => Err(ClientError::Checksum),
                _ => Ok(ItemReply {
                    data_len: item.data_len,
                    object_len: item.object_len,
                    data_crc: item.data_crc,
                    stored: 1,
                }),
            };
        }
        if !streamed && body_read != header.body_len {
            return Err(ClientError::Protocol("reply items do not fill the body".into()));
        }
        Ok(())
    }
}

fn key_items<'a>(keys: &[&'a [u8]]) -> Vec<Item<'a>> {
    keys.iter().map(|key| Item::of(key)).collect()
}

fn one<T>(mut results: Vec<Result<T, ClientError>>) -> Result<T, ClientError> {
    results.pop().unwrap_or_else(|| Err(ClientError::Protocol("no result".into())))
}

/// Sends one frame of `opcode`, carrying cluster epoch `epoch` (0: none), holding the items of `indices`
/// (into `sends`).
fn send_frame(
    connection: &mut ShardConnection,
    (opcode, epoch): (Opcode, u64),
    request_id: u64,
    items: &[Item<'_>],
    (sends, indices): (&[(usize, usize)], &[usize]),
    options: PutOptions,
) -> std::io::Result<()> {
    let version = options.version.map(|version| version.encode());
    let version_len = version.map_or(0, |version| version.len());
    let body_len: u64 = indices
        .iter()
        .map(|&send| {
            let item = &items[sends[send].0];
            (REQUEST_ITEM_BYTES + item.key.len()) as u64
                + if opcode == Opcode::Put {
                    (version_len + item.links.encoded_len() + item.value_len()) as u64
                } else {
                    0
                }
        })
        .sum();
    let mut head = Vec::with_capacity(FRAME_HEADER_BYTES);
    FrameHeader::request(opcode, request_id, indices.len() as u32, body_len).with_epoch(epoch).encode_into(&mut head);
    connection.send(&head)?;
    let (flags, put_offset) = options.encode();
    for &send in indices {
        let item = &items[sends[send].0];
        let header = match opcode {
            Opcode::Put => RequestItemHeader {
                key_len: item.key.len() as u16,
                flags: if item.links.is_none() { flags } else { flags | ITEM_LINKS },
                value_len: item.value_len() as u32,
                value_crc: item.value.iter().fold(0, |crc, part| strata_proto::crc32c_append(crc, part)),
                offset: put_offset,
            },
            // A waiting read carries its wait where a put carries its crc.
            Opcode::GetRange => RequestItemHeader {
                key_len: item.key.len() as u16,
                flags: if item.wait_ms == 0 { 0 } else { ITEM_WAIT },
                value_len: item.range.1,
                value_crc: item.wait_ms,
                offset: item.range.0,
            },
            Opcode::Get => RequestItemHeader {
                key_len: item.key.len() as u16,
                flags: if item.wait_ms == 0 { 0 } else { ITEM_WAIT }
                    | if item.with_version { ITEM_WITH_VERSION } else { 0 },
                value_crc: item.wait_ms,
                ..Default::default()
            },
            Opcode::PrefixMatch => {
                RequestItemHeader { key_len: item.key.len() as u16, offset: item.range.0, ..Default::default() }
            }
            Opcode::RemoveMatching => {
                RequestItemHeader { key_len: item.key.len() as u16, flags: item.range.0 as u16, ..Default::default() }
            }
            _ => RequestItemHeader { key_len: item.key.len() as u16, ..Default::default() },
        };
        // Item headers and keys are small: straight into the send buffer, no buffer of their own.
        header.encode_into(&mut connection.output);
        connection.send(item.key)?;
        if opcode == Opcode::Put {
            if let Some(version) = &version {
                connection.output.extend_from_slice(version);
            }
            item.links.encode_into(&mut connection.output);
            for part in item.value {
                connection.send(part)?;
            }
        }
    }
    connection.flush()
}
