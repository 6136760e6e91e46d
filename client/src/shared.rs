//! The shared-memory path, for a client on the node's host: values move between the node's DRAM and a
//! [`SharedBuffer`] by one copy on the node, with requests and replies (headers only) over each shard's
//! Unix socket.
//!
//! A [`SharedBuffer`] is a memfd this client allocated, sealed against shrinking and growing (the node
//! maps it, and a file that shrank under its mapping would fault it). It is registered with a shard the
//! first time a call sends one of its keys there, over a connection of its own to the shard's Unix socket
//! (the name the shard's HELLO gave), passing the memfd as `SCM_RIGHTS`. The node copies only into memory
//! a connection registered, and never shares its own.
//!
//! Where the path is not there (a node on another host, a cluster client, a node that runs without it,
//! [`ClientOptions::shared_memory`](crate::ClientOptions) off), the same calls move the same bytes over
//! TCP, into and out of the same buffer. Buffers the caller allocated itself always use TCP.
//!
//! Checksums stay end to end: a get's reply carries the value's stored crc32c, checked here over the bytes
//! the node copied; a put carries the crc32c computed here, checked by the node over its own copy.

use std::io::{BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use strata_proto::{
    FRAME_HEADER_BYTES, FrameHeader, HelloRequest, ITEM_SHARED, Opcode, PutOptions, REGISTER_RELEASE,
    REQUEST_ITEM_BYTES, RESPONSE_ITEM_BYTES, RequestItemHeader, ResponseItemHeader, SHARED_SPAN_BYTES, SharedSpan,
    Status, shard_of,
};

use crate::client::{Client, ClientOptions};
use crate::error::ClientError;

static NEXT_BUFFER_ID: AtomicU64 = AtomicU64::new(1);

/// Memory a node on this host can copy values into and out of directly: a sealed memfd, mapped here.
///
/// A shard maps a buffer the first time a call uses it, and keeps the mapping until the client releases it
/// ([`Client::release_shared`]) or the connection closes; a connection holds at most 64 buffers. Dropping
/// a buffer a node still maps is safe (the node's mapping keeps the memory), but holds one of those places.
pub struct SharedBuffer {
    memory: OwnedFd,
    base: NonNull<u8>,
    len: usize,
    /// Names the buffer among this process's, for the shards it is registered with.
    id: u64,
}

// SAFETY: the buffer owns its mapping and descriptor; moving it to another thread moves that ownership.
// Shared references only read (`as_slice`); writes need `&mut`.
#[allow(unsafe_code)]
unsafe impl Send for SharedBuffer {}
#[allow(unsafe_code)]
unsafe impl Sync for SharedBuffer {}

impl SharedBuffer {
    /// Allocates `len` bytes (zeroed, faulted in).
    pub fn new(len: usize) -> Result<Self, ClientError> {
        if len == 0 {
            return Err(ClientError::TooLarge("a shared buffer of 0 bytes".into()));
        }
        let failed = |what: &str| ClientError::Connection(format!("{what}: {}", std::io::Error::last_os_error()));
        // SAFETY: memfd_create takes a NUL-terminated name and flags; it returns a new descriptor or -1.
        #[allow(unsafe_code)]
        let fd = unsafe { libc::memfd_create(c"strata-buffer".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if fd < 0 {
            return Err(failed("memfd_create"));
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        #[allow(unsafe_code)]
        let memory = unsafe { OwnedFd::from_raw_fd(fd) };
        let file = std::fs::File::from(memory.try_clone().map_err(|error| ClientError::from_io(&error))?);
        file.set_len(len as u64).map_err(|error| ClientError::from_io(&error))?;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a descriptor this function owns; no memory is passed.
        #[allow(unsafe_code)]
        if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) } < 0 {
            return Err(failed("sealing the memfd"));
        }
        // SAFETY: a new shared mapping of the whole file, which the seals keep at `len` bytes.
        #[allow(unsafe_code)]
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(failed("mapping the memfd"));
        }
        let base = NonNull::new(base.cast::<u8>()).ok_or_else(|| failed("mapping the memfd"))?;
        Ok(Self { memory, base, len, id: NEXT_BUFFER_ID.fetch_add(1, Ordering::Relaxed) })
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never: buffers have at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is `len` bytes, valid for as long as `self`; writes need `&mut self`.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.base.as_ptr(), self.len)
        }
    }

    /// Its bytes, to write.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only reference.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(self.base.as_ptr(), self.len)
        }
    }

    /// The first byte's address (for bindings that hand the memory to numpy or torch).
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Disjoint mutable slices of `spans` (offset, length); `None` if two overlap or one runs past the end.
    ///
    /// # Safety
    /// Nothing else may reference the spans' bytes while the slices live.
    // The memory is the node's to write as much as this process's: `&self` hands out `&mut` only under
    // the caller's promise above, as `UnsafeCell` would.
    #[allow(unsafe_code, clippy::mut_from_ref)]
    unsafe fn split_mut(&self, spans: &[(usize, usize)]) -> Option<Vec<&mut [u8]>> {
        let mut order: Vec<usize> = (0..spans.len()).collect();
        order.sort_by_key(|&index| spans[index].0);
        let mut end = 0usize;
        for &index in &order {
            let (offset, len) = spans[index];
            if offset < end || offset.checked_add(len)? > self.len {
                return None;
            }
            end = offset + len;
        }
        // SAFETY: the spans lie within the mapping and do not overlap (checked above); the caller keeps
        // any other reference to them out for the slices' lifetime.
        Some(
            spans
                .iter()
                .map(|&(offset, len)| unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(offset), len) })
                .collect(),
        )
    }
}

impl Drop for SharedBuffer {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, unmapped once; a node that still maps the memfd keeps its own.
        #[allow(unsafe_code)]
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// How a call's values moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Copied by the node into or out of the shared buffer.
    SharedMemory,
    /// Over TCP.
    Tcp,
    /// Written or read by the node with RDMA, into or out of a registered buffer.
    Rdma,
}

/// A connection to one shard's Unix socket, and the buffers registered on it.
pub(crate) struct LocalConnection {
    writer: UnixStream,
    reader: BufReader<SpinningReader>,
    /// (buffer id, region id) of each buffer registered here.
    regions: Vec<(u64, u32)>,
    next_request_id: u64,
    /// The shard checks its gets' copies in this client's memory (its TCP HELLO said so).
    checked_copies: bool,
}

impl LocalConnection {
    /// Connects to the abstract socket `name` and says HELLO.
    fn open(name: &[u8], options: &ClientOptions, checked_copies: bool) -> Result<Self, ClientError> {
        use std::os::linux::net::SocketAddrExt;
        let io = |error: std::io::Error| ClientError::Connection(format!("the shard's Unix socket: {error}"));
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name).map_err(io)?;
        let writer = UnixStream::connect_addr(&addr).map_err(io)?;
        writer.set_read_timeout(Some(options.timeout)).map_err(io)?;
        writer.set_write_timeout(Some(options.timeout)).map_err(io)?;
        let stream = writer.try_clone().map_err(io)?;
        let reader = BufReader::with_capacity(64 << 10, SpinningReader { stream, spin: options.spin_before_block });
        let mut connection = Self { writer, reader, regions: Vec::new(), next_request_id: 1, checked_copies };
        let hello = HelloRequest {
            token: options.token.clone().unwrap_or_default(),
            offers_shared: false,
            offers_rdma: false,
            // Its replies carry no values (they are in the client's memory): nothing worth streaming.
            accepts_streamed: false,
            takes_checked_copies: false,
        };
        let mut frame = Vec::new();
        FrameHeader::request(Opcode::Hello, 0, 1, hello.encoded_len() as u64).encode_into(&mut frame);
        hello.encode_into(&mut frame);
        connection.writer.write_all(&frame).map_err(|error| ClientError::from_io(&error))?;
        let header = connection.read_header(Opcode::Hello, 0)?;
        // No offer was made here, so the reply is the 40 bytes alone.
        if header.body_len != strata_proto::HELLO_REPLY_BYTES as u64 {
            return Err(ClientError::Protocol(format!("HELLO reply of {} bytes", header.body_len)));
        }
        let mut body = [0u8; strata_proto::HELLO_REPLY_BYTES];
        connection.reader.read_exact(&mut body).map_err(|error| ClientError::from_io(&error))?;
        Ok(connection)
    }

    fn read_header(&mut self, opcode: Opcode, request_id: u64) -> Result<FrameHeader, ClientError> {
        let mut bytes = [0u8; FRAME_HEADER_BYTES];
        self.reader.read_exact(&mut bytes).map_err(|error| ClientError::from_io(&error))?;
        let header = FrameHeader::decode(&bytes).map_err(|error| ClientError::Protocol(error.to_string()))?;
        if header.status != Status::Ok {
            return Err(ClientError::from_status(header.status));
        }
        if header.request_id != request_id || header.opcode != opcode {
            return Err(ClientError::Protocol(format!("reply {} to request {request_id}", header.request_id)));
        }
        Ok(header)
    }

    /// Reads the reply to a frame of `count` items that carry no data.
    fn read_reply(
        &mut self,
        opcode: Opcode,
        request_id: u64,
        count: usize,
    ) -> Result<Vec<ResponseItemHeader>, ClientError> {
        let header = self.read_header(opcode, request_id)?;
        if header.count as usize != count || header.body_len != (count * RESPONSE_ITEM_BYTES) as u64 {
            return Err(ClientError::Protocol(format!(
                "{} replies ({} bytes) to {count} items",
                header.count, header.body_len
            )));
        }
        let mut items = Vec::with_capacity(count);
        let mut bytes = [0u8; RESPONSE_ITEM_BYTES];
        for _ in 0..count {
            self.reader.read_exact(&mut bytes).map_err(|error| ClientError::from_io(&error))?;
            let item = ResponseItemHeader::decode(&bytes).map_err(|error| ClientError::Protocol(error.to_string()))?;
            if item.data_len != 0 {
                return Err(ClientError::Protocol("data in the reply to a shared item".into()));
            }
            items.push(item);
        }
        Ok(items)
    }

    fn request_id(&mut self) -> u64 {
        self.next_request_id += 1;
        self.next_request_id
    }

    /// The region `buffer` is on this connection, registering it first if it is not.
    fn region(&mut self, buffer: &SharedBuffer) -> Result<u32, ClientError> {
        if let Some(&(_, region)) = self.regions.iter().find(|(id, _)| *id == buffer.id) {
            return Ok(region);
        }
        let request_id = self.request_id();
        let frame = register_frame(request_id, RequestItemHeader { key_len: 1, ..Default::default() });
        send_with_descriptor(&self.writer, &frame, buffer.memory.as_raw_fd())
            .map_err(|error| ClientError::from_io(&error))?;
        let answer = self.read_reply(Opcode::Register, request_id, 1)?[0];
        if answer.status != Status::Ok {
            return Err(ClientError::from_status(answer.status));
        }
        self.regions.push((buffer.id, answer.object_len));
        Ok(answer.object_len)
    }

    /// Releases the region of buffer `id`, if it has one here.
    fn release(&mut self, id: u64) -> Result<(), ClientError> {
        let Some(at) = self.regions.iter().position(|(buffer, _)| *buffer == id) else { return Ok(()) };
        let (_, region) = self.regions.remove(at);
        let request_id = self.request_id();
        let release = RequestItemHeader { key_len: 1, flags: REGISTER_RELEASE, offset: region, ..Default::default() };
        let frame = register_frame(request_id, release);
        self.writer.write_all(&frame).map_err(|error| ClientError::from_io(&error))?;
        self.read_reply(Opcode::Register, request_id, 1).map(|_| ())
    }
}

/// The read side of a local connection: with a spin, non-blocking receives (`MSG_DONTWAIT`, which leaves
/// the socket, shared with the writer, blocking) for that long before a blocking read, as `SpinReader`
/// does over TCP.
struct SpinningReader {
    stream: UnixStream,
    spin: Option<std::time::Duration>,
}

impl Read for SpinningReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let Some(spin) = self.spin else { return self.stream.read(buf) };
        let fd = self.stream.as_raw_fd();
        let polled = crate::client::spin_for(spin, || {
            // SAFETY: recv(2) writes at most `buf.len()` bytes into `buf`.
            #[allow(unsafe_code)]
            let read = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            if read >= 0 {
                return Some(Ok(read as usize));
            }
            let error = std::io::Error::last_os_error();
            (error.kind() != std::io::ErrorKind::WouldBlock).then_some(Err(error))
        });
        if let Some(result) = polled {
            return result;
        }
        self.stream.read(buf)
    }
}

/// A REGISTER frame of one item, `item`, with the one-byte key nobody reads.
fn register_frame(request_id: u64, item: RequestItemHeader) -> Vec<u8> {
    let mut frame = Vec::with_capacity(FRAME_HEADER_BYTES + REQUEST_ITEM_BYTES + 1);
    FrameHeader::request(Opcode::Register, request_id, 1, REQUEST_ITEM_BYTES as u64 + 1).encode_into(&mut frame);
    item.encode_into(&mut frame);
    frame.push(b'*');
    frame
}

/// Sends `bytes` with `fd` attached (`SCM_RIGHTS`): the node receives the descriptor with the frame.
fn send_with_descriptor(socket: &UnixStream, bytes: &[u8], fd: std::os::fd::RawFd) -> std::io::Result<()> {
    let mut control = [0u64; 4];
    let mut iov = libc::iovec { iov_base: bytes.as_ptr().cast_mut().cast(), iov_len: bytes.len() };
    // SAFETY: an all-zero msghdr is valid; the fields set below point at `iov`, `bytes` and `control`,
    // which outlive the call, and the control message is written within `control` (CMSG_SPACE of one
    // descriptor is 24 bytes).
    #[allow(unsafe_code)]
    let sent = unsafe {
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) as usize;
        let header = libc::CMSG_FIRSTHDR(&message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as usize;
        libc::CMSG_DATA(header).cast::<libc::c_int>().write_unaligned(fd);
        libc::sendmsg(socket.as_raw_fd(), &message, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // The rest (a frame is small; a stream socket may still take it in two sends).
    let sent = sent as usize;
    if sent < bytes.len() {
        let mut writer = socket;
        writer.write_all(&bytes[sent..])?;
    }
    Ok(())
}

/// The keys of a put, the memory their values lie in, and each value's span there.
pub(crate) type InPlaceValues<'a, 'k> = (&'a [&'k [u8]], &'a [u8], &'a [(usize, usize)]);

/// The keys of a call, their spans, and the indices (into both) of one frame's items.
pub(crate) type SharedItems<'a, 'k> = (&'a [&'k [u8]], &'a [(usize, usize)], &'a [usize]);

impl Client {
    /// How this client moves the values of a [`SharedBuffer`]: through shared memory when every shard of
    /// its node offered the path (a node on this host, a client of one node), else over TCP.
    pub fn shared_transport(&mut self) -> Transport {
        if self.cluster.is_some() || !self.options.shared_memory {
            return Transport::Tcp;
        }
        let reached = (0..self.peers.len()).all(|peer| self.local_connection(peer));
        if reached { Transport::SharedMemory } else { Transport::Tcp }
    }

    /// Whether `peer`'s Unix socket is open, opening it if its HELLO offered one. A socket that cannot be
    /// opened (a peer that looked local and is not, say) is forgotten: this client then uses TCP there.
    fn local_connection(&mut self, peer: usize) -> bool {
        if self.peers[peer].local.is_some() {
            return true;
        }
        let Ok(connection) = self.connection(peer) else { return false };
        let (Some(name), checked_copies) = (connection.local_socket.clone(), connection.checked_copies) else {
            return false;
        };
        match LocalConnection::open(&name, &self.options, checked_copies) {
            Ok(local) => {
                self.peers[peer].local = Some(local);
                true
            }
            Err(_) => {
                if let Some(connection) = self.peers[peer].connection.as_mut() {
                    connection.local_socket = None;
                }
                false
            }
        }
    }

    /// Reads the values of `keys` into `buffer`, each at its span (offset, length): the bytes read, or
    /// why not (`BufferTooSmall` when a value is longer than its span). Spans must not overlap.
    pub fn batch_get_into_shared(
        &mut self,
        keys: &[&[u8]],
        buffer: &mut SharedBuffer,
        spans: &[(usize, usize)],
    ) -> Vec<Result<usize, ClientError>> {
        // SAFETY: `&mut` keeps every other reference to the buffer's bytes out while the call runs.
        #[allow(unsafe_code)]
        unsafe {
            self.batch_get_into_shared_unchecked(keys, buffer, spans)
        }
    }

    /// [`Client::batch_get_into_shared`] through a shared reference, for bindings whose callers hold the
    /// buffer's memory themselves (Python's `alloc_buffer`).
    ///
    /// # Safety
    /// No reference to the bytes of `spans` may be alive, and nothing else may read or write them, while
    /// the call runs: the node (or this call, over TCP) writes them.
    #[allow(unsafe_code)]
    pub unsafe fn batch_get_into_shared_unchecked(
        &mut self,
        keys: &[&[u8]],
        buffer: &SharedBuffer,
        spans: &[(usize, usize)],
    ) -> Vec<Result<usize, ClientError>> {
        let failed = |why: &str| keys.iter().map(|_| Err(ClientError::Protocol(why.into()))).collect();
        if keys.len() != spans.len() {
            return failed("a span per key expected");
        }
        // SAFETY: the caller hands the spans' bytes to this call (this function's contract).
        let Some(mut slices) = (unsafe { buffer.split_mut(spans) }) else {
            return failed("spans overlap or run past the buffer");
        };
        if self.shared_transport() == Transport::Tcp {
            return self.batch_get_into(keys, &mut slices);
        }
        let replies = self.shared_exchange(keys, spans, |client, peer, chunk| {
            client.local_frame(peer, Opcode::Get, (keys, spans, chunk), buffer, None)
        });
        // A node that checks its copies in this memory has done this client's pass (`HELLO_CHECKED_COPIES`).
        let checked = self.peers.iter().all(|peer| peer.local.as_ref().is_some_and(|local| local.checked_copies));
        received_in_place(replies, slices, self.options.verify_checksums && !checked)
    }

    /// Stores the values at `spans` (offset, length) of `buffer` under `keys`.
    pub fn batch_put_from_shared(
        &mut self,
        keys: &[&[u8]],
        buffer: &SharedBuffer,
        spans: &[(usize, usize)],
        options: PutOptions,
    ) -> Vec<Result<(), ClientError>> {
        let in_place = |client: &mut Client| client.shared_transport() == Transport::SharedMemory;
        self.put_in_place((keys, buffer.as_slice(), spans), options, in_place, |client, peer, chunk| {
            client.local_frame(peer, Opcode::Put, (keys, spans, chunk), buffer, Some(options))
        })
    }

    /// Stores the values at `spans` (offset, length) of `values` under `keys`: in place, one frame (`frame`)
    /// per shard's share, when `in_place` says the transport moves them so; else over TCP.
    pub(crate) fn put_in_place(
        &mut self,
        (keys, values, spans): InPlaceValues<'_, '_>,
        options: PutOptions,
        in_place: impl FnOnce(&mut Client) -> bool,
        frame: impl FnMut(&mut Client, usize, &[usize]) -> Result<Vec<ResponseItemHeader>, ClientError>,
    ) -> Vec<Result<(), ClientError>> {
        let in_buffer =
            spans.iter().all(|&(offset, len)| offset.checked_add(len).is_some_and(|end| end <= values.len()));
        if keys.len() != spans.len() || !in_buffer {
            return keys
                .iter()
                .map(|_| Err(ClientError::Protocol("a span within the buffer per key expected".into())))
                .collect();
        }
        if !in_place(self) {
            let items: Vec<(&[u8], &[u8])> =
                keys.iter().zip(spans).map(|(key, &(offset, len))| (*key, &values[offset..offset + len])).collect();
            return self.batch_put_with(&items, options);
        }
        stored_in_place(self.shared_exchange(keys, spans, frame))
    }

    /// Forgets `buffer` on every shard it was registered with (the node unmaps it). Dropping the buffer
    /// without this is safe: the node keeps its mapping until the connection closes.
    pub fn release_shared(&mut self, buffer: &SharedBuffer) -> Result<(), ClientError> {
        for peer in &mut self.peers {
            if let Some(local) = peer.local.as_mut() {
                local.release(buffer.id)?;
            }
        }
        Ok(())
    }

    /// Sends the shared items of `keys` to their shards, one frame (`frame`: the client, the peer, the items'
    /// indices) at a time within the node's bounds, and collects a reply per key.
    pub(crate) fn shared_exchange(
        &mut self,
        keys: &[&[u8]],
        spans: &[(usize, usize)],
        mut frame: impl FnMut(&mut Client, usize, &[usize]) -> Result<Vec<ResponseItemHeader>, ClientError>,
    ) -> Vec<Result<ResponseItemHeader, ClientError>> {
        let mut results: Vec<Result<ResponseItemHeader, ClientError>> =
            keys.iter().map(|_| Err(ClientError::Protocol("no reply".into()))).collect();
        let shards = self.hello.shard_count;
        let max_items = self.hello.limits.max_batch_items.max(1) as usize;
        let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); self.peers.len()];
        for (index, key) in keys.iter().enumerate() {
            if key.is_empty() || key.len() > self.hello.limits.max_key_bytes as usize {
                results[index] = Err(ClientError::TooLarge(format!("key of {} bytes", key.len())));
            } else if spans[index].1 > u32::MAX as usize {
                results[index] = Err(ClientError::TooLarge(format!("a span of {} bytes", spans[index].1)));
            } else {
                by_shard[shard_of(key, shards) as usize].push(index);
            }
        }
        for (peer, indices) in by_shard.iter().enumerate() {
            for chunk in indices.chunks(max_items) {
                match frame(self, peer, chunk) {
                    Ok(answers) => {
                        for (&index, answer) in chunk.iter().zip(answers) {
                            results[index] = Ok(answer);
                        }
                    }
                    Err(error) => {
                        for &index in chunk {
                            results[index] = Err(error.clone());
                        }
                    }
                }
            }
        }
        results
    }

    /// One frame of shared items (`chunk`, into `keys` and `spans`) to `peer`'s Unix socket, and its reply.
    fn local_frame(
        &mut self,
        peer: usize,
        opcode: Opcode,
        (keys, spans, chunk): SharedItems<'_, '_>,
        buffer: &SharedBuffer,
        put: Option<PutOptions>,
    ) -> Result<Vec<ResponseItemHeader>, ClientError> {
        if !self.local_connection(peer) {
            return Err(ClientError::Connection("the shard's Unix socket cannot be reached".into()));
        }
        let local = self.peers[peer].local.as_mut().ok_or_else(|| ClientError::Connection("no connection".into()))?;
        let answers = local.region(buffer).and_then(|region| {
            let request_id = local.request_id();
            let frame = shared_frame(opcode, request_id, (keys, spans, chunk), (region, buffer.as_slice()), put);
            local.writer.write_all(&frame).map_err(|error| ClientError::from_io(&error))?;
            local.read_reply(opcode, request_id, chunk.len())
        });
        if answers.is_err() {
            self.peers[peer].local = None;
        }
        answers
    }
}

/// A frame of shared items (`chunk`, into `keys` and `spans`) naming region `region`, whose bytes (`values`)
/// a put's crcs are taken over.
pub(crate) fn shared_frame(
    opcode: Opcode,
    request_id: u64,
    (keys, spans, chunk): SharedItems<'_, '_>,
    (region, values): (u32, &[u8]),
    put: Option<PutOptions>,
) -> Vec<u8> {
    let (put_flags, put_offset) = put.map_or((0, 0), |options| options.encode());
    let version = put.and_then(|options| options.version).map(|version| version.encode());
    let version_len = version.map_or(0, |version| version.len());
    let body_len: usize =
        chunk.iter().map(|&index| REQUEST_ITEM_BYTES + keys[index].len() + version_len + SHARED_SPAN_BYTES).sum();
    let mut frame = Vec::with_capacity(FRAME_HEADER_BYTES + body_len);
    FrameHeader::request(opcode, request_id, chunk.len() as u32, body_len as u64).encode_into(&mut frame);
    for &index in chunk {
        let (key, (offset, len)) = (keys[index], spans[index]);
        let header = match put {
            // A get's spans are not read here: the caller handed them to the node to write.
            Some(_) => RequestItemHeader {
                key_len: key.len() as u16,
                flags: put_flags | ITEM_SHARED,
                value_len: len as u32,
                value_crc: strata_proto::crc32c(&values[offset..offset + len]),
                offset: put_offset,
            },
            None => RequestItemHeader { key_len: key.len() as u16, flags: ITEM_SHARED, ..Default::default() },
        };
        header.encode_into(&mut frame);
        frame.extend_from_slice(key);
        if let Some(version) = &version {
            frame.extend_from_slice(version);
        }
        SharedSpan { region, len: len as u32, offset: offset as u64 }.encode_into(&mut frame);
    }
    frame
}

/// The results of gets whose values the node moved into `slices` (one per key): the bytes, checked against
/// the reply's crc32c when `verify`, or why not.
pub(crate) fn received_in_place(
    replies: Vec<Result<ResponseItemHeader, ClientError>>,
    slices: Vec<&mut [u8]>,
    verify: bool,
) -> Vec<Result<usize, ClientError>> {
    replies
        .into_iter()
        .zip(slices)
        .map(|(reply, slice)| {
            let item = reply?;
            match item.status {
                Status::Ok if item.object_len as usize <= slice.len() => {
                    let bytes = &slice[..item.object_len as usize];
                    if verify && strata_proto::crc32c(bytes) != item.data_crc {
                        return Err(ClientError::Checksum);
                    }
                    Ok(item.object_len as usize)
                }
                Status::Ok => Err(ClientError::Protocol("a shared get moved past its span".into())),
                Status::TooLarge => {
                    Err(ClientError::BufferTooSmall { needed: item.object_len as usize, available: slice.len() })
                }
                status => Err(ClientError::from_status(status)),
            }
        })
        .collect()
}

/// The results of puts whose values the node took from the caller's memory.
pub(crate) fn stored_in_place(replies: Vec<Result<ResponseItemHeader, ClientError>>) -> Vec<Result<(), ClientError>> {
    replies
        .into_iter()
        .map(|reply| match reply?.status {
            Status::Ok => Ok(()),
            status => Err(ClientError::from_status(status)),
        })
        .collect()
}
