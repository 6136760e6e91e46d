//! A subscription to a node's events: one dedicated connection per shard, each read by its own thread,
//! merged into one bounded queue. When the caller falls behind, the queue fills, the threads stop reading,
//! TCP pushes back, and the shard's bounded log reports the gap as a `Lagged` event — nothing grows
//! without bound on either side. The queue carries one batch per frame the node sent (not one message per
//! event: at 600 K events/s a message each cost the subscriber a tenth of a core), and the caller pops
//! events from the batch at hand.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::Read;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::Duration;

use strata_proto::{EVENT_HEADER_BYTES, Event, FrameHeader, ITEM_MATCH_ALL, Opcode, RequestItemHeader, Status};

use crate::client::{ClientOptions, ShardConnection};
use crate::error::ClientError;

/// Frames (batches of events, about 256 KiB each at most) queued between the readers and the caller.
const QUEUE_FRAMES: usize = 16;
/// The longest event frame accepted (the node sends about 256 KiB).
const MAX_FRAME_BYTES: u64 = 16 << 20;

/// One event of one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardEvent {
    /// The shard it happened on.
    pub shard: u32,
    /// Its number in the shard's sequence.
    pub sequence: u64,
    /// What happened.
    pub event: Event,
}

type Batch = Vec<Result<ShardEvent, ClientError>>;

/// A live subscription; dropping it closes the connections. `Send`, not `Sync`: one consumer.
pub struct EventStream {
    events: Receiver<Batch>,
    /// What is left of the batch being consumed.
    pending: RefCell<VecDeque<Result<ShardEvent, ClientError>>>,
    sockets: Vec<TcpStream>,
    readers: Vec<JoinHandle<()>>,
}

impl EventStream {
    pub(crate) fn open(
        addrs: &[SocketAddr],
        options: &ClientOptions,
        prefix: Option<&[u8]>,
    ) -> Result<Self, ClientError> {
        let (sender, events) = sync_channel(QUEUE_FRAMES);
        let mut stream =
            Self { events, pending: RefCell::new(VecDeque::new()), sockets: Vec::new(), readers: Vec::new() };
        for (shard, &addr) in addrs.iter().enumerate() {
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
                .spawn(move || read_events(connection, shard as u32, sender))
                .map_err(io)?;
            stream.readers.push(reader);
        }
        Ok(stream)
    }

    /// The next event, waiting at most `timeout`; `None` if none came. An `Err` ends that shard's stream
    /// (the connection failed): subscribe again, and resync.
    pub fn next_timeout(&self, timeout: Duration) -> Option<Result<ShardEvent, ClientError>> {
        let mut pending = self.pending.borrow_mut();
        if pending.is_empty() {
            // A timeout and a closed stream both mean "nothing now".
            pending.extend(self.events.recv_timeout(timeout).ok()?);
        }
        pending.pop_front()
    }

    /// Every event queued now, without waiting.
    pub fn drain(&self) -> Vec<Result<ShardEvent, ClientError>> {
        let mut events: Vec<_> = self.pending.borrow_mut().drain(..).collect();
        events.extend(self.events.try_iter().flatten());
        events
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        for socket in &self.sockets {
            let _ = socket.shutdown(Shutdown::Both);
        }
        // Unblock readers waiting on a full queue.
        while self.events.try_recv().is_ok() {}
        for reader in self.readers.drain(..) {
            while !reader.is_finished() {
                while self.events.try_recv().is_ok() {}
                std::thread::sleep(Duration::from_millis(1));
            }
            let _ = reader.join();
        }
    }
}

fn read_events(mut connection: ShardConnection, shard: u32, sender: SyncSender<Batch>) {
    let outcome = (|| -> Result<(), ClientError> {
        let mut body = Vec::new();
        loop {
            let header = connection.read_header(Opcode::Subscribe, 1)?;
            if header.status != Status::Ok {
                return Err(ClientError::from_status(header.status));
            }
            if header.body_len > MAX_FRAME_BYTES {
                return Err(ClientError::Protocol(format!("event frame of {} bytes", header.body_len)));
            }
            body.resize(header.body_len as usize, 0);
            connection.reader.read_exact(&mut body).map_err(|error| ClientError::from_io(&error))?;
            let mut at = 0;
            // The count is the node's word: an event takes at least its header, so the body bounds it.
            let mut batch = Vec::with_capacity((header.count as usize).min(body.len() / EVENT_HEADER_BYTES));
            for _ in 0..header.count {
                let (event, sequence, len) =
                    Event::decode(&body[at..]).map_err(|error| ClientError::Protocol(error.to_string()))?;
                at += len;
                batch.push(Ok(ShardEvent { shard, sequence, event }));
            }
            if at != body.len() {
                return Err(ClientError::Protocol("events do not fill their frame".into()));
            }
            if !batch.is_empty() && sender.send(batch).is_err() {
                return Ok(());
            }
        }
    })();
    if let Err(error) = outcome {
        // The stream was closed by its owner (drop) or failed; report only the latter, without blocking.
        let _ = sender.try_send(vec![Err(error)]);
    }
}
