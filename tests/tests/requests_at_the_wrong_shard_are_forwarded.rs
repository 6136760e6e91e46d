//! A request that reaches a shard that does not own its key is forwarded to the owner and counted: a client
//! that sends everything to one port still reads and writes the same objects a shard-aware client does.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;

use common::{client, config, start, total};
use strata_proto::{FRAME_HEADER_BYTES, FrameHeader, Opcode, RequestItemHeader, ResponseItemHeader, Status, shard_of};

/// Sends one frame of `opcode` with `items` (key, value) on `stream` and returns the reply's items with their
/// data.
/// A LOCATE frame of `keys`: each item's status, value length and tiers.
fn locate(stream: &mut TcpStream, keys: &[(&[u8], &[u8])]) -> Vec<(Status, u32, u32)> {
    let mut body = Vec::new();
    for (key, _) in keys {
        RequestItemHeader { key_len: key.len() as u16, ..Default::default() }.encode_into(&mut body);
        body.extend_from_slice(key);
    }
    let mut frame = FrameHeader::request(Opcode::Locate, 2, keys.len() as u32, body.len() as u64).encode().to_vec();
    frame.extend_from_slice(&body);
    stream.write_all(&frame).expect("send");
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header).expect("reply");
    let header = FrameHeader::decode(&header).expect("header");
    assert_eq!((header.status, header.count as usize), (Status::Ok, keys.len()));
    (0..header.count)
        .map(|_| {
            let mut item = [0u8; 16];
            stream.read_exact(&mut item).expect("item");
            let item = ResponseItemHeader::decode(&item).expect("item");
            assert_eq!(item.data_len, 0, "LOCATE sends no value");
            (item.status, item.object_len, item.data_crc)
        })
        .collect()
}

fn call(stream: &mut TcpStream, opcode: Opcode, items: &[(&[u8], &[u8])]) -> Vec<(Status, Vec<u8>)> {
    let mut body = Vec::new();
    for (key, value) in items {
        let value_len = if opcode == Opcode::Put { value.len() as u32 } else { 0 };
        RequestItemHeader {
            key_len: key.len() as u16,
            flags: 0,
            value_len,
            value_crc: strata_proto::crc32c(value),
            offset: 0,
        }
        .encode_into(&mut body);
        body.extend_from_slice(key);
        if opcode == Opcode::Put {
            body.extend_from_slice(value);
        }
    }
    let mut frame = FrameHeader::request(opcode, 1, items.len() as u32, body.len() as u64).encode().to_vec();
    frame.extend_from_slice(&body);
    stream.write_all(&frame).expect("send");
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header).expect("reply");
    let header = FrameHeader::decode(&header).expect("header");
    assert_eq!(header.status, Status::Ok);
    (0..header.count)
        .map(|_| {
            let mut item = [0u8; 16];
            stream.read_exact(&mut item).expect("item");
            let item = ResponseItemHeader::decode(&item).expect("item");
            let mut data = vec![0u8; item.data_len as usize];
            stream.read_exact(&mut data).expect("data");
            assert_eq!(strata_proto::crc32c(&data), item.data_crc);
            (item.status, data)
        })
        .collect()
}

#[test]
fn every_operation_is_forwarded_to_the_owner() {
    let node = start(config(&[0, 1], 32 << 20));
    let keys: Vec<Vec<u8>> = (0..40u32).map(|index| format!("key-{index}").into_bytes()).collect();
    let foreign: Vec<&Vec<u8>> = keys.iter().filter(|key| shard_of(key, 2) == 1).collect();
    assert!(foreign.len() > 5, "some keys belong to shard 1");
    // Everything goes to shard 0's port.
    let mut stream = TcpStream::connect(node.local_addr()).expect("connect");
    let puts: Vec<(&[u8], &[u8])> = keys.iter().map(|key| (&key[..], &key[..])).collect();
    assert!(call(&mut stream, Opcode::Put, &puts).iter().all(|(status, _)| *status == Status::Ok));
    assert!(total(&node, |m| &m.forwarded) >= foreign.len() as u64);
    let gets: Vec<(&[u8], &[u8])> = keys.iter().map(|key| (&key[..], &b""[..])).collect();
    for ((status, data), key) in call(&mut stream, Opcode::Get, &gets).into_iter().zip(&keys) {
        assert_eq!((status, &data), (Status::Ok, key));
    }
    // The shard-aware client finds them where they belong.
    let mut aware = client(&node);
    for key in &keys {
        assert_eq!(&aware.get(key).expect("owner has it"), key);
    }
    assert!(call(&mut stream, Opcode::Exists, &gets).iter().all(|(status, _)| *status == Status::Ok));
    // LOCATE, forwarded too: each value's length, in DRAM (the node has no tier).
    for ((status, len, tiers), key) in locate(&mut stream, &gets).into_iter().zip(&keys) {
        assert_eq!((status, len as usize, tiers), (Status::Ok, key.len(), strata_proto::LOCATED_IN_DRAM));
    }
    assert!(call(&mut stream, Opcode::Remove, &gets).iter().all(|(status, _)| *status == Status::Ok));
    assert!(locate(&mut stream, &gets).iter().all(|(status, _, _)| *status == Status::NotFound));
    assert!(call(&mut stream, Opcode::Exists, &gets).iter().all(|(status, _)| *status == Status::NotFound));
    node.shutdown().expect("shutdown");
}

/// A durable put larger than a region is refused by its owner whichever shard it reached: forwarded, it
/// goes through the same put pipeline, so it leaves no copy behind either.
#[test]
fn a_forwarded_durable_put_too_large_for_a_region_is_refused_and_leaves_nothing() {
    let mut config = config(&[0, 1], 32 << 20);
    config.nvme = vec![strata_nvme::DeviceSpec::Memory { capacity_bytes: 64 << 20 }];
    config.write_policy = strata_proto::WritePolicy::Durable;
    let node = start(config);
    let key_at =
        |shard: u32| (0..).map(|index| format!("big-{index}").into_bytes()).find(|key| shard_of(key, 2) == shard);
    let value = vec![7u8; 2 << 20];
    let mut stream = TcpStream::connect(node.local_addr()).expect("shard 0");
    for key in [key_at(0).expect("own key"), key_at(1).expect("foreign key")] {
        let put = call(&mut stream, Opcode::Put, &[(&key, &value)]);
        assert_eq!(put[0].0, Status::TooLarge, "key owned by shard {}", shard_of(&key, 2));
        let exists = call(&mut stream, Opcode::Exists, &[(&key, b"")]);
        assert_eq!(exists[0].0, Status::NotFound, "key owned by shard {}", shard_of(&key, 2));
    }
    assert!(total(&node, |m| &m.forwarded) >= 2);
    node.shutdown().expect("shutdown");
}
