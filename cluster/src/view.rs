//! A cluster's members as a client routes by them: every registered node, and the cluster epoch, the etcd
//! revision at which placement last changed (a free-space refresh changes no placement, so no epoch).

use strata_proto::placement::Candidate;

use crate::member::{Member, MemberState};

/// The members at one etcd revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// The etcd revision at which the serving members, their addresses, zones or capacities last changed.
    pub epoch: i64,
    /// The etcd revision this view was read at.
    pub revision: i64,
    /// Every registered node, sorted by id.
    pub members: Vec<Member>,
}

impl View {
    /// The view of `members` read at `revision`, following `previous`: the epoch moves only when
    /// placement does.
    pub fn next(previous: &View, revision: i64, mut members: Vec<Member>) -> View {
        members.sort_by(|a, b| a.id.cmp(&b.id));
        let moved = placement_key(&members) != placement_key(&previous.members);
        let epoch = if moved || previous.epoch == 0 { revision } else { previous.epoch };
        View { epoch, revision, members }
    }

    /// The members that own keys: those serving.
    pub fn serving(&self) -> impl Iterator<Item = &Member> {
        self.members.iter().filter(|member| member.state == MemberState::Serving)
    }

    /// The serving members as placement candidates, in the order of [`View::serving`].
    pub fn candidates(&self) -> Vec<Candidate<'_>> {
        self.serving().map(|member| Candidate { id: &member.id, weight: weight(member), zone: &member.zone }).collect()
    }

    /// Whether placement changed since `before` only by members that stopped serving: every candidate now
    /// was one then, with the same weight and zone. Rendezvous hashing then keeps every key where it was
    /// on the members still serving (a key's ranking over them is unchanged, and each still comes first
    /// in its zone), so none of their keys has to move; only replicas held by the members gone are lost.
    pub fn only_left_since(&self, before: &View) -> bool {
        let then = before.candidates();
        self.candidates().iter().all(|candidate| then.contains(candidate))
    }
}

/// The members as a node answers MEMBERS and `strata-pool cluster status --output-format=json` prints them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MembersDocument {
    /// The cluster's name.
    pub cluster: String,
    /// The view's epoch.
    pub epoch: i64,
    /// The etcd revision it was read at.
    pub revision: i64,
    /// Every registered node, sorted by id.
    pub members: Vec<Member>,
}

impl View {
    /// The view as a document of cluster `cluster`.
    pub fn document(&self, cluster: &str) -> MembersDocument {
        MembersDocument {
            cluster: cluster.to_string(),
            epoch: self.epoch,
            revision: self.revision,
            members: self.members.clone(),
        }
    }
}

impl MembersDocument {
    /// The view it describes, keeping only members that can be routed to (an id that is a name, 1 to
    /// 1,024 shards): a node's answer is input, not trusted.
    pub fn into_view(self) -> View {
        let mut members: Vec<Member> = self
            .members
            .into_iter()
            .filter(|member| {
                crate::member::validate_name("node id", &member.id).is_ok()
                    && (1..=crate::watch::MAX_SHARDS_PER_MEMBER).contains(&member.shards.len())
            })
            .collect();
        members.sort_by(|a, b| a.id.cmp(&b.id));
        View { epoch: self.epoch, revision: self.revision, members }
    }
}

/// A member's placement weight: its capacity over both tiers, in MiB (at least 1 for a serving node, so
/// a node with no tier sizes reported still takes keys).
pub fn weight(member: &Member) -> u64 {
    ((member.dram.capacity + member.nvme.capacity) >> 20).max(1)
}

/// What placement depends on: the serving members' ids, addresses, zones and weights.
fn placement_key(members: &[Member]) -> Vec<(&str, &[std::net::SocketAddr], &str, u64)> {
    members
        .iter()
        .filter(|member| member.state == MemberState::Serving)
        .map(|member| (member.id.as_str(), member.shards.as_slice(), member.zone.as_str(), weight(member)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::TierSpace;

    fn member(id: &str, free: u64) -> Member {
        Member {
            id: id.into(),
            shards: vec!["127.0.0.1:7600".parse().unwrap()],
            zone: String::new(),
            state: MemberState::Serving,
            epoch: 1,
            dram: TierSpace { capacity: 1 << 30, free },
            nvme: TierSpace::default(),
            keys: 0,
        }
    }

    #[test]
    fn the_epoch_moves_with_placement_only() {
        let first = View::next(&View::default(), 10, vec![member("b", 5), member("a", 5)]);
        assert_eq!((first.epoch, first.revision), (10, 10));
        assert_eq!(first.members[0].id, "a", "sorted by id");
        let refreshed = View::next(&first, 11, vec![member("a", 1), member("b", 2)]);
        assert_eq!((refreshed.epoch, refreshed.revision), (10, 11), "free space is not placement");
        let joined = View::next(&refreshed, 12, vec![member("a", 1), member("b", 2), member("c", 0)]);
        assert_eq!(joined.epoch, 12);
        let mut draining = joined.members.clone();
        draining[2].state = MemberState::Draining;
        let drained = View::next(&joined, 13, draining);
        assert_eq!(drained.epoch, 13, "a node that stops serving moves keys");
        assert_eq!(drained.candidates().len(), 2);
        assert_eq!(drained.candidates()[0].weight, 1024);
    }

    #[test]
    fn only_members_that_stopped_serving_is_told_apart_from_other_changes() {
        let before = View::next(&View::default(), 10, vec![member("a", 5), member("b", 5), member("c", 5)]);
        let left = View::next(&before, 11, vec![member("a", 5), member("c", 1)]);
        assert!(left.only_left_since(&before), "b left; free space is not placement");
        let mut draining = before.members.clone();
        draining[1].state = MemberState::Draining;
        assert!(View::next(&before, 12, draining).only_left_since(&before), "b stopped serving");
        let joined = View::next(&left, 13, vec![member("a", 5), member("c", 5), member("d", 5)]);
        assert!(!joined.only_left_since(&before), "d joined");
        let mut rezoned = left.members.clone();
        rezoned[0].zone = "z2".into();
        assert!(!View::next(&left, 14, rezoned).only_left_since(&before), "a moved zone");
        let mut grown = left.members.clone();
        grown[0].dram.capacity *= 2;
        assert!(!View::next(&left, 15, grown).only_left_since(&before), "a's weight changed");
    }
}
