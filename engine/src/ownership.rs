//! Which keys this node owns in a cluster, as the members' watch last said, so that a request sent under
//! an older membership for a key the node no longer owns is answered `MOVED` instead of being served or
//! stored where no reader will look (docs/PROTOCOL.md, "Routing in a cluster").
//!
//! The watch runs outside the shards and publishes each new view here ([`Ownership::publish`]); a shard
//! keeps its own copy and pays one atomic load per item to see whether it is still current, taking the
//! lock only when it is not. A node started without a cluster has no [`Ownership`], and checks nothing.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Whether this node owns a key (a user key, as the client placed it).
pub type Owns = Box<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// One view: its cluster epoch, what the node owns under it, and the members as the MEMBERS request
/// answers them (JSON).
pub struct OwnershipView {
    epoch: u64,
    owns: Owns,
    members: Vec<u8>,
}

impl OwnershipView {
    /// The members as JSON.
    pub fn members(&self) -> &[u8] {
        &self.members
    }
}

/// The node's latest view, shared by its shards.
#[derive(Default)]
pub struct Ownership {
    /// Bumped by every publish.
    generation: AtomicU64,
    view: Mutex<Option<Arc<OwnershipView>>>,
    /// Times the node may have been out of the cluster (its lease lost, or its entry gone from its view).
    absences: AtomicU64,
}

impl std::fmt::Debug for Ownership {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Ownership").field("generation", &self.generation.load(Ordering::Relaxed)).finish()
    }
}

impl Ownership {
    /// Makes `owns` the node's ownership from cluster epoch `epoch` on, and `members` (JSON) the answer to
    /// MEMBERS.
    pub fn publish(&self, epoch: u64, owns: Owns, members: Vec<u8>) {
        *self.view.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
            Some(Arc::new(OwnershipView { epoch, owns, members }));
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Records that the node may have been out of the cluster: its registration's lease was lost, or its
    /// view no longer has it serving. Upserts may have reached the key's other replicas meanwhile, so every
    /// upserted object stored before now may be superseded: the shards answer them as misses from here on
    /// ([`Ownership::term`]).
    pub fn absent(&self) {
        self.absences.fetch_add(1, Ordering::AcqRel);
    }

    /// The node's current term in the cluster, from 1: the upserted objects stored in an earlier one (or
    /// recovered from the tier, term 0) may be superseded elsewhere and are never served.
    pub fn term(&self) -> u64 {
        self.absences.load(Ordering::Acquire) + 1
    }

    /// The epoch of the latest view (0 before the first).
    pub fn epoch(&self) -> u64 {
        self.view.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).as_ref().map_or(0, |view| view.epoch)
    }
}

/// A shard's copy of the node's ownership.
#[derive(Default)]
pub(crate) struct OwnershipCache {
    source: Option<Arc<Ownership>>,
    seen: Cell<u64>,
    view: RefCell<Option<Arc<OwnershipView>>>,
}

impl OwnershipCache {
    pub(crate) fn new(source: Option<Arc<Ownership>>) -> Self {
        Self { source, seen: Cell::new(0), view: RefCell::new(None) }
    }

    /// The latest view, fetched if it changed.
    fn current(&self) -> Option<Arc<OwnershipView>> {
        let source = self.source.as_ref()?;
        let generation = source.generation.load(Ordering::Acquire);
        if generation != self.seen.get() {
            *self.view.borrow_mut() = source.view.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
            self.seen.set(generation);
        }
        self.view.borrow().clone()
    }

    /// The members as the node last saw them (JSON), for MEMBERS; `None` alone or before the first view.
    pub(crate) fn members(&self) -> Option<Arc<OwnershipView>> {
        self.current().filter(|view| !view.members.is_empty())
    }

    /// `Some(the node's epoch)` when an item for `key` sent under `request_epoch` must be answered MOVED:
    /// the request names an epoch (cluster clients do), an older one than the node's, and the node does
    /// not own the key under its own. A request under the node's epoch or a newer one is served: the node
    /// may be the one behind.
    pub(crate) fn moved(&self, key: &[u8], request_epoch: u64) -> Option<u64> {
        if request_epoch == 0 {
            return None;
        }
        let view = self.current()?;
        (request_epoch < view.epoch && !(view.owns)(key)).then_some(view.epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_older_requests_for_keys_not_owned_move() {
        let ownership = Arc::new(Ownership::default());
        let cache = OwnershipCache::new(Some(Arc::clone(&ownership)));
        assert_eq!(cache.moved(b"b-key", 5), None, "no view yet: serve");
        ownership.publish(10, Box::new(|key: &[u8]| key.starts_with(b"a")), b"{}".to_vec());
        assert_eq!(cache.moved(b"b-key", 5), Some(10));
        assert_eq!(cache.moved(b"a-key", 5), None, "owned");
        assert_eq!(cache.moved(b"b-key", 10), None, "the same epoch: the node agrees with the client");
        assert_eq!(cache.moved(b"b-key", 12), None, "a newer epoch: the node is behind");
        assert_eq!(cache.moved(b"b-key", 0), None, "a client of one node names no epoch");
        ownership.publish(20, Box::new(|_: &[u8]| true), b"{}".to_vec());
        assert_eq!(cache.moved(b"b-key", 12), None, "a new view is seen at once");
        assert_eq!(ownership.epoch(), 20);
        assert_eq!(OwnershipCache::new(None).moved(b"b-key", 5), None, "no cluster: serve");
    }
}
