//! What a node does with one of its keys under the current view: the rules of repair, rebalance and drain,
//! as pure functions of the key's preference order (docs/PROTOCOL.md, "Placement").
//!
//! Nodes are named by their index among the view's candidates; `order` is the key's whole preference
//! order, `replicas` the cluster's replica count (the node's `--replicas`) and `max_replicas` how far
//! ownership reaches (`--max-replicas`).

/// The node's part in a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Among the key's first `replicas` nodes. It repairs the other replicas that lack the key, unless a
    /// replica before it in the order holds the key: that one repairs, so a lost replica costs one copy,
    /// not one per survivor.
    Replica {
        /// The other replicas, in order.
        others: Vec<usize>,
        /// How many of `others` come before this node.
        before: usize,
    },
    /// An owner past the replicas (a put may ask for more copies than the cluster's count): it keeps the
    /// key, and copies it to the replicas that lack it when it is hot, as a departed owner does (a join
    /// that puts a new node first leaves the old owner a spare: without the copy, readers, who go to the
    /// first replica, would miss a key still held next door).
    Spare {
        /// Where a hot key goes; empty for a cold one.
        copy_to: Vec<usize>,
    },
    /// Not an owner any more (the key moved, or the node drains). It copies the key to the replicas that
    /// lack it when the key is hot (in DRAM) or the node drains, and gives its copy up either way: a key
    /// it no longer owns would be served stale if ownership came back after an upsert or a removal.
    Departed {
        /// Where to copy it first; empty: give it up at once (a cold key becomes a miss).
        copy_to: Vec<usize>,
    },
}

/// The node's role in a key whose preference order is `order`; `me` is the node's index, `None` when it
/// is not a candidate (it drains).
pub fn role(
    order: &[usize],
    me: Option<usize>,
    replicas: usize,
    max_replicas: usize,
    hot: bool,
    draining: bool,
) -> Role {
    let replicas = replicas.max(1).min(order.len());
    let position = me.and_then(|me| order.iter().position(|&node| node == me));
    match position {
        Some(at) if at < replicas => Role::Replica {
            others: order[..replicas].iter().copied().filter(|&node| Some(node) != me).collect(),
            before: at,
        },
        Some(at) if at < max_replicas.max(replicas) && !draining => {
            Role::Spare { copy_to: if hot { order[..replicas].to_vec() } else { Vec::new() } }
        }
        _ if hot || draining => Role::Departed { copy_to: order[..replicas].to_vec() },
        _ => Role::Departed { copy_to: Vec::new() },
    }
}

/// The nodes whose answer to "do you hold the key" the role needs.
pub fn to_ask(role: &Role) -> &[usize] {
    match role {
        Role::Replica { others, .. } => others,
        Role::Spare { copy_to } => copy_to,
        Role::Departed { copy_to } => copy_to,
    }
}

/// What to do with the local copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    /// Keep it.
    Keep,
    /// Remove it now.
    Now,
    /// Remove it once a replica holds the key (one did already, or a copy succeeds); keep it otherwise,
    /// for the next pass.
    OnceHeld,
}

/// What the node does, given each asked node's answer (`None`: it did not answer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Nodes to copy the key to.
    pub copy_to: Vec<usize>,
    /// The local copy's fate.
    pub removal: Removal,
    /// Whether a replica already holds the key.
    pub held: bool,
}

/// The decision for `role` once `holds` answers for the nodes of [`to_ask`].
pub fn decide(role: &Role, holds: impl Fn(usize) -> Option<bool>) -> Decision {
    let lacking = |nodes: &[usize]| nodes.iter().copied().filter(|&node| holds(node) == Some(false)).collect();
    match role {
        Role::Replica { others, before } => {
            let earlier_holder = others[..*before].iter().any(|&node| holds(node) == Some(true));
            let copy_to = if earlier_holder { Vec::new() } else { lacking(others) };
            Decision { copy_to, removal: Removal::Keep, held: true }
        }
        Role::Spare { copy_to } => Decision { copy_to: lacking(copy_to), removal: Removal::Keep, held: true },
        Role::Departed { copy_to } if copy_to.is_empty() => {
            Decision { copy_to: Vec::new(), removal: Removal::Now, held: false }
        }
        Role::Departed { copy_to } => Decision {
            copy_to: lacking(copy_to),
            removal: Removal::OnceHeld,
            held: copy_to.iter().any(|&node| holds(node) == Some(true)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: [usize; 4] = [2, 0, 3, 1];

    #[test]
    fn the_first_holder_among_the_replicas_repairs_the_others() {
        // Replicas 2 and 0 (R = 2); node 0 is second.
        let role = role(&ORDER, Some(0), 2, 3, false, false);
        assert_eq!(role, Role::Replica { others: vec![2], before: 1 });
        assert_eq!(to_ask(&role), &[2]);
        // Node 2 lost the key (its node was replaced): node 0 copies it there.
        assert_eq!(decide(&role, |_| Some(false)).copy_to, vec![2]);
        // Node 2 holds it: nothing to do.
        assert!(decide(&role, |_| Some(true)).copy_to.is_empty());
        // Node 2 did not answer: nothing is copied blindly, nothing removed.
        let unknown = decide(&role, |_| None);
        assert!(unknown.copy_to.is_empty() && unknown.removal == Removal::Keep);
    }

    #[test]
    fn a_later_replica_leaves_the_repair_to_an_earlier_holder() {
        // R = 3: replicas 2, 0, 3; node 3 is third. Node 2 holds it and node 0 does not: node 2 repairs.
        let role = role(&ORDER, Some(3), 3, 3, false, false);
        let decision = decide(&role, |node| Some(node == 2));
        assert!(decision.copy_to.is_empty());
        // Neither earlier replica holds it: node 3 is the first holder and repairs both.
        assert_eq!(decide(&role, |_| Some(false)).copy_to, vec![2, 0]);
    }

    #[test]
    fn an_owner_past_the_replicas_keeps_its_copy_and_hands_a_hot_one_to_replicas_that_lack_it() {
        let hot = role(&ORDER, Some(3), 2, 3, true, false);
        assert_eq!(hot, Role::Spare { copy_to: vec![2, 0] });
        let decision = decide(&hot, |node| Some(node == 2));
        assert_eq!((decision.copy_to, decision.removal), (vec![0], Removal::Keep));
        let cold = role(&ORDER, Some(3), 2, 3, false, false);
        assert_eq!(cold, Role::Spare { copy_to: Vec::new() });
        assert!(decide(&cold, |_| Some(false)).copy_to.is_empty(), "a cold key is left where it is");
    }

    #[test]
    fn a_moved_key_goes_with_its_old_owner_if_hot_and_is_given_up_if_cold() {
        // Node 1 is last: not an owner under max_replicas 3.
        let hot = role(&ORDER, Some(1), 2, 3, true, false);
        assert_eq!(hot, Role::Departed { copy_to: vec![2, 0] });
        let decision = decide(&hot, |node| Some(node == 2));
        assert_eq!((decision.copy_to, decision.removal, decision.held), (vec![0], Removal::OnceHeld, true));
        let cold = role(&ORDER, Some(1), 2, 3, false, false);
        assert_eq!(decide(&cold, |_| None).removal, Removal::Now);
    }

    #[test]
    fn a_draining_node_moves_every_key_to_its_replicas() {
        let order = [2, 0, 1];
        let draining = role(&order, None, 2, 3, false, true);
        assert_eq!(draining, Role::Departed { copy_to: vec![2, 0] });
        let decision = decide(&draining, |_| Some(false));
        assert_eq!((decision.copy_to, decision.removal, decision.held), (vec![2, 0], Removal::OnceHeld, false));
    }

    #[test]
    fn a_cluster_smaller_than_the_replica_count_asks_for_what_there_is() {
        assert_eq!(role(&[1], Some(1), 3, 3, false, false), Role::Replica { others: vec![], before: 0 });
    }
}
