//! Listing a shard's keys a page at a time (SCAN): what a node's rebalancer walks to find the keys to copy
//! or give up when its cluster changes.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use strata_proto::SCAN_DONE;

use super::Shard;
use crate::backend::Backend;
use crate::index::{Entry, FLAG_VERSIONED, NONE_U32, NONE_U64, replicas_of};
use crate::join::join_in_order;

/// Ids looked at per key wanted, at most: a page over a sparse id space ends early (with a cursor to go
/// on from) rather than walking every free id in one frame.
const IDS_PER_KEY: usize = 16;
/// Record heads a page reads at once.
const SCAN_READS_AT_ONCE: usize = 32;

/// One key of a page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScannedKey {
    /// The key without the scope's prefix.
    pub key: Vec<u8>,
    /// Bytes of its value.
    pub value_len: u32,
    /// The tiers that hold it (`LOCATED_IN_DRAM`, `LOCATED_ON_NVME`).
    pub tiers: u32,
    /// The replica count its put asked for (0: not said).
    pub replicas: u8,
}

/// A page of keys, and where the next one starts ([`SCAN_DONE`] after the last).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanPage {
    /// The keys.
    pub keys: Vec<ScannedKey>,
    /// The next page's cursor.
    pub next: u32,
}

impl<E: Backend> Shard<E> {
    /// The keys of `scope` (a tenant's prefix, stripped) from entry id `cursor` on: at most `max_keys`, and
    /// no more once the page's keys pass `max_bytes`. A key read from the NVMe tier costs a small read of its
    /// record's head, as `remove_matching`: an administrative walk, linear in the shard's objects. The
    /// page's heads are read [`SCAN_READS_AT_ONCE`] at a time: one after another, a page of 256 keys held
    /// on a remote namespace took 100-250 ms, most of a takeover's move.
    pub async fn scan(self: &Rc<Self>, scope: &[u8], cursor: u32, max_keys: usize, max_bytes: usize) -> ScanPage {
        let (candidates, after) = self.scan_candidates(cursor, max_keys);
        let mut keys: Vec<Option<Vec<u8>>> = Vec::with_capacity(candidates.len());
        for chunk in candidates.chunks(SCAN_READS_AT_ONCE) {
            let reads =
                chunk.iter().map(|&(_, entry)| Box::pin(self.stored_key(entry)) as Pin<Box<dyn Future<Output = _>>>);
            keys.extend(join_in_order(reads.collect()).await);
        }
        let mut page = ScanPage::default();
        let mut next = after;
        let mut bytes = 0usize;
        for (&(id, entry), key) in candidates.iter().zip(keys) {
            if bytes >= max_bytes {
                next = id;
                break;
            }
            let Some(key) = key else { continue };
            // The entry may have gone, or been replaced, while its key was read.
            let Some(now) = self.index.borrow().live(id).filter(|now| now.hash == entry.hash).copied() else {
                continue;
            };
            let Some(user_key) = key.strip_prefix(scope) else { continue };
            bytes += user_key.len() + strata_proto::scan::SCAN_ENTRY_HEAD_BYTES;
            let (value_len, tiers, replicas) = (entry.value_len, tiers_of(&now), replicas_of(&entry));
            page.keys.push(ScannedKey { key: user_key.to_vec(), value_len, tiers, replicas });
        }
        let done = next >= self.index.borrow().id_space();
        ScanPage { next: if done { SCAN_DONE } else { next }, ..page }
    }

    /// The live entries of a page from id `cursor` on: at most `max_keys`, looking at most at
    /// `IDS_PER_KEY` ids per key wanted; and the id after the last one looked at.
    fn scan_candidates(&self, cursor: u32, max_keys: usize) -> (Vec<(u32, Entry)>, u32) {
        let index = self.index.borrow();
        let end = u64::from(cursor).saturating_add(max_keys.saturating_mul(IDS_PER_KEY) as u64);
        let end = end.min(u64::from(index.id_space())) as u32;
        let mut candidates = Vec::with_capacity(max_keys.min(1024));
        let mut id = cursor;
        while id < end && candidates.len() < max_keys {
            if let Some(entry) = index.live(id) {
                candidates.push((id, *entry));
            }
            id += 1;
        }
        (candidates, id)
    }
}

fn tiers_of(entry: &Entry) -> u32 {
    let mut tiers = if entry.flags & FLAG_VERSIONED != 0 { strata_proto::SCAN_VERSIONED } else { 0 };
    if entry.dram != NONE_U32 {
        tiers |= strata_proto::LOCATED_IN_DRAM;
    }
    if entry.nvme != NONE_U64 {
        tiers |= strata_proto::LOCATED_ON_NVME;
    }
    tiers
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use strata_proto::{Links, Pin, PutOptions, SCAN_DONE, WritePolicy};

    use crate::sim::testing::{TestTier, put, value};

    #[test]
    fn pages_list_every_key_once_with_its_tier() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            let keys: BTreeSet<Vec<u8>> = (0..300).map(|at| format!("key-{at}").into_bytes()).collect();
            for key in &keys {
                put(&shard, key, &value(1, 1000), WritePolicy::Durable, Pin::None).await.expect("put");
            }
            shard.remove(b"key-7").await.expect("remove");
            let mut seen = Vec::new();
            let mut cursor = 0;
            for _page in 0..100 {
                let page = shard.scan(b"", cursor, 64, 1 << 20).await;
                assert!(page.keys.len() <= 64);
                seen.extend(page.keys.iter().map(|key| key.key.clone()));
                assert!(page.keys.iter().all(|key| key.value_len == 1000 && key.tiers != 0));
                if page.next == SCAN_DONE {
                    break;
                }
                cursor = page.next;
            }
            let listed: BTreeSet<Vec<u8>> = seen.iter().cloned().collect();
            assert_eq!(seen.len(), listed.len(), "a key listed twice");
            let mut expected = keys.clone();
            expected.remove(&b"key-7"[..]);
            assert_eq!(listed, expected);
        });
        // After a restart the keys come from the records' heads on the tier.
        tier.crash();
        tier.life(async |shard, _| {
            let page = shard.scan(b"", 0, 1024, 1 << 20).await;
            assert_eq!((page.keys.len(), page.next), (299, SCAN_DONE));
            assert!(page.keys.iter().all(|key| key.tiers == strata_proto::LOCATED_ON_NVME));
        });
    }

    #[test]
    fn a_puts_replica_count_is_listed_and_survives_a_restart() {
        let tier = TestTier::new(|_| {});
        let replicas_listed = async |shard: &std::rc::Rc<crate::shard::Shard<crate::sim::Simulated>>| {
            let page = shard.scan(b"", 0, 16, 1 << 20).await;
            let mut listed: Vec<(Vec<u8>, u8)> = page.keys.into_iter().map(|key| (key.key, key.replicas)).collect();
            listed.sort();
            listed
        };
        tier.life(async |shard, _| {
            for (key, replicas) in [(&b"three"[..], 3u8), (b"unsaid", 0), (b"upserted", 2)] {
                let options = PutOptions { policy: Some(WritePolicy::Durable), replicas, ..PutOptions::default() };
                let bytes = value(1, 100);
                shard.put_value(key, &bytes, strata_proto::crc32c(&bytes), options, Links::NONE).await.expect("put");
            }
            // An upsert says its own count: the count belongs to the version.
            let options =
                PutOptions { upsert: true, policy: Some(WritePolicy::Durable), replicas: 4, ..PutOptions::default() };
            let bytes = value(2, 100);
            shard
                .put_value(b"upserted", &bytes, strata_proto::crc32c(&bytes), options, Links::NONE)
                .await
                .expect("upsert");
            let expected = vec![(b"three".to_vec(), 3), (b"unsaid".to_vec(), 0), (b"upserted".to_vec(), 4)];
            assert_eq!(replicas_listed(&shard).await, expected);
        });
        tier.crash();
        tier.life(async |shard, _| {
            let expected = vec![(b"three".to_vec(), 3), (b"unsaid".to_vec(), 0), (b"upserted".to_vec(), 4)];
            assert_eq!(replicas_listed(&shard).await, expected, "restored from the records");
        });
    }

    #[test]
    fn a_scope_lists_its_own_keys_without_its_prefix() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            for key in [&b"AAAAone"[..], b"AAAAtwo", b"BBBBthree"] {
                put(&shard, key, &value(1, 10), WritePolicy::WriteBack, Pin::None).await.expect("put");
            }
            let page = shard.scan(b"AAAA", 0, 16, 1 << 20).await;
            let mut keys: Vec<Vec<u8>> = page.keys.into_iter().map(|key| key.key).collect();
            keys.sort();
            assert_eq!(keys, vec![b"one".to_vec(), b"two".to_vec()]);
            let page = shard.scan(b"", 0, 2, 1 << 20).await;
            assert_eq!(page.keys.len(), 2, "a page stops at its count");
            assert_ne!(page.next, SCAN_DONE);
        });
    }
}
