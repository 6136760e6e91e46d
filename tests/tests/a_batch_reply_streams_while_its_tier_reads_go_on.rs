//! A GET batch whose items need device reads is answered as a stream to a client that accepted it in HELLO
//! (FRAME_STREAMED): the header goes out with no body length and the items follow in request order, each
//! run of ready items as soon as it is ready, so DRAM hits are not held back by the tier's reads. A client
//! that did not accept it gets the exact body length; a batch that DRAM answers whole is never streamed.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Scratch, client, config, key_of, read_header, say_hello, start, value_of, with_file};
use strata_proto::{
    FRAME_STREAMED, FrameHeader, HelloRequest, Opcode, RESPONSE_ITEM_BYTES, RequestItemHeader, ResponseItemHeader,
    Status,
};

const VALUE_BYTES: usize = 64 << 10;

/// A raw connection past its HELLO, accepting streamed replies or not.
fn raw(node: &strata_engine::Node, accepts_streamed: bool) -> TcpStream {
    let mut stream = TcpStream::connect(node.local_addr()).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let hello = HelloRequest { accepts_streamed, ..HelloRequest::default() };
    let (header, _) = say_hello(&mut stream, &hello);
    assert_eq!(header.status, Status::Ok, "HELLO");
    stream
}

/// Sends one GET of `keys` and reads its reply item by item, each with its data: the reply's header and
/// the items. The data of each item is checked against its crc.
fn get_batch(stream: &mut TcpStream, keys: &[Vec<u8>]) -> (FrameHeader, Vec<(ResponseItemHeader, Vec<u8>)>) {
    let mut body = Vec::new();
    for key in keys {
        RequestItemHeader { key_len: key.len() as u16, ..Default::default() }.encode_into(&mut body);
        body.extend_from_slice(key);
    }
    let mut frame = Vec::new();
    FrameHeader::request(Opcode::Get, 9, keys.len() as u32, body.len() as u64).encode_into(&mut frame);
    frame.extend_from_slice(&body);
    stream.write_all(&frame).expect("get");
    let header = read_header(stream);
    assert_eq!((header.status, header.count as usize), (Status::Ok, keys.len()));
    let items = (0..keys.len())
        .map(|_| {
            let mut bytes = [0u8; RESPONSE_ITEM_BYTES];
            stream.read_exact(&mut bytes).expect("reply item");
            let item = ResponseItemHeader::decode(&bytes).expect("an item");
            let mut data = vec![0u8; item.data_len as usize];
            stream.read_exact(&mut data).expect("its data");
            assert_eq!(strata_proto::crc32c(&data), item.data_crc, "the item's crc");
            (item, data)
        })
        .collect();
    (header, items)
}

fn body_bytes(items: &[(ResponseItemHeader, Vec<u8>)]) -> u64 {
    items.iter().map(|(_, data)| (RESPONSE_ITEM_BYTES + data.len()) as u64).sum()
}

#[test]
fn a_batch_with_tier_reads_is_streamed_only_to_a_client_that_accepted_it() {
    let scratch = Scratch::new("streamed-reply");
    let node = start(with_file(config(&[0], 4 << 20), &scratch.file("ns0.img"), 64 << 20));
    let mut writer = client(&node);
    // 12 MiB over 4 MiB of DRAM: the first values live on the tier only, the last ones in DRAM too.
    for index in 0..192u64 {
        writer.put(&key_of(index), &value_of(index, VALUE_BYTES)).expect("put");
    }
    let mut streaming = raw(&node, true);
    let mut plain = raw(&node, false);

    // DRAM answers the whole batch: one reply of known length, even where streaming was accepted.
    let dram_only = [key_of(191), key_of(190)];
    let (header, items) = get_batch(&mut streaming, &dram_only);
    assert_eq!(header.flags & FRAME_STREAMED, 0, "nothing to wait for, nothing streamed");
    assert_eq!(header.body_len, body_bytes(&items));
    assert_eq!(items[0].1, value_of(191, VALUE_BYTES));

    // DRAM hits, tier reads and a miss, interleaved.
    let mixed = [key_of(189), key_of(0), b"missing".to_vec(), key_of(1), key_of(188), key_of(2)];
    let expected = |at: usize| match at {
        0 => Some(value_of(189, VALUE_BYTES)),
        1 => Some(value_of(0, VALUE_BYTES)),
        3 => Some(value_of(1, VALUE_BYTES)),
        4 => Some(value_of(188, VALUE_BYTES)),
        5 => Some(value_of(2, VALUE_BYTES)),
        _ => None,
    };
    for (stream, streamed) in [(&mut plain, false), (&mut streaming, true)] {
        let (header, items) = get_batch(stream, &mixed);
        assert_eq!(header.flags & FRAME_STREAMED != 0, streamed, "streamed to the client that accepted it alone");
        let body_len = if streamed { 0 } else { body_bytes(&items) };
        assert_eq!(header.body_len, body_len, "a streamed reply has no body length; another one the exact one");
        for (at, (item, data)) in items.iter().enumerate() {
            match expected(at) {
                Some(value) => assert_eq!((item.status, data), (Status::Ok, &value), "item {at}"),
                None => assert_eq!((item.status, data.len()), (Status::NotFound, 0), "item {at}"),
            }
        }
    }

    // The client library reads a streamed reply into its buffers (it accepts streaming in its HELLO).
    let keys: Vec<Vec<u8>> = (0..24u64).map(key_of).chain([key_of(187)]).collect();
    let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let mut buffers: Vec<Vec<u8>> = keys.iter().map(|_| vec![0u8; VALUE_BYTES]).collect();
    let mut slices: Vec<&mut [u8]> = buffers.iter_mut().map(Vec::as_mut_slice).collect();
    for (at, result) in writer.batch_get_into(&refs, &mut slices).into_iter().enumerate() {
        assert_eq!(result.expect("a hit"), VALUE_BYTES, "key {at}");
    }
    for (at, buffer) in buffers.iter().enumerate() {
        let index = if at < 24 { at as u64 } else { 187 };
        assert_eq!(buffer, &value_of(index, VALUE_BYTES), "key {index}");
    }
    node.shutdown().expect("shutdown");
}
