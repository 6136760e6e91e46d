//! Where a key lives in a cluster: weighted rendezvous (highest random weight) hashing over the live
//! nodes. Every node and client computes it alike from the membership alone, so no request asks a master
//! where a key is (docs/PROTOCOL.md, "Placement", writes the function out for other languages).
//!
//! A node's score for a key is `weight / -ln(u)`, where `u` in (0, 1) is drawn from the key and the node's
//! id. The replica set is the nodes in descending score, taking a node of a zone not chosen yet before a
//! second node of a chosen zone. Adding or removing a node moves only the keys whose first choice it is or
//! was: about 1/N of them, weighted.

use crate::hash::fnv1a_64;

/// A live node as placement sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate<'a> {
    /// The node's id (`--node-id`), unique in the cluster.
    pub id: &'a str,
    /// Its share of keys relative to the others (its capacity); zero takes none.
    pub weight: u64,
    /// Its zone label; empty: unlabelled, no zone constraint.
    pub zone: &'a str,
}

/// MurmurHash3's 64-bit finaliser: spreads FNV-1a's weak low-order mixing over all 64 bits.
fn fmix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// `key`'s score on node `id` of `weight`: higher wins.
pub fn score(key: &[u8], id: &str, weight: u64) -> f64 {
    if weight == 0 {
        return f64::NEG_INFINITY;
    }
    let draw = fmix64(fnv1a_64(key) ^ fmix64(fnv1a_64(id.as_bytes())));
    // The 53 high bits, centred in their interval: u is never 0 or 1, so ln(u) is finite and negative.
    let unit = ((draw >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    weight as f64 / -unit.ln()
}

/// `key`'s first replica, `replicas(key, candidates, 1)[0]` without allocating: what a read asks first.
pub fn first(key: &[u8], candidates: &[Candidate<'_>]) -> Option<usize> {
    let mut best: Option<(f64, usize)> = None;
    for (index, candidate) in candidates.iter().enumerate() {
        if candidate.weight == 0 {
            continue;
        }
        let score = score(key, candidate.id, candidate.weight);
        let better = best
            .is_none_or(|(top, at)| score.total_cmp(&top).then_with(|| candidates[at].id.cmp(candidate.id)).is_gt());
        if better {
            best = Some((score, index));
        }
    }
    best.map(|(_, index)| index)
}

/// `key`'s replica set: up to `count` indices into `candidates`, distinct nodes, best first, on distinct
/// zones while an unchosen labelled zone remains. Ties (equal scores) go to the smaller id.
pub fn replicas(key: &[u8], candidates: &[Candidate<'_>], count: usize) -> Vec<usize> {
    let mut ranked: Vec<(f64, usize)> = candidates
        .iter()
        .enumerate()
        .filter(|(_, candidate)| candidate.weight > 0)
        .map(|(index, candidate)| (score(key, candidate.id, candidate.weight), index))
        .collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| candidates[a.1].id.cmp(candidates[b.1].id)));
    let mut chosen: Vec<usize> = Vec::with_capacity(count.min(ranked.len()));
    // First pass: the best node of each zone not chosen yet (unlabelled nodes are each their own zone).
    for &(_, index) in &ranked {
        if chosen.len() == count {
            return chosen;
        }
        let zone = candidates[index].zone;
        if zone.is_empty() || !chosen.iter().any(|&taken| candidates[taken].zone == zone) {
            chosen.push(index);
        }
    }
    // Second pass: more replicas than zones; the rest in score order.
    for &(_, index) in &ranked {
        if chosen.len() == count {
            break;
        }
        if !chosen.contains(&index) {
            chosen.push(index);
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes<'a>(ids: &'a [String], weight: u64) -> Vec<Candidate<'a>> {
        ids.iter().map(|id| Candidate { id, weight, zone: "" }).collect()
    }

    fn ids(count: usize) -> Vec<String> {
        (0..count).map(|at| format!("node-{at}")).collect()
    }

    fn owners(candidates: &[Candidate<'_>], keys: usize) -> Vec<String> {
        (0..keys)
            .map(|at| candidates[replicas(format!("key-{at}").as_bytes(), candidates, 1)[0]].id.to_string())
            .collect()
    }

    #[test]
    fn the_score_is_the_documented_function() {
        // docs/PROTOCOL.md quotes this value: a port to another language checks itself against it.
        let draw = fmix64(fnv1a_64(b"block-0") ^ fmix64(fnv1a_64(b"node-a")));
        let unit = ((draw >> 11) as f64 + 0.5) / 9_007_199_254_740_992.0;
        assert_eq!(score(b"block-0", "node-a", 3), 3.0 / -unit.ln());
        // Computed by an independent Python transcription of the documented function.
        assert_eq!(format!("{:.6}", score(b"block-0", "node-a", 1)), "0.694621");
        assert_eq!(format!("{:.6}", score(b"block-0", "node-b", 1)), "0.648479");
        assert_eq!(format!("{:.6}", score(b"block-0", "node-c", 2)), "6.233156");
        assert_eq!(score(b"block-0", "node-a", 0), f64::NEG_INFINITY);
    }

    #[test]
    fn replicas_are_distinct_nodes_in_score_order() {
        let ids = ids(5);
        let candidates = nodes(&ids, 1);
        for at in 0..1_000 {
            let key = format!("key-{at}");
            let set = replicas(key.as_bytes(), &candidates, 3);
            assert_eq!(set.len(), 3);
            assert!(set[0] != set[1] && set[1] != set[2] && set[0] != set[2]);
            let scores: Vec<f64> = set.iter().map(|&index| score(key.as_bytes(), &ids[index], 1)).collect();
            assert!(scores[0] >= scores[1] && scores[1] >= scores[2], "{scores:?}");
            assert_eq!(replicas(key.as_bytes(), &candidates, 3), set, "deterministic");
        }
        assert_eq!(replicas(b"k", &candidates, 9).len(), 5, "no more replicas than nodes");
        assert!(replicas(b"k", &[], 2).is_empty());
    }

    #[test]
    fn first_is_the_first_replica() {
        let ids = ids(7);
        let mut candidates = nodes(&ids, 2);
        candidates[3].weight = 5;
        candidates[4].weight = 0;
        for at in 0..2_000 {
            let key = format!("key-{at}");
            assert_eq!(first(key.as_bytes(), &candidates), replicas(key.as_bytes(), &candidates, 1).first().copied());
        }
        // Equal scores (the same id twice) go to the smaller id, as in `replicas`.
        let twins = [Candidate { id: "b", weight: 1, zone: "" }, Candidate { id: "b", weight: 1, zone: "" }];
        assert_eq!(first(b"k", &twins), Some(0));
        assert_eq!(first(b"k", &[]), None);
    }

    #[test]
    fn keys_spread_by_weight() {
        let ids = ids(3);
        let mut candidates = nodes(&ids, 1);
        candidates[0].weight = 2;
        let owners = owners(&candidates, 40_000);
        let share = owners.iter().filter(|owner| **owner == ids[0]).count() as f64 / 40_000.0;
        assert!((0.47..0.53).contains(&share), "a double-weight node of three takes half: {share}");
        candidates[1].weight = 0;
        assert!(!replicas(b"key", &candidates, 3).contains(&1), "weight zero takes nothing");
    }

    #[test]
    fn a_join_moves_about_one_nth_and_only_to_the_new_node() {
        let ids = ids(5);
        let before = owners(&nodes(&ids[..4], 1), 20_000);
        let after = owners(&nodes(&ids, 1), 20_000);
        let moved: Vec<_> = before.iter().zip(&after).filter(|(was, now)| was != now).collect();
        let expected = 20_000.0 / 5.0;
        assert!((moved.len() as f64 - expected).abs() < 0.2 * expected, "{} moved", moved.len());
        assert!(moved.iter().all(|(_, now)| **now == ids[4]), "keys only move to the new node");
        // And a leave moves only the leaver's keys back.
        let unmoved = before.iter().zip(&after).filter(|(_, now)| **now != ids[4]).all(|(was, now)| was == now);
        assert!(unmoved);
    }

    #[test]
    fn replicas_take_distinct_zones_first() {
        let ids = ids(6);
        let zones = ["a", "a", "a", "b", "b", "c"];
        let candidates: Vec<Candidate<'_>> =
            ids.iter().zip(zones).map(|(id, zone)| Candidate { id, weight: 1, zone }).collect();
        for at in 0..1_000 {
            let set = replicas(format!("key-{at}").as_bytes(), &candidates, 3);
            let mut chosen: Vec<&str> = set.iter().map(|&index| candidates[index].zone).collect();
            chosen.sort_unstable();
            assert_eq!(chosen, ["a", "b", "c"]);
            let four = replicas(format!("key-{at}").as_bytes(), &candidates, 4);
            assert_eq!(four[..3], set[..], "a fourth replica extends the set");
        }
    }
}
