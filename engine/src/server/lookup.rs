//! EXISTS, PREFIX_MATCH, LOCATE, REMOVE and REMOVE_MATCHING frames: answered per item, here or at the key's
//! owner.

use std::collections::HashSet;

use strata_proto::{RequestItem, ResponseItemHeader, Status};

use super::ShardServer;
use super::get::{local_hashes, prefetch_stages};
use super::put::sync_batch;
use crate::forward::ForwardOp;
use crate::shard::Prefetch;
use crate::tenants::Scope;

/// The statuses of an EXISTS frame's items, or (`prefix`) of a PREFIX_MATCH's.
///
/// A prefix match looks keys up in order and stops at each chain's first miss: the rest of that chain is
/// useless to the caller (a suffix without its prefix), so it is answered NOT_FOUND without a lookup. The
/// blocks it finds are held for a read lease, so that the load that follows finds them still there. An item
/// MOVED (`epoch`, see `ownership.rs`) does not break its chain: the client asks its new owner.
pub(super) async fn exists(
    server: &ShardServer,
    items: &[RequestItem<'_>],
    scope: &Scope,
    (prefix, epoch): (bool, u64),
) -> Vec<ResponseItemHeader> {
    let shard = &server.shard;
    let mut broken_chains: HashSet<u32> = HashSet::new();
    let mut statuses = Vec::with_capacity(items.len());
    // Each key of this shard hashed once, and its index lines asked for one and two items ahead: a
    // 1,000-key chain is otherwise a chain of misses.
    let hashes = local_hashes(server, scope, items.iter().map(|item| item.key));
    for (at, item) in items.iter().enumerate() {
        prefetch_stages(shard, &hashes, at + 1, &[Prefetch::Entry, Prefetch::IndexSlot]);
        let user_key = item.key;
        let chain = item.header.offset;
        if let Some(moved) = server.moved(user_key, epoch) {
            statuses.push(moved);
            continue;
        }
        if prefix && !broken_chains.is_empty() && broken_chains.contains(&chain) {
            statuses.push(ResponseItemHeader::status(Status::NotFound));
            continue;
        }
        let found = match hashes[at] {
            Some(hash) => shard.exists_hashed(hash, prefix).map_err(|error| error.status()),
            None => {
                let owner = server.other_owner(user_key).unwrap_or(shard.id);
                let key = scope.scoped(user_key);
                let reply = server.forward(owner, &key, ForwardOp::Exists { lease: prefix }).await;
                if reply.status == Status::Ok { Ok(reply.object_len) } else { Err(reply.status) }
            }
        };
        if prefix && found.is_err() {
            broken_chains.insert(chain);
        }
        statuses.push(match found {
            Ok(len) => ResponseItemHeader { status: Status::Ok, data_len: 0, data_crc: 0, object_len: len },
            Err(status) => ResponseItemHeader::status(status),
        });
    }
    statuses
}

/// The answers of a LOCATE frame's items: each value's length and the tiers that hold it.
pub(super) async fn locate(
    server: &ShardServer,
    items: &[RequestItem<'_>],
    scope: &Scope,
    epoch: u64,
) -> Vec<ResponseItemHeader> {
    let mut answers = Vec::with_capacity(items.len());
    for user_key in items.iter().map(|item| item.key) {
        if let Some(moved) = server.moved(user_key, epoch) {
            answers.push(moved);
            continue;
        }
        let key = scope.scoped(user_key);
        let found = match server.other_owner(user_key) {
            None => server.shard.locate(&key).map_err(|error| error.status()),
            Some(owner) => {
                let reply = server.forward(owner, &key, ForwardOp::Locate).await;
                if reply.status == Status::Ok { Ok((reply.object_len, reply.data_crc)) } else { Err(reply.status) }
            }
        };
        answers.push(match found {
            Ok((len, tiers)) => {
                ResponseItemHeader { status: Status::Ok, data_len: 0, data_crc: tiers, object_len: len }
            }
            Err(status) => ResponseItemHeader::status(status),
        });
    }
    answers
}

/// The statuses of a REMOVE frame's items.
pub(super) async fn remove(
    server: &ShardServer,
    items: &[RequestItem<'_>],
    scope: &Scope,
    epoch: u64,
) -> Vec<ResponseItemHeader> {
    let mut statuses = Vec::with_capacity(items.len());
    let mut durable = Vec::new();
    for user_key in items.iter().map(|item| item.key) {
        if let Some(moved) = server.moved(user_key, epoch) {
            statuses.push(moved);
            continue;
        }
        let key = scope.scoped(user_key);
        let status = match server.other_owner(user_key) {
            None => match server.shard.remove_unsynced(&key).await {
                Ok(Some(point)) => {
                    durable.push((statuses.len(), point));
                    Status::Ok
                }
                Ok(None) => Status::Ok,
                Err(error) => error.status(),
            },
            Some(owner) => server.forward(owner, &key, ForwardOp::Remove).await.status,
        };
        statuses.push(ResponseItemHeader::status(status));
    }
    // Acknowledged once their tombstones are durable: one sync per region for the frame.
    sync_batch(&server.shard, &durable, &mut statuses).await;
    statuses
}

/// The statuses of a REMOVE_MATCHING frame's items (each a pattern, removed on this shard).
pub(super) async fn remove_all_matching(
    server: &ShardServer,
    items: &[RequestItem<'_>],
    scope: &Scope,
) -> Vec<ResponseItemHeader> {
    let mut statuses = Vec::with_capacity(items.len());
    for item in items {
        statuses.push(remove_matching(server, item.header.flags, item.key, scope).await);
    }
    statuses
}

/// The answer to one REMOVE_MATCHING item on this shard: the keys removed, or `Invalid` for a pattern that
/// is not a regular expression (or one too large to compile within a bound, so a pattern cannot make the
/// shard build an unbounded automaton).
async fn remove_matching(server: &ShardServer, flags: u16, pattern: &[u8], scope: &Scope) -> ResponseItemHeader {
    let matcher = if flags & strata_proto::ITEM_MATCH_ALL != 0 {
        None
    } else {
        let compiled = std::str::from_utf8(pattern).ok().and_then(|text| {
            regex::bytes::RegexBuilder::new(text).size_limit(1 << 20).dfa_size_limit(1 << 20).build().ok()
        });
        match compiled {
            Some(regex) => Some(regex),
            None => return ResponseItemHeader::status(Status::Invalid),
        }
    };
    let removed = server.shard.remove_matching(scope.prefix(), matcher.as_ref()).await;
    ResponseItemHeader { status: Status::Ok, data_len: 0, data_crc: 0, object_len: removed }
}
