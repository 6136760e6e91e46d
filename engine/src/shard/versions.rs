//! Upsert versions: the cluster version each upserted object was stored with, and the rule that a
//! versioned upsert replaces only an older version (`strata_proto::Version`).
//!
//! Only upserted objects carry a version, and KV blocks are rarely upserted, so versions live in a book
//! keyed by the entry's hash (like soft pins' expiries) rather than in every index entry; the entry's
//! `FLAG_VERSIONED` says the book has it.
//!
//! A node of a cluster that may have been out of it (`Ownership::term`) may hold an upserted object that
//! was upserted again elsewhere meanwhile: such an object, stored in an earlier term or recovered from the
//! tier, is *stale* and answered as a miss. Objects never upserted are immutable and never stale.

use std::collections::HashMap;

use strata_proto::{RemovalReason, Version};

use super::usage::Use;
use super::{Shard, object_bytes};
use crate::backend::Backend;
use crate::error::EngineError;
use crate::index::{Entry, FLAG_VERSIONED, Index, NONE_U32};
use crate::metrics::add;

/// Entry hash → the version its object was upserted with, and the node's term when it was stored.
pub struct VersionBook {
    versions: HashMap<u64, (Version, u64)>,
    /// No object in the book was stored in an earlier term than this (a bound, not kept exact as objects
    /// leave): while the node's term has not passed it, nothing is stale and a lookup skips the book.
    oldest_term: u64,
}

impl Default for VersionBook {
    fn default() -> Self {
        Self { versions: HashMap::new(), oldest_term: u64::MAX }
    }
}

impl VersionBook {
    /// The version of `entry`'s object, if it was stored with one.
    pub fn of(&self, entry: &Entry) -> Option<Version> {
        self.stored(entry).map(|(version, _)| version)
    }

    fn stored(&self, entry: &Entry) -> Option<(Version, u64)> {
        if entry.flags & FLAG_VERSIONED == 0 {
            return None;
        }
        self.versions.get(&entry.hash).copied()
    }
}

impl<E: Backend> Shard<E> {
    /// The version of `entry`'s object.
    pub(super) fn version_of(&self, entry: &Entry) -> Option<Version> {
        self.versions.borrow().of(entry)
    }

    /// The node's term in its cluster (0 for a node alone: nothing is ever stale there).
    fn term(&self) -> u64 {
        self.config.ownership.as_ref().map_or(0, |ownership| ownership.term())
    }

    /// Whether `entry`'s object is an upsert stored before the node's current term (or recovered), which
    /// may have been superseded on other replicas while this node was out of the cluster.
    pub(super) fn is_stale(&self, entry: &Entry) -> bool {
        if entry.flags & FLAG_VERSIONED == 0 {
            return false;
        }
        let book = self.versions.borrow();
        let term = self.term();
        // The common case, a node that was never away: no book lookup per key of a prefix match.
        book.oldest_term < term && book.stored(entry).is_some_and(|(_, stored)| stored < term)
    }

    /// Why an upsert carrying `version` must not replace the object of entry `existing`: it holds that
    /// version or a newer one (`Superseded`). An unversioned put is never refused here: a node orders the
    /// puts it receives itself.
    pub(super) fn version_refusal(
        &self,
        index: &Index,
        existing: Option<u32>,
        version: Option<Version>,
    ) -> Option<EngineError> {
        let (id, version) = (existing?, version?);
        let held = self.version_of(index.get(id))?;
        (held >= version).then_some(EngineError::Superseded)
    }

    /// Records that entry `id` now holds an object of `version` (none: an unversioned put, which drops
    /// the version its previous object had), stored now (`recovered`: read back from the tier, term 0).
    pub(super) fn set_version(&self, index: &mut Index, id: u32, version: Option<Version>, recovered: bool) {
        let term = if recovered { 0 } else { self.term() };
        let entry = index.get_mut(id);
        let mut book = self.versions.borrow_mut();
        match version {
            Some(version) => {
                book.versions.insert(entry.hash, (version, term));
                book.oldest_term = book.oldest_term.min(term);
                entry.flags |= FLAG_VERSIONED;
            }
            None => {
                if entry.flags & FLAG_VERSIONED != 0 {
                    book.versions.remove(&entry.hash);
                }
                entry.flags &= !FLAG_VERSIONED;
            }
        }
    }

    /// Drops entry `id`, a stale upsert of `key` (see [`Shard::is_stale`]): a miss from now on. Its record,
    /// if any, stays on the tier without a tombstone: recovered, it is stale again.
    pub(super) fn drop_stale(&self, index: &mut Index, id: u32, key: &[u8]) {
        let entry = *index.get(id);
        if entry.dram != NONE_U32 {
            self.dram.borrow_mut().retire(entry.dram);
            self.account(key, Use::Dram, object_bytes(&entry), false);
        }
        self.forget(index, id, Some(key));
        self.events.borrow_mut().removed(key, RemovalReason::Evicted);
        add(&self.metrics.stale_upserts_dropped, 1);
    }

    /// Forgets the version of `entry`, which left the index.
    pub(super) fn drop_version(&self, entry: &Entry) {
        if entry.flags & FLAG_VERSIONED != 0 {
            self.versions.borrow_mut().versions.remove(&entry.hash);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;
    use std::time::Duration;

    use strata_proto::{Links, PutOptions, Status, Version, WritePolicy};

    use crate::shard::Shard;
    use crate::sim::Simulated;
    use crate::sim::testing::{TestTier, fill, put, read, value};

    fn version(epoch: u64, sequence: u64) -> Version {
        Version { epoch, sequence }
    }

    async fn upsert(
        shard: &Rc<Shard<Simulated>>,
        key: &[u8],
        bytes: &[u8],
        version: Version,
        links: Links<'_>,
    ) -> Result<(), Status> {
        let options = PutOptions {
            upsert: true,
            policy: Some(WritePolicy::Durable),
            version: Some(version),
            ..PutOptions::default()
        };
        shard.put_value(key, bytes, strata_proto::crc32c(bytes), options, links).await.map_err(|error| error.status())
    }

    async fn plain_put(shard: &Rc<Shard<Simulated>>, key: &[u8], bytes: &[u8]) {
        let options = PutOptions { policy: Some(WritePolicy::Durable), ..PutOptions::default() };
        shard.put_value(key, bytes, strata_proto::crc32c(bytes), options, Links::NONE).await.expect("put");
    }

    async fn read_version(shard: &Rc<Shard<Simulated>>, key: &[u8]) -> Option<Version> {
        shard.get(key, None, Duration::ZERO).await.ok().and_then(|hit| hit.version)
    }

    #[test]
    fn a_versioned_upsert_replaces_only_an_older_version() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            assert_eq!(upsert(&shard, b"k", &value(1, 300), version(3, 10), Links::NONE).await, Ok(()));
            // Arriving late (another writer's, ordered before): refused, the newer one kept.
            assert_eq!(upsert(&shard, b"k", &value(2, 300), version(3, 9), Links::NONE).await, Err(Status::Superseded));
            assert_eq!(
                upsert(&shard, b"k", &value(2, 300), version(2, 99), Links::NONE).await,
                Err(Status::Superseded)
            );
            assert_eq!(
                upsert(&shard, b"k", &value(2, 300), version(3, 10), Links::NONE).await,
                Err(Status::Superseded)
            );
            assert_eq!(read(&shard, b"k").await, Ok(value(1, 300)));
            assert_eq!(upsert(&shard, b"k", &value(4, 300), version(4, 1), Links::NONE).await, Ok(()));
            assert_eq!(
                (read(&shard, b"k").await, read_version(&shard, b"k").await),
                (Ok(value(4, 300)), Some(version(4, 1)))
            );
            // An unversioned upsert is ordered by its arrival, and leaves the object with no version.
            assert_eq!(put(&shard, b"k", &value(5, 300), WritePolicy::Durable, strata_proto::Pin::None).await, Ok(()));
            assert_eq!(read_version(&shard, b"k").await, None);
            assert_eq!(upsert(&shard, b"k", &value(6, 300), version(1, 1), Links::NONE).await, Ok(()));
            // A removal forgets the version with the key.
            shard.remove(b"k").await.expect("removed");
            assert_eq!(upsert(&shard, b"k", &value(7, 300), version(1, 0), Links::NONE).await, Ok(()));
            assert_eq!(read_version(&shard, b"k").await, Some(version(1, 0)));
        });
    }

    #[test]
    fn a_version_survives_a_crash_with_its_record_read_from_the_tier() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            upsert(&shard, b"plain", &value(1, 3000), version(5, 50), Links::NONE).await.expect("upsert");
            upsert(&shard, b"linked", &value(2, 3000), version(5, 51), Links::parent(b"plain")).await.expect("upsert");
            // Out of DRAM: later reads go to the records.
            fill(&shard, 0, 200, 10_000).await;
            assert_eq!(read(&shard, b"plain").await, Ok(value(1, 3000)), "read past the version in its record");
        });
        tier.crash();
        tier.life(async |shard, _| {
            assert_eq!(read(&shard, b"plain").await, Ok(value(1, 3000)));
            assert_eq!(read(&shard, b"linked").await, Ok(value(2, 3000)), "past the links and the version");
            assert_eq!(read_version(&shard, b"linked").await, Some(version(5, 51)));
            assert_eq!(
                upsert(&shard, b"plain", &value(9, 3000), version(5, 49), Links::NONE).await,
                Err(Status::Superseded),
                "a restarted replica still refuses what is older than what it acknowledged"
            );
            assert_eq!(read(&shard, b"plain").await, Ok(value(1, 3000)));
        });
    }

    #[test]
    fn a_node_back_in_its_cluster_never_serves_an_upsert_it_stored_before() {
        let ownership = std::sync::Arc::new(crate::ownership::Ownership::default());
        let shared = std::sync::Arc::clone(&ownership);
        let tier = TestTier::new(|config| config.ownership = Some(shared));
        tier.life(async |shard, _| {
            upsert(&shard, b"upserted", &value(1, 3000), version(5, 1), Links::NONE).await.expect("upsert");
            plain_put(&shard, b"immutable", &value(2, 3000)).await;
            assert_eq!(read(&shard, b"upserted").await, Ok(value(1, 3000)), "served in the term it was stored in");
            // The node's lease was lost: other replicas may have taken newer upserts meanwhile.
            ownership.absent();
            assert_eq!(read(&shard, b"upserted").await, Err(Status::NotFound), "a miss, never a superseded value");
            assert_eq!(shard.exists(b"upserted").map_err(|error| error.status()), Err(Status::NotFound));
            assert_eq!(read(&shard, b"immutable").await, Ok(value(2, 3000)), "a block never upserted stays");
            upsert(&shard, b"upserted", &value(3, 3000), version(5, 2), Links::NONE).await.expect("a new upsert");
            assert_eq!(read(&shard, b"upserted").await, Ok(value(3, 3000)), "stored in this term: served");
        });
        tier.crash();
        tier.life(async |shard, _| {
            assert_eq!(read(&shard, b"upserted").await, Err(Status::NotFound), "recovered: maybe superseded");
            assert_eq!(read(&shard, b"immutable").await, Ok(value(2, 3000)));
        });
    }
}
