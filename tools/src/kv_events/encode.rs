//! Strata's events as vLLM's `KVEventBatch`, the MessagePack that vLLM's `ZmqEventPublisher` sends and
//! Dynamo, llm-d and vLLM's own subscribers decode (`vllm/distributed/kv_events.py`, msgspec):
//! a batch is the array `[ts, events]`; an event is a map tagged by `type`.
//!
//! - A stored chain (or a single block) is one `BlockStored`: its keys are the `block_hashes` (bytes),
//!   the first one's parent the `parent_block_hash`, and the tier the `medium` (`CPU` for DRAM, `STORAGE`
//!   for NVMe). Blocks stored together but not chained, each naming the same parent, are one event each.
//!   The node knows no token ids (`token_ids` is empty) and no engine block size (`block_size` is the
//!   publisher's setting, 0 when not given).
//! - Blocks that left the node are one `BlockRemoved`.
//! - Lost events (`Lagged`: the publisher fell behind) become `AllBlocksCleared`: a subscriber forgets what it
//!   knew of this node and relearns it from the events that follow, rather than trusting a view with holes.
//! - A tier change is not published: vLLM's events have no form for it.
use super::msgpack;
use strata_proto::{EventRef, Keys, Tier};

/// Writes one `KVEventBatch` of `events` at time `ts` (seconds since the epoch); returns its bytes and how
/// many vLLM events it holds (0: nothing to publish).
pub fn batch<'a>(events: impl Iterator<Item = EventRef<'a>>, ts: f64, block_size: u32) -> (Vec<u8>, usize) {
    let mut body = Vec::new();
    let mut count = 0;
    for event in events {
        count += event_into(&mut body, &event, block_size);
    }
    let mut out = Vec::with_capacity(body.len() + 16);
    msgpack::array(&mut out, 2);
    msgpack::f64(&mut out, ts);
    msgpack::array(&mut out, count);
    out.extend_from_slice(&body);
    (out, count)
}

/// Appends the vLLM events of one Strata event; returns how many.
fn event_into(out: &mut Vec<u8>, event: &EventRef<'_>, block_size: u32) -> usize {
    match event {
        EventRef::BlockStored { keys, parent, chained, tier, .. } => {
            if *chained || keys.len() == 1 {
                stored(out, keys.iter(), keys.len(), *parent, *tier, block_size);
                return 1;
            }
            for key in keys.iter() {
                stored(out, std::iter::once(key), 1, *parent, *tier, block_size);
            }
            keys.len()
        }
        EventRef::BlockRemoved { keys, .. } => {
            removed(out, keys);
            1
        }
        EventRef::Lagged { .. } => {
            msgpack::map(out, 1);
            msgpack::str(out, "type");
            msgpack::str(out, "AllBlocksCleared");
            1
        }
        EventRef::TierChanged { .. } => 0,
    }
}

fn stored<'a>(
    out: &mut Vec<u8>,
    keys: impl Iterator<Item = &'a [u8]>,
    len: usize,
    parent: Option<&[u8]>,
    tier: Tier,
    block_size: u32,
) {
    msgpack::map(out, 8);
    msgpack::str(out, "type");
    msgpack::str(out, "BlockStored");
    msgpack::str(out, "block_hashes");
    msgpack::array(out, len);
    keys.for_each(|key| msgpack::bin(out, key));
    msgpack::str(out, "parent_block_hash");
    match parent {
        Some(parent) => msgpack::bin(out, parent),
        None => msgpack::nil(out),
    }
    msgpack::str(out, "token_ids");
    msgpack::array(out, 0);
    msgpack::str(out, "block_size");
    msgpack::uint(out, u64::from(block_size));
    msgpack::str(out, "lora_id");
    msgpack::nil(out);
    msgpack::str(out, "medium");
    match tier {
        Tier::Dram => msgpack::str(out, "CPU"),
        Tier::Nvme => msgpack::str(out, "STORAGE"),
        Tier::None => msgpack::nil(out),
    }
    msgpack::str(out, "lora_name");
    msgpack::nil(out);
}

fn removed(out: &mut Vec<u8>, keys: &Keys<'_>) {
    msgpack::map(out, 3);
    msgpack::str(out, "type");
    msgpack::str(out, "BlockRemoved");
    msgpack::str(out, "block_hashes");
    msgpack::array(out, keys.len());
    keys.iter().for_each(|key| msgpack::bin(out, key));
    msgpack::str(out, "medium");
    msgpack::nil(out);
}
