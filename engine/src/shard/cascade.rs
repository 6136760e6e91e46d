//! Links between objects: parents, children and groups, and the cascades that make a departure take its
//! children and group members with it, here and on the peers.
//!
//! What the peers must hear (departures, and groups that gained or lost a hard-pinned member here) leaves
//! through a channel that the node's forwarder drains; what they send arrives through
//! [`Shard::accept_cascades`]. The shard itself knows nothing of how shards reach each other.

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;

use glommio::channels::local_channel::LocalSender;
use strata_proto::RemovalReason;

use super::Shard;
use crate::backend::Backend;
use crate::index::{Entry, FLAG_LINKED, FLAG_PINNED, FLAG_SOFT_PINNED, Index};
use crate::links::{LinkBook, LinkCounts, NO_LINK, ObjectLinks};
use crate::metrics::add;

/// What a cascade names: a parent (its children leave) or a group (its members leave); or a change of
/// whether the sender holds a hard-pinned member of a group (which keeps the group on every shard).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CascadeKind {
    /// Objects naming this parent.
    Parent,
    /// Members of this group.
    Group,
    /// The sender now holds a hard-pinned member of this group (it held none).
    GroupPinned,
    /// The sender no longer holds a hard-pinned member of this group.
    GroupUnpinned,
}

impl CascadeKind {
    /// Whether it tells of a pin rather than a departure: every peer needs it, linked objects or not (a
    /// member of the group may arrive there later).
    pub fn is_pin_change(self) -> bool {
        matches!(self, CascadeKind::GroupPinned | CascadeKind::GroupUnpinned)
    }
}

/// "The object or group named `name` left this node": what shards tell each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cascade {
    /// The hash naming it (`links::link_hash`).
    pub name: u64,
    /// Parent or group.
    pub kind: CascadeKind,
}

/// A shard's links and the cascades under way.
pub struct LinkState {
    /// Which objects name which parent and group.
    pub(super) book: RefCell<LinkBook>,
    /// Departures whose children and group members have yet to leave (here and on the peers), each with
    /// whether the peers must be told.
    queue: RefCell<VecDeque<(Cascade, bool)>>,
    /// The cascade task is running.
    cascading: Cell<bool>,
    /// Hard-pinned members of each group, here (group hash → count).
    hard_pinned_here: RefCell<HashMap<u64, u32>>,
    /// Groups with a hard-pinned member on a peer (group hash → peers that said so): their members here
    /// are not evicted either, so the group stays whole.
    hard_pinned_elsewhere: RefCell<HashMap<u64, u32>>,
    /// Every shard's count of linked objects (this one's is published at every change).
    counts: Arc<LinkCounts>,
    /// Where batches for the peers go, once the shard serves (set by [`Shard::start_serving`]).
    to_peers: OnceCell<LocalSender<Vec<Cascade>>>,
}

impl LinkState {
    pub(super) fn new(counts: Arc<LinkCounts>) -> Self {
        Self {
            book: RefCell::new(LinkBook::default()),
            queue: RefCell::new(VecDeque::new()),
            cascading: Cell::new(false),
            hard_pinned_here: RefCell::new(HashMap::new()),
            hard_pinned_elsewhere: RefCell::new(HashMap::new()),
            counts,
            to_peers: OnceCell::new(),
        }
    }

    /// Whether the shard serves (recovery is over): only then do departures cascade.
    pub(super) fn serving(&self) -> bool {
        self.to_peers.get().is_some()
    }

    /// Whether any shard but `me` holds linked objects.
    pub(super) fn peers_hold_links(&self, me: u32) -> bool {
        self.counts.any_but(me)
    }
}

/// Counts `key` up or down in `counts`, where a key at zero is absent (a count never goes below zero);
/// returns whether the key went from zero to one or from one to zero.
pub(super) fn count_up_or_down(counts: &mut HashMap<u64, u32>, key: u64, up: bool) -> bool {
    let count = counts.entry(key).or_default();
    let before = *count;
    *count = if up { before + 1 } else { before.saturating_sub(1) };
    let after = *count;
    if after == 0 {
        counts.remove(&key);
    }
    (before == 0) != (after == 0)
}

impl<E: Backend> Shard<E> {
    /// Ends start-up: from now on departures cascade, and what the peers must hear is sent on `to_peers`
    /// (which the node's forwarder drains). Tells the peers of the links and hard-pinned groups that
    /// recovery restored.
    pub fn start_serving(&self, to_peers: LocalSender<Vec<Cascade>>) {
        let _ = self.links.to_peers.set(to_peers);
        self.publish_links();
        self.announce_hard_pinned_groups();
    }

    /// Tells the peers how many linked objects this shard holds (after recovery, and at every change).
    pub(crate) fn publish_links(&self) {
        self.links.counts.publish(self.id, self.links.book.borrow().len());
    }

    /// Queues a departure for the cascade task (started if idle); `tell_peers`: also send it to the peers
    /// holding links (not for one a peer sent: it told every peer itself).
    pub(super) fn queue_cascade(&self, cascade: Cascade, tell_peers: bool) {
        self.links.queue.borrow_mut().push_back((cascade, tell_peers));
        if !self.links.cascading.replace(true)
            && let Some(shard) = self.me.upgrade()
        {
            // glommio may start polling a spawned task at once, and the caller holds the index: the task
            // yields first, so it starts only once the caller is done.
            glommio::spawn_local(async move {
                futures_lite::future::yield_now().await;
                shard.cascade().await
            })
            .detach();
        }
    }

    /// Departures (and hard pins of group members) announced by a peer.
    pub fn accept_cascades(&self, batch: &[Cascade]) {
        let has_links = !self.links.book.borrow().is_empty();
        for &cascade in batch {
            match cascade.kind {
                CascadeKind::GroupPinned => {
                    count_up_or_down(&mut self.links.hard_pinned_elsewhere.borrow_mut(), cascade.name, true);
                }
                CascadeKind::GroupUnpinned => {
                    count_up_or_down(&mut self.links.hard_pinned_elsewhere.borrow_mut(), cascade.name, false);
                }
                CascadeKind::Parent | CascadeKind::Group if has_links => self.queue_cascade(cascade, false),
                CascadeKind::Parent | CascadeKind::Group => {}
            }
        }
    }

    /// A hard-pinned member of `group` arrived here (`pinned`) or left: the peers hear when the shard starts
    /// or stops holding one, so that none of them evicts a member of a group pinned here.
    pub(super) fn hard_pin_group(&self, group: u64, pinned: bool) {
        let changed = count_up_or_down(&mut self.links.hard_pinned_here.borrow_mut(), group, pinned);
        // Before serving (recovery) the peers are told once, by `announce_hard_pinned_groups`.
        if changed && self.links.serving() {
            let kind = if pinned { CascadeKind::GroupPinned } else { CascadeKind::GroupUnpinned };
            self.queue_cascade(Cascade { name: group, kind }, true);
        }
    }

    /// After recovery: counts the restored hard-pinned members of each group and tells the peers of the
    /// groups pinned here.
    fn announce_hard_pinned_groups(&self) {
        let counts: HashMap<u64, u32> = {
            let book = self.links.book.borrow();
            let index = self.index.borrow();
            book.groups()
                .into_iter()
                .filter_map(|group| {
                    let pinned =
                        book.members_of(group).into_iter().filter(|&id| index.get(id).flags & FLAG_PINNED != 0).count()
                            as u32;
                    (pinned > 0).then_some((group, pinned))
                })
                .collect()
        };
        for &group in counts.keys() {
            self.queue_cascade(Cascade { name: group, kind: CascadeKind::GroupPinned }, true);
        }
        *self.links.hard_pinned_here.borrow_mut() = counts;
    }

    /// The cascade task: for each queued departure, removes this shard's objects that name it (children of
    /// a parent that left, members of a group that lost one) — each of which is a departure in turn — and
    /// tells the peers that hold links, in batches. Hard-pinned objects stay (removed only explicitly).
    pub(super) async fn cascade(self: Rc<Self>) {
        let mut for_peers = Vec::new();
        loop {
            let next = self.links.queue.borrow_mut().pop_front();
            let Some((cascade, tell_peers)) = next else {
                if !for_peers.is_empty() {
                    self.send_to_peers(std::mem::take(&mut for_peers)).await;
                    // Sending awaited: departures may have been queued meanwhile.
                    continue;
                }
                // No await since the queue was found empty, so nothing was queued in between.
                self.links.cascading.set(false);
                return;
            };
            if tell_peers {
                for_peers.push(cascade);
            }
            if cascade.kind.is_pin_change() {
                // Nothing leaves: it only had to reach the peers.
                continue;
            }
            let ids = {
                let links = self.links.book.borrow();
                match cascade.kind {
                    CascadeKind::Parent => links.children_of(cascade.name),
                    _ => links.members_of(cascade.name),
                }
            };
            for id in ids {
                let names_it = |links: ObjectLinks| match cascade.kind {
                    CascadeKind::Parent => links.parent == cascade.name,
                    _ => links.group == cascade.name,
                };
                // Checked again after every await: the object may have left or been relinked meanwhile.
                let Some(entry) = self.linked_entry(id, names_it) else { continue };
                if entry.flags & FLAG_PINNED != 0 {
                    continue;
                }
                let Some(key) = self.stored_key(entry).await else { continue };
                if self.linked_entry(id, names_it).is_none_or(|now| now.hash != entry.hash) {
                    continue;
                }
                if cascade.kind == CascadeKind::Group {
                    // Its group is leaving already: its own departure need not announce the group again.
                    self.links.book.borrow_mut().unlink(id);
                    self.publish_links();
                }
                if self.remove_as(&key, RemovalReason::Cascaded).await.is_ok() {
                    add(&self.metrics.cascade_removals, 1);
                }
            }
            if for_peers.len() >= 256 {
                self.send_to_peers(std::mem::take(&mut for_peers)).await;
            }
        }
    }

    /// Resolves once no cascade is under way here (a bounded number of turns of the executor: a peer may
    /// keep sending departures).
    pub(crate) async fn cascades_settled(&self) {
        for _ in 0..10_000 {
            if !self.links.cascading.get() {
                return;
            }
            futures_lite::future::yield_now().await;
        }
    }

    /// Hands a batch to the forwarder; a shard that is not serving (or whose node stops) drops it.
    async fn send_to_peers(&self, batch: Vec<Cascade>) {
        if let Some(to_peers) = self.links.to_peers.get() {
            let _ = to_peers.send(batch).await;
        }
    }

    /// Entry `id`, if it is linked and its links satisfy `names_it`.
    pub(super) fn linked_entry(&self, id: u32, names_it: impl Fn(ObjectLinks) -> bool) -> Option<Entry> {
        let links = self.links.book.borrow().of(id)?;
        if !names_it(links) {
            return None;
        }
        let index = self.index.borrow();
        let entry = *index.get(id);
        (entry.flags & FLAG_LINKED != 0 && index.find(entry.hash) == Some(id)).then_some(entry)
    }

    /// Whether another member of entry `id`'s group on this shard is pinned, so the group must stay
    /// ("evicted all together or not at all").
    pub(super) fn group_stays(&self, index: &mut Index, id: u32, now: u32) -> bool {
        if index.get(id).flags & FLAG_LINKED == 0 {
            return false;
        }
        let (group, members) = {
            let book = self.links.book.borrow();
            match book.of(id) {
                Some(links) if links.group != NO_LINK => (links.group, book.members_of(links.group)),
                _ => return false,
            }
        };
        if self.links.hard_pinned_elsewhere.borrow().contains_key(&group) {
            // A peer holds a hard-pinned member: this one leaving would take the group apart.
            return true;
        }
        members.into_iter().filter(|&member| member != id).any(|member| {
            let entry = *index.get(member);
            entry.flags & FLAG_PINNED != 0
                || (entry.flags & FLAG_SOFT_PINNED != 0 && self.soft_pin_live(entry.hash, now))
        })
    }
}

#[cfg(test)]
mod tests {
    use strata_proto::{Pin, Status, WritePolicy};

    use crate::sim::testing::{TestTier, put, put_child, read, value};

    #[test]
    fn a_put_of_a_key_a_cascade_removed_waits_for_the_removal_to_be_durable() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            put(&shard, b"parent", &value(1, 100), WritePolicy::Durable, Pin::None).await.expect("parent");
            put_child(&shard, b"child", &value(2, 100), b"parent").await.expect("child");
            shard.remove(b"parent").await.expect("remove");
            shard.cascades_settled().await;
            assert_eq!(read(&shard, b"child").await, Err(Status::NotFound), "the child left with its parent");
            // Before: acknowledged at once, while the cascade's tombstone was not durable; a crash then
            // brought the child's old version back over this acknowledged one.
            put(&shard, b"child", &value(3, 100), WritePolicy::WriteBack, Pin::None).await.expect("put again");
        });
        tier.crash();
        tier.life(async |shard, _| {
            assert_ne!(read(&shard, b"child").await, Ok(value(2, 100)), "the removed version came back");
        });
    }

    #[test]
    fn children_and_theirs_leave_with_their_parent() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            put(&shard, b"root", &value(1, 100), WritePolicy::WriteThrough, Pin::None).await.expect("root");
            put_child(&shard, b"leaf", &value(2, 100), b"root").await.expect("leaf");
            put_child(&shard, b"grandleaf", &value(3, 100), b"leaf").await.expect("grandleaf");
            shard.remove(b"root").await.expect("remove");
            shard.cascades_settled().await;
            assert_eq!(read(&shard, b"leaf").await, Err(Status::NotFound));
            assert_eq!(read(&shard, b"grandleaf").await, Err(Status::NotFound), "and so on down the tree");
            assert_eq!(shard.metrics.cascade_removals.load(std::sync::atomic::Ordering::Relaxed), 2);
        });
    }
}
