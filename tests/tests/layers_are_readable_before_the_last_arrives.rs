//! Progressive puts: a prefill sends a block's layers as it computes them, and a reader of the block gets
//! each layer (GET_RANGE) as soon as it arrived and passed its checksum, before the last layer is sent. The
//! block is visible to GET, EXISTS and prefix match only once complete; a part that fails its checksum is
//! never served and the block is not stored; an abandoned put leaves nothing behind.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::Duration;

use common::{client, config, start, value_of};
use strata_client::{ClientError, Links, PutOptions};
use strata_proto::{
    FRAME_HEADER_BYTES, FrameHeader, ITEM_PROGRESSIVE, Opcode, PART_HEADER_BYTES, RequestItemHeader,
    ResponseItemHeader, Status, encode_part_header, shard_of,
};

const LAYER: usize = 64 << 10;
const LAYERS: usize = 8;

/// Reads a range of `key`, waiting (up to 5 s) for the put if the node has not seen it yet: its item header
/// may still be in flight on the writer's connection when the reader asks.
fn read_range(reader: &mut strata_client::Client, key: &[u8], offset: u32, buffer: &mut [u8]) -> usize {
    reader.get_range_into_waiting(key, offset, buffer, Duration::from_secs(5)).expect("range read")
}

#[test]
fn each_layer_is_readable_once_it_arrived_and_the_block_once_complete() {
    let node = start(config(&[0, 1], 64 << 20));
    let value = value_of(7, LAYER * LAYERS);
    let layer = |index: usize| &value[index * LAYER..(index + 1) * LAYER];
    let mut writer = client(&node);
    let mut put =
        writer.put_progressive(b"block/0", &[LAYER as u32; LAYERS], Links::NONE, PutOptions::default()).expect("start");
    put.send_part(layer(0)).expect("layer 0");
    put.send_part(layer(1)).expect("layer 1");

    let mut reader = client(&node);
    let mut buffer = vec![0u8; LAYER];
    assert_eq!(read_range(&mut reader, b"block/0", 0, &mut buffer), LAYER, "layer 0 is in");
    assert_eq!(&buffer[..], layer(0));
    assert_eq!(reader.get_range_into(b"block/0", LAYER as u32, &mut buffer).expect("layer 1 is in"), LAYER);
    assert_eq!(&buffer[..], layer(1));
    assert!(!reader.exists(b"block/0").expect("exists"), "not visible as a whole before it is complete");
    // The writer's client serves other calls meanwhile (on a connection of its own).
    writer.put(b"other", b"x").expect("put");

    // A reader of layer 5 waits for it; so does a reader of the whole block.
    let address = node.local_addr();
    let (sender, receiver) = mpsc::channel();
    let waiting_layer = sender.clone();
    let layer_reader = std::thread::spawn(move || {
        let mut reader = strata_client::Client::connect(address, Default::default()).expect("connect");
        let mut buffer = vec![0u8; LAYER];
        let read = reader.get_range_into(b"block/0", 5 * LAYER as u32, &mut buffer).map(|len| buffer[..len].to_vec());
        waiting_layer.send(("layer 5", read)).expect("send");
    });
    let whole_reader = std::thread::spawn(move || {
        let mut reader = strata_client::Client::connect(address, Default::default()).expect("connect");
        sender.send(("whole", reader.get(b"block/0"))).expect("send");
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(receiver.try_recv().is_err(), "nothing answered before layer 5 was sent");
    for index in 2..=5 {
        put.send_part(layer(index)).expect("layer");
    }
    let (what, read) = receiver.recv_timeout(Duration::from_secs(10)).expect("layer 5 answered");
    assert_eq!(what, "layer 5");
    assert_eq!(read.expect("layer 5"), layer(5));
    std::thread::sleep(Duration::from_millis(100));
    assert!(receiver.try_recv().is_err(), "the whole block waits for the last layer");
    put.send_part(layer(6)).expect("layer 6");
    put.send_part(layer(7)).expect("layer 7");
    assert!(matches!(put.send_part(layer(0)), Err(ClientError::Invalid(_))), "no ninth part");
    put.finish().expect("stored");
    let (what, read) = receiver.recv_timeout(Duration::from_secs(10)).expect("the whole block answered");
    assert_eq!(what, "whole");
    assert_eq!(read.expect("whole"), value);
    layer_reader.join().expect("join");
    whole_reader.join().expect("join");
    // Stored like any other block: its crc (folded from the parts') is checked end to end.
    assert_eq!(reader.get(b"block/0").expect("get"), value);
    assert_eq!(reader.prefix_match(&[b"block/0"]).expect("prefix match"), 1);

    // An abandoned put: its waiting reader is answered at once, and nothing is stored.
    let mut put =
        writer.put_progressive(b"block/1", &[LAYER as u32; 2], Links::NONE, PutOptions::default()).expect("start");
    put.send_part(layer(0)).expect("layer 0");
    // Once layer 0 is readable the node holds the put open; then a reader waits for layer 1.
    read_range(&mut reader, b"block/1", 0, &mut buffer);
    let waiting = std::thread::spawn(move || {
        let mut reader = strata_client::Client::connect(address, Default::default()).expect("connect");
        let mut buffer = vec![0u8; LAYER];
        reader.get_range_into(b"block/1", LAYER as u32, &mut buffer)
    });
    std::thread::sleep(Duration::from_millis(100));
    drop(put);
    assert!(matches!(waiting.join().expect("join"), Err(ClientError::NotFound)));
    assert!(!reader.exists(b"block/1").expect("exists"));
    assert!(matches!(
        writer.put_progressive(b"k", &[1, 0], Links::NONE, PutOptions::default()),
        Err(ClientError::Invalid(_))
    ));
}

/// A progressive put of `parts` under `key` as raw bytes (the client always sends good crcs), with part
/// `bad` (if any) carrying a wrong one; returns the item's status.
fn raw_progressive_put(stream: &mut TcpStream, key: &[u8], parts: &[&[u8]], bad: Option<usize>) -> Status {
    let value_len: usize = parts.iter().map(|part| part.len()).sum();
    let mut body = Vec::new();
    RequestItemHeader {
        key_len: key.len() as u16,
        flags: ITEM_PROGRESSIVE,
        value_len: value_len as u32,
        value_crc: 0,
        offset: 0,
    }
    .encode_into(&mut body);
    body.extend_from_slice(key);
    for (index, part) in parts.iter().enumerate() {
        let crc = strata_proto::crc32c(part) ^ u32::from(bad == Some(index));
        encode_part_header(part.len() as u32, crc, &mut body);
        body.extend_from_slice(part);
    }
    assert_eq!(body.len(), 16 + key.len() + value_len + parts.len() * PART_HEADER_BYTES);
    let mut frame = FrameHeader::request(Opcode::Put, 1, 1, body.len() as u64).encode().to_vec();
    frame.extend_from_slice(&body);
    stream.write_all(&frame).expect("send");
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header).expect("reply");
    assert_eq!(FrameHeader::decode(&header).expect("header").status, Status::Ok);
    let mut item = [0u8; 16];
    stream.read_exact(&mut item).expect("item");
    ResponseItemHeader::decode(&item).expect("item").status
}

#[test]
fn a_damaged_part_is_never_stored_and_a_misrouted_put_is_forwarded_whole() {
    let node = start(config(&[0, 1], 64 << 20));
    let mut reader = client(&node);
    let value = value_of(3, 3000);
    let parts: [&[u8]; 3] = [&value[..1000], &value[1000..2000], &value[2000..]];
    // Keys for each shard, each sent to shard 0's port.
    let key_on = |shard: u32| {
        (0..100u32).map(|index| format!("raw/{index}").into_bytes()).find(|key| shard_of(key, 2) == shard).expect("key")
    };
    let (local, foreign) = (key_on(0), key_on(1));
    let mut stream = TcpStream::connect(node.local_addr()).expect("connect");
    assert_eq!(raw_progressive_put(&mut stream, &local, &parts, Some(1)), Status::TransferChecksum);
    assert!(!reader.exists(&local).expect("exists"));
    assert_eq!(raw_progressive_put(&mut stream, &foreign, &parts, Some(2)), Status::TransferChecksum);
    assert!(!reader.exists(&foreign).expect("exists"));
    // The same connection is still in step: good puts, here and forwarded, store the whole value.
    assert_eq!(raw_progressive_put(&mut stream, &local, &parts, None), Status::Ok);
    assert_eq!(raw_progressive_put(&mut stream, &foreign, &parts, None), Status::Ok);
    assert_eq!(reader.get(&local).expect("get"), value);
    assert_eq!(reader.get(&foreign).expect("get"), value);
    // A put of a stored key is refused and its parts skipped, the stream still in step.
    assert_eq!(raw_progressive_put(&mut stream, &local, &parts, None), Status::Exists);
    assert_eq!(raw_progressive_put(&mut stream, b"raw/after", &parts[..1], None), Status::Ok);
}

#[test]
fn a_reader_can_wait_for_a_key_that_is_not_there_yet() {
    let node = start(config(&[0, 1], 64 << 20));
    let addr = node.local_addr();
    let layer0 = value_of(30, LAYER);
    let layer1 = value_of(31, LAYER);

    // The reader asks before the writer has started: it is answered with the first layer as soon as that
    // arrived, while the writer holds the second layer back until the reader reports.
    let (read_sender, read_done) = mpsc::channel();
    let (asking_sender, asking) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut reader = strata_client::Client::connect(addr, Default::default()).expect("connect");
        let mut buffer = vec![0u8; LAYER];
        asking_sender.send(()).expect("send");
        let read = reader.get_range_into_waiting(b"later", 0, &mut buffer, Duration::from_secs(10));
        read_sender.send((read, buffer)).expect("send");
    });
    asking.recv().expect("the reader is asking");
    std::thread::sleep(Duration::from_millis(200));
    let mut writer = client(&node);
    let mut put =
        writer.put_progressive(b"later", &[LAYER as u32; 2], Links::NONE, PutOptions::default()).expect("start");
    put.send_part(&layer0).expect("layer 0");
    let (read, buffer) = read_done.recv_timeout(Duration::from_secs(10)).expect("the reader was answered");
    assert_eq!(read, Ok(LAYER));
    assert_eq!(buffer, layer0, "the first layer, before the second was sent");
    put.send_part(&layer1).expect("layer 1");
    put.finish().expect("finish");
    reader.join().expect("reader");

    // A whole get waits for a plain put that comes later.
    let (whole_sender, whole) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let mut reader = strata_client::Client::connect(addr, Default::default()).expect("connect");
        let mut buffer = vec![0u8; 1000];
        let read = reader.get_into_waiting(b"plain-later", &mut buffer, Duration::from_secs(10));
        whole_sender.send((read, buffer)).expect("send");
    });
    std::thread::sleep(Duration::from_millis(200));
    writer.put(b"plain-later", &value_of(32, 1000)).expect("put");
    let (read, buffer) = whole.recv_timeout(Duration::from_secs(10)).expect("answered");
    assert_eq!((read, buffer), (Ok(1000), value_of(32, 1000)));
    waiter.join().expect("waiter");

    // A key that never comes: NOT_FOUND once the wait is over, not before and not much after.
    let mut reader = client(&node);
    let started = std::time::Instant::now();
    let mut buffer = vec![0u8; 10];
    assert_eq!(
        reader.get_range_into_waiting(b"never", 0, &mut buffer, Duration::from_millis(300)),
        Err(ClientError::NotFound)
    );
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(290) && waited < Duration::from_secs(5), "waited {waited:?}");
    // Without a wait, at once; and a wait the client's own timeout would cut is refused before sending.
    assert_eq!(reader.get_range_into(b"never", 0, &mut buffer), Err(ClientError::NotFound));
    let refused = reader.get_range_into_waiting(b"never", 0, &mut buffer, Duration::from_secs(45));
    assert!(matches!(refused, Err(ClientError::Invalid(_))), "{refused:?}");
    assert_eq!(reader.get(b"later").expect("the connection still works").len(), 2 * LAYER);
    node.shutdown().expect("shutdown");
}

#[test]
fn waiting_ranges_of_one_frame_wait_together() {
    let node = start(config(&[0], 32 << 20));
    let addr = node.local_addr();
    let mut reader = client(&node);
    // Two ranges on one shard whose keys never come: 500 ms each, waited together, not one after the other.
    let mut destination = vec![0u8; 20];
    let started = std::time::Instant::now();
    let results = reader.gather_into_waiting(
        &[(b"absent-a", 0, 10), (b"absent-b", 0, 10)],
        &mut destination,
        Duration::from_millis(500),
    );
    let waited = started.elapsed();
    assert_eq!(results, vec![Err(ClientError::NotFound), Err(ClientError::NotFound)]);
    assert!(waited >= Duration::from_millis(490) && waited < Duration::from_millis(900), "waited {waited:?}");

    // One of them comes 200 ms in: its bytes are gathered, the other times out.
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        let mut writer = strata_client::Client::connect(addr, Default::default()).expect("connect");
        writer.put(b"late-b", &value_of(8, 10)).expect("put");
    });
    let results = reader.gather_into_waiting(
        &[(b"absent-c", 0, 10), (b"late-b", 0, 10)],
        &mut destination,
        Duration::from_secs(1),
    );
    writer.join().expect("writer");
    assert_eq!(results, vec![Err(ClientError::NotFound), Ok(10)]);
    assert_eq!(&destination[10..], &value_of(8, 10)[..]);
    node.shutdown().expect("shutdown");
}
