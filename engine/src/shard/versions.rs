//! Upsert versions: the cluster version each upserted object was stored with, and the rule that a
//! versioned upsert replaces only an older version (`strata_proto::Version`).
//!
//! Only upserted objects carry a version, and KV blocks are rarely upserted, so versions live in a book
//! keyed by the entry's hash (like soft pins' expiries) rather than in every index entry; the entry's
//! `FLAG_VERSIONED` says the book has it.

use std::collections::HashMap;

use strata_proto::Version;

use super::Shard;
use crate::backend::Backend;
use crate::error::EngineError;
use crate::index::{Entry, FLAG_VERSIONED, Index};

/// Entry hash → the version its object was upserted with.
#[derive(Default)]
pub struct VersionBook {
    versions: HashMap<u64, Version>,
}

impl VersionBook {
    /// The version of `entry`'s object, if it was stored with one.
    pub fn of(&self, entry: &Entry) -> Option<Version> {
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
    /// the version its previous object had).
    pub(super) fn set_version(&self, index: &mut Index, id: u32, version: Option<Version>) {
        let entry = index.get_mut(id);
        let mut book = self.versions.borrow_mut();
        match version {
            Some(version) => {
                book.versions.insert(entry.hash, version);
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
        shard.put_value(key, bytes, crc32c::crc32c(bytes), options, links).await.map_err(|error| error.status())
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
}
