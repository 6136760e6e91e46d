//! The rebalancer's seeded simulation: nodes in memory, a membership that changes by kills, joins, drains
//! and partitions, clients that put with two replicas under the current view, and every node's real pass code
//! (`pass.rs`, `plan.rs`) run after each change until the cluster settles. After each settle the
//! cluster is checked against the model of what was acknowledged:
//! - every copy of a key holds the bytes put (never another value);
//! - no node holds a key it does not own (a moved key is migrated or given up, never kept stale);
//! - a key held by one of its replicas is held by all of them (lost replicas are re-created);
//! - with one change at a time, no acknowledged key is lost.
//!
//! A partitioned node keeps its keys and runs its passes under the view it had when it was cut off (its
//! watch reaches no etcd), reaching no other node; the others see it leave (its lease expires). It then
//! comes back with what it held. While it is cut off its copies are invisible, so the checks skip it.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::atomic::AtomicBool;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use strata_client::{ClientError, ScanEntry, ScanPage};
use strata_cluster::{Member, MemberState, TierSpace, View};
use strata_proto::{WritePolicy, placement};

use super::pass::{PassContext, run_pass};
use super::store::{CopyItem, Directory, KeyStore, VersionedValue};
use super::throttle::Throttle;

const REPLICAS: usize = 2;
const MAX_REPLICAS: usize = 2;

/// A node in memory: keys by a stable id (as the index's entry ids), so a scan by cursor sees each key
/// that stays for the whole walk once, even while others are removed.
#[derive(Default)]
struct SimNode {
    alive: bool,
    /// Cut off: alive with its keys, but no other node reaches it.
    partitioned: bool,
    next_id: u32,
    by_id: BTreeMap<u32, Vec<u8>>,
    keys: HashMap<Vec<u8>, (u32, Vec<u8>, bool)>,
}

#[derive(Clone)]
struct Handle(Rc<RefCell<SimNode>>);

fn down<T>(count: usize) -> Vec<Result<T, ClientError>> {
    (0..count).map(|_| Err(ClientError::Connection("down".into()))).collect()
}

impl KeyStore for Handle {
    fn shard_count(&self) -> usize {
        1
    }

    fn scan_shard(&mut self, _shard: usize, cursor: u32, max_keys: u32) -> Result<ScanPage, ClientError> {
        let node = self.0.borrow();
        if !node.alive {
            return Err(ClientError::Connection("down".into()));
        }
        let mut entries = Vec::new();
        let mut next = None;
        for (&id, key) in node.by_id.range(cursor..) {
            if entries.len() == max_keys as usize {
                next = Some(id);
                break;
            }
            let (_, value, hot) = &node.keys[key];
            let tiers = if *hot { strata_proto::LOCATED_IN_DRAM } else { strata_proto::LOCATED_ON_NVME };
            entries.push(ScanEntry { key: key.clone(), value_len: value.len() as u32, tiers, replicas: 0 });
        }
        Ok(ScanPage { entries, next })
    }

    fn batch_exists(&mut self, keys: &[&[u8]]) -> Vec<Result<bool, ClientError>> {
        let node = self.0.borrow();
        if !node.alive {
            return down(keys.len());
        }
        keys.iter().map(|key| Ok(node.keys.contains_key(*key))).collect()
    }

    fn batch_get(&mut self, keys: &[&[u8]]) -> Vec<Result<VersionedValue, ClientError>> {
        let node = self.0.borrow();
        if !node.alive {
            return down(keys.len());
        }
        keys.iter()
            .map(|key| node.keys.get(*key).map(|(_, value, _)| (value.clone(), None)).ok_or(ClientError::NotFound))
            .collect()
    }

    fn batch_put(&mut self, items: &[CopyItem<'_>], _: Option<WritePolicy>) -> Vec<Result<(), ClientError>> {
        let mut node = self.0.borrow_mut();
        if !node.alive {
            return down(items.len());
        }
        items.iter().map(|item| node.put(item.key, item.value, true)).collect()
    }

    fn batch_remove(&mut self, keys: &[&[u8]]) -> Vec<Result<(), ClientError>> {
        let mut node = self.0.borrow_mut();
        if !node.alive {
            return down(keys.len());
        }
        keys.iter()
            .map(|key| match node.keys.remove(*key) {
                Some((id, _, _)) => {
                    node.by_id.remove(&id);
                    Ok(())
                }
                None => Err(ClientError::NotFound),
            })
            .collect()
    }
}

impl SimNode {
    fn put(&mut self, key: &[u8], value: &[u8], hot: bool) -> Result<(), ClientError> {
        if self.keys.contains_key(key) {
            return Err(ClientError::Exists);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.by_id.insert(id, key.to_vec());
        self.keys.insert(key.to_vec(), (id, value.to_vec(), hot));
        Ok(())
    }
}

/// A member of equal weight in no zone, in `state` (the simulation's nodes are never dialled).
pub(crate) fn member(id: &str, state: MemberState) -> Member {
    Member {
        id: id.to_string(),
        shards: vec!["127.0.0.1:1".parse().expect("address")],
        zone: String::new(),
        state,
        epoch: 1,
        dram: TierSpace { capacity: 1 << 30, free: 1 << 30 },
        nvme: TierSpace::default(),
        keys: 0,
    }
}

/// The other nodes as one node reaches them: none at all from a partitioned node, and never a dead or
/// partitioned one.
struct SimDirectory {
    nodes: HashMap<String, Handle>,
    cut_off: bool,
}

impl Directory for SimDirectory {
    type Store = Handle;

    fn node(&mut self, member: &Member) -> Option<&mut Handle> {
        if self.cut_off {
            return None;
        }
        self.nodes.get_mut(&member.id).filter(|handle| {
            let node = handle.0.borrow();
            node.alive && !node.partitioned
        })
    }

    fn forget(&mut self, _member: &Member) {}
}

/// The cluster: nodes (dead ones stay, out of the view), their states, the view, and what was acknowledged.
struct World {
    rng: ChaCha8Rng,
    nodes: BTreeMap<String, (Handle, MemberState)>,
    view: View,
    revision: i64,
    model: BTreeMap<Vec<u8>, Vec<u8>>,
    next_node: usize,
    next_key: usize,
    /// A partitioned node and the view it was cut off with.
    cut_off: Option<(String, View)>,
}

impl World {
    fn new(seed: u64) -> Self {
        let mut world = World {
            rng: ChaCha8Rng::seed_from_u64(seed),
            nodes: BTreeMap::new(),
            view: View::default(),
            revision: 0,
            model: BTreeMap::new(),
            next_node: 0,
            next_key: 0,
            cut_off: None,
        };
        for _ in 0..3 {
            world.join();
        }
        world
    }

    fn publish(&mut self) {
        self.revision += 1;
        let members = self
            .nodes
            .iter()
            .filter(|(_, (handle, _))| {
                let node = handle.0.borrow();
                node.alive && !node.partitioned
            })
            .map(|(id, (_, state))| member(id, *state))
            .collect();
        self.view = View::next(&self.view, self.revision, members);
    }

    fn serving_ids(&self) -> Vec<String> {
        self.view.serving().map(|member| member.id.clone()).collect()
    }

    /// The first `count` serving nodes of `key`'s order.
    fn first(&self, key: &[u8], count: usize) -> Vec<String> {
        let ids = self.serving_ids();
        placement::replicas(key, &self.view.candidates(), count).into_iter().map(|at| ids[at].clone()).collect()
    }

    fn join(&mut self) {
        let id = format!("n{}", self.next_node);
        self.next_node += 1;
        let node = SimNode { alive: true, ..SimNode::default() };
        self.nodes.insert(id, (Handle(Rc::new(RefCell::new(node))), MemberState::Serving));
        self.publish();
    }

    /// A client's put of fresh keys to their two replicas; acknowledged when both stored it.
    fn put_keys(&mut self, count: usize) {
        for _ in 0..count {
            let key = format!("key-{}", self.next_key).into_bytes();
            let value: Vec<u8> = (0..16).map(|at| (self.next_key * 7 + at) as u8).collect();
            self.next_key += 1;
            let hot = self.rng.random_bool(0.7);
            let replicas = self.first(&key, REPLICAS);
            let stored =
                replicas.iter().filter(|id| self.nodes[*id].0.0.borrow_mut().put(&key, &value, hot).is_ok()).count();
            if stored == REPLICAS.min(replicas.len()) && stored > 0 {
                self.model.insert(key, value);
            }
        }
    }

    /// Every live node runs passes, in a seeded order, until a round changes nothing (at most 6 rounds).
    fn settle(&mut self) {
        let stop = AtomicBool::new(false);
        for _round in 0..6 {
            let mut ids: Vec<String> = self.view.members.iter().map(|member| member.id.clone()).collect();
            ids.extend(self.cut_off.as_ref().map(|(id, _)| id.clone()));
            for at in (1..ids.len()).rev() {
                ids.swap(at, self.rng.random_range(0..=at));
            }
            let mut changed = false;
            for id in ids {
                let (handle, state) = self.nodes[&id].clone();
                // A partitioned node works under the view it was cut off with, which is its latest.
                let cut_off = self.cut_off.as_ref().filter(|(cut, _)| *cut == id).map(|(_, view)| view);
                let view = cut_off.unwrap_or(&self.view);
                let epoch = view.epoch;
                let context = PassContext {
                    view,
                    me: &id,
                    replicas: REPLICAS,
                    max_replicas: MAX_REPLICAS,
                    draining: state == MemberState::Draining,
                    stop: &stop,
                    latest_epoch: &move || epoch,
                    copy_policy: None,
                };
                let nodes = self.nodes.iter().map(|(id, (handle, _))| (id.clone(), handle.clone())).collect();
                let mut directory = SimDirectory { nodes, cut_off: cut_off.is_some() };
                let report = run_pass(&context, &mut handle.clone(), &mut directory, &mut Throttle::new(u64::MAX))
                    .expect("a live node's pass");
                // A partitioned node's passes change nothing the others see; they must not keep the cluster
                // from settling.
                changed |= cut_off.is_none() && (report.copied > 0 || report.removed > 0);
            }
            if !changed {
                return;
            }
        }
        panic!("the cluster did not settle in 6 rounds");
    }

    /// Cuts `id` off: the others see its lease expire; it keeps its keys and its view.
    fn partition(&mut self, id: &str) {
        self.cut_off = Some((id.to_string(), self.view.clone()));
        self.nodes[id].0.0.borrow_mut().partitioned = true;
        self.publish();
    }

    /// The partitioned node comes back, with what it held.
    fn heal(&mut self) {
        if let Some((id, _)) = self.cut_off.take() {
            self.nodes[&id].0.0.borrow_mut().partitioned = false;
            self.publish();
        }
    }

    fn kill(&mut self, id: &str) {
        self.nodes[id].0.0.borrow_mut().alive = false;
        self.publish();
    }

    /// SIGUSR1: the node drains, then leaves.
    fn drain(&mut self, id: &str) {
        self.nodes.get_mut(id).expect("node").1 = MemberState::Draining;
        self.publish();
        self.settle();
        let left = self.nodes[id].0.0.borrow().keys.len();
        assert_eq!(left, 0, "a drained node keeps no key");
        self.kill(id);
    }

    fn check(&self, step: usize) {
        let owners_of = |key: &[u8]| self.first(key, MAX_REPLICAS);
        for (key, value) in &self.model {
            let holders: Vec<&String> = self
                .nodes
                .iter()
                .filter(|(_, (handle, _))| handle.0.borrow().alive && !handle.0.borrow().partitioned)
                .filter(|(_, (handle, _))| {
                    handle.0.borrow().keys.get(key).map(|(_, held, _)| {
                        assert_eq!(held, value, "step {step}: wrong bytes");
                        true
                    }) == Some(true)
                })
                .map(|(id, _)| id)
                .collect();
            let name = String::from_utf8_lossy(key);
            assert!(!holders.is_empty(), "step {step}: acknowledged {name} lost");
            let owners = owners_of(key);
            assert!(
                holders.iter().all(|id| owners.contains(id)),
                "step {step}: {name} on {holders:?}, owners {owners:?}"
            );
            let replicas = self.first(key, REPLICAS);
            assert!(
                replicas.iter().all(|id| holders.contains(&id)),
                "step {step}: {name} on {holders:?}, replicas {replicas:?}"
            );
        }
    }

    fn step(&mut self, step: usize) {
        let serving = self.serving_ids();
        // One change at a time: while a node is cut off, none dies or drains (two losses could take both
        // replicas of a key).
        let whole = self.cut_off.is_none();
        match self.rng.random_range(0..12) {
            0..=3 => self.put_keys(20),
            4 | 5 if serving.len() > 2 && whole => {
                let victim = serving[self.rng.random_range(0..serving.len())].clone();
                self.kill(&victim);
            }
            6 | 7 if serving.len() < 6 => self.join(),
            8 if serving.len() > 2 && whole => {
                let leaving = serving[self.rng.random_range(0..serving.len())].clone();
                self.drain(&leaving);
            }
            9 if serving.len() > 2 && whole => {
                let cut = serving[self.rng.random_range(0..serving.len())].clone();
                self.partition(&cut);
            }
            10 => self.heal(),
            _ => {
                // Some keys go cold (evicted from DRAM): a move now gives them up.
                for (handle, _) in self.nodes.values() {
                    for (_, _, hot) in handle.0.borrow_mut().keys.values_mut() {
                        if self.rng.random_bool(0.2) {
                            *hot = false;
                        }
                    }
                }
            }
        }
        // Clients keep putting while the cluster settles.
        self.put_keys(5);
        self.settle();
        self.check(step);
    }
}

#[test]
fn seeded_membership_changes_keep_every_key_on_its_replicas() {
    for seed in 0..40 {
        let mut world = World::new(seed);
        for step in 0..40 {
            world.step(step);
        }
        assert!(world.model.len() > 100, "seed {seed}: the run put keys");
    }
}

#[test]
fn a_pass_whose_view_is_no_longer_the_latest_removes_nothing() {
    let mut world = World::new(7);
    world.put_keys(200);
    world.settle();
    for (handle, _) in world.nodes.values() {
        for (_, _, hot) in handle.0.borrow_mut().keys.values_mut() {
            *hot = false;
        }
    }
    // A fourth node joins, and dies before any pass: the view with it is already an old one.
    world.join();
    let with_n3 = world.view.clone();
    world.kill("n3");
    let (handle, _) = world.nodes["n0"].clone();
    let held = handle.0.borrow().keys.len();
    let stop = AtomicBool::new(false);
    let latest = world.view.epoch;
    let context = PassContext {
        view: &with_n3,
        me: "n0",
        replicas: REPLICAS,
        max_replicas: MAX_REPLICAS,
        draining: false,
        stop: &stop,
        latest_epoch: &|| latest,
        copy_policy: None,
    };
    let nodes = world.nodes.iter().map(|(id, (handle, _))| (id.clone(), handle.clone())).collect();
    let mut directory = SimDirectory { nodes, cut_off: false };
    let report = run_pass(&context, &mut handle.clone(), &mut directory, &mut Throttle::new(u64::MAX)).expect("pass");
    // Under the old view n0 would give up its cold keys that n3 owned; n3 is gone, so n0 owns them again.
    assert_eq!(report.removed, 0, "{report:?}");
    assert!(report.left > 0, "the pass says it stopped short: {report:?}");
    assert_eq!(handle.0.borrow().keys.len(), held);
    world.settle();
    world.check(0);
}
