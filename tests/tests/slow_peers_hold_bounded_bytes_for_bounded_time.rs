//! What a peer can hold is bounded: a frame that keeps moving, but slower than the minimum rate, is closed
//! after its grace; the bytes of values still arriving are capped per node and per tenant; connections are
//! limited per node and per tenant, with a clear refusal. An honest client at a modest rate is served.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{client, config, say_hello, start, total};
use strata_client::{Client, ClientError, ClientOptions};
use strata_engine::peer_limits::PeerLimits;
use strata_engine::tenants::TenantConfig;
use strata_proto::{
    FRAME_HEADER_BYTES, FrameHeader, Opcode, REQUEST_ITEM_BYTES, RequestItemHeader, ResponseItemHeader, Status,
};

fn raw(node: &strata_engine::Node) -> TcpStream {
    let stream = TcpStream::connect(node.local_addr()).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    stream
}

/// A put frame of one item: its header, item header and key, and the value to follow.
fn put_frame_head(key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut frame = Vec::new();
    let body_len = (REQUEST_ITEM_BYTES + key.len() + value.len()) as u64;
    FrameHeader::request(Opcode::Put, 1, 1, body_len).encode_into(&mut frame);
    RequestItemHeader {
        key_len: key.len() as u16,
        flags: 0,
        value_len: value.len() as u32,
        value_crc: strata_proto::crc32c(value),
        offset: 0,
    }
    .encode_into(&mut frame);
    frame.extend_from_slice(key);
    frame
}

/// The status of a one-item put's reply.
fn put_status(stream: &mut TcpStream) -> Status {
    let mut reply = [0u8; FRAME_HEADER_BYTES + 16];
    stream.read_exact(&mut reply).expect("reply");
    let header = FrameHeader::decode(&reply).expect("frame");
    assert_eq!(header.status, Status::Ok);
    ResponseItemHeader::decode(&reply[FRAME_HEADER_BYTES..]).expect("item").status
}

fn closed_by_node(stream: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    match stream.read_to_end(&mut rest) {
        Ok(_) => true,
        Err(error) => error.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

fn limits(grace_ms: u64, rate: u64) -> PeerLimits {
    PeerLimits { frame_grace: Duration::from_millis(grace_ms), min_transfer_rate: rate, ..PeerLimits::default() }
}

#[test]
fn a_put_that_keeps_moving_slower_than_the_minimum_is_closed_and_frees_its_reservation() {
    let mut node_config = config(&[0], 64 << 20);
    // The cap on arriving bytes is set out of the way: this test is about the rate, and the good put must
    // reach the reservation to show the slow one still holds it.
    node_config.peers = PeerLimits { partial_frame_bytes: Some(128 << 20), ..limits(1000, 4 << 20) };
    let node = start(node_config);
    let mut good = client(&node);

    // A header for 56 MiB of the 64 MiB, then a byte every 100 ms: the stall timeout (30 s) never fires,
    // since bytes keep moving.
    let value = vec![3u8; 56 << 20];
    let mut slow = raw(&node);
    slow.write_all(&put_frame_head(b"slow", &value)).expect("send");
    let mut trickle = slow.try_clone().expect("clone");
    let trickler = std::thread::spawn(move || {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            if trickle.write_all(&[3]).is_err() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    });
    std::thread::sleep(Duration::from_millis(300));
    let big = vec![5u8; 16 << 20];
    assert_eq!(good.put(b"big", &big), Err(ClientError::NoSpace), "the slow put holds its 56 MiB");

    let started = Instant::now();
    assert!(closed_by_node(&mut slow), "the node closes the slow put");
    assert!(started.elapsed() < Duration::from_secs(8), "within its grace and a few sweeps: {:?}", started.elapsed());
    assert!(trickler.join().expect("trickler"), "its writes failed once closed");
    assert_eq!(total(&node, |m| &m.slow_connections), 1);
    assert_eq!(total(&node, |m| &m.stalled_connections), 0, "it was never silent");

    let started = Instant::now();
    let mut put = good.put(b"big", &big);
    while put == Err(ClientError::NoSpace) && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
        put = good.put(b"big", &big);
    }
    put.expect("16 MiB fit once the slow put's reservation was freed");
    node.shutdown().expect("shutdown");
}

#[test]
fn an_honest_client_at_20_mb_per_second_puts_64_mib() {
    let mut node_config = config(&[0], 160 << 20);
    node_config.peers = limits(1000, 4 << 20);
    let node = start(node_config);
    let value: Vec<u8> = (0..64u32 << 20).map(|at| (at % 251) as u8).collect();
    let mut stream = raw(&node);
    stream.write_all(&put_frame_head(b"paced", &value)).expect("send");
    // 1 MiB every 50 ms: 20 MiB/s, 3.2 s in all, five times the minimum rate.
    let started = Instant::now();
    for (at, piece) in value.chunks(1 << 20).enumerate() {
        let due = Duration::from_millis(50 * at as u64);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
        stream.write_all(piece).expect("the node keeps reading");
    }
    assert_eq!(put_status(&mut stream), Status::Ok);
    assert_eq!(client(&node).get(b"paced").expect("get"), value);
    assert_eq!(total(&node, |m| &m.slow_connections), 0);
    node.shutdown().expect("shutdown");
}

/// Sends, on each connection, all but the last byte of a 1 MiB put.
fn send_all_but_last_byte(streams: &mut [TcpStream], from: usize) {
    let value = vec![9u8; 1 << 20];
    for (index, stream) in streams.iter_mut().enumerate() {
        let key = format!("part-{:03}", from + index);
        let mut frame = put_frame_head(key.as_bytes(), &value);
        frame.extend_from_slice(&value[..value.len() - 1]);
        stream.write_all(&frame).expect("send");
    }
}

/// Sends each connection's last byte; the statuses of their replies.
fn finish(streams: &mut [TcpStream]) -> Vec<Status> {
    streams.iter_mut().for_each(|stream| stream.write_all(&[9]).expect("last byte"));
    streams.iter_mut().map(put_status).collect()
}

/// Waits (a bounded time) until a counter of the node reaches `value`.
fn wait_for(
    node: &strata_engine::Node,
    field: impl Fn(&strata_engine::metrics::ShardMetrics) -> &std::sync::atomic::AtomicU64 + Copy,
    value: u64,
) -> u64 {
    let started = Instant::now();
    while total(node, field) < value && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    total(node, field)
}

fn count(statuses: &[Status], wanted: Status) -> usize {
    statuses.iter().filter(|status| **status == wanted).count()
}

#[test]
fn bytes_of_values_still_arriving_are_capped_and_the_refused_are_told() {
    let mut node_config = config(&[0], 64 << 20);
    let claim = (1 << 20) + 8; // each put's key and value
    node_config.peers = PeerLimits { partial_frame_bytes: Some(8 * claim), ..PeerLimits::default() };
    let node = start(node_config);
    let mut streams: Vec<TcpStream> = (0..12).map(|_| raw(&node)).collect();
    send_all_but_last_byte(&mut streams, 0);
    assert_eq!(wait_for(&node, |m| &m.partial_frame_refusals, 4), 4);
    assert_eq!(total(&node, |m| &m.partial_frame_bytes), 8 * claim, "the cap is full, not exceeded");
    let statuses = finish(&mut streams);
    assert_eq!((count(&statuses, Status::Ok), count(&statuses, Status::Quota)), (8, 4), "{statuses:?}");
    assert_eq!(total(&node, |m| &m.partial_frame_refusals), 4);
    assert_eq!(total(&node, |m| &m.partial_frame_bytes), 0, "every claim was given back");
    // The refused connections go on: their next put is served.
    let small = b"fits";
    let mut frame = put_frame_head(b"after-000", small);
    frame.extend_from_slice(small);
    streams[0].write_all(&frame).expect("send");
    assert_eq!(put_status(&mut streams[0]), Status::Ok);
    node.shutdown().expect("shutdown");
}

fn tenant(name: &str) -> TenantConfig {
    TenantConfig {
        name: name.into(),
        token: format!("token-of-{name}").into_bytes(),
        dram_quota: None,
        nvme_quota: None,
        max_pinned: None,
    }
}

fn connect(node: &strata_engine::Node, name: &str) -> Result<Client, ClientError> {
    let options = ClientOptions { token: Some(format!("token-of-{name}").into_bytes()), ..ClientOptions::default() };
    Client::connect(node.local_addr(), options)
}

/// A raw connection that has said HELLO as `name`.
fn raw_tenant(node: &strata_engine::Node, name: &str) -> TcpStream {
    let mut stream = raw(node);
    let token = format!("token-of-{name}").into_bytes();
    let hello = strata_proto::HelloRequest { token, ..Default::default() };
    let (header, _) = say_hello(&mut stream, &hello);
    assert_eq!(header.status, Status::Ok);
    stream
}

#[test]
fn one_tenant_cannot_take_every_byte_of_values_in_flight() {
    let mut node_config = config(&[0], 64 << 20);
    let claim = (1 << 20) + 8 + 4; // key (with its tenant prefix) and value
    node_config.tenants = vec![tenant("alpha"), tenant("beta")];
    node_config.peers = PeerLimits {
        partial_frame_bytes: Some(8 * claim),
        tenant_partial_frame_bytes: Some(4 * claim),
        ..PeerLimits::default()
    };
    let node = start(node_config);
    let mut alpha: Vec<TcpStream> = (0..6).map(|_| raw_tenant(&node, "alpha")).collect();
    send_all_but_last_byte(&mut alpha, 0);
    assert_eq!(wait_for(&node, |m| &m.partial_frame_refusals, 2), 2, "alpha is held to its 4");
    // While alpha holds its share, beta still has its own.
    let mut beta: Vec<TcpStream> = (0..4).map(|_| raw_tenant(&node, "beta")).collect();
    send_all_but_last_byte(&mut beta, 100);
    assert_eq!(wait_for(&node, |m| &m.partial_frame_bytes, 8 * claim), 8 * claim);
    let statuses = finish(&mut alpha);
    assert_eq!((count(&statuses, Status::Ok), count(&statuses, Status::Quota)), (4, 2), "alpha: {statuses:?}");
    let statuses = finish(&mut beta);
    assert_eq!(count(&statuses, Status::Ok), 4, "beta: {statuses:?}");
    assert_eq!(total(&node, |m| &m.partial_frame_refusals), 2);
    node.shutdown().expect("shutdown");
}

#[test]
fn connections_past_the_node_or_tenant_limit_are_refused_clearly() {
    let mut node_config = config(&[0], 32 << 20);
    node_config.tenants = vec![tenant("alpha"), tenant("beta")];
    node_config.peers = PeerLimits { max_connections: 4, tenant_max_connections: Some(2), ..PeerLimits::default() };
    let node = start(node_config);
    let first = connect(&node, "alpha").expect("alpha 1 of 2");
    let _second = connect(&node, "alpha").expect("alpha 2 of 2");
    assert_eq!(connect(&node, "alpha").err(), Some(ClientError::Quota), "alpha has its 2");
    // The refused connection's place is given back once the node has closed it.
    let started = Instant::now();
    while total(&node, |m| &m.connections) > 2 && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _beta = connect(&node, "beta").expect("beta 1 of 2");
    let _beta2 = connect(&node, "beta").expect("beta 2 of 2");
    // The node has its 4: a fifth connection is told so before it says anything.
    let mut fifth = raw(&node);
    let mut head = [0u8; FRAME_HEADER_BYTES];
    fifth.read_exact(&mut head).expect("refusal");
    assert_eq!(FrameHeader::decode(&head).expect("frame").status, Status::Quota);
    assert!(closed_by_node(&mut fifth));
    assert_eq!(total(&node, |m| &m.connections_refused), 2);
    drop(first);
    // Its place is free once the node has seen it close.
    let started = Instant::now();
    let mut again = connect(&node, "alpha");
    while again.is_err() && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
        again = connect(&node, "alpha");
    }
    again.expect("alpha's freed place");
    node.shutdown().expect("shutdown");
}
