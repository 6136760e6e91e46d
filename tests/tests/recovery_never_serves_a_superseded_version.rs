//! One corrupt byte in the tier must never bring back what was replaced or removed: a record after the
//! damaged one that superseded an older version (an upsert, a removal) is either recovered, or its key is
//! dropped; the older version is never served. What was lost is counted.

mod common;

use common::{Scratch, client, config, start, total, with_file};
use strata_client::ClientError;
use strata_proto::WritePolicy;

const TIER_BYTES: u64 = 64 << 20;

fn durable_node(path: &std::path::Path) -> strata_engine::Node {
    let mut config = with_file(config(&[0], 32 << 20), path, TIER_BYTES);
    config.write_policy = WritePolicy::Durable;
    start(config)
}

/// Flips one byte of the only copy of `needle` in the file.
fn flip_byte_of(path: &std::path::Path, needle: &[u8]) {
    let mut bytes = std::fs::read(path).expect("tier file");
    let found: Vec<usize> =
        bytes.windows(needle.len()).enumerate().filter(|(_, w)| *w == needle).map(|(at, _)| at).collect();
    assert_eq!(found.len(), 1, "one record holds {:?}", String::from_utf8_lossy(needle));
    bytes[found[0] + needle.len() / 2] ^= 0x5a;
    std::fs::write(path, bytes).expect("write back");
}

#[test]
fn a_damaged_record_before_an_upsert_and_a_removal_brings_back_neither_old_state() {
    let scratch = Scratch::new("superseded");
    let path = scratch.file("ns0.img");
    let node = durable_node(&path);
    let mut writer = client(&node);
    writer.put(b"upserted-key", b"version one").expect("put v1");
    writer.put(b"removed-key", b"soon removed").expect("put");
    // Filler until region 0 seals: the first versions sit in a sealed region, the rest in a later one.
    let filler = vec![3u8; 64 << 10];
    for index in 0..24u32 {
        writer.put(format!("filler-{index}").as_bytes(), &filler).expect("filler");
    }
    writer.put(b"the-damaged-record-key", b"whatever").expect("put F");
    writer.upsert(b"upserted-key", b"version two").expect("upsert v2");
    writer.remove(b"removed-key").expect("remove");
    writer.put(b"written-after-the-damage", b"still here").expect("put after");
    drop(writer);
    node.shutdown().expect("shutdown");

    flip_byte_of(&path, b"the-damaged-record-key");

    let node = durable_node(&path);
    let mut reader = client(&node);
    match reader.get(b"upserted-key") {
        Ok(value) => assert_eq!(value, b"version two", "never the superseded version"),
        Err(ClientError::NotFound) => {}
        Err(error) => panic!("upserted-key: {error}"),
    }
    assert_eq!(reader.get(b"removed-key"), Err(ClientError::NotFound), "a removed key stays removed");
    assert_eq!(reader.get(b"the-damaged-record-key"), Err(ClientError::NotFound));
    assert_eq!(reader.get(b"written-after-the-damage").expect("records after the damage recover"), b"still here");
    assert!(total(&node, |m| &m.recovery_lost_records) >= 1, "the damaged record is counted");
    let summary = node.summary().to_string();
    assert!(summary.contains("lost 1 records"), "the start-up summary says what was lost:\n{summary}");
    node.shutdown().expect("shutdown");
}
