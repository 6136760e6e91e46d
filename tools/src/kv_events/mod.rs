//! `strata-node --kv-events ENDPOINT`: the node's stored and removed blocks published as vLLM's
//! `KVEventBatch` over a ZeroMQ PUB socket, with vLLM's replay socket (ROUTER) beside it, so Dynamo, llm-d
//! and vLLM's own subscribers read Strata as they read a vLLM instance.
//!
//! The publisher is a thread of the node's process that subscribes to the node like any client (its
//! tenant's token, so it sees that tenant's blocks and no other: one publisher per tenant), turns each
//! event frame of a shard into one `KVEventBatch` (`encode`), and sends `[topic, sequence, payload]` on
//! the PUB socket, the sequence an 8-byte big-endian count from 0, as vLLM's publisher does. The shards
//! never wait on it: their event log is bounded, and a publisher that falls behind receives `Lagged`, which
//! it publishes as `AllBlocksCleared`.
//!
//! Replay: a subscriber that saw a gap in the sequence sends the first sequence it wants (8 bytes,
//! big-endian) to the ROUTER socket and receives every kept batch from there as `[topic, sequence,
//! payload]`, then `["", -1, ""]`. The last `REPLAY_BATCHES` batches are kept, and no more than
//! `REPLAY_BYTES` of them.
//!
//! ZeroMQ is `zmq`, the binding of libzmq (built from its source by `zmq-sys`, no system package): the
//! reference implementation that vLLM's own publisher and subscribers (pyzmq) use, so the wire is the same
//! by construction; its blocking API fits one thread of its own.

mod encode;
mod msgpack;
mod settings;

pub use settings::KvEventsSettings;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use strata_client::{Client, ClientOptions, EventStream};

/// Batches kept for replay, at most (vLLM's default `buffer_steps`).
pub const REPLAY_BATCHES: usize = 10_000;
/// Bytes of batches kept for replay, at most.
pub const REPLAY_BYTES: usize = 64 << 20;
/// Messages the PUB socket queues for a slow subscriber before it drops the newest (the subscriber sees
/// the gap in the sequence and asks the replay socket). A message is one shard's event frame, about
/// 256 KiB of events and a few times that as msgpack, so vLLM's default of 100,000 would let one
/// subscriber hold gigabytes; 128 holds it to a few hundred MiB at most.
const PUB_HIGH_WATER_MARK: i32 = 128;
/// How long the publisher waits for events before it looks at the replay socket and its stop flag.
const POLL: Duration = Duration::from_millis(20);
/// The sequence number that ends a replay.
const END_OF_REPLAY: [u8; 8] = (-1i64).to_be_bytes();

/// Where and what to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEventsConfig {
    /// The PUB socket's endpoint, e.g. `tcp://127.0.0.1:5557` or `tcp://*:5557`.
    pub endpoint: String,
    /// The replay (ROUTER) socket's endpoint, if any.
    pub replay_endpoint: Option<String>,
    /// The topic frame of every message (vLLM's default: empty).
    pub topic: String,
    /// The token of the tenant whose blocks are published (none on an open node).
    pub token: Option<Vec<u8>>,
    /// The engine's block size, published in `BlockStored` (0: not known to the node).
    pub block_size: u32,
}

/// A running publisher; `stop` ends it (dropping it does too).
pub struct KvEventsPublisher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    endpoint: String,
}

impl KvEventsPublisher {
    /// Binds the sockets, subscribes to the node at `node`, and starts publishing.
    pub fn start(config: KvEventsConfig, node: SocketAddr) -> anyhow::Result<Self> {
        let context = zmq::Context::new();
        let publish = context.socket(zmq::PUB).context("kv events: a PUB socket")?;
        publish.set_sndhwm(PUB_HIGH_WATER_MARK)?;
        publish.bind(&config.endpoint).with_context(|| format!("kv events: binding {}", config.endpoint))?;
        let endpoint = last_endpoint(&publish, &config.endpoint);
        let replay = match &config.replay_endpoint {
            Some(address) => {
                let socket = context.socket(zmq::ROUTER).context("kv events: a ROUTER socket")?;
                socket.set_sndhwm(2 * (REPLAY_BATCHES as i32 + 1))?;
                socket.bind(address).with_context(|| format!("kv events: binding the replay socket {address}"))?;
                Some(socket)
            }
            None => None,
        };
        let options = ClientOptions { token: config.token.clone(), ..ClientOptions::default() };
        let client = Client::connect(node, options.clone()).context("kv events: connecting to the node")?;
        let stream = client.subscribe_events(None).context("kv events: subscribing to the node's events")?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut publisher = Publisher { config, publish, replay, kept: Kept::default(), sequence: 0 };
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("strata-kv-events".into())
            .spawn(move || publisher.run(&stream, &stopped))
            .context("kv events: starting the publisher thread")?;
        Ok(Self { stop, thread: Some(thread), endpoint })
    }

    /// The PUB socket's bound endpoint (the port the system chose for `:0`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Stops publishing and closes the sockets and the subscription.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for KvEventsPublisher {
    fn drop(&mut self) {
        self.halt();
    }
}

fn last_endpoint(socket: &zmq::Socket, asked: &str) -> String {
    socket.get_last_endpoint().ok().and_then(Result::ok).unwrap_or_else(|| asked.to_string())
}

/// The publisher thread's state.
struct Publisher {
    config: KvEventsConfig,
    publish: zmq::Socket,
    replay: Option<zmq::Socket>,
    kept: Kept,
    sequence: u64,
}

impl Publisher {
    fn run(&mut self, stream: &EventStream, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            self.serve_replays();
            match stream.next_batch_timeout(POLL) {
                None => continue,
                Some(Ok(batch)) => {
                    let (payload, count) =
                        encode::batch(batch.iter().map(|(_, event)| event), now(), self.config.block_size);
                    if count > 0 {
                        self.send(payload);
                    }
                }
                Some(Err(error)) => {
                    // A shard's stream ended (the node is stopping, or the connection failed): what
                    // follows cannot be vouched for, so subscribers are told to forget, and publishing ends.
                    tracing::warn!(%error, "kv events: the node's event stream ended");
                    let (payload, _) =
                        encode::batch(std::iter::once(strata_proto::EventRef::Lagged { missed: 0 }), now(), 0);
                    self.send(payload);
                    return;
                }
            }
        }
    }

    fn send(&mut self, payload: Vec<u8>) {
        let sequence = self.sequence.to_be_bytes();
        let frames: [&[u8]; 3] = [self.config.topic.as_bytes(), &sequence, &payload];
        if let Err(error) = self.publish.send_multipart(frames, 0) {
            tracing::warn!(%error, "kv events: publishing a batch");
        }
        self.kept.push(self.sequence, payload);
        self.sequence += 1;
    }

    /// Answers every replay request waiting now.
    fn serve_replays(&mut self) {
        let Some(replay) = &self.replay else { return };
        while replay.poll(zmq::POLLIN, 0).is_ok_and(|ready| ready > 0) {
            let Ok(request) = replay.recv_multipart(0) else { return };
            let [client, empty, start] = request.iter().map(Vec::as_slice).collect::<Vec<_>>()[..] else {
                tracing::warn!(frames = request.len(), "kv events: a replay request of the wrong shape");
                continue;
            };
            let Ok(start) = <[u8; 8]>::try_from(start) else {
                tracing::warn!(len = start.len(), "kv events: a replay request's sequence is not 8 bytes");
                continue;
            };
            let topic = self.config.topic.as_bytes();
            for (sequence, payload) in self.kept.from(u64::from_be_bytes(start)) {
                let frames: [&[u8]; 5] = [client, empty, topic, &sequence.to_be_bytes(), payload];
                if replay.send_multipart(frames, 0).is_err() {
                    break;
                }
            }
            let end: [&[u8]; 5] = [client, empty, b"", &END_OF_REPLAY, b""];
            let _ = replay.send_multipart(end, 0);
        }
    }
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |since| since.as_secs_f64())
}

/// The batches kept for replay, oldest first, bounded in count and bytes.
#[derive(Default)]
struct Kept {
    batches: VecDeque<(u64, Vec<u8>)>,
    bytes: usize,
}

impl Kept {
    fn push(&mut self, sequence: u64, payload: Vec<u8>) {
        self.bytes += payload.len();
        self.batches.push_back((sequence, payload));
        while self.batches.len() > REPLAY_BATCHES || (self.bytes > REPLAY_BYTES && self.batches.len() > 1) {
            if let Some((_, dropped)) = self.batches.pop_front() {
                self.bytes -= dropped.len();
            }
        }
    }

    fn from(&self, start: u64) -> impl Iterator<Item = (u64, &[u8])> {
        self.batches
            .iter()
            .filter(move |(sequence, _)| *sequence >= start)
            .map(|(sequence, payload)| (*sequence, payload.as_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_keeps_the_newest_batches_within_its_bounds() {
        let mut kept = Kept::default();
        for sequence in 0..(REPLAY_BATCHES as u64 + 5) {
            kept.push(sequence, vec![0; 8]);
        }
        assert_eq!(kept.batches.len(), REPLAY_BATCHES);
        assert_eq!(kept.from(0).next().map(|(sequence, _)| sequence), Some(5));
        assert_eq!(kept.from(REPLAY_BATCHES as u64 + 3).count(), 2);
        kept.push(u64::MAX, vec![0; REPLAY_BYTES]);
        assert_eq!(kept.batches.len(), 1, "bytes bound: only the newest batch is left");
    }
}
