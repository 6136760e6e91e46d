//! Values from 1 byte to 64 MiB round-trip through put, get and get_into, single and batched.

mod common;

use common::{Scratch, client, config, key_of, start, value_of, with_file};

#[test]
fn every_size_round_trips() {
    let scratch = Scratch::new("sizes");
    let node = start(with_file(config(&[0, 1], 256 << 20), &scratch.file("ns0.img"), 128 << 20));
    let mut client = client(&node);
    let sizes = [1usize, 2, 7, 100, 4095, 4096, 4097, 65_536, 1 << 20, (3 << 20) + 1, 16 << 20, 64 << 20];
    for (index, &size) in sizes.iter().enumerate() {
        client
            .put(&key_of(index as u64), &value_of(index as u64, size))
            .unwrap_or_else(|error| panic!("put {size}: {error}"));
    }
    for (index, &size) in sizes.iter().enumerate() {
        let value = client.get(&key_of(index as u64)).unwrap_or_else(|error| panic!("get {size}: {error}"));
        assert_eq!(value.len(), size);
        assert!(value == value_of(index as u64, size), "value of {size} bytes differs");
        let mut buffer = vec![0u8; size + 5];
        assert_eq!(client.get_into(&key_of(index as u64), &mut buffer).expect("get_into"), size);
        assert!(buffer[..size] == value_of(index as u64, size)[..]);
    }
    let keys: Vec<Vec<u8>> = (0..sizes.len() as u64).map(key_of).collect();
    let key_refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    for (index, result) in client.batch_get(&key_refs).into_iter().enumerate() {
        assert!(result.expect("batch get") == value_of(index as u64, sizes[index]));
    }
    // A durable put of an object larger than a region (1 MiB here) cannot be made durable: refused, and
    // nothing is left behind.
    let big = vec![1u8; 2 << 20];
    let durable = strata_client::PutOptions { policy: Some(strata_proto::WritePolicy::Durable), ..Default::default() };
    let refused = client.put_with(b"durable-big", &big, durable);
    assert!(matches!(refused, Err(strata_client::ClientError::TooLarge(_))), "{refused:?}");
    assert_eq!(client.get(b"durable-big"), Err(strata_client::ClientError::NotFound));
    client.put_with(b"durable-small", b"kept", durable).expect("durable put");
    // An empty value is a value.
    client.put(b"empty", b"").expect("put empty");
    assert_eq!(client.get(b"empty").expect("get empty"), Vec::<u8>::new());
    node.shutdown().expect("shutdown");
}
