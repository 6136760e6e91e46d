//! A node with a DRAM and a file-backed NVMe tier serves put, get, get_into, ranged reads, exists, remove
//! and their batch forms over loopback, on two shards; every byte read is checked.

mod common;

use common::{Scratch, client, config, key_of, start, value_of, with_file};
use strata_client::ClientError;

#[test]
fn single_keys_round_trip_on_two_shards() {
    let scratch = Scratch::new("node-single");
    let node = start(with_file(config(&[0, 1], 64 << 20), &scratch.file("ns0.img"), 64 << 20));
    let mut client = client(&node);
    assert_eq!(client.shard_count(), 2);
    for index in 0..200u64 {
        client.put(&key_of(index), &value_of(index, 100 + index as usize)).expect("put");
    }
    for index in 0..200u64 {
        assert_eq!(client.get(&key_of(index)).expect("get"), value_of(index, 100 + index as usize));
        assert!(client.exists(&key_of(index)).expect("exists"));
        assert_eq!(client.get_size(&key_of(index)).expect("size"), 100 + index);
    }
    let mut buffer = vec![0u8; 4096];
    assert_eq!(client.get_into(&key_of(7), &mut buffer).expect("get_into"), 107);
    assert_eq!(&buffer[..107], &value_of(7, 107)[..]);
    let mut small = vec![0u8; 10];
    assert!(matches!(client.get_into(&key_of(7), &mut small), Err(ClientError::BufferTooSmall { needed: 107, .. })));
    let mut range = vec![0u8; 20];
    assert_eq!(client.get_range_into(&key_of(9), 50, &mut range).expect("range"), 20);
    assert_eq!(&range[..], &value_of(9, 109)[50..70]);
    let mut past_end = vec![0u8; 20];
    assert!(matches!(client.get_range_into(&key_of(9), 100, &mut past_end), Err(ClientError::Invalid(_))));
    client.remove(&key_of(3)).expect("remove");
    assert_eq!(client.get(&key_of(3)), Err(ClientError::NotFound));
    assert!(!client.exists(&key_of(3)).expect("exists"));
    assert_eq!(client.remove(&key_of(3)), Err(ClientError::NotFound));
    // A put leaves a stored key as it is; an upsert replaces the value.
    assert_eq!(client.put(&key_of(4), b"new value"), Err(ClientError::Exists));
    assert_eq!(client.get(&key_of(4)).expect("get"), value_of(4, 104));
    client.upsert(&key_of(4), b"new value").expect("upsert");
    assert_eq!(client.get(&key_of(4)).expect("get"), b"new value");
    node.shutdown().expect("shutdown");
}

#[test]
fn batches_report_per_key_and_fill_duplicates() {
    let node = start(config(&[0, 1], 64 << 20));
    let mut client = client(&node);
    let keys: Vec<Vec<u8>> = (0..64).map(key_of).collect();
    let values: Vec<Vec<u8>> = (0..64).map(|index| value_of(index, 4096)).collect();
    let items: Vec<(&[u8], &[u8])> = keys.iter().zip(&values).map(|(key, value)| (&key[..], &value[..])).collect();
    assert!(client.batch_put(&items).iter().all(Result::is_ok));
    // Present, missing and duplicate keys in one batch.
    let missing = key_of(1000);
    let asked: Vec<&[u8]> = vec![&keys[0], &missing, &keys[5], &keys[0], &keys[63]];
    let got = client.batch_get(&asked);
    assert_eq!(got[0].as_deref(), Ok(&values[0][..]));
    assert_eq!(got[1], Err(ClientError::NotFound));
    assert_eq!(got[2].as_deref(), Ok(&values[5][..]));
    assert_eq!(got[3].as_deref(), Ok(&values[0][..]));
    assert_eq!(got[4].as_deref(), Ok(&values[63][..]));
    let mut storage = vec![vec![0u8; 4096]; asked.len()];
    let mut buffers: Vec<&mut [u8]> = storage.iter_mut().map(|buffer| &mut buffer[..]).collect();
    let lengths = client.batch_get_into(&asked, &mut buffers);
    assert_eq!(lengths[1], Err(ClientError::NotFound));
    for (slot, index) in [(0usize, 0usize), (2, 5), (3, 0), (4, 63)] {
        assert_eq!(lengths[slot], Ok(4096));
        assert_eq!(storage[slot], values[index], "slot {slot}");
    }
    let exists = client.batch_exists(&asked);
    assert_eq!(exists, vec![Ok(true), Ok(false), Ok(true), Ok(true), Ok(true)]);
    // Without an NVMe tier nothing can be durable: refused, not stored.
    let options = strata_client::PutOptions { policy: Some(strata_proto::WritePolicy::Durable), ..Default::default() };
    let durable = client.put_with(b"durable", b"v", options);
    assert!(matches!(durable, Err(ClientError::Invalid(_))), "{durable:?}");
    assert_eq!(client.get(b"durable"), Err(ClientError::NotFound));
    let removed = client.batch_remove(&[&keys[1], &missing]);
    assert_eq!(removed, vec![Ok(()), Err(ClientError::NotFound)]);
    node.shutdown().expect("shutdown");
}
