//! The store's clients: one per call in flight, so that calls from several Python threads run at once.
//!
//! Serving engines call one store from several threads (vLLM's worker has a send and a receive thread,
//! SGLang thread pools): a call takes an idle client, or connects a new one, and runs with no lock held;
//! the lock covers only taking and returning a client. Idle clients are kept up to `MAX_IDLE`, so a burst
//! of threads does not leave a connection per thread behind it forever.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use strata_client::{Client, ClientError, ClientOptions, ClusterOptions, MembersWatch};
use strata_cluster::{WatchConfig, etcd_endpoints};

/// Idle clients kept for reuse; more are closed when returned.
const MAX_IDLE: usize = 16;

/// Where and how to connect, set by `setup`.
#[derive(Clone)]
enum Target {
    /// One node.
    Node {
        options: ClientOptions,
        /// The address that answered `setup`.
        answered: String,
    },
    /// A cluster, whose members one watch follows for every client of the store.
    Cluster { options: ClusterOptions, watch: Arc<MembersWatch> },
}

impl Target {
    fn connect(&self) -> Result<Client, ClientError> {
        match self {
            // The node that answered `setup`, not the first of its list that answers now: a node listed
            // as a fallback holds other data, and a store's calls must all reach the same node.
            Target::Node { options, answered } => Ok(connect_any(std::slice::from_ref(answered), options)?.0),
            Target::Cluster { options, watch } => Client::connect_watched(Arc::clone(watch), options),
        }
    }

    fn timeout(&self) -> Duration {
        match self {
            Target::Node { options, .. } => options.timeout,
            Target::Cluster { options, .. } => options.client.timeout,
        }
    }
}

#[derive(Default)]
struct State {
    target: Option<Target>,
    idle: Vec<Client>,
    /// Bumped by every `setup` and `close`: a client taken before is not returned to the pool after.
    generation: u64,
}

/// Clients of one store.
#[derive(Default)]
pub struct ClientPool {
    state: Mutex<State>,
    /// Signalled when a client is returned.
    returned: Condvar,
}

/// Connects to the first of `addresses` that answers; the client and that address.
fn connect_any(addresses: &[String], options: &ClientOptions) -> Result<(Client, String), ClientError> {
    let mut last = ClientError::Connection("no address given".into());
    for address in addresses {
        match Client::connect(address.as_str(), options.clone()) {
            Ok(client) => return Ok((client, address.clone())),
            Err(error) => last = error,
        }
    }
    Err(last)
}

impl ClientPool {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Connects to the first of `addresses` that answers and makes it the pool's target; the clients of
    /// an earlier target are closed. A node in a cluster makes the cluster the target (unless
    /// `single_node`): its members, as the node reports them, and then as the nodes report them
    /// (`Client::connect_learning`).
    pub fn setup(&self, addresses: Vec<String>, options: ClusterOptions, single_node: bool) -> Result<(), ClientError> {
        let mut last = ClientError::Connection("no address given".into());
        for answered in addresses {
            let connected = if single_node {
                Client::connect(answered.as_str(), options.client.clone())
            } else {
                Client::connect_learning(std::slice::from_ref(&answered), &options)
            };
            let client = match connected {
                Ok(client) => client,
                Err(error) => {
                    last = error;
                    continue;
                }
            };
            let target = match client.members_watch() {
                Some(watch) => Target::Cluster { options, watch },
                None => Target::Node { options: options.client, answered },
            };
            self.replace(target, client);
            return Ok(());
        }
        Err(last)
    }

    /// Connects to the cluster `options` names, through etcd, and makes it the pool's target.
    pub fn setup_cluster(&self, options: ClusterOptions) -> Result<(), ClientError> {
        let endpoints = etcd_endpoints(&options.etcd).map_err(|error| ClientError::Invalid(error.to_string()))?;
        let config = WatchConfig {
            timeout: options.client.timeout.min(Duration::from_secs(10)),
            ..WatchConfig::new(endpoints, &options.cluster)
        };
        let watch = Arc::new(MembersWatch::start(config).map_err(|error| ClientError::Connection(error.to_string()))?);
        let client = Client::connect_watched(Arc::clone(&watch), &options)?;
        self.replace(Target::Cluster { options, watch }, client);
        Ok(())
    }

    fn replace(&self, target: Target, client: Client) {
        let mut state = self.state();
        state.generation += 1;
        state.target = Some(target);
        state.idle = vec![client];
        self.returned.notify_all();
    }

    /// Closes every idle client and forgets the target; calls in flight finish on their own client.
    pub fn close(&self) {
        let idle = {
            let mut state = self.state();
            state.generation += 1;
            state.target = None;
            std::mem::take(&mut state.idle)
        };
        self.returned.notify_all();
        drop(idle);
    }

    /// The node address that answered `setup` (the etcd address of a cluster); `None` before it or after
    /// `close`.
    pub fn node_address(&self) -> Option<String> {
        self.state().target.as_ref().map(|target| match target {
            Target::Node { answered, .. } => answered.clone(),
            // A cluster learnt from its nodes names no etcd: one of its nodes then.
            Target::Cluster { options, watch } if options.etcd.is_empty() => {
                watch.view().serving().next().map(|member| member.shards[0].to_string()).unwrap_or_default()
            }
            Target::Cluster { options, .. } => options.etcd.clone(),
        })
    }

    /// Runs `work` on a client of its own: `None` before `setup` or after `close`. When no new connection
    /// can be made (the node refuses more), the call waits for another call's client, up to the client
    /// timeout; `None` if none comes back.
    pub fn run<T>(&self, work: impl FnOnce(&mut Client) -> T) -> Option<T> {
        let (taken, target, generation) = {
            let mut state = self.state();
            let target = state.target.clone()?;
            (state.idle.pop(), target, state.generation)
        };
        let mut client = match taken {
            Some(client) => client,
            None => match target.connect() {
                Ok(client) => client,
                Err(_) => self.wait_for_idle(generation, Instant::now() + target.timeout())?,
            },
        };
        let result = work(&mut client);
        let mut state = self.state();
        if state.generation == generation && state.idle.len() < MAX_IDLE {
            state.idle.push(client);
            self.returned.notify_one();
        }
        Some(result)
    }

    /// An idle client of `generation`, waiting for one until `deadline`.
    fn wait_for_idle(&self, generation: u64, deadline: Instant) -> Option<Client> {
        let mut state = self.state();
        loop {
            if state.generation != generation {
                return None;
            }
            if let Some(client) = state.idle.pop() {
                return Some(client);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            state = self.returned.wait_timeout(state, left).unwrap_or_else(|poison| poison.into_inner()).0;
        }
    }
}
