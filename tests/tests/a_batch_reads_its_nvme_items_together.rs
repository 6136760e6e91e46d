//! A batch of gets reads its NVMe-tier items from the device together, up to the shard's queue depth,
//! while DRAM hits and misses are answered in place; the reply keeps the request's order.

mod common;

use std::sync::atomic::Ordering;

use common::{Scratch, client, config, key_of, start, value_of, with_file};
use strata_client::ClientError;

#[test]
fn nvme_items_of_a_batch_are_in_flight_together_and_answered_in_order() {
    let scratch = Scratch::new("batch-nvme");
    let mut node_config = with_file(config(&[0], 4 << 20), &scratch.file("ns0.img"), 64 << 20);
    node_config.nvme_queue_depth = 8;
    let node = start(node_config);
    let mut client = client(&node);
    // 12 MiB of 64 KiB values over 4 MiB of DRAM: the first ones live on the tier only.
    for index in 0..192u64 {
        client.put(&key_of(index), &value_of(index, 64 << 10)).expect("put");
    }
    let peak = || node.metrics[0].nvme_reads_in_flight_peak.load(Ordering::Relaxed);
    assert!(peak() <= 1, "nothing was read from the tier in batches yet");
    // Tier items, a missing key and the newest (DRAM) items, interleaved.
    let mut keys: Vec<Vec<u8>> = (0..32u64).map(key_of).collect();
    keys.insert(5, b"missing".to_vec());
    keys.insert(9, key_of(191));
    let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let results = client.batch_get(&refs);
    for (key, result) in keys.iter().zip(&results) {
        match key.as_slice() {
            b"missing" => assert!(matches!(result, Err(ClientError::NotFound)), "{result:?}"),
            key => {
                let index = (0..192u64).find(|&index| key_of(index) == key).expect("a key of the test");
                assert_eq!(result.as_deref().ok(), Some(&value_of(index, 64 << 10)[..]), "key {index}");
            }
        }
    }
    let peak = peak();
    assert!((2..=8).contains(&peak), "tier reads in flight at once: {peak}");
    node.shutdown().expect("shutdown");
}
