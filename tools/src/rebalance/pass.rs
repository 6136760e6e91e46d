//! One pass of the rebalancer over the node's keys: scan each local shard a page at a time, ask the
//! key's replicas whether they hold it (one EXISTS batch per node and page), copy what the rules of
//! `plan.rs` say (throttled), and give up the keys the node no longer owns.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use strata_client::{ClientError, ScanEntry};
use strata_cluster::{Member, View};
use strata_proto::placement;

use super::plan::{Decision, Removal, Role, decide, role, to_ask};
use super::store::{Directory, KeyStore};
use super::throttle::Throttle;

/// Keys per SCAN page.
const PAGE_KEYS: u32 = 256;

/// What one pass is run under.
pub struct PassContext<'a> {
    /// The view it follows.
    pub view: &'a View,
    /// This node's id.
    pub me: &'a str,
    /// The cluster's replica count.
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
    pub latest_epoch: &'a dyn Fn() -> i64,
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
        let answers = self.ask(&roles, nodes);
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
                role(&order, me, replicas, max_replicas, entry.in_dram(), draining)
            })
            .collect()
    }

    /// Asks each node the roles need whether it holds their keys: (entry, node) → holds. A node that
    /// fails answers nothing.
    fn ask(&self, roles: &[Role], nodes: &mut impl Directory) -> HashMap<(usize, usize), bool> {
        let mut asked: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (entry, role) in roles.iter().enumerate() {
            for &node in to_ask(role) {
                asked.entry(node).or_default().push(entry);
            }
        }
        let mut answers = HashMap::new();
        for (node, entries) in asked {
            let member = self.serving[node];
            let Some(client) = nodes.node(member) else { continue };
            let keys: Vec<&[u8]> = entries.iter().map(|&entry| self.entries[entry].key.as_slice()).collect();
            let results = client.batch_exists(&keys);
            if results.iter().any(|result| matches!(result, Err(ClientError::Connection(_) | ClientError::Timeout))) {
                nodes.forget(member);
            }
            for (entry, result) in entries.into_iter().zip(results) {
                if let Ok(holds) = result {
                    answers.insert((entry, node), holds);
                }
            }
        }
        answers
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
                let items: Vec<(&[u8], &[u8])> =
                    ats.iter().map(|&at| (keys[at], values[at].as_deref().unwrap_or_default())).collect();
                for ((&at, item), result) in ats.iter().zip(&items).zip(client.batch_put(&items)) {
                    match result {
                        Ok(()) | Err(ClientError::Exists) => {
                            held.insert(batch[at], true);
                            report.copied += 1;
                            report.copied_bytes += item.1.len() as u64;
                            sent += item.1.len() as u64;
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

    #[test]
    fn batches_hold_their_bytes_and_a_large_entry_goes_alone() {
        let sizes = [3u64, 3, 3, 10, 1];
        let batched = batches(&[0, 1, 2, 3, 4], |entry| sizes[entry], 6);
        assert_eq!(batched, vec![vec![0, 1], vec![2], vec![3], vec![4]]);
        assert!(batches(&[], |_| 0, 6).is_empty());
    }
}
