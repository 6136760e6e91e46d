//! A client of a cluster: each key's replica set is weighted rendezvous placement
//! (`strata_proto::placement`) over the serving members that a [`MembersWatch`] keeps current, so no
//! request asks anyone where a key is. Writes go to every replica in one exchange (all nodes work on
//! them in parallel); reads go to the first live replica, and to the next one, inside the same call, when
//! a node does not answer.
//!
//! A node that fails a connection is passed over for `down_for`: reads try it last, writes skip it (and
//! count it as a replica not stored). The watch is asked to re-read the members at once; the node leaves
//! the view when its lease expires.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_cluster::{MembersWatch, WatchConfig, etcd_endpoints};
use strata_proto::placement::{self, Candidate};
use strata_proto::{Opcode, PutOptions, VersionClock, shard_of};

use crate::client::{Client, ClientOptions, Item, ItemReply, Peer, ShardConnection, Sink};
use crate::error::ClientError;

/// How a client finds a cluster and places its keys.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// etcd, `etcd://HOST:PORT[,HOST:PORT…]`.
    pub etcd: String,
    /// The cluster's name (its nodes' `--cluster-name`).
    pub cluster: String,
    /// Nodes that store a put whose options say 0 replicas.
    pub replicas: u8,
    /// Replicas that must store a put for it to succeed (at most the put's replicas).
    pub min_replicas: u8,
    /// How long a node that failed a connection is passed over.
    pub down_for: Duration,
    /// How each node is reached.
    pub client: ClientOptions,
}

impl ClusterOptions {
    /// Cluster `strata` on `etcd`: one replica per put, a node passed over for 1 s after a failure.
    pub fn new(etcd: &str) -> Self {
        Self {
            etcd: etcd.to_string(),
            cluster: "strata".to_string(),
            replicas: 1,
            min_replicas: 1,
            down_for: Duration::from_secs(1),
            client: ClientOptions::default(),
        }
    }
}

/// A serving node as the client routes to it.
struct RoutedNode {
    id: String,
    zone: String,
    weight: u64,
    /// Its shard `i` is peer `first_peer + i`.
    first_peer: usize,
    shard_count: u32,
    down_until: Option<Instant>,
}

/// Where keys live: the client's copy of the members, rebuilt when the watch's epoch moves.
pub(crate) struct Routing {
    watch: Arc<MembersWatch>,
    /// The watch generation `nodes` were built from.
    generation: u64,
    epoch: i64,
    nodes: Vec<RoutedNode>,
    replicas: u8,
    min_replicas: u8,
    down_for: Duration,
    /// Where this client's upserts get their versions.
    versions: VersionClock,
}

impl Routing {
    fn candidates(&self) -> Vec<Candidate<'_>> {
        self.nodes.iter().map(|node| Candidate { id: &node.id, weight: node.weight, zone: &node.zone }).collect()
    }

    fn peer(&self, node: usize, key: &[u8]) -> usize {
        let node = &self.nodes[node];
        node.first_peer + shard_of(key, node.shard_count) as usize
    }

    fn is_down(&self, node: usize, now: Instant) -> bool {
        self.nodes[node].down_until.is_some_and(|until| now < until)
    }

    fn node_of_peer(&self, peer: usize) -> usize {
        self.nodes.partition_point(|node| node.first_peer <= peer).saturating_sub(1)
    }

    /// The nodes a read of `key` tries, in turn while they fail: every serving node in placement order
    /// (a put may have asked for more replicas than this client's default), those passed over last.
    fn read_order(&self, key: &[u8], candidates: &[Candidate<'_>], now: Instant) -> Vec<usize> {
        let mut order = placement::replicas(key, candidates, candidates.len());
        order.sort_by_key(|&node| self.is_down(node, now));
        order
    }
}

/// A failure after which the next replica may answer: the node, not the request, is at fault.
fn is_node_failure(result: &Result<ItemReply, ClientError>) -> bool {
    matches!(result, Err(ClientError::Connection(_) | ClientError::Timeout | ClientError::ShuttingDown))
}

impl Client {
    /// Connects to the cluster on `options.etcd`: reads its members (and keeps watching them), and says
    /// HELLO to one node to learn the bounds. Connections to the other nodes open when first used.
    pub fn connect_cluster(options: &ClusterOptions) -> Result<Self, ClientError> {
        let endpoints = etcd_endpoints(&options.etcd).map_err(|error| ClientError::Invalid(error.to_string()))?;
        let watch = MembersWatch::start(WatchConfig::new(endpoints, &options.cluster))
            .map_err(|error| ClientError::Connection(error.to_string()))?;
        Self::connect_watched(Arc::new(watch), options)
    }

    /// A client of the cluster that `watch` follows (one watch may serve many clients, one per thread).
    pub fn connect_watched(watch: Arc<MembersWatch>, options: &ClusterOptions) -> Result<Self, ClientError> {
        let view = watch.view();
        let mut first = Err(ClientError::Connection(format!("cluster {:?} has no serving node", options.cluster)));
        for member in view.serving() {
            first = ShardConnection::open(member.shards[0], &options.client).map(|opened| (member.shards[0], opened));
            if first.is_ok() {
                break;
            }
        }
        let (addr, (connection, hello)) = first?;
        let routing = Routing {
            watch,
            generation: u64::MAX,
            epoch: 0,
            nodes: Vec::new(),
            replicas: options.replicas.max(1),
            min_replicas: options.min_replicas.max(1),
            down_for: options.down_for,
            versions: VersionClock::new(random_writer_id()),
        };
        let mut client = Client {
            options: options.client.clone(),
            hello,
            peers: vec![Peer::new(addr, "".into(), hello.shard_id, hello.shard_count)],
            cluster: Some(Box::new(routing)),
            frame_epoch: 0,
            next_request_id: 1,
            // A cluster client moves values over TCP.
            #[cfg(feature = "rdma")]
            rdma: Err("RDMA serves clients of one node".into()),
        };
        client.peers[0].connection = Some(connection);
        client.sync_membership();
        Ok(client)
    }

    /// The watch this client of a cluster routes by: more clients of the same cluster share it
    /// ([`Client::connect_watched`]).
    pub fn members_watch(&self) -> Option<Arc<MembersWatch>> {
        self.cluster.as_ref().map(|routing| Arc::clone(&routing.watch))
    }

    /// The cluster epoch this client routes by (the etcd revision at which placement last changed); none
    /// for a client of one node.
    pub fn cluster_epoch(&self) -> Option<i64> {
        self.cluster.as_ref().map(|routing| routing.epoch)
    }

    /// Rebuilds the peers from the watch's view if its epoch moved; open connections to shards still
    /// there are kept.
    pub(crate) fn sync_membership(&mut self) {
        let Some(routing) = self.cluster.as_mut() else { return };
        let generation = routing.watch.generation();
        if generation == routing.generation {
            return;
        }
        let view = routing.watch.view();
        let mut open: HashMap<(SocketAddr, u32, u32), ShardConnection> = self
            .peers
            .drain(..)
            .filter_map(|peer| Some(((peer.addr, peer.shard, peer.shard_count), peer.connection?)))
            .collect();
        let mut nodes = Vec::new();
        for member in view.serving() {
            let first_peer = self.peers.len();
            let shard_count = member.shards.len() as u32;
            let node: std::sync::Arc<str> = member.id.as_str().into();
            for (shard, &addr) in member.shards.iter().enumerate() {
                let mut peer = Peer::new(addr, std::sync::Arc::clone(&node), shard as u32, shard_count);
                peer.connection = open.remove(&(addr, shard as u32, shard_count));
                self.peers.push(peer);
            }
            let down_until = routing.nodes.iter().find(|node| node.id == member.id).and_then(|node| node.down_until);
            let (id, zone, weight) = (member.id.clone(), member.zone.clone(), strata_cluster::weight(member));
            nodes.push(RoutedNode { id, zone, weight, first_peer, shard_count, down_until });
        }
        routing.nodes = nodes;
        routing.generation = generation;
        routing.epoch = view.epoch;
        self.frame_epoch = u64::try_from(view.epoch).unwrap_or(0);
    }

    /// `options` with a version if they are an upsert of a cluster client that gave none: replicas keep the
    /// newest version whatever order two writers' upserts reach them in (see `strata_proto::Version`).
    pub(crate) fn versioned(&self, mut options: PutOptions) -> PutOptions {
        if let Some(routing) = self.cluster.as_deref()
            && options.upsert
            && options.version.is_none()
        {
            options.version = Some(routing.versions.next(u64::try_from(routing.epoch).unwrap_or(0)));
        }
        options
    }

    /// The peer a key's single-connection operations (progressive puts) go to: its shard, or in a cluster
    /// its first live replica's.
    pub(crate) fn primary_peer(&mut self, key: &[u8]) -> Result<usize, ClientError> {
        self.sync_membership();
        let Some(routing) = self.cluster.as_deref() else {
            return Ok(shard_of(key, self.hello.shard_count) as usize);
        };
        let order = routing.read_order(key, &routing.candidates(), Instant::now());
        order.first().map(|&node| routing.peer(node, key)).ok_or_else(no_serving_node)
    }

    /// [`Client::exchange`] in a cluster: puts and removals to every replica, the rest to the first live.
    pub(crate) fn run_in_cluster(
        &mut self,
        opcode: Opcode,
        items: &[Item<'_>],
        options: PutOptions,
        sink: &mut Sink<'_, '_, '_>,
    ) -> Vec<Result<ItemReply, ClientError>> {
        self.sync_membership();
        match opcode {
            Opcode::Put => {
                let options = self.versioned(options);
                self.send_to_every_replica(opcode, items, options, sink)
            }
            Opcode::Remove => self.send_to_every_replica(opcode, items, options, sink),
            _ => self.send_to_first_live_replica(opcode, items, options, sink),
        }
    }

    fn send_to_every_replica(
        &mut self,
        opcode: Opcode,
        items: &[Item<'_>],
        options: PutOptions,
        sink: &mut Sink<'_, '_, '_>,
    ) -> Vec<Result<ItemReply, ClientError>> {
        let Some(routing) = self.cluster.as_deref() else { return Vec::new() };
        let wanted = if options.replicas == 0 { routing.replicas } else { options.replicas };
        // Each replica keeps the count with the object, so that repairs re-create as many copies.
        let options = PutOptions { replicas: wanted, ..options };
        // A removal goes to every serving node: an owner past the key's replicas (a spare), or one whose
        // pass has not given its copy up yet, would otherwise keep the key and hand it back to the
        // replicas at the next pass.
        let wanted =
            if opcode == Opcode::Remove { u8::try_from(routing.nodes.len()).unwrap_or(u8::MAX) } else { wanted };
        // A removal counts once any replica answered; a put once `min_replicas` of its replicas stored it.
        let needed = if opcode == Opcode::Remove { 1 } else { usize::from(routing.min_replicas.min(wanted)) };
        let everyone: Vec<usize> = (0..items.len()).collect();
        let mut tallies: Vec<Tally> = (0..items.len()).map(|_| Tally::default()).collect();
        let moved = self.send_to_replicas(opcode, (items, &everyone), (options, wanted, true), sink, &mut tallies);
        // Items some node answered MOVED: once the view has caught up with that node's, to the replicas
        // that did not answer yet, once.
        if let Some(epoch) = moved.iter().map(|&(_, epoch)| epoch).max() {
            self.catch_up(epoch);
            let mut again: Vec<usize> = moved.into_iter().map(|(index, _)| index).collect();
            again.dedup();
            self.send_to_replicas(opcode, (items, &again), (options, wanted, false), sink, &mut tallies);
        }
        tallies.into_iter().map(|tally| tally.outcome(needed)).collect()
    }

    /// Sends each of `which` (indices into `items`) to those of its `wanted` replicas that are not passed
    /// over and have not answered it yet, and adds their answers to `tallies`; returns the items a node
    /// answered MOVED, with that node's epoch, if `set_aside_moved` (else a MOVED counts as a failure).
    fn send_to_replicas(
        &mut self,
        opcode: Opcode,
        (items, which): (&[Item<'_>], &[usize]),
        (options, wanted, set_aside_moved): (PutOptions, u8, bool),
        sink: &mut Sink<'_, '_, '_>,
        tallies: &mut [Tally],
    ) -> Vec<(usize, u64)> {
        let Some(routing) = self.cluster.as_deref() else { return Vec::new() };
        let candidates = routing.candidates();
        let now = Instant::now();
        let mut sends = Vec::with_capacity(which.len() * usize::from(wanted));
        for &index in which {
            let key = items[index].key;
            for node in placement::replicas(key, &candidates, usize::from(wanted)) {
                if !routing.is_down(node, now) && !tallies[index].answered_by(&routing.nodes[node].id) {
                    sends.push((index, routing.peer(node, key)));
                }
            }
        }
        drop(candidates);
        let replies = self.exchange(opcode, items, &sends, options, sink);
        self.pass_over_failed_nodes(&sends, &replies);
        let mut moved = Vec::new();
        for (&(index, peer), reply) in sends.iter().zip(replies) {
            match reply {
                Err(ClientError::Moved { epoch }) if set_aside_moved => moved.push((index, epoch)),
                reply => tallies[index].add(reply, &self.peers[peer].node),
            }
        }
        moved
    }

    /// Asks the watch to re-read the members and waits (at most `down_for`) until its view reaches
    /// `epoch`, a node's, or until one read came back without reaching it (the same placement, numbered
    /// from another etcd revision by a node that started later), then routes by it.
    fn catch_up(&mut self, epoch: u64) {
        let Some(routing) = self.cluster.as_deref() else { return };
        let read_before = routing.watch.view().revision;
        routing.watch.refresh();
        let deadline = Instant::now() + routing.down_for;
        while Instant::now() < deadline {
            let view = routing.watch.view();
            if u64::try_from(view.epoch).unwrap_or(0) >= epoch || view.revision > read_before {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.sync_membership();
    }

    fn send_to_first_live_replica(
        &mut self,
        opcode: Opcode,
        items: &[Item<'_>],
        options: PutOptions,
        sink: &mut Sink<'_, '_, '_>,
    ) -> Vec<Result<ItemReply, ClientError>> {
        // Placeholders that do not allocate (a 1,000-key call should not make 1,000 strings), replaced by
        // every reply; an item no node was asked keeps `None`.
        let mut results: Vec<Option<Result<ItemReply, ClientError>>> = (0..items.len()).map(|_| None).collect();
        // Each item's nodes still to try, in read order, worked out only for items whose first node failed
        // or is passed over: a read that succeeds on its first replica costs one score per node, and no
        // allocation.
        let mut untried: Vec<Option<VecDeque<usize>>> = (0..items.len()).map(|_| None).collect();
        let mut tried_first: Vec<Option<usize>> = vec![None; items.len()];
        let mut moved = vec![false; items.len()];
        let mut pending: Vec<usize> = (0..items.len()).collect();
        for attempt in 0.. {
            let Some(routing) = self.cluster.as_deref() else { break };
            let candidates = routing.candidates();
            let now = Instant::now();
            let any_down = (0..routing.nodes.len()).any(|node| routing.is_down(node, now));
            let mut sends = Vec::with_capacity(pending.len());
            for &index in &pending {
                let key = items[index].key;
                let node = if attempt == 0 && !any_down {
                    tried_first[index] = placement::first(key, &candidates);
                    tried_first[index]
                } else {
                    let queue = untried[index].get_or_insert_with(|| {
                        let mut order = routing.read_order(key, &candidates, now);
                        order.retain(|&node| Some(node) != tried_first[index]);
                        order.into()
                    });
                    queue.pop_front()
                };
                if let Some(node) = node {
                    sends.push((index, routing.peer(node, key)));
                }
            }
            drop(candidates);
            if sends.is_empty() {
                break;
            }
            let replies = self.exchange(opcode, items, &sends, options, sink);
            self.pass_over_failed_nodes(&sends, &replies);
            pending.clear();
            let mut moved_to = None;
            for (&(index, _), reply) in sends.iter().zip(replies) {
                match reply {
                    // Once: asked again, in the order of the view that has caught up.
                    Err(ClientError::Moved { epoch }) if !moved[index] => {
                        moved[index] = true;
                        moved_to = moved_to.max(Some(epoch));
                        pending.push(index);
                    }
                    // Twice: no node of the new view owns it either; a miss.
                    Err(ClientError::Moved { .. }) => results[index] = Some(Err(ClientError::NotFound)),
                    reply => {
                        if is_node_failure(&reply) {
                            pending.push(index);
                        }
                        results[index] = Some(reply);
                    }
                }
            }
            if let Some(epoch) = moved_to {
                // The nodes are numbered afresh: every order still to try is worked out again (a node
                // that failed is passed over, so it comes last).
                self.catch_up(epoch);
                untried.iter_mut().for_each(|queue| *queue = None);
                tried_first.iter_mut().for_each(|first| *first = None);
            }
        }
        results.into_iter().map(|result| result.unwrap_or_else(|| Err(no_serving_node()))).collect()
    }

    /// Marks the nodes that failed a send as passed over, and asks the watch for the members again.
    fn pass_over_failed_nodes(&mut self, sends: &[(usize, usize)], replies: &[Result<ItemReply, ClientError>]) {
        let Some(routing) = self.cluster.as_deref_mut() else { return };
        let until = Instant::now() + routing.down_for;
        let mut any = false;
        for (&(_, peer), reply) in sends.iter().zip(replies) {
            if is_node_failure(reply) {
                let node = routing.node_of_peer(peer);
                routing.nodes[node].down_until = Some(until);
                any = true;
            }
        }
        if any {
            routing.watch.refresh();
        }
    }
}

fn no_serving_node() -> ClientError {
    ClientError::Connection("no serving node holds the key's replicas".into())
}

/// One key's replies from its replicas.
#[derive(Default)]
struct Tally {
    /// The nodes that answered (whatever they said but MOVED).
    answered: Vec<Arc<str>>,
    /// Replicas that did it, and one of their replies.
    done: u32,
    reply: Option<ItemReply>,
    /// Replicas that had nothing to do: the key was stored already (put), at a newer version (upsert), or
    /// not stored (removal).
    moot: Option<ClientError>,
    moot_count: u32,
    failure: Option<ClientError>,
}

impl Tally {
    fn answered_by(&self, node: &str) -> bool {
        self.answered.iter().any(|answered| &**answered == node)
    }

    fn add(&mut self, reply: Result<ItemReply, ClientError>, node: &Arc<str>) {
        if !matches!(reply, Err(ClientError::Moved { .. })) {
            self.answered.push(Arc::clone(node));
        }
        match reply {
            Ok(reply) => {
                self.done += 1;
                self.reply = Some(reply);
            }
            Err(error @ (ClientError::Exists | ClientError::NotFound | ClientError::Superseded)) => {
                self.moot_count += 1;
                self.moot = Some(error);
            }
            Err(error) => {
                self.failure.get_or_insert(error);
            }
        }
    }

    /// Done when at least `needed` replicas stored it or had it already; the reply counts those that did.
    fn outcome(self, needed: usize) -> Result<ItemReply, ClientError> {
        let answered = (self.done + self.moot_count) as usize;
        if answered >= needed && answered > 0 {
            return match (self.reply, self.moot) {
                (Some(reply), _) => Ok(ItemReply { stored: self.done, ..reply }),
                (None, Some(moot)) => Err(moot),
                (None, None) => Err(no_serving_node()),
            };
        }
        Err(self
            .failure
            .unwrap_or_else(|| ClientError::Connection(format!("{answered} of the {needed} replicas needed answered"))))
    }
}

/// A writer id for this client's versions: random, so that two writers rarely share one (they would need
/// the same id and the same microsecond to give two upserts one version).
fn random_writer_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish()
}
