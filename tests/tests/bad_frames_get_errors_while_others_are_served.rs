//! Malformed, oversized and unauthenticated frames get an error status (and, where the stream can no longer
//! be trusted, a closed connection); the node keeps serving every other connection, and an oversized value
//! inside a good frame costs only that item.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{client, config, start, total};
use strata_client::{Client, ClientError, ClientOptions};
use strata_engine::config::EventCpus;
use strata_proto::{FRAME_HEADER_BYTES, FrameHeader, Opcode, RequestItemHeader, ResponseItemHeader, Status};

fn raw(node: &strata_engine::Node) -> TcpStream {
    let stream = TcpStream::connect(node.local_addr()).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    stream
}

/// Reads one reply header, then expects the node to close the connection.
fn error_then_close(mut stream: TcpStream) -> FrameHeader {
    let mut bytes = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut bytes).expect("an error frame");
    let header = FrameHeader::decode(&bytes).expect("a valid error frame");
    let mut rest = Vec::new();
    assert_eq!(stream.read_to_end(&mut rest).expect("closed"), 0, "the node closes the connection");
    header
}

#[test]
fn garbage_oversize_and_truncated_frames_close_only_their_connection() {
    let node = start(config(&[0], 32 << 20));
    let mut good = client(&node);
    good.put(b"survivor", b"still here").expect("put");

    let mut garbage = raw(&node);
    garbage.write_all(&[0xAB; 64]).expect("send");
    assert_eq!(error_then_close(garbage).status, Status::Invalid);
    assert_eq!(good.get(b"survivor").expect("served"), b"still here");

    // A valid header announcing a body far over the bound for a get.
    let mut oversize = raw(&node);
    oversize.write_all(&FrameHeader::request(Opcode::Get, 5, 1, 1 << 40).encode()).expect("send");
    let reply = error_then_close(oversize);
    assert_eq!((reply.status, reply.request_id), (Status::TooLarge, 5));

    // Items that do not fill the body they announce.
    let mut short = raw(&node);
    let mut body = Vec::new();
    RequestItemHeader { key_len: 3, ..Default::default() }.encode_into(&mut body);
    body.extend_from_slice(b"abc");
    let mut frame = FrameHeader::request(Opcode::Exists, 6, 1, body.len() as u64 + 4).encode().to_vec();
    frame.extend_from_slice(&body);
    frame.extend_from_slice(&[0; 4]);
    short.write_all(&frame).expect("send");
    assert_eq!(error_then_close(short).status, Status::Invalid);

    // A header, then nothing: the node waits on that connection only.
    let mut stalled = raw(&node);
    stalled.write_all(&FrameHeader::request(Opcode::Get, 7, 1, 19).encode()).expect("send");
    for index in 0..50u32 {
        good.put(&index.to_le_bytes(), b"x").expect("served while another connection stalls");
    }
    drop(stalled);
    assert_eq!(good.get(b"survivor").expect("served"), b"still here");
    assert!(total(&node, |m| &m.protocol_errors) >= 3);
    node.shutdown().expect("shutdown");
}

#[test]
fn an_oversized_value_fails_alone_and_the_connection_goes_on() {
    let mut node_config = config(&[0], 32 << 20);
    node_config.limits.max_value_bytes = 64 << 10;
    let node = start(node_config);
    let mut stream = raw(&node);
    let big = vec![7u8; 100 << 10];
    let mut body = Vec::new();
    for (key, value) in [(&b"small"[..], &b"fits"[..]), (b"big", &big[..])] {
        RequestItemHeader {
            key_len: key.len() as u16,
            flags: 0,
            value_len: value.len() as u32,
            value_crc: strata_proto::crc32c(value),
            offset: 0,
        }
        .encode_into(&mut body);
        body.extend_from_slice(key);
        body.extend_from_slice(value);
    }
    let mut frame = FrameHeader::request(Opcode::Put, 9, 2, body.len() as u64).encode().to_vec();
    frame.extend_from_slice(&body);
    stream.write_all(&frame).expect("send");
    let mut reply = [0u8; FRAME_HEADER_BYTES + 32];
    stream.read_exact(&mut reply).expect("reply");
    let header = FrameHeader::decode(&reply).expect("header");
    assert_eq!((header.status, header.count), (Status::Ok, 2));
    let first = ResponseItemHeader::decode(&reply[FRAME_HEADER_BYTES..]).expect("item");
    let second = ResponseItemHeader::decode(&reply[FRAME_HEADER_BYTES + 16..]).expect("item");
    assert_eq!((first.status, second.status), (Status::Ok, Status::TooLarge));
    // The same connection still works: the oversized value's bytes were skipped, not parsed as frames.
    let mut body = Vec::new();
    RequestItemHeader { key_len: 5, ..Default::default() }.encode_into(&mut body);
    body.extend_from_slice(b"small");
    let mut frame = FrameHeader::request(Opcode::Get, 10, 1, body.len() as u64).encode().to_vec();
    frame.extend_from_slice(&body);
    stream.write_all(&frame).expect("send");
    let mut reply = [0u8; FRAME_HEADER_BYTES + 16 + 4];
    stream.read_exact(&mut reply).expect("reply");
    assert_eq!(&reply[FRAME_HEADER_BYTES + 16..], b"fits");
    // The client refuses it before sending.
    let mut good = client(&node);
    assert!(matches!(good.put(b"big", &big), Err(ClientError::TooLarge(_))));
    node.shutdown().expect("shutdown");
}

#[test]
fn a_put_damaged_in_transit_is_refused() {
    let node = start(config(&[0], 32 << 20));
    let mut stream = raw(&node);
    let mut body = Vec::new();
    RequestItemHeader { key_len: 1, flags: 0, value_len: 4, value_crc: strata_proto::crc32c(b"good"), offset: 0 }
        .encode_into(&mut body);
    body.extend_from_slice(b"k");
    body.extend_from_slice(b"evil");
    let mut frame = FrameHeader::request(Opcode::Put, 1, 1, body.len() as u64).encode().to_vec();
    frame.extend_from_slice(&body);
    stream.write_all(&frame).expect("send");
    let mut reply = [0u8; FRAME_HEADER_BYTES + 16];
    stream.read_exact(&mut reply).expect("reply");
    assert_eq!(
        ResponseItemHeader::decode(&reply[FRAME_HEADER_BYTES..]).expect("item").status,
        Status::TransferChecksum
    );
    assert_eq!(client(&node).get(b"k"), Err(ClientError::NotFound), "nothing stored");
    node.shutdown().expect("shutdown");
}

#[test]
fn a_node_with_a_token_refuses_clients_without_it() {
    let mut node_config = config(&[0], 32 << 20);
    node_config.tenants = vec![strata_engine::tenants::TenantConfig {
        name: "only".into(),
        token: b"s3cret".to_vec(),
        dram_quota: None,
        nvme_quota: None,
        max_pinned: None,
    }];
    let node = start(node_config);
    let refused = Client::connect(node.local_addr(), ClientOptions::default()).err();
    assert_eq!(refused, Some(ClientError::Unauthenticated));
    let wrong = ClientOptions { token: Some(b"s3cres".to_vec()), ..ClientOptions::default() };
    assert_eq!(Client::connect(node.local_addr(), wrong).err(), Some(ClientError::Unauthenticated));
    // A data frame before HELLO is refused too.
    let mut stream = raw(&node);
    stream.write_all(&FrameHeader::request(Opcode::Exists, 2, 1, 17).encode()).expect("send");
    assert_eq!(error_then_close(stream).status, Status::Unauthenticated);
    let right = ClientOptions { token: Some(b"s3cret".to_vec()), ..ClientOptions::default() };
    let mut client = Client::connect(node.local_addr(), right).expect("authenticated");
    client.put(b"k", b"v").expect("put");
    assert_eq!(total(&node, |m| &m.auth_failures), 3);
    node.shutdown().expect("shutdown");
}

#[test]
fn a_peer_that_stalls_mid_frame_is_closed_and_frees_what_it_held() {
    stalled_peers_are_closed(false);
}

#[test]
fn a_busy_polled_node_closes_stalled_peers_too() {
    stalled_peers_are_closed(true);
}

fn stalled_peers_are_closed(busy_poll: bool) {
    let mut node_config = config(&[0], 32 << 20);
    node_config.stall_timeout = Duration::from_secs(2);
    node_config.busy_poll = busy_poll;
    // The stall timeout is what is tested, so the cap on values in flight is out of its way (the default,
    // half the DRAM tier, would refuse the 24 MiB put before it could stall).
    node_config.peers.partial_frame_bytes = Some(64 << 20);
    let node = start(node_config);
    let mut good = client(&node);

    // A put announcing 24 MiB of the 32 MiB of DRAM, 1,000 bytes of its value, then nothing.
    let mut stalled = raw(&node);
    let value_len = 24u32 << 20;
    let mut frame = Vec::new();
    let key = b"stalled-put";
    let body_len = (strata_proto::REQUEST_ITEM_BYTES + key.len()) as u64 + u64::from(value_len);
    FrameHeader::request(Opcode::Put, 9, 1, body_len).encode_into(&mut frame);
    RequestItemHeader { key_len: key.len() as u16, value_len, ..Default::default() }.encode_into(&mut frame);
    frame.extend_from_slice(key);
    frame.extend_from_slice(&[1u8; 1000]);
    stalled.write_all(&frame).expect("send");
    std::thread::sleep(Duration::from_millis(200));
    // Its reservation holds the DRAM while it lasts: a 16 MiB put does not fit beside it.
    let big = vec![5u8; 16 << 20];
    assert_eq!(good.put(b"big", &big), Err(ClientError::NoSpace), "the stalled put's reservation holds 24 MiB");

    // An idle connection between frames is left alone, however long; a slow but steady progressive put
    // (a part every 300 ms under a 2 s timeout, on a machine that may be busy with other tests) is too.
    let mut idle = client(&node);
    let mut steady = client(&node);
    let mut put = steady
        .put_progressive(b"steady", &[1000, 1000, 1000, 1000], strata_client::Links::NONE, Default::default())
        .expect("start");
    for part in 0..4u8 {
        std::thread::sleep(Duration::from_millis(300));
        put.send_part(&[part; 1000]).expect("part");
    }
    put.finish().expect("a steady put is stored");

    // The stalled put's connection was closed after two seconds of silence, and its reservation freed.
    let mut rest = Vec::new();
    let closed = stalled.read_to_end(&mut rest);
    let closed_by_node = match &closed {
        Ok(read) => *read == 0,
        Err(error) => error.kind() == std::io::ErrorKind::ConnectionReset,
    };
    assert!(closed_by_node, "the node closed the stalled connection (not our read timeout): {closed:?}");
    assert_eq!(total(&node, |m| &m.stalled_connections), 1);
    // (Read first: a 16 MiB put that does not fit yet evicts what it can, small objects included.)
    assert_eq!(good.get(b"steady").expect("get").len(), 4000);
    // The reservation is freed when the stalled connection's task next runs and finds its socket shut down,
    // which may come just after we see the close (the shard's core is shared with this test).
    let started = std::time::Instant::now();
    let mut put = good.put(b"big", &big);
    while put == Err(ClientError::NoSpace) && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
        put = good.put(b"big", &big);
    }
    put.expect("the 16 MiB fit once the stalled reservation was freed");

    // A client that asks for 16 MiB and reads none of it: closed too, before the reply was delivered.
    let mut deaf = raw(&node);
    let mut frame = Vec::new();
    FrameHeader::request(Opcode::Get, 10, 1, (strata_proto::REQUEST_ITEM_BYTES + 3) as u64).encode_into(&mut frame);
    RequestItemHeader { key_len: 3, ..Default::default() }.encode_into(&mut frame);
    frame.extend_from_slice(b"big");
    deaf.write_all(&frame).expect("send");
    let mut waited = Duration::ZERO;
    while total(&node, |m| &m.stalled_connections) < 2 && waited < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
        waited += Duration::from_millis(50);
    }
    assert_eq!(total(&node, |m| &m.stalled_connections), 2, "a reader that reads nothing is closed");
    let mut received = Vec::new();
    let _ = deaf.read_to_end(&mut received);
    assert!(received.len() < FRAME_HEADER_BYTES + (16 << 20), "{} bytes: the whole reply went out", received.len());

    assert_eq!(idle.get(b"big").expect("the idle connection still works").len(), 16 << 20);
    node.shutdown().expect("shutdown");
}

#[test]
fn a_subscriber_that_reads_nothing_is_closed_by_its_sender_thread() {
    subscribers_that_read_nothing_are_closed(EventCpus::These(vec![0]));
}

#[test]
fn a_subscriber_that_reads_nothing_is_closed_by_its_shard() {
    subscribers_that_read_nothing_are_closed(EventCpus::Inline);
}

/// A subscriber that stops reading while events pour in fills its socket, then is closed after the stall
/// timeout, whoever writes its frames; the puts behind the events go on meanwhile.
fn subscribers_that_read_nothing_are_closed(event_cpus: EventCpus) {
    let mut node_config = config(&[0], 64 << 20);
    node_config.stall_timeout = Duration::from_secs(2);
    node_config.event_cpus = event_cpus.clone();
    let node = start(node_config);
    let expected_cpus = if let EventCpus::These(cpus) = &event_cpus { cpus.clone() } else { Vec::new() };
    assert_eq!(node.summary().event_cpus, expected_cpus);
    let mut deaf = raw(&node);
    let mut frame = Vec::new();
    FrameHeader::request(Opcode::Subscribe, 11, 1, (strata_proto::REQUEST_ITEM_BYTES + 1) as u64)
        .encode_into(&mut frame);
    RequestItemHeader { key_len: 1, flags: strata_proto::ITEM_MATCH_ALL, ..Default::default() }.encode_into(&mut frame);
    frame.push(b'*');
    deaf.write_all(&frame).expect("subscribe");
    let mut ready = [0u8; FRAME_HEADER_BYTES];
    deaf.read_exact(&mut ready).expect("the subscription is acknowledged");
    assert_eq!(FrameHeader::decode(&ready).expect("header").status, Status::Ok);

    // Puts until the node gave up on the subscriber (bounded by count and time): ~45 bytes of events
    // each, far more than loopback's socket buffers hold after a few hundred thousand.
    let mut good = client(&node);
    let keys: Vec<Vec<u8>> = (0..1_000u64).map(|index| format!("deaf-subscriber-{index:020}").into_bytes()).collect();
    let started = std::time::Instant::now();
    let mut rounds = 0;
    while total(&node, |m| &m.stalled_connections) == 0
        && rounds < 100_000
        && started.elapsed() < Duration::from_secs(20)
    {
        let items: Vec<(&[u8], &[u8])> = keys.iter().map(|key| (&key[..], &b"v"[..])).collect();
        assert!(good.batch_upsert(&items).iter().all(Result::is_ok), "puts go on beside the subscriber");
        rounds += 1;
    }
    assert_eq!(total(&node, |m| &m.stalled_connections), 1, "the subscriber was closed as stalled ({rounds} rounds)");
    // What was in its socket is still readable; then the connection ends.
    let mut received = Vec::new();
    let ended = deaf.read_to_end(&mut received);
    let closed_by_node = match &ended {
        Ok(_) => true,
        Err(error) => error.kind() == std::io::ErrorKind::ConnectionReset,
    };
    assert!(closed_by_node, "the node closed the subscriber (not our read timeout): {ended:?}");
    assert_eq!(good.get(&keys[0]).expect("the node still serves"), b"v");
    node.shutdown().expect("shutdown");
}

#[test]
fn frame_flags_statuses_and_reserved_bytes_in_requests_are_refused() {
    let node = start(config(&[0], 32 << 20));
    let mut body = Vec::new();
    RequestItemHeader { key_len: 3, ..Default::default() }.encode_into(&mut body);
    body.extend_from_slice(b"abc");
    let good = FrameHeader::request(Opcode::Exists, 11, 1, body.len() as u64);
    let mut damaged: Vec<(&str, Vec<u8>)> = vec![
        ("flags", FrameHeader { flags: 1, ..good }.encode().to_vec()),
        ("status", FrameHeader { status: Status::NotFound, ..good }.encode().to_vec()),
    ];
    // Reserved bytes 36..40 lie outside the header crc; 22..24 inside it (the crc is made right again).
    let mut trailing = good.encode();
    trailing[38] = 1;
    damaged.push(("reserved after the crc", trailing.to_vec()));
    let mut inner = good.encode();
    inner[22] = 1;
    let crc = strata_proto::crc32c(&inner[..32]);
    inner[32..36].copy_from_slice(&crc.to_le_bytes());
    damaged.push(("reserved under the crc", inner.to_vec()));
    for (what, mut frame) in damaged {
        frame.extend_from_slice(&body);
        let mut stream = raw(&node);
        stream.write_all(&frame).expect("send");
        assert_eq!(error_then_close(stream).status, Status::Invalid, "{what}");
    }
    // MEMBERS takes one item: a frame of two would have the node copy its view twice.
    let mut members = FrameHeader::request(Opcode::Members, 12, 2, 2 * body.len() as u64).encode().to_vec();
    members.extend_from_slice(&body);
    members.extend_from_slice(&body);
    let mut stream = raw(&node);
    stream.write_all(&members).expect("send");
    assert_eq!(error_then_close(stream).status, Status::Invalid, "two MEMBERS items");
    // One is answered: NOT_FOUND from a node that runs alone.
    let mut members = FrameHeader::request(Opcode::Members, 13, 1, body.len() as u64).encode().to_vec();
    members.extend_from_slice(&body);
    let mut stream = raw(&node);
    stream.write_all(&members).expect("send");
    let mut reply = [0u8; FRAME_HEADER_BYTES + 16];
    stream.read_exact(&mut reply).expect("reply");
    assert_eq!(ResponseItemHeader::decode(&reply[FRAME_HEADER_BYTES..]).expect("item").status, Status::NotFound);
    // SCAN takes one item too: a frame of two would have the shard walk its index twice.
    let mut scan_body = Vec::new();
    RequestItemHeader { key_len: 3, value_len: 16, ..Default::default() }.encode_into(&mut scan_body);
    scan_body.extend_from_slice(b"abc");
    let mut scans = FrameHeader::request(Opcode::Scan, 14, 2, 2 * scan_body.len() as u64).encode().to_vec();
    scans.extend_from_slice(&scan_body);
    scans.extend_from_slice(&scan_body);
    let mut stream = raw(&node);
    stream.write_all(&scans).expect("send");
    assert_eq!(error_then_close(stream).status, Status::Invalid, "two SCAN items");
    // A page of 0 keys, or of more than MAX_SCAN_KEYS, is refused for that item; the connection serves on.
    let mut stream = raw(&node);
    for (id, wanted) in [(15, 0), (16, strata_proto::MAX_SCAN_KEYS + 1), (17, 16)] {
        let mut frame = Vec::new();
        FrameHeader::request(Opcode::Scan, id, 1, scan_body.len() as u64).encode_into(&mut frame);
        RequestItemHeader { key_len: 3, value_len: wanted, ..Default::default() }.encode_into(&mut frame);
        frame.extend_from_slice(b"abc");
        stream.write_all(&frame).expect("send");
        let mut reply = [0u8; FRAME_HEADER_BYTES + 16];
        stream.read_exact(&mut reply).expect("reply");
        let item = ResponseItemHeader::decode(&reply[FRAME_HEADER_BYTES..]).expect("item");
        let status = if wanted == 16 { Status::Ok } else { Status::Invalid };
        assert_eq!(item.status, status, "a page of {wanted} keys");
        assert_eq!(item.data_len, 0, "an empty node lists no key");
    }
    // The same frame with every reserved field zero is answered.
    let mut frame = good.encode().to_vec();
    frame.extend_from_slice(&body);
    let mut stream = raw(&node);
    stream.write_all(&frame).expect("send");
    let mut reply = [0u8; FRAME_HEADER_BYTES + 16];
    stream.read_exact(&mut reply).expect("reply");
    let item = ResponseItemHeader::decode(&reply[FRAME_HEADER_BYTES..]).expect("item");
    assert_eq!(item.status, Status::NotFound);
    node.shutdown().expect("shutdown");
}
