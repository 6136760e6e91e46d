//! Objects evicted from DRAM are written to the NVMe tier and served from it, bit-exact; objects hit twice
//! are promoted back to DRAM. A working set four times the DRAM tier is served with zero mismatches, under
//! write-back (written on eviction) and write-through (written at once), and by a busy-polled node (whose
//! file is a ring of its own that the shard polls beside its sockets, never parking).

mod common;

use common::{Scratch, client, config, key_of, start, total, value_of, with_file};
use strata_proto::WritePolicy;

const VALUE_BYTES: usize = 64 << 10;

fn serve_four_times_dram(policy: WritePolicy, busy_poll: bool) {
    let scratch = Scratch::new(&format!("four-times-{}-{busy_poll}", policy.name()));
    let dram = 16u64 << 20;
    let mut node_config = with_file(config(&[0], dram), &scratch.file("ns0.img"), 256 << 20);
    node_config.write_policy = policy;
    node_config.busy_poll = busy_poll;
    let node = start(node_config);
    let mut client = client(&node);
    let keys = (4 * dram as usize / VALUE_BYTES) as u64;
    for batch in (0..keys).collect::<Vec<_>>().chunks(16) {
        let owned: Vec<(Vec<u8>, Vec<u8>)> = batch.iter().map(|&i| (key_of(i), value_of(i, VALUE_BYTES))).collect();
        let items: Vec<(&[u8], &[u8])> = owned.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        for result in client.batch_put(&items) {
            result.expect("put");
        }
    }
    assert!(total(&node, |m| &m.dram_evictions) > keys / 2, "most objects left DRAM");
    let mut mismatches = 0;
    let mut buffer = vec![0u8; VALUE_BYTES];
    for index in 0..keys {
        let len = client.get_into(&key_of(index), &mut buffer).unwrap_or_else(|error| panic!("key {index}: {error}"));
        if buffer[..len] != value_of(index, VALUE_BYTES)[..] {
            mismatches += 1;
        }
    }
    assert_eq!(mismatches, 0);
    let nvme_hits = total(&node, |m| &m.nvme_hits);
    assert!(nvme_hits > keys / 2, "{nvme_hits} NVMe hits for {keys} keys");
    // A second read of a few keys promotes them; the third is a DRAM hit with the same bytes.
    let promotions_before = total(&node, |m| &m.promotions);
    for index in 0..8 {
        assert_eq!(client.get(&key_of(index)).expect("second read"), value_of(index, VALUE_BYTES));
    }
    assert!(total(&node, |m| &m.promotions) > promotions_before, "hot objects were promoted");
    let dram_hits_before = total(&node, |m| &m.dram_hits);
    for index in 0..8 {
        assert_eq!(client.get(&key_of(index)).expect("third read"), value_of(index, VALUE_BYTES));
    }
    assert!(total(&node, |m| &m.dram_hits) >= dram_hits_before + 4, "promoted objects are served from DRAM");
    assert_eq!(total(&node, |m| &m.checksum_failures), 0);
    node.shutdown().expect("shutdown");
}

#[test]
fn write_back_serves_four_times_dram_from_nvme() {
    serve_four_times_dram(WritePolicy::WriteBack, false);
}

#[test]
fn write_through_serves_four_times_dram_from_nvme() {
    serve_four_times_dram(WritePolicy::WriteThrough, false);
}

#[test]
fn a_busy_polled_node_serves_four_times_dram_from_nvme() {
    serve_four_times_dram(WritePolicy::WriteThrough, true);
}

#[test]
fn region_reclaim_keeps_serving_correct_bytes_when_the_tier_wraps() {
    tier_wraps(false);
}

#[test]
fn region_reclaim_on_a_busy_polled_node_keeps_serving_correct_bytes_when_the_tier_wraps() {
    tier_wraps(true);
}

fn tier_wraps(busy_poll: bool) {
    // 24 MiB of NVMe regions for 64 MiB of puts: regions are reclaimed; what is left is correct.
    let scratch = Scratch::new(&format!("tier-wraps-{busy_poll}"));
    let mut node_config = with_file(config(&[0], 8 << 20), &scratch.file("ns0.img"), 25 << 20);
    node_config.busy_poll = busy_poll;
    let node = start(node_config);
    let mut client = client(&node);
    let keys = (64 << 20) / VALUE_BYTES as u64;
    for index in 0..keys {
        client.put(&key_of(index), &value_of(index, VALUE_BYTES)).expect("put");
    }
    assert!(total(&node, |m| &m.reclaims) > 0, "regions were reclaimed");
    let mut found = 0;
    for index in 0..keys {
        match client.get(&key_of(index)) {
            Ok(value) => {
                assert_eq!(value, value_of(index, VALUE_BYTES), "key {index}");
                found += 1;
            }
            Err(strata_client::ClientError::NotFound) => {}
            Err(error) => panic!("key {index}: {error}"),
        }
    }
    assert!(found > keys / 8, "{found} of {keys} keys still cached");
    assert!(found < keys, "a tier smaller than the data cannot hold it all");
    node.shutdown().expect("shutdown");
}
