//! SUBSCRIBE: a connection that streams the shard's events (filtered by a key prefix, scoped to the
//! tenant) from then on, written by the shard or by a sender thread off its core (`event_sender`).

use std::sync::Arc;

use strata_proto::{FRAME_HEADER_BYTES, FrameHeader, Opcode, RequestItem, Status};

use super::connection::Connection;
use super::watch::on_socket;
use super::{ConnectionError, ShardServer};
use crate::event_sender::HandOffRefused;
use crate::tenants::Scope;

/// Bytes of events per frame sent to a subscriber (at most; one event may take it past).
const EVENT_FRAME_BYTES: usize = 256 << 10;
/// What a frame's buffer is allocated with: a full frame and the event that may take it past.
const EVENT_FRAME_CAPACITY: usize = FRAME_HEADER_BYTES + EVENT_FRAME_BYTES + 4096;
/// How long a woken subscriber waits for more events before it sends what it has.
const EVENT_GATHER: std::time::Duration = std::time::Duration::from_millis(2);
/// A subscriber with nothing to receive gets an empty frame this often, so a vanished one is noticed.
const EVENT_HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(1);

/// Streams the shard's events to the connection until it closes; the connection takes no more requests.
pub(super) async fn handle_subscribe(
    server: &ShardServer,
    connection: &mut Connection,
    header: FrameHeader,
    items: &[RequestItem<'_>],
    scope: &Scope,
) -> Result<(u64, u64), ConnectionError> {
    let [item] = items else {
        return Err(ConnectionError::Protocol(Status::Invalid, "SUBSCRIBE takes one item".into()));
    };
    // A tenant sees only its own keys' events, with its prefix taken off again.
    let user_prefix: &[u8] = if item.header.flags & strata_proto::ITEM_MATCH_ALL == 0 { item.key } else { &[] };
    let full_prefix = scope.scoped(user_prefix);
    let prefix = (!full_prefix.is_empty()).then_some(&full_prefix[..]);
    let strip = scope.prefix().len();
    let shard = &server.shard;
    let (subscription, mut cursor) = crate::events::Subscription::new(shard.events());
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
        epoch: 0,
    };
    on_socket(&connection.watch, connection.stream.write_all(&ready.encode())).await?;
    // Frames go to a thread of their own off the shard's core where the node has a CPU for it
    // (`crate::event_sender`); otherwise the shard writes them.
    let sender =
        server.event_senders.start(connection.stream.raw_fd(), shard.config.stall_timeout, Arc::clone(&shard.metrics));
    // The frame's header and its events in one buffer, sent with one write: through the reactor a header
    // apart from a body of 16 KiB or more is a send of its own whenever the socket lacks room for both
    // (`Socket::write_all_vectored`), and each send on loopback costs the sending core the receiving side's
    // TCP work and a wake-up of the subscriber.
    let mut frame = Vec::with_capacity(EVENT_FRAME_CAPACITY);
    loop {
        frame.clear();
        frame.resize(FRAME_HEADER_BYTES, 0);
        let (count, next) = shard.events().borrow_mut().read(cursor, prefix, strip, EVENT_FRAME_BYTES, &mut frame);
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
            epoch: 0,
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
