//! Links between objects: parents, children and groups, and the cascades that make a departure take its children and group members with it, here and on the peers.

use std::rc::Rc;

use strata_proto::RemovalReason;

use super::Shard;
use crate::forward::{Cascade, CascadeKind};
use crate::index::{Entry, FLAG_LINKED, FLAG_PINNED, FLAG_SOFT_PINNED, Index};
use crate::links::{NO_LINK, ObjectLinks};
use crate::metrics::add;

/// Counts `key` up or down in `counts`, where a key at zero is absent (a count never goes below zero);
/// returns whether the key went from zero to one or from one to zero.
pub(super) fn count_up_or_down(counts: &mut std::collections::HashMap<u64, u32>, key: u64, up: bool) -> bool {
    let count = counts.entry(key).or_default();
    let before = *count;
    *count = if up { before + 1 } else { before.saturating_sub(1) };
    let after = *count;
    if after == 0 {
        counts.remove(&key);
    }
    (before == 0) != (after == 0)
}

impl Shard {
    /// Tells the peers how many linked objects this shard holds (after recovery, and at every change).
    pub(crate) fn publish_links(&self) {
        if let Some(forwarder) = self.forwarder.get() {
            forwarder.publish_links(self.id, self.links.borrow().len());
        }
    }

    /// Queues a departure for the cascade task (started if idle); `tell_peers`: also send it to the peers
    /// holding links (not for one a peer sent: it told every peer itself).
    pub(super) fn queue_cascade(&self, cascade: Cascade, tell_peers: bool) {
        self.cascades.borrow_mut().push_back((cascade, tell_peers));
        if !self.cascading.replace(true)
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
        let has_links = !self.links.borrow().is_empty();
        for &cascade in batch {
            match cascade.kind {
                CascadeKind::GroupPinned => {
                    count_up_or_down(&mut self.hard_pinned_elsewhere.borrow_mut(), cascade.name, true);
                }
                CascadeKind::GroupUnpinned => {
                    count_up_or_down(&mut self.hard_pinned_elsewhere.borrow_mut(), cascade.name, false);
                }
                CascadeKind::Parent | CascadeKind::Group if has_links => self.queue_cascade(cascade, false),
                CascadeKind::Parent | CascadeKind::Group => {}
            }
        }
    }

    /// A hard-pinned member of `group` arrived here (`pinned`) or left: the peers hear when the shard starts
    /// or stops holding one, so that none of them evicts a member of a group pinned here.
    pub(super) fn hard_pin_group(&self, group: u64, pinned: bool) {
        let changed = count_up_or_down(&mut self.hard_pinned_groups.borrow_mut(), group, pinned);
        // Before serving (recovery) the peers are told once, by `announce_hard_pinned_groups`.
        if changed && self.forwarder.get().is_some() {
            let kind = if pinned { CascadeKind::GroupPinned } else { CascadeKind::GroupUnpinned };
            self.queue_cascade(Cascade { name: group, kind }, true);
        }
    }

    /// After recovery: counts the restored hard-pinned members of each group and tells the peers of the
    /// groups pinned here.
    pub(crate) fn announce_hard_pinned_groups(&self) {
        let counts: std::collections::HashMap<u64, u32> = {
            let book = self.links.borrow();
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
        *self.hard_pinned_groups.borrow_mut() = counts;
    }

    /// The cascade task: for each queued departure, removes this shard's objects that name it (children of
    /// a parent that left, members of a group that lost one) — each of which is a departure in turn — and
    /// tells the peers that hold links, in batches. Hard-pinned objects stay (removed only explicitly).
    pub(super) async fn cascade(self: Rc<Self>) {
        let mut for_peers = Vec::new();
        loop {
            let next = self.cascades.borrow_mut().pop_front();
            let Some((cascade, tell_peers)) = next else {
                if !for_peers.is_empty() {
                    if let Some(forwarder) = self.forwarder.get() {
                        forwarder.send_cascades(&for_peers).await;
                    }
                    for_peers.clear();
                    // Sending awaited: departures may have been queued meanwhile.
                    continue;
                }
                // No await since the queue was found empty, so nothing was queued in between.
                self.cascading.set(false);
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
                let links = self.links.borrow();
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
                    self.links.borrow_mut().unlink(id);
                    self.publish_links();
                }
                if self.remove_as(&key, RemovalReason::Cascaded).await.is_ok() {
                    add(&self.metrics.cascade_removals, 1);
                }
            }
            if for_peers.len() >= 256
                && let Some(forwarder) = self.forwarder.get()
            {
                forwarder.send_cascades(&for_peers).await;
                for_peers.clear();
            }
        }
    }

    /// Entry `id`, if it is linked and its links satisfy `names_it`.
    pub(super) fn linked_entry(&self, id: u32, names_it: impl Fn(ObjectLinks) -> bool) -> Option<Entry> {
        let links = self.links.borrow().of(id)?;
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
            let book = self.links.borrow();
            match book.of(id) {
                Some(links) if links.group != NO_LINK => (links.group, book.members_of(links.group)),
                _ => return false,
            }
        };
        if self.hard_pinned_elsewhere.borrow().contains_key(&group) {
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
