//! RDMA verbs moving bytes both ways between two queue pairs on one device, as the node and a client do:
//! the "node" side has local-only registrations and a queue pair that grants no remote access; the
//! "client" side registers its buffer for remote read and write. Every value is checked byte for byte.
//!
//! Needs an RDMA device: `STRATA_RDMA_DEVICE=rxe0 … --ignored` (tests/lab/rdma-guest runs them in a guest
//! on soft-RoCE). Without one, only the device-free check runs.

use std::time::Duration;

use strata_transfer::verbs::{
    Access, Completion, CompletionKind, CompletionQueue, Device, ProtectionDomain, QueuePair, QueuePairOptions,
    RegisteredBuffer,
};
use strata_transfer::{RemoteSpan, TransferError};

const WAIT: Duration = Duration::from_secs(60);
const MIB: usize = 1 << 20;

fn device() -> Device {
    let name = std::env::var("STRATA_RDMA_DEVICE").expect("STRATA_RDMA_DEVICE names the device to test on");
    Device::open(&name).expect("the device opens")
}

/// One side of a connection: its domain, completion queue, queue pair and buffer.
struct Side {
    _domain: ProtectionDomain,
    completions: CompletionQueue,
    pair: QueuePair,
    buffer: RegisteredBuffer,
}

impl Side {
    fn new(device: &Device, buffer_bytes: usize, as_client: bool, options: QueuePairOptions) -> Side {
        let domain = ProtectionDomain::new(device).expect("protection domain");
        let completions = CompletionQueue::new(device, 256).expect("completion queue");
        let options = QueuePairOptions { remote_access: as_client, ..options };
        let pair = QueuePair::new(&domain, &completions, options).expect("queue pair");
        let access = if as_client { Access::RemoteReadWrite } else { Access::Local };
        let buffer = RegisteredBuffer::new(&domain, buffer_bytes, access).expect("registered buffer");
        Side { _domain: domain, completions, pair, buffer }
    }

    fn remote(&self, offset: usize, length: usize) -> RemoteSpan {
        self.buffer.region().remote_span(offset as u64, length as u32).expect("span inside the buffer")
    }

    /// Waits for exactly `count` completions.
    fn completions(&self, count: usize) -> Vec<Completion> {
        let mut done = Vec::new();
        for _ in 0..count {
            if done.len() >= count {
                break;
            }
            let missing = count - done.len();
            let got = self.completions.wait(&mut done, missing, WAIT).expect("wait");
            assert!(got > 0, "no completion within {WAIT:?} ({} of {count})", done.len());
        }
        done
    }

    fn write(&self, id: u64, offset: usize, length: usize, remote: RemoteSpan) {
        let local = self.buffer.region().local_span(offset as u64, length as u32).expect("local span");
        // SAFETY: the buffer is neither dropped nor written before the completion is polled.
        unsafe { self.pair.post_write(id, local, remote) }.expect("post write");
    }

    fn read(&self, id: u64, offset: usize, length: usize, remote: RemoteSpan) {
        let local = self.buffer.region().local_span(offset as u64, length as u32).expect("local span");
        // SAFETY: the buffer is neither dropped nor touched before the completion is polled.
        unsafe { self.pair.post_read(id, local, remote) }.expect("post read");
    }
}

/// A node side and a client side, connected.
fn connected(device: &Device, node_bytes: usize, client_bytes: usize, options: QueuePairOptions) -> (Side, Side) {
    let node = Side::new(device, node_bytes, false, options);
    let client = Side::new(device, client_bytes, true, options);
    node.pair.connect(&client.pair.endpoint()).expect("node connects");
    client.pair.connect(&node.pair.endpoint()).expect("client connects");
    (node, client)
}

fn pattern(length: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn assert_ok(completions: &[Completion]) {
    for completion in completions {
        assert!(
            completion.result.is_ok(),
            "work request {} failed: {:?}",
            completion.work_request_id,
            completion.result
        );
    }
}

#[test]
fn opening_a_missing_device_is_a_clear_error() {
    let error = Device::open("strata-no-such-device").err().expect("no such device");
    match &error {
        TransferError::NoDevices => {}
        TransferError::NoSuchDevice { name, available } => {
            assert_eq!(name, "strata-no-such-device");
            assert!(!available.is_empty());
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert!(error.to_string().contains("RDMA device"), "{error}");
}

#[test]
#[ignore = "needs an RDMA device: tests/lab/rdma-guest runs it with STRATA_RDMA_DEVICE"]
fn writes_and_reads_move_values_of_4k_to_16m_both_ways() {
    let device = device();
    let (mut node, mut client) = connected(&device, 16 * MIB, 16 * MIB, QueuePairOptions::default());
    for (at, length) in [4096, 65536, MIB, 16 * MIB].into_iter().enumerate() {
        let value = pattern(length, at as u64);
        node.buffer.as_mut_slice()[..length].copy_from_slice(&value);
        node.write(at as u64, 0, length, client.remote(0, length));
        let done = node.completions(1);
        assert_ok(&done);
        assert_eq!(done[0].work_request_id, at as u64);
        assert!(client.buffer.as_slice()[..length] == value[..], "a {length}-byte RDMA WRITE landed intact");

        let value = pattern(length, 100 + at as u64);
        client.buffer.as_mut_slice()[..length].copy_from_slice(&value);
        node.read(at as u64, 0, length, client.remote(0, length));
        assert_ok(&node.completions(1));
        assert!(node.buffer.as_slice()[..length] == value[..], "a {length}-byte RDMA READ landed intact");
    }
}

#[test]
#[ignore = "needs an RDMA device: tests/lab/rdma-guest runs it with STRATA_RDMA_DEVICE"]
fn a_batch_completes_every_request_exactly_once() {
    let device = device();
    let (mut node, client) = connected(&device, 2 * MIB, 2 * MIB, QueuePairOptions::default());
    let (count, length) = (32usize, 64 * 1024);
    let values = pattern(count * length, 7);
    node.buffer.as_mut_slice()[..values.len()].copy_from_slice(&values);
    for index in 0..count {
        node.write(1000 + index as u64, index * length, length, client.remote(index * length, length));
    }
    let done = node.completions(count);
    assert_ok(&done);
    let mut ids: Vec<u64> = done.iter().map(|completion| completion.work_request_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, (1000..1000 + count as u64).collect::<Vec<_>>());
    assert!(done.iter().all(|completion| completion.result == Ok(length as u32)));
    assert!(client.buffer.as_slice()[..values.len()] == values[..]);
}

#[test]
#[ignore = "needs an RDMA device: tests/lab/rdma-guest runs it with STRATA_RDMA_DEVICE"]
fn an_armed_queue_makes_its_descriptor_readable() {
    let device = device();
    let (node, client) = connected(&device, MIB, MIB, QueuePairOptions::default());
    let mut done = Vec::new();
    assert_eq!(node.completions.poll(&mut done, 8).expect("poll"), 0);
    node.completions.arm().expect("arm");
    node.write(1, 0, 4096, client.remote(0, 4096));
    let mut poll = libc::pollfd { fd: node.completions.event_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one pollfd on a descriptor the queue keeps open.
    let ready = unsafe { libc::poll(&mut poll, 1, WAIT.as_millis() as i32) };
    assert_eq!(ready, 1, "the completion channel became readable");
    assert!(node.completions.take_events().expect("take events") >= 1);
    assert_eq!(node.completions.take_events().expect("take events"), 0, "events are consumed once");
    assert_eq!(node.completions.poll(&mut done, 8).expect("poll"), 1);
    assert_ok(&done);
}

#[test]
#[ignore = "needs an RDMA device: tests/lab/rdma-guest runs it with STRATA_RDMA_DEVICE"]
fn keys_reach_only_what_their_connection_granted() {
    let device = device();
    let (mut node, client) = connected(&device, MIB, MIB, QueuePairOptions::default());
    let (_other_node, mut other_client) = connected(&device, MIB, MIB, QueuePairOptions::default());
    other_client.buffer.as_mut_slice().fill(0x5a);

    // The node, on its connection to `client`, names memory `other_client` registered: its domain refuses.
    node.buffer.as_mut_slice().fill(0xee);
    node.write(1, 0, 4096, other_client.remote(0, 4096));
    let done = node.completions(1);
    let error = done[0].result.clone().expect_err("another connection's key is refused");
    assert!(error.is_remote_access(), "{error}");
    assert!(other_client.buffer.as_slice().iter().all(|&byte| byte == 0x5a), "its memory is untouched");

    // A client names the node's own memory, with the node's key: the node grants no remote access.
    let node_key = node.buffer.region().remote_span(0, 4096).expect("span");
    client.read(2, 0, 4096, node_key);
    let done = client.completions(1);
    assert!(done[0].result.is_err(), "the node's memory is not readable by a client: {:?}", done[0].result);
}

#[test]
#[ignore = "needs an RDMA device: tests/lab/rdma-guest runs it with STRATA_RDMA_DEVICE"]
fn a_failed_queue_pair_flushes_what_is_queued() {
    let device = device();
    let (node, client) = connected(&device, MIB, MIB, QueuePairOptions::default());
    node.pair.fail().expect("to the error state");
    for id in 0..4 {
        node.write(id, 0, 4096, client.remote(0, 4096));
    }
    let done = node.completions(4);
    for completion in &done {
        let error = completion.result.clone().expect_err("nothing runs on a failed queue pair");
        assert!(error.is_flushed(), "{error}");
    }
}

#[test]
#[ignore = "needs an RDMA device: tests/lab/rdma-guest runs it with STRATA_RDMA_DEVICE"]
fn a_dead_peer_fails_the_request_and_flushes_the_rest() {
    let device = device();
    // Short timeouts: 4.096 µs × 2^12 ≈ 17 ms, one retry.
    let options = QueuePairOptions { ack_timeout_exponent: 12, retry_count: 1, ..QueuePairOptions::default() };
    let (node, client) = connected(&device, MIB, MIB, options);
    let remote = client.remote(0, 4096);
    drop(client);
    node.write(1, 0, 4096, remote);
    node.write(2, 0, 4096, remote);
    let done = node.completions(2);
    assert!(done.iter().all(|completion| completion.result.is_err()), "{done:?}");
    let first = done.iter().find(|completion| completion.work_request_id == 1).expect("request 1 completed");
    assert!(!first.result.clone().expect_err("failed").is_flushed(), "the first request failed itself: {first:?}");
}

#[test]
#[ignore = "needs an RDMA device: tests/lab/rdma-tests runs it with STRATA_RDMA_DEVICE"]
fn sends_land_in_posted_receives_in_order() {
    let device = device();
    let options = QueuePairOptions { receive_queue_depth: 8, ..QueuePairOptions::default() };
    let (mut node, client) = connected(&device, MIB, MIB, options);
    // The client posts four receives of 64 bytes (a command capsule's size), the node sends four capsules.
    for slot in 0..4u64 {
        let local = client.buffer.region().local_span(slot * 64, 64).expect("span");
        // SAFETY: the buffer is not touched until the receive's completion.
        unsafe { client.pair.post_receive(100 + slot, local) }.expect("post receive");
    }
    let capsules = pattern(4 * 64, 11);
    node.buffer.as_mut_slice()[..capsules.len()].copy_from_slice(&capsules);
    for slot in 0..4u64 {
        let local = node.buffer.region().local_span(slot * 64, 64).expect("span");
        // SAFETY: the buffer is not written until the send's completion.
        unsafe { node.pair.post_send(slot, local) }.expect("post send");
    }
    let sent = node.completions(4);
    assert_ok(&sent);
    assert!(sent.iter().all(|completion| completion.kind == CompletionKind::Send), "{sent:?}");
    let received = client.completions(4);
    assert_ok(&received);
    assert!(
        received.iter().all(|completion| completion.kind == CompletionKind::Receive && completion.result == Ok(64))
    );
    let order: Vec<u64> = received.iter().map(|completion| completion.work_request_id).collect();
    assert_eq!(order, vec![100, 101, 102, 103], "receives complete in the order they were posted");
    assert!(client.buffer.as_slice()[..capsules.len()] == capsules[..], "each capsule in its receive");
    // A write completes as a write.
    node.write(9, 0, 4096, client.remote(4096, 4096));
    assert_eq!(node.completions(1)[0].kind, CompletionKind::Write);
}
