//! The node's registration in etcd, on its own thread and tokio runtime: grant a lease of `lease_ttl`, put
//! the node's [`Member`] under it, keep the lease alive every third of its TTL (and refresh the entry's free
//! space), and on any failure report etcd unreachable and start again with a new lease. Every etcd call is
//! bounded by the TTL, so a silent etcd is noticed within one TTL. Stopping revokes the lease: the entry
//! goes at once, not a TTL later.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, PutOptions, Txn, TxnOp};
use strata_engine::metrics::{ShardMetrics, tier_usage};
use strata_engine::ownership::Ownership;
use strata_engine::reports::{Report, Reports};
use tokio::sync::Notify;

use crate::error::{ClusterError, bounded};
use crate::member::{Member, MemberState, TierSpace, member_key, validate_name};

/// Where and as whom a node registers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// etcd's client endpoints, `http://host:port`.
    pub endpoints: Vec<String>,
    /// The cluster's name.
    pub cluster: String,
    /// This node's id.
    pub node_id: String,
    /// The lease's TTL: a node silent this long is gone.
    pub lease_ttl: Duration,
    /// The node's zone; empty: unlabelled.
    pub zone: String,
    /// The most replicas a put asks for in this cluster: the node owns a key among its first this many
    /// nodes, and answers MOVED for the others (`ownership.rs`).
    pub max_replicas: usize,
}

/// The NVMe tier a node holds on shared namespaces: its record's key and the revision the node's claim
/// wrote. Each put of the node's entry is conditional on the record being unchanged, so a node whose tier
/// was taken over (it was silent past its lease) learns it is fenced instead of registering again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierHold {
    /// The tier record's key (`tier_key`).
    pub key: String,
    /// Its mod revision at the claim.
    pub revision: i64,
}

/// What the node registers, and where the registration reports.
struct Subject {
    config: ClusterConfig,
    tier: Mutex<Option<TierHold>>,
    fenced: AtomicBool,
    shards: Vec<SocketAddr>,
    usage: Mutex<Vec<Arc<ShardMetrics>>>,
    reports: Reports,
    stopping: AtomicBool,
    wake: Notify,
    registrations: AtomicU64,
    state: Mutex<MemberState>,
    /// Told when the lease is lost: the node may have been out of the cluster.
    ownership: Mutex<Option<Arc<Ownership>>>,
}

/// A running registration; [`Registration::stop`] ends it and removes the entry.
pub struct Registration {
    subject: Arc<Subject>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Registration {
    /// Starts registering the node whose shards will listen on `shards`, as `joining`, reporting in `reports`
    /// (the node's `/metrics` and `/healthz`). The entry is there before the node claims and recovers its
    /// tier, so no survivor takes a starting node's tier over; [`Registration::serve`] makes it a
    /// placement candidate once it serves.
    pub fn start(
        config: ClusterConfig,
        shards: Vec<SocketAddr>,
        reports: Reports,
    ) -> Result<Registration, ClusterError> {
        validate_name("cluster name", &config.cluster)?;
        validate_name("node id", &config.node_id)?;
        if config.lease_ttl < Duration::from_secs(1) {
            return Err(ClusterError::Ttl(config.lease_ttl));
        }
        let subject = Arc::new(Subject {
            config,
            tier: Mutex::new(None),
            fenced: AtomicBool::new(false),
            shards,
            usage: Mutex::new(Vec::new()),
            reports,
            stopping: AtomicBool::new(false),
            wake: Notify::new(),
            registrations: AtomicU64::new(0),
            state: Mutex::new(MemberState::Joining),
            ownership: Mutex::new(None),
        });
        subject.report(None, Some("not registered yet".to_string()));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let running = Arc::clone(&subject);
        let thread =
            std::thread::Builder::new().name("strata-etcd".into()).spawn(move || runtime.block_on(running.run()))?;
        Ok(Registration { subject, thread: Some(thread) })
    }

    /// Waits (at most `limit`) until the entry is in etcd; whether it is.
    pub fn wait_registered(&self, limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        while self.subject.registrations.load(Ordering::SeqCst) == 0 {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// The NVMe tier the node claimed on shared namespaces: from now on its entry is put only while the
    /// tier's record is unchanged.
    pub fn hold_tier(&self, tier: TierHold) {
        if let Ok(mut held) = self.subject.tier.lock() {
            *held = Some(tier);
        }
    }

    /// The node serves: its entry says `serving`, with its tiers' use read from `usage`, from now on.
    pub fn serve(&self, usage: Vec<Arc<ShardMetrics>>) {
        if let Ok(mut used) = self.subject.usage.lock() {
            *used = usage;
        }
        if let Ok(mut state) = self.subject.state.lock() {
            *state = MemberState::Serving;
        }
        self.subject.wake.notify_one();
    }

    /// Tells `ownership` each time the registration's lease is lost or etcd cannot be reached (and the
    /// lease may expire): other nodes may have taken the node's keys meanwhile
    /// ([`Ownership::absent`]).
    pub fn report_absences_to(&self, ownership: Arc<Ownership>) {
        if let Ok(mut held) = self.subject.ownership.lock() {
            *held = Some(ownership);
        }
    }

    /// Marks the node draining in its entry, at once rather than at the next keep-alive: placement leaves
    /// it out from the next epoch on, so clients stop sending it keys while it moves its own away.
    pub fn drain(&self) {
        if let Ok(mut state) = self.subject.state.lock() {
            *state = MemberState::Draining;
        }
        self.subject.wake.notify_one();
    }

    /// Whether the node's tier was taken over: it registers no more and must stop serving.
    pub fn fenced(&self) -> bool {
        self.subject.fenced.load(Ordering::SeqCst)
    }

    /// Revokes the lease (at most one TTL of waiting) and ends the thread.
    pub fn stop(mut self) {
        self.subject.stopping.store(true, Ordering::SeqCst);
        self.subject.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Subject {
    async fn run(self: Arc<Self>) {
        let mut epoch = None;
        while !self.stopping.load(Ordering::SeqCst) && !self.fenced.load(Ordering::SeqCst) {
            if let Err(error) = self.session(&mut epoch).await {
                tracing::warn!(%error, "cluster registration lost; serving on, registering again");
                if let Some(ownership) = self.ownership.lock().ok().and_then(|held| held.clone()) {
                    ownership.absent();
                }
                self.report(
                    epoch,
                    Some(format!("etcd unreachable ({error}): serving its keys, taking no new ownership")),
                );
                self.pause(self.config.lease_ttl / 3).await;
            }
        }
    }

    /// One lease's life: grant, put, keep alive until stopped (Ok) or until etcd fails (Err).
    async fn session(&self, epoch: &mut Option<i64>) -> Result<(), ClusterError> {
        let ttl = self.config.lease_ttl;
        let options = ConnectOptions::new().with_connect_timeout(ttl).with_timeout(ttl);
        let mut client = bounded(ttl, Client::connect(&self.config.endpoints, Some(options))).await?;
        let lease = bounded(ttl, client.lease_grant(ttl.as_secs() as i64, None)).await?;
        let epoch = *epoch.get_or_insert(lease.header().map_or(0, |header| header.revision()));
        let put = PutOptions::new().with_lease(lease.id());
        let mut registered = self.member(epoch);
        if !self.put_entry(&mut client, &registered, &put).await? {
            return Ok(());
        }
        self.registrations.fetch_add(1, Ordering::Relaxed);
        self.report(Some(epoch), None);
        tracing::info!(key = %self.key(), epoch, "registered in the cluster");
        let (mut keeper, mut answers) = bounded(ttl, client.lease_keep_alive(lease.id())).await?;
        loop {
            self.pause(ttl / 3).await;
            if self.stopping.load(Ordering::SeqCst) {
                let _ = bounded(ttl, client.lease_revoke(lease.id())).await;
                return Ok(());
            }
            bounded(ttl, keeper.keep_alive()).await?;
            match bounded(ttl, answers.message()).await? {
                Some(answer) if answer.ttl() > 0 => {}
                _ => return Err(ClusterError::LeaseExpired),
            }
            let now = self.member(epoch);
            let holds_tier = self.tier.lock().is_ok_and(|tier| tier.is_some());
            if (now != registered || holds_tier) && !self.put_entry(&mut client, &now, &put).await? {
                let _ = bounded(ttl, client.lease_revoke(lease.id())).await;
                return Ok(());
            }
            registered = now;
        }
    }

    /// Puts the node's entry; for a node holding a tier, only while the tier's record is unchanged.
    /// `false`: it changed (the tier was taken over), and the node is marked fenced.
    async fn put_entry(&self, client: &mut Client, member: &Member, put: &PutOptions) -> Result<bool, ClusterError> {
        let ttl = self.config.lease_ttl;
        let tier = self.tier.lock().map(|tier| tier.clone()).unwrap_or_default();
        let Some(tier) = tier else {
            bounded(ttl, client.put(self.key(), encode(member), Some(put.clone()))).await?;
            return Ok(true);
        };
        let txn = Txn::new()
            .when([Compare::mod_revision(tier.key.as_str(), CompareOp::Equal, tier.revision)])
            .and_then([TxnOp::put(self.key(), encode(member), Some(put.clone()))]);
        if bounded(ttl, client.txn(txn)).await?.succeeded() {
            return Ok(true);
        }
        tracing::error!(tier = %tier.key, "the node's NVMe tier was taken over: fenced, registering no more");
        self.fenced.store(true, Ordering::SeqCst);
        self.report(None, Some(format!("fenced: its NVMe tier ({}) was taken over by another node", tier.key)));
        Ok(false)
    }

    /// Waits `duration`, or less when stopped.
    async fn pause(&self, duration: Duration) {
        let _ = tokio::time::timeout(duration, self.wake.notified()).await;
    }

    fn key(&self) -> String {
        member_key(&self.config.cluster, &self.config.node_id)
    }

    fn member(&self, epoch: i64) -> Member {
        let usage = self.usage.lock().map(|usage| tier_usage(&usage)).unwrap_or_default();
        Member {
            id: self.config.node_id.clone(),
            shards: self.shards.clone(),
            zone: self.config.zone.clone(),
            state: self.state.lock().map_or(MemberState::Joining, |state| *state),
            epoch,
            dram: TierSpace {
                capacity: usage.dram_capacity,
                free: usage.dram_capacity.saturating_sub(usage.dram_used),
            },
            nvme: TierSpace {
                capacity: usage.nvme_capacity,
                free: usage.nvme_capacity.saturating_sub(usage.nvme_used),
            },
            keys: usage.keys,
        }
    }

    /// Sets the node's "cluster" report: registered or not, and why not.
    fn report(&self, epoch: Option<i64>, degraded: Option<String>) {
        let metrics = format!(
            "# HELP strata_cluster_registered Whether the node's entry is in etcd under a live lease.\n\
             # TYPE strata_cluster_registered gauge\nstrata_cluster_registered {}\n\
             # HELP strata_cluster_registrations_total Leases granted and entries put (1, plus 1 per recovery).\n\
             # TYPE strata_cluster_registrations_total counter\nstrata_cluster_registrations_total {}\n\
             # HELP strata_cluster_epoch The etcd revision of the node's first registration.\n\
             # TYPE strata_cluster_epoch gauge\nstrata_cluster_epoch {}\n",
            u8::from(degraded.is_none()),
            self.registrations.load(Ordering::Relaxed),
            epoch.unwrap_or(0),
        );
        self.reports.set("cluster", Report { metrics, degraded });
    }
}

fn encode(member: &Member) -> String {
    // A struct of strings, numbers and addresses always serialises.
    serde_json::to_string(member).unwrap_or_default()
}
