//! A node's ownership in its cluster, kept current from a members' watch and published to the engine
//! (`strata_engine::ownership`): the node owns a key when it is among the key's first `max_replicas` nodes
//! under the view (docs/PROTOCOL.md, "Routing in a cluster"). A node that is not serving in the view owns
//! nothing: while etcd cannot be reached, or before its entry is seen, it takes no new ownership.

use std::sync::Arc;

use strata_engine::ownership::{Ownership, Owns};
use strata_proto::placement::{self, Candidate};

use crate::error::ClusterError;
use crate::registration::ClusterConfig;
use crate::view::{View, weight};
use crate::watch::{MembersWatch, WatchConfig};

/// What the node owns under `view`: the keys whose first `max_replicas` nodes include `me`.
pub fn owns_under(view: &View, me: &str, max_replicas: usize) -> Owns {
    let nodes: Vec<(String, u64, String)> =
        view.serving().map(|member| (member.id.clone(), weight(member), member.zone.clone())).collect();
    let Some(mine) = nodes.iter().position(|(id, _, _)| id == me) else { return Box::new(|_: &[u8]| false) };
    Box::new(move |key: &[u8]| {
        let candidates: Vec<Candidate<'_>> =
            nodes.iter().map(|(id, weight, zone)| Candidate { id, weight: *weight, zone }).collect();
        placement::replicas(key, &candidates, max_replicas).contains(&mine)
    })
}

/// Starts a members' watch that publishes the node's ownership into `ownership` at each new epoch.
pub fn feed_ownership(config: &ClusterConfig, ownership: Arc<Ownership>) -> Result<MembersWatch, ClusterError> {
    let (me, max_replicas, cluster) = (config.node_id.clone(), config.max_replicas.max(1), config.cluster.clone());
    let watch =
        WatchConfig { timeout: config.lease_ttl, ..WatchConfig::new(config.endpoints.clone(), &config.cluster) };
    let was_present = std::sync::atomic::AtomicBool::new(false);
    let publish = move |view: &View| {
        let members = serde_json::to_vec(&view.document(&cluster)).unwrap_or_default();
        // Its entry gone from its own view after it was there: its lease expired, and its keys went to other
        // nodes (a drain keeps the entry, so it is not an absence).
        let present = view.members.iter().any(|member| member.id == me);
        if was_present.swap(present, std::sync::atomic::Ordering::AcqRel) && !present {
            ownership.absent();
        }
        ownership.publish(view.epoch.max(0) as u64, owns_under(view, &me, max_replicas), members);
    };
    MembersWatch::spawn(watch, Some(Box::new(publish)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::{Member, MemberState, TierSpace};

    fn member(id: &str) -> Member {
        Member {
            id: id.into(),
            shards: vec!["127.0.0.1:1".parse().unwrap()],
            zone: String::new(),
            state: MemberState::Serving,
            epoch: 1,
            dram: TierSpace { capacity: 1 << 30, free: 0 },
            nvme: TierSpace::default(),
            keys: 0,
        }
    }

    #[test]
    fn a_node_owns_the_keys_placement_gives_it() {
        let view = View::next(&View::default(), 7, vec![member("a"), member("b"), member("c")]);
        let owns: Vec<Owns> = ["a", "b", "c"].iter().map(|id| owns_under(&view, id, 2)).collect();
        for at in 0..1_000 {
            let key = format!("key-{at}");
            let owners = owns.iter().filter(|owns| owns(key.as_bytes())).count();
            assert_eq!(owners, 2, "each key has its two replicas and no more");
        }
        assert!(!owns_under(&view, "z", 2)(b"key-0"), "a node not serving owns nothing");
    }
}
