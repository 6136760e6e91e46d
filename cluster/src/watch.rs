//! A members' watch: reads a cluster's members from etcd and keeps a [`View`] of them current, from a thread
//! and tokio runtime of its own, so that callers only read the last view (one atomic load tells them it
//! changed).
//!
//! The thread reads the prefix whole, then applies the events of etcd's watch on it (each a member's
//! entry put or deleted, in revision order, with no gap while the watch lasts), and reads it whole again
//! every `resync` and whenever a caller asks ([`MembersWatch::refresh`]). Applying rather than re-reading
//! matters at scale: every node rewrites its entry as its free space changes (every third of its lease's
//! TTL), and a read per event per client would make etcd serve nodes × clients range reads every few
//! seconds. When etcd cannot be reached the last view stands, and callers route by it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, GetOptions, WatchOptions};
use tokio::sync::Notify;

use crate::error::{ClusterError, bounded};
use crate::member::{Member, members_prefix, validate_name};
use crate::view::View;

/// Shards a member may list: a bound on what one etcd entry makes a client allocate.
pub(crate) const MAX_SHARDS_PER_MEMBER: usize = 1024;

/// Where a watch reads, and how patiently.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchConfig {
    /// etcd's client endpoints, `http://host:port`.
    pub endpoints: Vec<String>,
    /// The cluster's name.
    pub cluster: String,
    /// Each etcd call's bound, and how long [`MembersWatch::start`] waits for a first serving member.
    pub timeout: Duration,
    /// How often the members are re-read with no watch event: also how soon a silent etcd is noticed.
    pub resync: Duration,
}

impl WatchConfig {
    /// Cluster `cluster` on `endpoints`, with a 5 s timeout and a 2 s resync.
    pub fn new(endpoints: Vec<String>, cluster: &str) -> Self {
        Self {
            endpoints,
            cluster: cluster.to_string(),
            timeout: Duration::from_secs(5),
            resync: Duration::from_secs(2),
        }
    }
}

/// Called with each view whose epoch moved, on the watch's thread.
pub type OnChange = Box<dyn Fn(&View) + Send + Sync>;

/// Fetches the members some other way than from etcd (a MEMBERS request to a node), given the last view;
/// `None` when no source answered.
pub type Fetch = Box<dyn Fn(&View) -> Option<View> + Send + Sync>;

struct Shared {
    config: WatchConfig,
    on_change: Option<OnChange>,
    view: Mutex<Arc<View>>,
    /// Bumped each time the view's epoch changes.
    generation: AtomicU64,
    failure: Mutex<Option<String>>,
    stopping: AtomicBool,
    wake: Notify,
}

/// A running watch; dropping it ends the thread.
pub struct MembersWatch {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MembersWatch {
    /// Starts watching, and waits (up to `config.timeout`) for a view with at least one serving member.
    pub fn start(config: WatchConfig) -> Result<MembersWatch, ClusterError> {
        let watch = Self::spawn(config, None)?;
        let waited = watch.shared.config.timeout;
        let deadline = Instant::now() + waited;
        while watch.view().serving().next().is_none() {
            if Instant::now() >= deadline {
                let reason = watch.failure().unwrap_or_else(|| "no node is serving".to_string());
                return Err(ClusterError::NoView { cluster: watch.shared.config.cluster.clone(), waited, reason });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(watch)
    }

    /// Starts watching without waiting for a first view; `on_change` (if any) is called with each view
    /// whose epoch moved.
    pub fn spawn(config: WatchConfig, on_change: Option<OnChange>) -> Result<MembersWatch, ClusterError> {
        validate_name("cluster name", &config.cluster)?;
        let shared = Arc::new(Shared::new(config, on_change, View::default()));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let running = Arc::clone(&shared);
        let thread =
            std::thread::Builder::new().name("strata-members".into()).spawn(move || runtime.block_on(running.run()))?;
        Ok(MembersWatch { shared, thread: Some(thread) })
    }

    /// A watch that starts from `initial` and asks `fetch` for the members every `resync` and whenever
    /// asked ([`MembersWatch::refresh`]): for a client that learnt the cluster from a node, not from etcd.
    /// A view fetched is taken as it is, its epoch the node's.
    pub fn polled(initial: View, fetch: Fetch, resync: Duration) -> Result<MembersWatch, ClusterError> {
        let config = WatchConfig { resync, ..WatchConfig::new(Vec::new(), "polled") };
        let shared = Arc::new(Shared::new(config, None, initial));
        shared.generation.store(1, Ordering::Release);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let running = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("strata-members".into())
            .spawn(move || runtime.block_on(running.poll(fetch)))?;
        Ok(MembersWatch { shared, thread: Some(thread) })
    }

    /// A watch that never reads etcd and always holds `view`: a client routed by members given to it (or
    /// a test's client with an old view).
    pub fn fixed(view: View) -> MembersWatch {
        let shared = Arc::new(Shared::new(WatchConfig::new(Vec::new(), "fixed"), None, view));
        shared.generation.store(1, Ordering::Release);
        MembersWatch { shared, thread: None }
    }

    /// The last view read.
    pub fn view(&self) -> Arc<View> {
        Arc::clone(&self.shared.view.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    /// How many times the epoch changed: compare with an earlier value to see whether to re-route.
    pub fn generation(&self) -> u64 {
        self.shared.generation.load(Ordering::Acquire)
    }

    /// Asks for a re-read now (a node did not answer, or said it no longer owns a key).
    pub fn refresh(&self) {
        self.shared.wake.notify_one();
    }

    /// Why the last read failed, while etcd is unreachable.
    pub fn failure(&self) -> Option<String> {
        self.shared.failure.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }
}

impl Drop for MembersWatch {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads cluster `config.cluster`'s members once, every call bounded by `config.timeout` (on a runtime of
/// its own: for tools, not for a caller already inside tokio). The view's epoch is its revision.
pub fn read_members(config: &WatchConfig) -> Result<View, ClusterError> {
    validate_name("cluster name", &config.cluster)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let limit = config.timeout;
        let options = ConnectOptions::new().with_connect_timeout(limit);
        let mut client = bounded(limit, Client::connect(&config.endpoints, Some(options))).await?;
        let (revision, members) = read_prefix(&mut client, &members_prefix(&config.cluster), limit).await?;
        Ok(View::next(&View::default(), revision, members))
    })
}

/// The members under `prefix` and the revision they were read at.
async fn read_prefix(client: &mut Client, prefix: &str, limit: Duration) -> Result<(i64, Vec<Member>), ClusterError> {
    let answer = bounded(limit, client.get(prefix, Some(GetOptions::new().with_prefix()))).await?;
    let revision = answer.header().map_or(0, |header| header.revision());
    let members = answer.kvs().iter().filter_map(|entry| parse(prefix, entry.key(), entry.value())).collect();
    Ok((revision, members))
}

/// What woke the watch.
enum Wake {
    Watched(Result<Option<etcd_client::WatchResponse>, etcd_client::Error>),
    Asked,
}

impl Shared {
    fn new(config: WatchConfig, on_change: Option<OnChange>, view: View) -> Self {
        Shared {
            config,
            on_change,
            view: Mutex::new(Arc::new(view)),
            generation: AtomicU64::new(0),
            failure: Mutex::new(None),
            stopping: AtomicBool::new(false),
            wake: Notify::new(),
        }
    }

    async fn run(self: Arc<Self>) {
        while !self.stopping.load(Ordering::SeqCst) {
            if let Err(error) = self.session().await {
                tracing::warn!(%error, cluster = %self.config.cluster, "members' watch lost etcd; routing by the last view");
                *self.failure.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(error.to_string());
                let _ = tokio::time::timeout(self.config.resync, self.wake.notified()).await;
            }
        }
    }

    /// Fetches the members every resync or request, until stopped.
    async fn poll(self: Arc<Self>, fetch: Fetch) {
        loop {
            let _ = tokio::time::timeout(self.config.resync, self.wake.notified()).await;
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            let last = Arc::clone(&self.view.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
            let Some(next) = fetch(&last) else {
                *self.failure.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
                    Some("no node answered MEMBERS".into());
                continue;
            };
            let moved = next.epoch != last.epoch;
            *self.view.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(next);
            *self.failure.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
            if moved {
                self.generation.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// One connection's life: read, watch and apply its events, re-read on request or resync; Err when
    /// etcd fails.
    async fn session(&self) -> Result<(), ClusterError> {
        let limit = self.config.timeout;
        let options = ConnectOptions::new().with_connect_timeout(limit);
        let mut client = bounded(limit, Client::connect(&self.config.endpoints, Some(options))).await?;
        let revision = self.read(&mut client).await?;
        let watching = WatchOptions::new().with_prefix().with_start_revision(revision + 1);
        let mut stream = bounded(limit, client.watch(self.prefix(), Some(watching))).await?;
        loop {
            let woken = futures_lite::future::or(async { Wake::Watched(stream.message().await) }, async {
                let _ = tokio::time::timeout(self.config.resync, self.wake.notified()).await;
                Wake::Asked
            })
            .await;
            if self.stopping.load(Ordering::SeqCst) {
                return Ok(());
            }
            match woken {
                Wake::Watched(Ok(Some(answer))) if answer.canceled() => {
                    return Err(ClusterError::WatchEnded(answer.cancel_reason().to_string()));
                }
                Wake::Watched(Ok(None)) => return Err(ClusterError::WatchEnded("the stream closed".into())),
                Wake::Watched(Err(error)) => return Err(error.into()),
                Wake::Watched(Ok(Some(answer))) => self.apply(&answer),
                Wake::Asked => {
                    self.read(&mut client).await?;
                }
            }
        }
    }

    /// Reads every member and publishes the view; returns the revision read at.
    async fn read(&self, client: &mut Client) -> Result<i64, ClusterError> {
        let (revision, members) = read_prefix(client, &self.prefix(), self.config.timeout).await?;
        self.publish(revision, |_| members);
        Ok(revision)
    }

    /// Applies a watch answer's events to the view: a put replaces (or adds) its member, a delete removes
    /// it, and an entry that is not a well-formed member removes what was under its id, as a read would
    /// not list it. The view is then the members at the last event's revision, not at the answer header's:
    /// events up to the header's revision may still be on their way, and an epoch must never name a
    /// placement older than one seen at a smaller revision.
    fn apply(&self, answer: &etcd_client::WatchResponse) {
        let prefix = self.prefix();
        // Events a re-read already saw (it ran at a later revision than they) are not applied again: an
        // older entry would stand in for a newer one until the newer's event came.
        let read_at = self.view.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).revision;
        let fresh = |event: &&etcd_client::Event| event.kv().is_some_and(|kv| kv.mod_revision() > read_at);
        let Some(revision) =
            answer.events().iter().filter(fresh).filter_map(|event| event.kv()).map(|kv| kv.mod_revision()).max()
        else {
            return;
        };
        self.publish(revision, |mut members| {
            for event in answer.events().iter().filter(fresh) {
                let Some(entry) = event.kv() else { continue };
                let Some(id) = entry.key().strip_prefix(prefix.as_bytes()) else { continue };
                members.retain(|member| member.id.as_bytes() != id);
                if event.event_type() == etcd_client::EventType::Put
                    && let Some(member) = parse(&prefix, entry.key(), entry.value())
                {
                    members.push(member);
                }
            }
            members
        });
    }

    /// Publishes the view of the members `change` makes of the last ones, at `revision`.
    fn publish(&self, revision: i64, change: impl FnOnce(Vec<Member>) -> Vec<Member>) {
        let mut view = self.view.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let next = View::next(&view, revision, change(view.members.clone()));
        let moved = next.epoch != view.epoch;
        let next = Arc::new(next);
        *view = Arc::clone(&next);
        drop(view);
        if moved {
            if let Some(on_change) = &self.on_change {
                on_change(&next);
            }
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        *self.failure.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
    }

    fn prefix(&self) -> String {
        members_prefix(&self.config.cluster)
    }
}

/// A member's entry, or None (with a warning) for one that is not a well-formed entry under its own id.
fn parse(prefix: &str, key: &[u8], value: &[u8]) -> Option<Member> {
    let id = key.strip_prefix(prefix.as_bytes())?;
    match serde_json::from_slice::<Member>(value) {
        Ok(member)
            if member.id.as_bytes() == id
                && !member.shards.is_empty()
                && member.shards.len() <= MAX_SHARDS_PER_MEMBER =>
        {
            Some(member)
        }
        Ok(member) => {
            tracing::warn!(id = %member.id, shards = member.shards.len(), "member entry ignored: id or shards do not fit");
            None
        }
        Err(error) => {
            tracing::warn!(%error, key = %String::from_utf8_lossy(key), "member entry ignored: not a member's JSON");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_that_do_not_fit_are_ignored() {
        let prefix = members_prefix("c");
        let good = br#"{"id":"n1","shards":["127.0.0.1:1"],"zone":"","state":"serving","epoch":1,"dram":{"capacity":0,"free":0},"nvme":{"capacity":0,"free":0}}"#;
        assert!(parse(&prefix, b"/strata/c/nodes/n1", good).is_some());
        assert!(parse(&prefix, b"/strata/c/nodes/n2", good).is_none(), "an entry under another id");
        assert!(parse(&prefix, b"/strata/c/nodes/n1", b"{not json").is_none());
        let no_shards = String::from_utf8_lossy(good).replace(r#"["127.0.0.1:1"]"#, "[]");
        assert!(parse(&prefix, b"/strata/c/nodes/n1", no_shards.as_bytes()).is_none());
    }
}
