//! A subscription to a node's events, or a cluster's: one dedicated connection per shard of every node, each read by its own thread,
//! merged into one bounded queue. When the caller falls behind, the queue fills, the threads stop reading,
//! TCP pushes back, and the shard's bounded log reports the gap as a `Lagged` event — nothing grows
//! without bound on either side. The queue carries one batch per frame the node sent (not one message per
//! event: at 600 K events/s a message each cost the subscriber a tenth of a core), and the caller pops
//! events from the batch at hand.

use std::cell::RefCell;
use std::io::Read;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::Duration;

use strata_proto::{Event, EventRef, FrameHeader, ITEM_MATCH_ALL, Opcode, RequestItemHeader, Status};

use crate::client::{ClientOptions, ShardConnection};
use crate::error::ClientError;

/// Frames (batches of events, about 256 KiB each at most) queued between the readers and the caller.
const QUEUE_FRAMES: usize = 16;
/// The longest event frame accepted (the node sends about 256 KiB).
const MAX_FRAME_BYTES: u64 = 16 << 20;

/// One event of one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardEvent {
    /// The node it happened on: its id in a cluster, empty for a client of one node.
    pub node: Arc<str>,
    /// The shard it happened on, among its node's.
    pub shard: u32,
    /// Its number in the shard's sequence.
    pub sequence: u64,
    /// What happened.
    pub event: Event,
}

/// One frame of one shard's events as the node sent it, checked whole by the reader thread: iterate it
/// with keys borrowed from it ([`EventBatch::iter`]), or take owned events one by one from the stream.
#[derive(Debug)]
pub struct EventBatch {
    node: Arc<str>,
    shard: u32,
    body: Vec<u8>,
    /// Where the events not yet consumed start, and how many there are.
    at: usize,
    left: usize,
}

impl EventBatch {
    /// The node its events happened on: its id in a cluster, empty for a client of one node.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The shard its events happened on, among its node's.
    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// Events in it.
    pub fn len(&self) -> usize {
        self.left
    }

    /// Whether it holds no event.
    pub fn is_empty(&self) -> bool {
        self.left == 0
    }

    /// Its events, `(sequence, event)`, keys borrowed from the batch: no allocation per event, for a
    /// consumer that only looks (a router hashing keys into its own table).
    pub fn iter(&self) -> impl Iterator<Item = (u64, EventRef<'_>)> + '_ {
        let mut at = self.at;
        (0..self.left).map_while(move |_| {
            // Checked by the reader thread when the frame arrived, so this cannot fail.
            let (event, sequence, len) = EventRef::decode(&self.body[at..]).ok()?;
            at += len;
            Some((sequence, event))
        })
    }

    /// Takes its next event, owned.
    fn pop(&mut self) -> Option<ShardEvent> {
        if self.left == 0 {
            return None;
        }
        let (event, sequence, len) = EventRef::decode(&self.body[self.at..]).ok()?;
        self.at += len;
        self.left -= 1;
        Some(ShardEvent { node: Arc::clone(&self.node), shard: self.shard, sequence, event: event.to_event() })
    }
}

/// A live subscription; dropping it closes the connections. `Send`, not `Sync`: one consumer.
pub struct EventStream {
    batches: Receiver<Result<EventBatch, ClientError>>,
    /// What is left of the batch being consumed.
    pending: RefCell<Option<EventBatch>>,
    sockets: Vec<TcpStream>,
    readers: Vec<JoinHandle<()>>,
}

impl EventStream {
    /// Subscribes on each `(address, node, shard)` of `sources`.
    pub(crate) fn open(
        sources: &[(SocketAddr, Arc<str>, u32)],
        options: &ClientOptions,
        prefix: Option<&[u8]>,
    ) -> Result<Self, ClientError> {
        let (sender, batches) = sync_channel(QUEUE_FRAMES);
        let mut stream = Self { batches, pending: RefCell::new(None), sockets: Vec::new(), readers: Vec::new() };
        for (addr, node, shard) in sources.iter().cloned() {
            let (mut connection, _hello) = ShardConnection::open(addr, options)?;
            let (key, flags) = match prefix {
                Some(prefix) if !prefix.is_empty() => (prefix, 0),
                _ => (&b"*"[..], ITEM_MATCH_ALL),
            };
            let mut item = Vec::new();
            RequestItemHeader { key_len: key.len() as u16, flags, ..Default::default() }.encode_into(&mut item);
            item.extend_from_slice(key);
            let mut head = Vec::new();
            FrameHeader::request(Opcode::Subscribe, 1, 1, item.len() as u64).encode_into(&mut head);
            let io = |error: std::io::Error| ClientError::from_io(&error);
            connection.send(&head).map_err(io)?;
            connection.send(&item).map_err(io)?;
            connection.flush().map_err(io)?;
            // The node's first frame (empty) says the subscription is in place: events from here on are
            // delivered, so `subscribe_events` returning means "nothing after this is missed".
            let ready = connection.read_header(Opcode::Subscribe, 1)?;
            if ready.status != Status::Ok || ready.count != 0 || ready.body_len != 0 {
                return Err(ClientError::Protocol("SUBSCRIBE was not acknowledged".into()));
            }
            stream.sockets.push(connection.writer.try_clone().map_err(io)?);
            let sender = sender.clone();
            let reader = std::thread::Builder::new()
                .name(format!("strata-events-{shard}"))
                .spawn(move || read_events(connection, (node, shard), sender))
                .map_err(io)?;
            stream.readers.push(reader);
        }
        Ok(stream)
    }

    /// The next event, waiting at most `timeout`; `None` if none came. An `Err` ends that shard's stream
    /// (the connection failed): subscribe again, and resync.
    pub fn next_timeout(&self, timeout: Duration) -> Option<Result<ShardEvent, ClientError>> {
        let mut pending = self.pending.borrow_mut();
        loop {
            if let Some(event) = pending.as_mut().and_then(EventBatch::pop) {
                return Some(Ok(event));
            }
            // A timeout and a closed stream both mean "nothing now".
            match self.batches.recv_timeout(timeout).ok()? {
                Ok(batch) => *pending = Some(batch),
                Err(error) => return Some(Err(error)),
            }
        }
    }

    /// The next batch of events (the rest of the one being consumed, if any), waiting at most `timeout`;
    /// `None` if none came. Its events borrow their keys from it ([`EventBatch::iter`]): a consumer that
    /// only looks at events pays no allocation per event. An `Err` as for [`next_timeout`](Self::next_timeout).
    pub fn next_batch_timeout(&self, timeout: Duration) -> Option<Result<EventBatch, ClientError>> {
        if let Some(batch) = self.pending.borrow_mut().take().filter(|batch| !batch.is_empty()) {
            return Some(Ok(batch));
        }
        self.batches.recv_timeout(timeout).ok()
    }

    /// Every event queued now, without waiting.
    pub fn drain(&self) -> Vec<Result<ShardEvent, ClientError>> {
        let mut events = Vec::new();
        let mut pending = self.pending.borrow_mut().take();
        loop {
            if let Some(batch) = pending.as_mut() {
                events.extend(std::iter::from_fn(|| batch.pop()).map(Ok));
            }
            match self.batches.try_recv() {
                Ok(Ok(batch)) => pending = Some(batch),
                Ok(Err(error)) => {
                    events.push(Err(error));
                    pending = None;
                }
                Err(_) => return events,
            }
        }
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        for socket in &self.sockets {
            let _ = socket.shutdown(Shutdown::Both);
        }
        // Unblock readers waiting on a full queue.
        while self.batches.try_recv().is_ok() {}
        for reader in self.readers.drain(..) {
            while !reader.is_finished() {
                while self.batches.try_recv().is_ok() {}
                std::thread::sleep(Duration::from_millis(1));
            }
            let _ = reader.join();
        }
    }
}

fn read_events(
    mut connection: ShardConnection,
    (node, shard): (Arc<str>, u32),
    sender: SyncSender<Result<EventBatch, ClientError>>,
) {
    let outcome = (|| -> Result<(), ClientError> {
        loop {
            let header = connection.read_header(Opcode::Subscribe, 1)?;
            if header.status != Status::Ok {
                return Err(ClientError::from_status(header.status));
            }
            if header.body_len > MAX_FRAME_BYTES {
                return Err(ClientError::Protocol(format!("event frame of {} bytes", header.body_len)));
            }
            let mut body = vec![0u8; header.body_len as usize];
            connection.reader.read_exact(&mut body).map_err(|error| ClientError::from_io(&error))?;
            // Checked whole here (without allocating), so consumers can iterate it without errors. The count
            // is the node's word: an event takes at least its header, so the body bounds it.
            let mut at = 0;
            for _ in 0..header.count {
                let (_, _, len) =
                    EventRef::decode(&body[at..]).map_err(|error| ClientError::Protocol(error.to_string()))?;
                at += len;
            }
            if at != body.len() {
                return Err(ClientError::Protocol("events do not fill their frame".into()));
            }
            let batch = EventBatch { node: Arc::clone(&node), shard, body, at: 0, left: header.count as usize };
            if !batch.is_empty() && sender.send(Ok(batch)).is_err() {
                return Ok(());
            }
        }
    })();
    if let Err(error) = outcome {
        // The stream was closed by its owner (drop) or failed; report only the latter, without blocking.
        let _ = sender.try_send(Err(error));
    }
}
