//! Values moved by RDMA (feature `rdma`): the client registers an [`RdmaBuffer`] for remote read and write,
//! and the node RDMA-WRITEs a get's value into it and RDMA-READs a put's value out of it. Requests and
//! replies go over the shard's TCP connection, as items with a span (docs/PROTOCOL.md, "RDMA").
//!
//! Each shard's queue pair is connected at the first RDMA call that reaches the shard: RDMA_CONNECT
//! carries this side's endpoint and brings back the node's. A buffer is registered with a shard at its
//! first use there (REGISTER with `REGISTER_REMOTE`: its address, length and remote key). The client's
//! protection domain holds its buffers and its queue pairs only, so a node's queue pair reaches this
//! client's buffers and nothing else of the process.
//!
//! The client never waits for a completion: the node completes its RDMA before it replies, and the reply
//! on the TCP connection is the signal.

use std::sync::atomic::{AtomicU64, Ordering};

use strata_proto::{
    Opcode, PutOptions, REGISTER_RELEASE, REGISTER_REMOTE, RequestItemHeader, ResponseItemHeader, Status,
};
use strata_transfer::Endpoint;
use strata_transfer::verbs::{
    Access, CompletionQueue, Device, MemoryRegion, ProtectionDomain, QueuePair, QueuePairOptions, RegisteredBuffer,
};

use crate::client::Client;
use crate::error::ClientError;
use crate::shared::{Transport, received_in_place, shared_frame};

/// A client's RDMA device and protection domain.
pub(crate) struct ClientRdma {
    device: Device,
    domain: ProtectionDomain,
}

impl ClientRdma {
    /// The device `options` names, or why there is none.
    pub(crate) fn open(options: &crate::ClientOptions) -> Result<ClientRdma, String> {
        let Some(name) = options.rdma_device.as_deref() else { return Err("no RDMA device was named".into()) };
        let device = Device::open(name).map_err(|error| error.to_string())?;
        let domain = ProtectionDomain::new(&device).map_err(|error| error.to_string())?;
        Ok(ClientRdma { device, domain })
    }
}

/// One shard's queue pair, and the buffers registered with it.
pub(crate) struct RdmaPeer {
    /// Kept open for the node's requests; this side posts nothing on it.
    _pair: QueuePair,
    _completions: CompletionQueue,
    /// (buffer id, region id) of each buffer registered here.
    regions: Vec<(u64, u32)>,
}

/// Memory registered for the node to RDMA-READ and -WRITE: allocated by this handle (page-aligned,
/// zeroed; [`Client::rdma_buffer`]), or the caller's own ([`Client::register_rdma_memory`]: an engine's KV
/// cache, which the node then reads and writes in place). The registration is per client; it ends when
/// the buffer is dropped, after which a node's access to it fails (its connection's later RDMA items then
/// fail too): release it first ([`Client::release_rdma`]) to keep them working.
pub struct RdmaBuffer {
    memory: Memory,
    id: u64,
}

enum Memory {
    Owned(RegisteredBuffer),
    /// The caller's memory: its registration, its first byte and its length.
    Borrowed(MemoryRegion, std::ptr::NonNull<u8>, usize),
}

// SAFETY: the borrowed memory is the caller's, who promised (`register_rdma_memory`) that it stays valid
// for the buffer's life; the handle moves between threads like any owner of a pointer to it.
#[allow(unsafe_code)]
unsafe impl Send for Memory {}

static NEXT_BUFFER_ID: AtomicU64 = AtomicU64::new(1);

impl RdmaBuffer {
    /// Bytes.
    pub fn len(&self) -> usize {
        match &self.memory {
            Memory::Owned(buffer) => buffer.as_slice().len(),
            Memory::Borrowed(_, _, len) => *len,
        }
    }

    /// Whether it is empty (never: at least one byte is allocated).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes, to read (a value a get moved in is there once the call returns).
    pub fn as_slice(&self) -> &[u8] {
        match &self.memory {
            Memory::Owned(buffer) => buffer.as_slice(),
            // SAFETY: `len` bytes the caller keeps valid for the buffer's life (`register_rdma_memory`).
            #[allow(unsafe_code)]
            Memory::Borrowed(_, start, len) => unsafe { std::slice::from_raw_parts(start.as_ptr(), *len) },
        }
    }

    /// The bytes, to write (a put's value goes here before the call).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.memory {
            Memory::Owned(buffer) => buffer.as_mut_slice(),
            // SAFETY: as `as_slice`, with `&mut self` for exclusive access through this handle.
            #[allow(unsafe_code)]
            Memory::Borrowed(_, start, len) => unsafe { std::slice::from_raw_parts_mut(start.as_ptr(), *len) },
        }
    }

    fn region(&self) -> &MemoryRegion {
        match &self.memory {
            Memory::Owned(buffer) => buffer.region(),
            Memory::Borrowed(region, _, _) => region,
        }
    }
}

impl Client {
    /// A buffer of `len` bytes registered with this client's RDMA device.
    pub fn rdma_buffer(&mut self, len: usize) -> Result<RdmaBuffer, ClientError> {
        let rdma = self.rdma.as_ref().map_err(|why| ClientError::Connection(format!("no RDMA: {why}")))?;
        let memory = RegisteredBuffer::new(&rdma.domain, len, Access::RemoteReadWrite)
            .map_err(|error| ClientError::Connection(error.to_string()))?;
        Ok(RdmaBuffer { memory: Memory::Owned(memory), id: NEXT_BUFFER_ID.fetch_add(1, Ordering::Relaxed) })
    }

    /// Registers `len` bytes of the caller's memory at `start` with this client's RDMA device, for gets
    /// the node writes straight into it and puts it reads straight out of it (Mooncake's
    /// `register_buffer`, with no copy on this side).
    ///
    /// # Safety
    /// The memory must stay allocated while the returned buffer lives, and nothing may rely on the bytes of
    /// a span while a call that names it runs (the node writes a get's spans).
    #[allow(unsafe_code)]
    pub unsafe fn register_rdma_memory(&mut self, start: *mut u8, len: usize) -> Result<RdmaBuffer, ClientError> {
        let rdma = self.rdma.as_ref().map_err(|why| ClientError::Connection(format!("no RDMA: {why}")))?;
        let start = std::ptr::NonNull::new(start).ok_or_else(|| ClientError::Invalid("a null address".into()))?;
        if len == 0 {
            return Err(ClientError::Invalid("an empty buffer".into()));
        }
        // SAFETY: the caller keeps the memory allocated for the buffer's life, which holds the registration.
        let region = unsafe { MemoryRegion::register(&rdma.domain, start.as_ptr(), len, Access::RemoteReadWrite) }
            .map_err(|error| ClientError::Connection(error.to_string()))?;
        Ok(RdmaBuffer {
            memory: Memory::Borrowed(region, start, len),
            id: NEXT_BUFFER_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// How this client moves the values of an [`RdmaBuffer`]: by RDMA when it has a device and every shard
    /// of its node connected a queue pair, else over TCP (the reason is in [`Client::rdma_unavailable`]).
    pub fn rdma_transport(&mut self) -> Transport {
        let connected = self.rdma.is_ok() && (0..self.peers.len()).all(|peer| self.rdma_peer(peer).is_ok());
        if connected { Transport::Rdma } else { Transport::Tcp }
    }

    /// Why [`Client::rdma_transport`] is TCP, if it is.
    pub fn rdma_unavailable(&mut self) -> Option<String> {
        if let Err(why) = &self.rdma {
            return Some(why.clone());
        }
        (0..self.peers.len()).find_map(|peer| self.rdma_peer(peer).err().map(|error| error.to_string()))
    }

    /// `peer`'s queue pair, connected first if it is not.
    fn rdma_peer(&mut self, peer: usize) -> Result<&mut RdmaPeer, ClientError> {
        if self.peers[peer].rdma.is_some() {
            return self.peers[peer].rdma.as_mut().ok_or_else(|| ClientError::Connection("no queue pair".into()));
        }
        let rdma = self.rdma.as_ref().map_err(|why| ClientError::Connection(format!("no RDMA: {why}")))?;
        let failed = |error: strata_transfer::TransferError| ClientError::Connection(error.to_string());
        let completions = CompletionQueue::new(&rdma.device, 4).map_err(failed)?;
        let options = QueuePairOptions { send_queue_depth: 1, remote_access: true, ..QueuePairOptions::default() };
        let pair = QueuePair::new(&rdma.domain, &completions, options).map_err(failed)?;
        let request_id = self.next_id();
        let connection = self.connection(peer)?;
        if !connection.rdma_offered {
            return Err(ClientError::Connection("the node offers no RDMA (started without --rdma-device?)".into()));
        }
        let endpoint = pair.endpoint().encode();
        let item = (RequestItemHeader::default(), &endpoint[..]);
        let (answer, data) = connection.ask_one_keyed(Opcode::RdmaConnect, request_id, item, 64)?;
        if answer.status != Status::Ok {
            return Err(ClientError::from_status(answer.status));
        }
        let node = Endpoint::decode(&data).map_err(|error| ClientError::Protocol(error.to_string()))?;
        pair.connect(&node).map_err(failed)?;
        Ok(self.peers[peer].rdma.insert(RdmaPeer { _pair: pair, _completions: completions, regions: Vec::new() }))
    }

    /// The region `buffer` is with `peer`, registering it there first if it is not.
    fn rdma_region(&mut self, peer: usize, buffer: &RdmaBuffer) -> Result<u32, ClientError> {
        if let Some(&(_, region)) = self.rdma_peer(peer)?.regions.iter().find(|(id, _)| *id == buffer.id) {
            return Ok(region);
        }
        let length =
            u32::try_from(buffer.len()).map_err(|_| ClientError::TooLarge("an RDMA buffer past 4 GiB".into()))?;
        let span = buffer.region().remote_span(0, length).map_err(|error| ClientError::Invalid(error.to_string()))?;
        let request_id = self.next_id();
        let item = (RequestItemHeader { flags: REGISTER_REMOTE, ..Default::default() }, &span.encode()[..]);
        let (answer, _) = self.connection(peer)?.ask_one_keyed(Opcode::Register, request_id, item, 0)?;
        if answer.status != Status::Ok {
            return Err(ClientError::from_status(answer.status));
        }
        self.rdma_peer(peer)?.regions.push((buffer.id, answer.object_len));
        Ok(answer.object_len)
    }

    /// Reads the values of `keys` into `buffer`, each at its span (offset, length): the bytes read, or why
    /// not (`BufferTooSmall` when a value is longer than its span). Spans must not overlap. Over TCP when
    /// [`Client::rdma_transport`] is.
    pub fn batch_get_into_rdma(
        &mut self,
        keys: &[&[u8]],
        buffer: &mut RdmaBuffer,
        spans: &[(usize, usize)],
    ) -> Vec<Result<usize, ClientError>> {
        let failed = |why: &str| keys.iter().map(|_| Err(ClientError::Protocol(why.into()))).collect();
        if keys.len() != spans.len() {
            return failed("a span per key expected");
        }
        let Some(slices) = split_spans(buffer.as_mut_slice(), spans) else {
            return failed("spans overlap or run past the buffer");
        };
        if self.rdma_transport() == Transport::Tcp {
            let mut slices = slices;
            return self.batch_get_into(keys, &mut slices);
        }
        drop(slices);
        let replies = self.shared_exchange(keys, spans, |client, peer, chunk| {
            client.rdma_frame(peer, Opcode::Get, (keys, spans, chunk), buffer, None)
        });
        let slices = split_spans(buffer.as_mut_slice(), spans).unwrap_or_default();
        received_in_place(replies, slices, self.options.verify_checksums)
    }

    /// Stores the values at `spans` (offset, length) of `buffer` under `keys`. Over TCP when
    /// [`Client::rdma_transport`] is.
    pub fn batch_put_from_rdma(
        &mut self,
        keys: &[&[u8]],
        buffer: &RdmaBuffer,
        spans: &[(usize, usize)],
        options: PutOptions,
    ) -> Vec<Result<(), ClientError>> {
        let in_place = |client: &mut Client| client.rdma_transport() == Transport::Rdma;
        self.put_in_place((keys, buffer.as_slice(), spans), options, in_place, |client, peer, chunk| {
            client.rdma_frame(peer, Opcode::Put, (keys, spans, chunk), buffer, Some(options))
        })
    }

    /// Forgets `buffer` on every shard it was registered with.
    pub fn release_rdma(&mut self, buffer: &RdmaBuffer) -> Result<(), ClientError> {
        for peer in 0..self.peers.len() {
            let Some(rdma) = self.peers[peer].rdma.as_mut() else { continue };
            let Some(at) = rdma.regions.iter().position(|(id, _)| *id == buffer.id) else { continue };
            let (_, region) = rdma.regions.remove(at);
            let request_id = self.next_id();
            let release = RequestItemHeader { flags: REGISTER_RELEASE, offset: region, ..Default::default() };
            self.connection(peer)?.ask_one(Opcode::Register, request_id, release, 0)?;
        }
        Ok(())
    }

    /// One frame of RDMA items to `peer` over its TCP connection, and its reply: a status per item.
    fn rdma_frame(
        &mut self,
        peer: usize,
        opcode: Opcode,
        items: crate::shared::SharedItems<'_, '_>,
        buffer: &RdmaBuffer,
        put: Option<PutOptions>,
    ) -> Result<Vec<ResponseItemHeader>, ClientError> {
        let region = self.rdma_region(peer, buffer)?;
        let request_id = self.next_id();
        let frame = shared_frame(opcode, request_id, items, (region, buffer.as_slice()), put);
        let count = items.2.len();
        let connection = self.connection(peer)?;
        let io = |error: std::io::Error| ClientError::from_io(&error);
        let answers = connection.send(&frame).and_then(|()| connection.flush()).map_err(io).and_then(|()| {
            let header = connection.read_header(opcode, request_id)?;
            if header.status != Status::Ok {
                return Err(ClientError::from_status(header.status));
            }
            if header.count as usize != count {
                return Err(ClientError::Protocol(format!("{} replies to {count} items", header.count)));
            }
            let answers = (0..count).map(|_| connection.read_item()).collect::<Result<Vec<_>, _>>()?;
            if answers.iter().any(|answer| answer.data_len != 0) {
                return Err(ClientError::Protocol("data in the reply to an RDMA item".into()));
            }
            Ok(answers)
        });
        // The connection's state is unknown after an error, and its queue pair is failed after a TRANSFER:
        // both start afresh at the next call.
        let failed =
            answers.as_ref().map_or(true, |answers| answers.iter().any(|answer| answer.status == Status::Transfer));
        if failed {
            self.peers[peer].connection = None;
            self.peers[peer].rdma = None;
        }
        answers
    }
}

/// The slices of `bytes` at `spans`, if they lie within it and do not overlap.
fn split_spans<'a>(mut bytes: &'a mut [u8], spans: &[(usize, usize)]) -> Option<Vec<&'a mut [u8]>> {
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&index| spans[index].0);
    let mut slices: Vec<Option<&'a mut [u8]>> = spans.iter().map(|_| None).collect();
    let mut consumed = 0usize;
    for index in order {
        let (offset, len) = spans[index];
        let skip = offset.checked_sub(consumed)?;
        if skip + len > bytes.len() {
            return None;
        }
        let (_, rest) = std::mem::take(&mut bytes).split_at_mut(skip);
        let (slice, rest) = rest.split_at_mut(len);
        slices[index] = Some(slice);
        bytes = rest;
        consumed = offset + len;
    }
    slices.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::split_spans;

    #[test]
    fn spans_split_in_any_order_and_refuse_overlap() {
        let mut bytes = [0u8; 10];
        let slices = split_spans(&mut bytes, &[(6, 4), (0, 2), (2, 3)]).expect("disjoint");
        assert_eq!(slices.iter().map(|slice| slice.len()).collect::<Vec<_>>(), vec![4, 2, 3]);
        assert!(split_spans(&mut bytes, &[(0, 4), (3, 2)]).is_none(), "overlap");
        assert!(split_spans(&mut bytes, &[(8, 3)]).is_none(), "past the end");
        assert!(split_spans(&mut bytes, &[(3, 0), (3, 2)]).is_some(), "an empty span overlaps nothing");
    }
}
