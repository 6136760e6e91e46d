//! A node's rebalancer: when its cluster's placement changes it repairs lost replicas from survivors,
//! migrates hot keys it no longer owns and gives up the rest; on a drain it moves every key away
//! (docs/PROTOCOL.md, "Repair, rebalance and drain"; the rules are in `plan.rs`).
//!
//! It runs on a thread of its own as a client of its own node (SCAN, GET, REMOVE) and of the others
//! (EXISTS, PUT), once per tenant with the tenant's token, so the shards know nothing of it and tenant
//! scoping is the nodes' own. A pass starts once a new epoch has held for `settle`, and only while the
//! node serves in its own view: a node that lost its lease, or sees a cluster without itself, moves and
//! removes nothing.

pub(crate) mod pass;
mod plan;
#[cfg(test)]
pub(crate) mod sim;
pub(crate) mod store;
pub(crate) mod throttle;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use strata_client::{Client, ClientOptions};
use strata_cluster::{ClusterConfig, MemberState, MembersWatch, View};
use strata_engine::reports::{Report, Reports};

pub use pass::PassReport;
use pass::{PassContext, run_pass};
use store::Nodes;
use throttle::Throttle;

/// How often the thread looks at the view.
const TICK: Duration = Duration::from_millis(100);
/// How long after an incomplete pass the next one starts.
const RETRY: Duration = Duration::from_secs(5);
/// The most passes a drain makes before it gives up on the keys still left.
const DRAIN_PASSES: usize = 5;

/// How the rebalancer works.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RebalanceConfig {
    /// The cluster's replica count: repairs top keys up to it (`--replicas`).
    pub replicas: usize,
    /// Bytes per second copies may take (`--repair-rate`); 0 turns repair and rebalance off (a drain
    /// still moves keys, at 256 MiB/s).
    pub rate: u64,
    /// How long a new epoch must hold before a pass starts, so that a burst of changes makes one pass.
    pub settle: Duration,
}

/// What a drain did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// The passes' sums.
    pub moved: PassReport,
    /// Whether every key went (none left on the node).
    pub complete: bool,
}

/// State shared with the thread.
struct Shared {
    stop: AtomicBool,
    drain: AtomicBool,
    drained: Mutex<Option<DrainReport>>,
    done: Condvar,
    passes: AtomicU64,
    totals: Mutex<PassReport>,
    reports: Reports,
}

/// A running rebalancer.
pub struct Rebalancer {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Who the rebalancer works for and on: the node's cluster, its own address, its tenants' tokens (none
/// for an open node).
pub struct Subject {
    /// The node's cluster settings.
    pub cluster: ClusterConfig,
    /// The node's first shard.
    pub local: SocketAddr,
    /// One token per tenant, or one `None` for an open node.
    pub tokens: Vec<Option<Vec<u8>>>,
    /// Where it reports (`/metrics`).
    pub reports: Reports,
    /// The node's members' watch (the one that feeds its ownership), shared.
    pub members: Arc<MembersWatch>,
}

impl Rebalancer {
    /// Starts the thread.
    pub fn start(config: RebalanceConfig, subject: Subject) -> anyhow::Result<Rebalancer> {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            drain: AtomicBool::new(false),
            drained: Mutex::new(None),
            done: Condvar::new(),
            passes: AtomicU64::new(0),
            totals: Mutex::new(PassReport::default()),
            reports: subject.reports.clone(),
        });
        shared.report();
        let running = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("strata-rebalance".into())
            .spawn(move || Worker { config, subject, shared: running }.run())?;
        Ok(Rebalancer { shared, thread: Some(thread) })
    }

    /// Moves every key away (the node's entry must say draining, [`strata_cluster::Registration::drain`]);
    /// waits at most `limit`. `None`: the drain did not end in time.
    pub fn drain(&self, limit: Duration) -> Option<DrainReport> {
        self.shared.drain.store(true, Ordering::SeqCst);
        let drained = self.shared.drained.lock().ok()?;
        let (drained, _) = self.shared.done.wait_timeout_while(drained, limit, |done| done.is_none()).ok()?;
        *drained
    }

    /// Stops the thread after its current page.
    pub fn stop(mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Shared {
    fn add(&self, report: PassReport) {
        self.passes.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut totals) = self.totals.lock() {
            totals.add(&report);
            totals.left = report.left;
        }
        self.report();
    }

    fn report(&self) {
        let totals = self.totals.lock().map(|totals| *totals).unwrap_or_default();
        let metrics = format!(
            "# HELP strata_rebalance_passes_total Passes of the rebalancer over the node's keys.\n\
             # TYPE strata_rebalance_passes_total counter\nstrata_rebalance_passes_total {}\n\
             # HELP strata_rebalance_copies_total Keys copied to another node (repairs, migrations, drains).\n\
             # TYPE strata_rebalance_copies_total counter\nstrata_rebalance_copies_total {}\n\
             # HELP strata_rebalance_copied_bytes_total Bytes of value copied to other nodes.\n\
             # TYPE strata_rebalance_copied_bytes_total counter\nstrata_rebalance_copied_bytes_total {}\n\
             # HELP strata_rebalance_removed_total Keys given up because the node no longer owns them.\n\
             # TYPE strata_rebalance_removed_total counter\nstrata_rebalance_removed_total {}\n\
             # HELP strata_rebalance_left Keys the last pass could not carry out (tried again).\n\
             # TYPE strata_rebalance_left gauge\nstrata_rebalance_left {}\n",
            self.passes.load(Ordering::Relaxed),
            totals.copied,
            totals.copied_bytes,
            totals.removed,
            totals.left,
        );
        self.reports.set("rebalance", Report { metrics, degraded: None });
    }
}

/// The thread's state.
struct Worker {
    config: RebalanceConfig,
    subject: Subject,
    shared: Arc<Shared>,
}

impl Worker {
    fn run(self) {
        // (epoch, since when it holds), and the epoch and view of the last complete pass.
        let mut seen = (0i64, Instant::now());
        let mut done = 0i64;
        let mut done_view: Option<Arc<View>> = None;
        while !self.shared.stop.load(Ordering::SeqCst) {
            std::thread::sleep(TICK);
            let view = self.subject.members.view();
            let state = view.members.iter().find(|member| member.id == self.subject.cluster.node_id).map(|m| m.state);
            if self.shared.drain.load(Ordering::SeqCst) {
                if state != Some(MemberState::Serving) {
                    self.drain();
                    return;
                }
                continue;
            }
            if state != Some(MemberState::Serving) || self.config.rate == 0 {
                continue;
            }
            if view.epoch != seen.0 {
                seen = (view.epoch, Instant::now());
            }
            if view.epoch == done || seen.1.elapsed() < self.config.settle {
                continue;
            }
            if self.nothing_to_move(done_view.as_deref(), &view) {
                tracing::info!(epoch = view.epoch, "rebalance: members only left and no key has a second replica");
                done = view.epoch;
                done_view = Some(view);
                continue;
            }
            let report = self.pass(&view, false, self.config.rate);
            self.shared.add(report);
            tracing::info!(epoch = view.epoch, ?report, "rebalance pass");
            if report.left == 0 {
                done = view.epoch;
                done_view = Some(view);
            } else {
                seen.1 = Instant::now() + RETRY.saturating_sub(self.config.settle);
            }
        }
    }

    /// Whether a pass would find nothing to do: since the last complete pass members only stopped serving
    /// ([`View::only_left_since`]: every key here stays here) and no key can have a replica to repair
    /// (`--max-replicas 1`). Such a pass would still read every key's entry, beside a takeover moving the
    /// tier of the member that left.
    fn nothing_to_move(&self, done_view: Option<&View>, view: &View) -> bool {
        self.subject.cluster.max_replicas <= 1 && done_view.is_some_and(|before| view.only_left_since(before))
    }

    /// Drain passes until a pass leaves no key behind (or `DRAIN_PASSES` of them); then says so.
    fn drain(&self) {
        let mut moved = PassReport::default();
        let mut complete = false;
        for _ in 0..DRAIN_PASSES {
            if self.shared.stop.load(Ordering::SeqCst) {
                break;
            }
            let view = self.subject.members.view();
            let rate = if self.config.rate == 0 { 256 << 20 } else { self.config.rate };
            let report = self.pass(&view, true, rate);
            self.shared.add(report);
            tracing::info!(?report, "drain pass");
            moved.add(&report);
            moved.left = report.left;
            if report.left == 0 && report.scanned == report.removed {
                complete = true;
                break;
            }
        }
        if let Ok(mut drained) = self.shared.drained.lock() {
            *drained = Some(DrainReport { moved, complete });
        }
        self.shared.done.notify_all();
    }

    /// One pass for every tenant.
    fn pass(&self, view: &View, draining: bool, rate: u64) -> PassReport {
        let context = PassContext {
            view,
            me: &self.subject.cluster.node_id,
            replicas: self.config.replicas,
            max_replicas: self.subject.cluster.max_replicas,
            draining,
            stop: &self.shared.stop,
            latest_epoch: &|| self.subject.members.view().epoch,
            copy_policy: None,
        };
        let mut throttle = Throttle::new(rate);
        let mut total = PassReport::default();
        for token in &self.subject.tokens {
            let options =
                ClientOptions { token: token.clone(), timeout: Duration::from_secs(10), ..Default::default() };
            let outcome = Client::connect(self.subject.local, options.clone())
                .and_then(|mut local| run_pass(&context, &mut local, &mut Nodes::new(options), &mut throttle));
            match outcome {
                Ok(report) => total.add(&report),
                Err(error) => {
                    tracing::warn!(%error, "rebalance pass failed; trying again");
                    total.left += 1;
                }
            }
        }
        total
    }
}
