//! What a serving engine's connector does with a node: asks how much of a block chain is stored, stores
//! blocks without clobbering ones already there, pins the blocks it must keep, writes and reads one block
//! from per-layer buffers, and gathers the KV-head slices a decode rank needs from the shards that prefill
//! ranks stored (tensor parallelism Tp = 8 → Td = 2).

mod common;

use std::time::Duration;

use common::{client, config, key_of, start, total, value_of};
use strata_client::{ClientError, Pin, PutOptions};

#[test]
fn prefix_match_counts_the_leading_stored_keys_of_each_chain() {
    let node = start(config(&[0, 1], 64 << 20));
    let mut client = client(&node);
    let chain: Vec<Vec<u8>> = (0..50).map(key_of).collect();
    for index in (0..30).chain([40]) {
        client.put(&chain[index], &value_of(index as u64, 256)).expect("put");
    }
    let refs: Vec<&[u8]> = chain.iter().map(Vec::as_slice).collect();
    // Keys 0..30 and 40 are stored: the prefix stops at 30, and key 40 past the gap does not count.
    assert_eq!(client.prefix_match(&refs), Ok(30));
    assert_eq!(client.prefix_match(&refs[..12]), Ok(12));
    assert_eq!(client.prefix_match(&refs[30..]), Ok(0));
    assert_eq!(client.prefix_match(&[]), Ok(0));
    // Many chains in one call: a result per chain.
    let other: Vec<Vec<u8>> = (1000..1010).map(key_of).collect();
    let other_refs: Vec<&[u8]> = other.iter().map(Vec::as_slice).collect();
    let chains: Vec<&[&[u8]]> = vec![&refs, &other_refs, &refs[5..8]];
    assert_eq!(client.batch_prefix_match(&chains), vec![Ok(30), Ok(0), Ok(3)]);
    // A 1,000-key chain, spread over both shards, fully stored.
    let long: Vec<Vec<u8>> = (5000..6000).map(key_of).collect();
    let items: Vec<(&[u8], &[u8])> = long.iter().map(|key| (&key[..], &b"kv"[..])).collect();
    assert!(client.batch_put(&items).iter().all(Result::is_ok));
    let long_refs: Vec<&[u8]> = long.iter().map(Vec::as_slice).collect();
    assert_eq!(client.prefix_match(&long_refs), Ok(1000));
    client.remove(&long[700]).expect("remove");
    assert_eq!(client.prefix_match(&long_refs), Ok(700));
    // Routed by the shard map: nothing was forwarded.
    assert_eq!(total(&node, |shard| &shard.forwarded), 0);
    node.shutdown().expect("shutdown");
}

#[test]
fn a_prefix_match_holds_the_blocks_it_found_until_the_engine_loads_them() {
    // DRAM only (an eviction is a departure), a long read lease: blocks a scheduler matched stay while
    // DRAM pressure evicts everything else, so the load that follows the match finds them.
    let mut node_config = config(&[0, 1], 8 << 20);
    node_config.read_lease = Duration::from_secs(60);
    let node = start(node_config);
    let mut client = client(&node);
    let matched: Vec<Vec<u8>> = (0..8).map(|index| format!("matched/{index}").into_bytes()).collect();
    let unmatched: Vec<Vec<u8>> = (0..8).map(|index| format!("unmatched/{index}").into_bytes()).collect();
    for (index, key) in matched.iter().chain(&unmatched).enumerate() {
        client.put(key, &value_of(index as u64, 64 << 10)).expect("put");
    }
    let chain: Vec<&[u8]> = matched.iter().map(Vec::as_slice).collect();
    assert_eq!(client.prefix_match(&chain).expect("prefix match"), 8);
    // 24 MiB of new blocks through 8 MiB of DRAM.
    for index in 0..384u64 {
        client.put(&key_of(index), &value_of(index, 64 << 10)).expect("put");
    }
    let unmatched_refs: Vec<&[u8]> = unmatched.iter().map(Vec::as_slice).collect();
    assert!(client.batch_exists(&unmatched_refs).iter().all(|found| !found.as_ref().expect("exists")));
    assert!(!client.exists(&key_of(0)).expect("exists"), "the oldest filler was evicted");
    for (index, key) in matched.iter().enumerate() {
        assert_eq!(client.get(key).expect("the matched block is still there"), value_of(index as u64, 64 << 10));
    }
}

#[test]
fn a_put_keeps_a_stored_block_and_an_upsert_replaces_it() {
    let node = start(config(&[0, 1], 64 << 20));
    let mut client = client(&node);
    let (first, second) = (key_of(1), key_of(2));
    client.put(&first, b"version one").expect("put");
    let results = client.batch_put(&[(&first, b"version two"), (&second, b"fresh")]);
    assert_eq!(results, vec![Err(ClientError::Exists), Ok(())]);
    assert_eq!(client.get(&first).expect("get"), b"version one");
    assert_eq!(client.batch_upsert(&[(&first, b"version two")]), vec![Ok(())]);
    assert_eq!(client.get(&first).expect("get"), b"version two");
    node.shutdown().expect("shutdown");
}

#[test]
fn hard_pins_are_never_evicted_and_soft_pins_go_only_when_their_ttl_ran_out() {
    // One shard, 8 MiB of DRAM, no NVMe tier: an evicted object is gone, so presence proves sparing.
    let node = start(config(&[0], 8 << 20));
    let mut client = client(&node);
    let value = |index: u64| value_of(index, 64 << 10);
    let hard = PutOptions { pin: Pin::Hard, ..PutOptions::default() };
    let soft = PutOptions { pin: Pin::Soft { ttl_seconds: 600 }, ..PutOptions::default() };
    let lapsing = PutOptions { pin: Pin::Soft { ttl_seconds: 1 }, ..PutOptions::default() };
    client.put_with(b"system-prompt", &value(1), hard).expect("hard pin");
    client.put_with(b"hot-chat", &value(2), soft).expect("soft pin");
    client.put_with(b"old-chat", &value(3), lapsing).expect("soft pin, 1 s");
    assert_eq!(total(&node, |shard| &shard.pinned_bytes), 3 * (64 << 10) + 13 + 8 + 8);
    std::thread::sleep(Duration::from_millis(1200));
    // Three times the DRAM tier in unpinned blocks: everything evictable is evicted at least once.
    for index in 0..384u64 {
        client.put(&key_of(index), &value(100 + index)).expect("put");
    }
    assert!(total(&node, |shard| &shard.dram_evictions) > 200);
    assert_eq!(client.get(b"system-prompt").expect("hard pin kept"), value(1));
    assert_eq!(client.get(b"hot-chat").expect("soft pin kept"), value(2));
    assert_eq!(client.get(b"old-chat"), Err(ClientError::NotFound), "a lapsed soft pin is evictable");
    assert_eq!(client.get(&key_of(0)), Err(ClientError::NotFound));
    // Pins are bounded (half the DRAM by default): a pin past the bound is refused and not stored.
    let big = vec![7u8; 3 << 20];
    client.put_with(b"pin-a", &big, hard).expect("pin within the bound");
    assert_eq!(client.put_with(b"pin-b", &big, hard), Err(ClientError::Quota));
    assert_eq!(client.get(b"pin-b"), Err(ClientError::NotFound));
    // A removal unpins: the bytes are free for another pin.
    client.remove(b"pin-a").expect("remove");
    client.put_with(b"pin-b", &big, hard).expect("pin after the removal");
    node.shutdown().expect("shutdown");
}

#[test]
fn a_block_is_written_from_and_read_into_per_layer_buffers() {
    let node = start(config(&[0, 1], 64 << 20));
    let mut client = client(&node);
    let layers: Vec<Vec<u8>> = (0..32).map(|layer| value_of(layer, 4096)).collect();
    let parts: Vec<&[u8]> = layers.iter().map(Vec::as_slice).collect();
    client.put_parts(b"block-0", &parts, PutOptions::default()).expect("put from layers");
    assert_eq!(client.get(b"block-0").expect("get"), layers.concat());
    let mut storage = vec![vec![0u8; 4096]; 32];
    let mut buffers: Vec<&mut [u8]> = storage.iter_mut().map(Vec::as_mut_slice).collect();
    assert_eq!(client.get_into_parts(b"block-0", &mut buffers), Ok(32 * 4096));
    assert_eq!(storage, layers);
    // Layer 5 alone, by range.
    let mut layer = vec![0u8; 4096];
    assert_eq!(client.get_range_into(b"block-0", 5 * 4096, &mut layer), Ok(4096));
    assert_eq!(layer, layers[5]);
    // Buffers too small for the value: refused for that key, nothing written past them.
    let mut short = [vec![0u8; 4096], vec![0u8; 100]];
    let mut short_refs: Vec<&mut [u8]> = short.iter_mut().map(Vec::as_mut_slice).collect();
    assert!(matches!(client.get_into_parts(b"block-0", &mut short_refs), Err(ClientError::BufferTooSmall { .. })));
    node.shutdown().expect("shutdown");
}

#[test]
fn a_decode_rank_gathers_its_kv_heads_from_the_prefill_ranks_shards() {
    // Llama-3-8B-like: 8 KV heads, head_dim 128, bf16, 16 tokens per block, one layer shown. A K (or V)
    // slice of one head is 16 × 128 × 2 = 4 KiB. Prefill ran with Tp = 8: rank r stored key
    // "blk/tp8/r" = [K of head r | V of head r]. Decode runs with Td = 2: rank d needs heads 4d..4d+4,
    // laid out [K of its 4 heads | V of its 4 heads] in one buffer.
    const SLICE: u32 = 16 * 128 * 2;
    let node = start(config(&[0, 1], 64 << 20));
    let mut client = client(&node);
    let k_of = |head: u64| value_of(head, SLICE as usize);
    let v_of = |head: u64| value_of(100 + head, SLICE as usize);
    let keys: Vec<Vec<u8>> = (0..8).map(|rank| format!("blk/tp8/{rank}").into_bytes()).collect();
    for (rank, key) in keys.iter().enumerate() {
        // Each prefill rank scatters its one buffer [K | V] into its key (one piece here).
        let buffer = [k_of(rank as u64), v_of(rank as u64)].concat();
        let results = client.scatter_put(&buffer, &[(key, buffer.len())], PutOptions::default());
        assert_eq!(results, vec![Ok(())]);
    }
    for decode_rank in 0..2u64 {
        let heads = decode_rank * 4..decode_rank * 4 + 4;
        let mut ranges: Vec<(&[u8], u32, u32)> = Vec::new();
        for head in heads.clone() {
            ranges.push((&keys[head as usize], 0, SLICE));
        }
        for head in heads.clone() {
            ranges.push((&keys[head as usize], SLICE, SLICE));
        }
        let mut destination = vec![0u8; 8 * SLICE as usize];
        let results = client.gather_into(&ranges, &mut destination);
        assert!(results.iter().all(|result| *result == Ok(SLICE as usize)), "{results:?}");
        let expected: Vec<u8> = heads.clone().map(k_of).chain(heads.map(v_of)).flatten().collect();
        assert!(destination == expected, "decode rank {decode_rank} got the wrong bytes");
    }
    // One range of a missing key fails alone; the others are filled.
    let missing = b"blk/tp8/none".to_vec();
    let ranges: Vec<(&[u8], u32, u32)> = vec![(&keys[0], 0, SLICE), (&missing, 0, SLICE), (&keys[1], 0, SLICE)];
    let mut destination = vec![0u8; 3 * SLICE as usize];
    let results = client.gather_into(&ranges, &mut destination);
    assert_eq!(results, vec![Ok(SLICE as usize), Err(ClientError::NotFound), Ok(SLICE as usize)]);
    assert!(destination[2 * SLICE as usize..] == k_of(1));
    // A scatter of one buffer into several keys, and a destination too small for a gather.
    let source = value_of(77, 300);
    let pieces: Vec<(&[u8], usize)> = vec![(b"piece-a", 100), (b"piece-b", 200)];
    assert_eq!(client.scatter_put(&source, &pieces, PutOptions::default()), vec![Ok(()), Ok(())]);
    assert_eq!(client.get(b"piece-b").expect("get"), &source[100..]);
    let mut tiny = [0u8; 10];
    assert!(matches!(client.gather_into(&ranges, &mut tiny)[0], Err(ClientError::BufferTooSmall { .. })));
    node.shutdown().expect("shutdown");
}

#[test]
fn removal_by_pattern_reaches_dram_and_nvme_objects_and_survives_a_restart() {
    let scratch = common::Scratch::new("remove-matching");
    let path = scratch.file("ns0.img");
    let node_config = || common::with_file(config(&[0, 1], 8 << 20), &path, 64 << 20);
    let node = start(node_config());
    let mut client = client(&node);
    // 25 MiB of values over 8 MiB of DRAM: most objects are on the NVMe tier only.
    for index in 0..200u64 {
        let prefix = if index % 2 == 0 { "chat" } else { "system" };
        let key = format!("{prefix}/{index}");
        client.put(key.as_bytes(), &value_of(index, 128 << 10)).expect("put");
    }
    assert!(total(&node, |shard| &shard.dram_evictions) > 100, "objects were evicted to NVMe");
    assert_eq!(client.remove_matching("^chat/"), Ok(100));
    assert_eq!(client.remove_matching("^chat/"), Ok(0));
    assert!(matches!(client.remove_matching("(unclosed"), Err(ClientError::Invalid(_))));
    assert_eq!(client.get(b"chat/0"), Err(ClientError::NotFound));
    assert_eq!(client.get(b"system/1").expect("kept"), value_of(1, 128 << 10));
    drop(client);
    node.shutdown().expect("shutdown");

    let node = start(node_config());
    let mut client = common::client(&node);
    assert_eq!(client.get(b"chat/10"), Err(ClientError::NotFound), "removed before the restart");
    assert_eq!(client.get(b"system/11").expect("kept"), value_of(11, 128 << 10));
    assert_eq!(client.remove_all(), Ok(100));
    assert_eq!(client.batch_exists(&[&b"system/1"[..], &b"system/199"[..]]), vec![Ok(false), Ok(false)]);
    node.shutdown().expect("shutdown");
}
