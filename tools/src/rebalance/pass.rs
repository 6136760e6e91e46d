//! One pass of the rebalancer over the node's keys: scan each local shard a page at a time, ask the
//! key's replicas whether they hold it (one EXISTS batch per node and page), copy what the rules of
//! `plan.rs` say (throttled), and give up the keys the node no longer owns.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use strata_client::{ClientError, ScanEntry};
use strata_cluster::{Member, View};
use strata_proto::{WritePolicy, placement};

use super::plan::{Decision, Removal, Role, decide, role, to_ask};
use super::store::{CopyItem, Directory, KeyStore};
use super::throttle::Throttle;

/// Keys per SCAN page.
const PAGE_KEYS: u32 = 256;

/// What one pass is run under.
pub struct PassContext<'a> {
    /// The view it follows.
    pub view: &'a View,
    /// This node's id.
    pub me: &'a str,
    /// The cluster's replica count (for keys whose put did not say one).
    pub replicas: usize,
    /// How far ownership reaches.
    pub max_replicas: usize,
    /// Whether the node drains (every key goes).
    pub draining: bool,
    /// Set when the node stops: the pass ends after its page.
    pub stop: &'a AtomicBool,
    /// The epoch of the latest view. A pass whose view is no longer the latest removes nothing more and
    /// ends: a removal decided under an old placement could drop a key its node owns again (a page that
    /// waited on a node that stopped answering can take seconds).
    pub latest_epoch: &'a (dyn Fn() -> i64 + Sync),
    /// The write policy of the copies (none: each receiving node's default). A takeover copies durably:
    /// every key it moves was on a tier's log, written through or durably.
    pub copy_policy: Option<WritePolicy>,
}

impl PassContext<'_> {
    fn stale(&self) -> bool {
        (self.latest_epoch)() != self.view.epoch
    }
}

/// What a pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Keys looked at.
    pub scanned: u64,
    /// Copies made (a key copied to two nodes counts twice).
    pub copied: u64,
    /// Bytes of value copied.
    pub copied_bytes: u64,
    /// Keys given up.
    pub removed: u64,
    /// Keys whose plan could not be carried out (a node did not answer, a copy failed): the next pass
    /// tries again.
    pub left: u64,
}

impl PassReport {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &PassReport) {
        self.scanned += other.scanned;
        self.copied += other.copied;
        self.copied_bytes += other.copied_bytes;
        self.removed += other.removed;
        self.left += other.left;
    }
}

/// Runs one pass over every shard of `local` (this node, as one tenant).
pub fn run_pass(
    context: &PassContext<'_>,
    local: &mut impl KeyStore,
    nodes: &mut impl Directory,
    throttle: &mut Throttle,
) -> Result<PassReport, ClientError> {
    let serving: Vec<&Member> = context.view.serving().collect();
    let mut report = PassReport::default();
    for shard in 0..local.shard_count() {
        let mut cursor = 0;
        loop {
            if context.stop.load(Ordering::Relaxed) || context.stale() {
                report.left += 1;
                return Ok(report);
            }
            let page = local.scan_shard(shard, cursor, PAGE_KEYS)?;
            Page { context, serving: &serving, entries: &page.entries }.carry_out(local, nodes, throttle, &mut report);
            match page.next {
                Some(next) => cursor = next,
                None => break,
            }
        }
    }
    Ok(report)
}

/// One pass like [`run_pass`], with each of `workers` (a connection to this node, the other nodes, a
/// throttle) carrying pages out at once: the scan stays one stream (keys only, cheap), while the reads,
/// copies and removals of several pages overlap. For a takeover's drain, whose time is its copies.
pub fn run_pass_parallel<S: KeyStore + Send, D: Directory + Send>(
    context: &PassContext<'_>,
    scanner: &mut impl KeyStore,
    workers: Vec<(S, D, Throttle)>,
) -> Result<PassReport, ClientError> {
    let serving: Vec<&Member> = context.view.serving().collect();
    let (pages, queue) = std::sync::mpsc::sync_channel::<Vec<ScanEntry>>(workers.len().max(1));
    let queue = std::sync::Mutex::new(queue);
    std::thread::scope(|scope| {
        let running: Vec<_> = workers
            .into_iter()
            .map(|(mut local, mut nodes, mut throttle)| {
                let (queue, serving) = (&queue, &serving);
                scope.spawn(move || {
                    let mut report = PassReport::default();
                    loop {
                        let next = queue.lock().map_err(|_| ()).and_then(|queue| queue.recv().map_err(|_| ()));
                        let Ok(entries) = next else { return report };
                        let page = Page { context, serving, entries: &entries };
                        page.carry_out(&mut local, &mut nodes, &mut throttle, &mut report);
                    }
                })
            })
            .collect();
        let scanned = scan_into(context, scanner, &pages);
        drop(pages);
        let mut report = PassReport::default();
        for worker in running {
            // A worker that panicked carried nothing more out: its pages count as left.
            report.add(&worker.join().unwrap_or(PassReport { left: 1, ..PassReport::default() }));
        }
        scanned.map(|stopped| {
            report.left += u64::from(stopped);
            report
        })
    })
}

/// Scans every shard of `local` into `pages`; whether it stopped early (stopping, a newer view, or the
/// workers gone).
fn scan_into(
    context: &PassContext<'_>,
    local: &mut impl KeyStore,
    pages: &std::sync::mpsc::SyncSender<Vec<ScanEntry>>,
) -> Result<bool, ClientError> {
    for shard in 0..local.shard_count() {
        let mut cursor = 0;
        loop {
            if context.stop.load(Ordering::Relaxed) || context.stale() {
                return Ok(true);
            }
            let page = local.scan_shard(shard, cursor, PAGE_KEYS)?;
            if pages.send(page.entries).is_err() {
                return Ok(true);
            }
            match page.next {
                Some(next) => cursor = next,
                None => break,
            }
        }
    }
    Ok(false)
}

/// One page of keys under one view.
struct Page<'a> {
    context: &'a PassContext<'a>,
    serving: &'a [&'a Member],
    entries: &'a [ScanEntry],
}

impl Page<'_> {
    fn carry_out(
        &self,
        local: &mut impl KeyStore,
        nodes: &mut impl Directory,
        throttle: &mut Throttle,
        report: &mut PassReport,
    ) {
        report.scanned += self.entries.len() as u64;
        let roles = self.roles();
        let answers = self.ask(&roles, local, nodes);
        let decisions: Vec<Decision> = roles
            .iter()
            .enumerate()
            .map(|(entry, role)| decide(role, |node| answers.get(&(entry, node)).copied()))
            .collect();
        let unanswered = roles.iter().enumerate().filter(|(entry, role)| {
            !matches!(role, Role::Departed { copy_to } if copy_to.is_empty())
                && to_ask(role).iter().any(|&node| !answers.contains_key(&(*entry, node)))
        });
        report.left += unanswered.count() as u64;
        let (held, failed) = self.copy(&decisions, local, nodes, throttle, report);
        report.left += failed;
        let give_up: Vec<&[u8]> = decisions
            .iter()
            .enumerate()
            .filter(|(entry, decision)| match decision.removal {
                Removal::Keep => false,
                Removal::Now => true,
                Removal::OnceHeld => decision.held || held.get(entry).is_some_and(|&held| held),
            })
            .map(|(entry, _)| self.entries[entry].key.as_slice())
            .collect();
        if !give_up.is_empty() && self.context.stale() {
            report.left += give_up.len() as u64;
        } else if !give_up.is_empty() {
            report.removed += local.batch_remove(&give_up).iter().filter(|result| result.is_ok()).count() as u64;
        }
    }

    fn roles(&self) -> Vec<Role> {
        let candidates = self.context.view.candidates();
        let me = self.serving.iter().position(|member| member.id == self.context.me);
        let (replicas, max_replicas, draining) =
            (self.context.replicas, self.context.max_replicas, self.context.draining);
        self.entries
            .iter()
            .map(|entry| {
                let order = placement::replicas(&entry.key, &candidates, candidates.len());
                // A put that said its replica count keeps it through repairs; the others take the cluster's.
                let replicas = if entry.replicas == 0 { replicas } else { usize::from(entry.replicas) };
                role(&order, me, replicas, max_replicas, entry.in_dram(), draining)
            })
            .collect()
    }

    /// Asks each node the roles need whether it holds their keys: (entry, node) → holds. A node that
    /// fails answers nothing. An upserted key is held only at this node's version or a newer one, so that
    /// a replica that missed an upsert is repaired like one that lost the key (a versioned copy replaces
    /// its older version).
    fn ask(
        &self,
        roles: &[Role],
        local: &mut impl KeyStore,
        nodes: &mut impl Directory,
    ) -> HashMap<(usize, usize), bool> {
        let mut asked: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (entry, role) in roles.iter().enumerate() {
            for &node in to_ask(role) {
                asked.entry(node).or_default().push(entry);
            }
        }
        let mine = self.local_versions(local);
        let mut answers = HashMap::new();
        for (node, entries) in asked {
            let member = self.serving[node];
            let Some(client) = nodes.node(member) else { continue };
            let (versioned, plain): (Vec<usize>, Vec<usize>) =
                entries.into_iter().partition(|entry| mine.contains_key(entry));
            let keys = |entries: &[usize]| -> Vec<&[u8]> {
                entries.iter().map(|&entry| self.entries[entry].key.as_slice()).collect()
            };
            let held = client.batch_exists(&keys(&plain));
            let theirs = if versioned.is_empty() { Vec::new() } else { client.batch_versions(&keys(&versioned)) };
            if held.iter().any(unreachable) || theirs.iter().any(unreachable) {
                nodes.forget(member);
            }
            for (entry, result) in plain.into_iter().zip(held) {
                if let Ok(holds) = result {
                    answers.insert((entry, node), holds);
                }
            }
            for (entry, result) in versioned.into_iter().zip(theirs) {
                let holds = match result {
                    Ok(theirs) => theirs >= mine[&entry],
                    Err(ClientError::NotFound) => false,
                    Err(_) => continue,
                };
                answers.insert((entry, node), holds);
            }
        }
        answers
    }

    /// The versions of this page's upserted keys as the local node holds them (entry → version); a key it
    /// no longer holds is left out, and asked about as any other.
    fn local_versions(&self, local: &mut impl KeyStore) -> HashMap<usize, Option<strata_proto::Version>> {
        let versioned: Vec<usize> = (0..self.entries.len()).filter(|&entry| self.entries[entry].versioned()).collect();
        if versioned.is_empty() {
            return HashMap::new();
        }
        let keys: Vec<&[u8]> = versioned.iter().map(|&entry| self.entries[entry].key.as_slice()).collect();
        versioned
            .into_iter()
            .zip(local.batch_versions(&keys))
            .filter_map(|(entry, result)| Some((entry, result.ok()?)))
            .collect()
    }

    /// Copies each decision's key to its nodes, in batches of at most the throttle's size; returns which
    /// entries a node now holds, and how many copies failed.
    fn copy(
        &self,
        decisions: &[Decision],
        local: &mut impl KeyStore,
        nodes: &mut impl Directory,
        throttle: &mut Throttle,
        report: &mut PassReport,
    ) -> (HashMap<usize, bool>, u64) {
        let mut held = HashMap::new();
        let mut failed = 0u64;
        let wanted: Vec<usize> = (0..decisions.len()).filter(|&entry| !decisions[entry].copy_to.is_empty()).collect();
        for batch in batches(&wanted, |entry| u64::from(self.entries[entry].value_len), throttle.batch_bytes()) {
            let keys: Vec<&[u8]> = batch.iter().map(|&entry| self.entries[entry].key.as_slice()).collect();
            let values = local.batch_get(&keys);
            let mut targets: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            for (at, &entry) in batch.iter().enumerate() {
                if values[at].is_err() {
                    // Gone since the scan (removed, evicted): nothing to copy, nothing to keep.
                    continue;
                }
                for &node in &decisions[entry].copy_to {
                    targets.entry(node).or_default().push(at);
                }
            }
            let mut sent = 0u64;
            for (node, ats) in targets {
                let member = self.serving[node];
                let Some(client) = nodes.node(member) else {
                    failed += ats.len() as u64;
                    continue;
                };
                let items: Vec<CopyItem<'_>> = ats
                    .iter()
                    .map(|&at| {
                        let (value, version) =
                            values[at].as_ref().map_or((&[][..], None), |(value, version)| (value, *version));
                        CopyItem { key: keys[at], value, version, replicas: self.entries[batch[at]].replicas }
                    })
                    .collect();
                for ((&at, item), result) in
                    ats.iter().zip(&items).zip(client.batch_put(&items, self.context.copy_policy))
                {
                    match result {
                        // Held already, or at a newer version: a copy never replaces what is newer.
                        Ok(()) | Err(ClientError::Exists | ClientError::Superseded) => {
                            held.insert(batch[at], true);
                            report.copied += 1;
                            report.copied_bytes += item.value.len() as u64;
                            sent += item.value.len() as u64;
                        }
                        Err(error) => {
                            tracing::debug!(node = %member.id, %error, "rebalance: a copy failed");
                            failed += 1;
                        }
                    }
                }
            }
            std::thread::sleep(throttle.after(sent).min(Duration::from_secs(5)));
        }
        (held, failed)
    }
}

/// Whether a call's result says its node could not be reached.
fn unreachable<T>(result: &Result<T, ClientError>) -> bool {
    matches!(result, Err(ClientError::Connection(_) | ClientError::Timeout))
}

/// `entries` in consecutive batches of at most `limit` bytes by `size` (a larger entry alone).
fn batches(entries: &[usize], size: impl Fn(usize) -> u64, limit: u64) -> Vec<Vec<usize>> {
    let mut batches: Vec<Vec<usize>> = Vec::new();
    let mut bytes = 0u64;
    for &entry in entries {
        let entry_bytes = size(entry);
        if batches.last().is_none_or(|batch| !batch.is_empty() && bytes + entry_bytes > limit) {
            batches.push(Vec::new());
            bytes = 0;
        }
        bytes += entry_bytes;
        if let Some(batch) = batches.last_mut() {
            batch.push(entry);
        }
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use strata_client::ScanPage;
    use strata_cluster::MemberState;

    use crate::rebalance::sim::member;
    use crate::rebalance::store::VersionedValue;

    /// Keys and values in insertion order (the scan's cursor is the position).
    type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

    /// A node in memory that threads share: its keys, the replica count its scan reports for each, and the
    /// counts the copies it received said.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Pairs>>, u8, Arc<Mutex<Vec<u8>>>);

    impl KeyStore for Shared {
        fn shard_count(&self) -> usize {
            1
        }
        fn scan_shard(&mut self, _: usize, cursor: u32, max_keys: u32) -> Result<ScanPage, ClientError> {
            let keys = self.0.lock().unwrap();
            let end = (cursor as usize + max_keys as usize).min(keys.len());
            let entries = keys[cursor as usize..end]
                .iter()
                .map(|(key, value)| ScanEntry {
                    key: key.clone(),
                    value_len: value.len() as u32,
                    tiers: 0,
                    replicas: self.1,
                })
                .collect();
            Ok(ScanPage { entries, next: (end < keys.len()).then_some(end as u32) })
        }
        fn batch_exists(&mut self, keys: &[&[u8]]) -> Vec<Result<bool, ClientError>> {
            let held = self.0.lock().unwrap();
            keys.iter().map(|key| Ok(held.iter().any(|(k, _)| k == key))).collect()
        }
        fn batch_get(&mut self, keys: &[&[u8]]) -> Vec<Result<VersionedValue, ClientError>> {
            let held = self.0.lock().unwrap();
            let find = |key: &[u8]| held.iter().find(|(k, _)| k == key).map(|(_, v)| (v.clone(), None));
            keys.iter().map(|key| find(key).ok_or(ClientError::NotFound)).collect()
        }
        fn batch_put(&mut self, items: &[CopyItem<'_>], _: Option<WritePolicy>) -> Vec<Result<(), ClientError>> {
            let mut held = self.0.lock().unwrap();
            held.extend(items.iter().map(|item| (item.key.to_vec(), item.value.to_vec())));
            self.2.lock().unwrap().extend(items.iter().map(|item| item.replicas));
            items.iter().map(|_| Ok(())).collect()
        }
        fn batch_remove(&mut self, _: &[&[u8]]) -> Vec<Result<(), ClientError>> {
            // Removals mark, not shift: the scan's cursors stay valid (as entry ids do in the index).
            Vec::new()
        }
    }

    struct Everyone(HashMap<String, Shared>);

    impl Directory for Everyone {
        type Store = Shared;
        fn node(&mut self, member: &Member) -> Option<&mut Shared> {
            self.0.get_mut(&member.id)
        }
        fn forget(&mut self, _: &Member) {}
    }

    /// A drain pass of node "dead" (not in `view`), holding `tier`, to `owners`, with `workers` workers, the
    /// cluster's replica count 1 and ownership reaching `max_replicas` nodes.
    fn drain_a_dead_node(
        view: &View,
        tier: &Shared,
        owners: &HashMap<String, Shared>,
        max_replicas: usize,
        workers: usize,
    ) -> PassReport {
        let stop = AtomicBool::new(false);
        let context = PassContext {
            view,
            me: "dead",
            replicas: 1,
            max_replicas,
            draining: true,
            stop: &stop,
            latest_epoch: &|| 5,
            copy_policy: None,
        };
        let workers = (0..workers).map(|_| (tier.clone(), Everyone(owners.clone()), Throttle::new(u64::MAX))).collect();
        run_pass_parallel(&context, &mut tier.clone(), workers).expect("pass")
    }

    #[test]
    fn a_parallel_drain_copies_every_key_to_its_replica_once() {
        let members = vec![member("a", MemberState::Serving), member("b", MemberState::Serving)];
        let view = View { epoch: 5, revision: 5, members };
        let tier = Shared::default();
        let values: Pairs =
            (0..1000u32).map(|at| (format!("k{at}").into_bytes(), at.to_le_bytes().repeat(3))).collect();
        tier.0.lock().unwrap().extend(values.iter().cloned());
        let owners: HashMap<String, Shared> = ["a", "b"].iter().map(|id| (id.to_string(), Shared::default())).collect();
        let report = drain_a_dead_node(&view, &tier, &owners, 1, 4);
        assert_eq!((report.scanned, report.copied, report.left), (1000, 1000, 0), "{report:?}");
        let candidates = view.candidates();
        for (key, value) in &values {
            let owner = &view.members[placement::replicas(key, &candidates, 1)[0]].id;
            let held = owners[owner].0.lock().unwrap();
            let copies: Vec<_> = held.iter().filter(|(k, _)| k == key).collect();
            assert_eq!(copies.len(), 1, "{} copied once, to its owner", String::from_utf8_lossy(key));
            assert_eq!(&copies[0].1, value);
        }
    }

    #[test]
    fn a_key_put_with_more_replicas_than_the_clusters_count_keeps_them() {
        let ids = ["a", "b", "c"];
        let members = ids.iter().map(|id| member(id, MemberState::Serving)).collect();
        let view = View { epoch: 5, revision: 5, members };
        let tier = Shared(Arc::default(), 3, Arc::default());
        let values: Pairs = (0..300u32).map(|at| (format!("k{at}").into_bytes(), at.to_le_bytes().to_vec())).collect();
        tier.0.lock().unwrap().extend(values.iter().cloned());
        let owners: HashMap<String, Shared> = ids.iter().map(|id| (id.to_string(), Shared::default())).collect();
        let report = drain_a_dead_node(&view, &tier, &owners, 3, 2);
        assert_eq!((report.scanned, report.copied, report.left), (300, 900, 0), "three copies each: {report:?}");
        for id in ids {
            assert_eq!(owners[id].0.lock().unwrap().len(), 300, "{id} holds every key");
            assert!(owners[id].2.lock().unwrap().iter().all(|&said| said == 3), "each copy says its count again");
        }
    }

    #[test]
    fn batches_hold_their_bytes_and_a_large_entry_goes_alone() {
        let sizes = [3u64, 3, 3, 10, 1];
        let batched = batches(&[0, 1, 2, 3, 4], |entry| sizes[entry], 6);
        assert_eq!(batched, vec![vec![0, 1], vec![2], vec![3], vec![4]]);
        assert!(batches(&[], |_| 0, 6).is_empty());
    }
}
