//! Cross-shard forwarding: an item that reached a shard that does not own its key (a client with a stale or
//! no shard map, or one that sends everything to one port) is handed to the owner by message, over a
//! glommio shared channel per ordered pair of shards, and the reply comes back the same way. Counted in
//! `strata_forwarded_total`: a client that routes by the shard map never pays for it.
//!
//! Values cross as owned vectors (one copy each way); this is the slow path, kept simple. The owner serves
//! each link's requests in order in one task, so one slow forwarded request delays only those behind it on
//! the same link.
//!
//! The mesh also carries **cascades** one way (no reply): "the object named N left" from a shard to the
//! peers that hold linked objects, so that children and group members on other shards leave too (see
//! `links.rs`). Each shard publishes how many linked objects it holds in a shared array of counters, so a
//! node that links nothing sends nothing.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use glommio::channels::shared_channel::{self, ConnectedReceiver, ConnectedSender, SharedReceiver, SharedSender};
use strata_proto::{PutOptions, Status};

use crate::links::LinkCounts;
use crate::shard::{Cascade, Shard};

/// What a forwarded item asks.
#[derive(Debug)]
pub enum ForwardOp {
    /// Store `value` (with its crc32c, checked by the client's frame already) under the key.
    Put {
        /// The value.
        value: Vec<u8>,
        /// Its crc32c.
        value_crc: u32,
        /// Its options (the write policy is the client's, or none for the owner's default).
        options: PutOptions,
        /// Its parent's key (scoped), if it names one.
        parent: Option<Vec<u8>>,
        /// Its group's name (scoped), if it names one.
        group: Option<Vec<u8>>,
    },
    /// Read the value, or a range of it.
    Get(Option<(u32, u32)>, std::time::Duration),
    /// Is it stored; with `lease`, hold it for a read lease (a prefix match: the caller loads it next).
    Exists {
        /// Grant a read lease.
        lease: bool,
    },
    /// Where is it stored.
    Locate,
    /// Remove it.
    Remove,
}

/// A forwarded item.
#[derive(Debug)]
pub struct Forward {
    id: u64,
    key: Vec<u8>,
    op: ForwardOp,
}

/// The owner's answer.
#[derive(Debug)]
pub struct ForwardReply {
    id: u64,
    /// The item's status.
    pub status: Status,
    /// Bytes read (gets).
    pub data: Vec<u8>,
    /// Their crc32c.
    pub data_crc: u32,
    /// Length of the whole value.
    pub object_len: u32,
    /// The version of the object read (gets).
    pub version: Option<strata_proto::Version>,
}

impl ForwardReply {
    /// A reply that never reached the owner.
    pub fn failed(status: Status) -> Self {
        Self { id: 0, status, data: Vec::new(), data_crc: 0, object_len: 0, version: None }
    }
}

/// The endpoints one shard holds for one peer, before connecting on the shard's executor.
pub struct PeerEndpoints {
    /// Peer shard id.
    pub peer: u32,
    requests_out: SharedSender<Forward>,
    replies_in: SharedReceiver<ForwardReply>,
    requests_in: SharedReceiver<Forward>,
    replies_out: SharedSender<ForwardReply>,
    cascades_out: SharedSender<Vec<Cascade>>,
    cascades_in: SharedReceiver<Vec<Cascade>>,
}

/// One shard's side of the mesh, before connecting.
pub struct MeshEnds {
    /// Its endpoints, one per peer.
    pub peers: Vec<PeerEndpoints>,
    /// Every shard's count of linked objects.
    pub link_counts: Arc<LinkCounts>,
}

/// Both ends of a channel, each taken once when dealt to its shard.
type Ends<T> = (Option<SharedSender<T>>, Option<SharedReceiver<T>>);

/// Channels for every ordered pair of `shards` shards: element `i` holds shard `i`'s endpoints. Every
/// shard publishes its count of linked objects in `link_counts`.
pub fn mesh(shards: u32, link_counts: &Arc<LinkCounts>) -> Vec<MeshEnds> {
    const DEPTH: usize = 256;
    let mut requests: HashMap<(u32, u32), Ends<Forward>> = HashMap::new();
    let mut replies: HashMap<(u32, u32), Ends<ForwardReply>> = HashMap::new();
    let mut cascades: HashMap<(u32, u32), Ends<Vec<Cascade>>> = HashMap::new();
    for from in 0..shards {
        for to in 0..shards {
            if from != to {
                let (sender, receiver) = shared_channel::new_bounded(DEPTH);
                requests.insert((from, to), (Some(sender), Some(receiver)));
                let (sender, receiver) = shared_channel::new_bounded(DEPTH);
                replies.insert((to, from), (Some(sender), Some(receiver)));
                let (sender, receiver) = shared_channel::new_bounded(DEPTH);
                cascades.insert((from, to), (Some(sender), Some(receiver)));
            }
        }
    }
    (0..shards)
        .map(|me| MeshEnds {
            peers: (0..shards)
                .filter(|&peer| peer != me)
                .filter_map(|peer| {
                    Some(PeerEndpoints {
                        peer,
                        requests_out: requests.get_mut(&(me, peer))?.0.take()?,
                        requests_in: requests.get_mut(&(peer, me))?.1.take()?,
                        replies_out: replies.get_mut(&(me, peer))?.0.take()?,
                        replies_in: replies.get_mut(&(peer, me))?.1.take()?,
                        cascades_out: cascades.get_mut(&(me, peer))?.0.take()?,
                        cascades_in: cascades.get_mut(&(peer, me))?.1.take()?,
                    })
                })
                .collect(),
            link_counts: Arc::clone(link_counts),
        })
        .collect()
}

struct Link {
    requests: ConnectedSender<Forward>,
    pending: RefCell<HashMap<u64, LocalSender<ForwardReply>>>,
    cascades: ConnectedSender<Vec<Cascade>>,
}

/// A shard's side of the mesh: send to owners, serve peers.
pub struct Forwarder {
    links: HashMap<u32, Rc<Link>>,
    next_id: Cell<u64>,
    link_counts: Arc<LinkCounts>,
}

impl Forwarder {
    /// Connects `endpoints` on the current executor and starts the tasks that serve peers' requests to
    /// `shard` and route replies back to waiting callers.
    pub async fn connect(shard: &Rc<Shard>, ends: MeshEnds) -> Self {
        let MeshEnds { peers: endpoints, link_counts } = ends;
        // Connecting an endpoint waits for its peer's end to connect, on the peer's executor: connect every
        // endpoint at once, or shards connecting in different orders would wait for each other forever.
        let connecting: Vec<_> = endpoints
            .into_iter()
            .map(|endpoint| {
                (
                    endpoint.peer,
                    glommio::spawn_local(endpoint.requests_out.connect()),
                    glommio::spawn_local(endpoint.replies_in.connect()),
                    glommio::spawn_local(endpoint.requests_in.connect()),
                    glommio::spawn_local(endpoint.replies_out.connect()),
                    glommio::spawn_local(endpoint.cascades_out.connect()),
                    glommio::spawn_local(endpoint.cascades_in.connect()),
                )
            })
            .collect();
        let mut links = HashMap::new();
        for (peer, requests_out, replies_in, requests_in, replies_out, cascades_out, cascades_in) in connecting {
            let link = Rc::new(Link {
                requests: requests_out.await,
                pending: RefCell::new(HashMap::new()),
                cascades: cascades_out.await,
            });
            let cascades_in: ConnectedReceiver<Vec<Cascade>> = cascades_in.await;
            let owner = Rc::clone(shard);
            glommio::spawn_local(async move {
                while let Some(batch) = cascades_in.recv().await {
                    owner.accept_cascades(&batch);
                }
            })
            .detach();
            let replies_in: ConnectedReceiver<ForwardReply> = replies_in.await;
            let waiting = Rc::clone(&link);
            glommio::spawn_local(async move {
                while let Some(reply) = replies_in.recv().await {
                    if let Some(caller) = waiting.pending.borrow_mut().remove(&reply.id) {
                        let _ = caller.try_send(reply);
                    }
                }
            })
            .detach();
            let requests_in: ConnectedReceiver<Forward> = requests_in.await;
            let replies_out: ConnectedSender<ForwardReply> = replies_out.await;
            let owner = Rc::clone(shard);
            glommio::spawn_local(async move {
                while let Some(request) = requests_in.recv().await {
                    let reply = serve(&owner, request).await;
                    if replies_out.send(reply).await.is_err() {
                        break;
                    }
                }
            })
            .detach();
            links.insert(peer, link);
        }
        Self { links, next_id: Cell::new(1), link_counts }
    }

    /// Starts relaying what `shard` tells its peers (departures and group pins) and lets it serve: the shard
    /// knows nothing of the mesh, and hands its batches to the channel this drains.
    pub fn relay_cascades_of(self: &Rc<Self>, shard: &Shard) {
        let (to_peers, from_shard): (LocalSender<Vec<Cascade>>, LocalReceiver<Vec<Cascade>>) =
            local_channel::new_bounded(16);
        let forwarder = Rc::clone(self);
        glommio::spawn_local(async move {
            while let Some(batch) = from_shard.recv().await {
                forwarder.send_cascades(&batch).await;
            }
        })
        .detach();
        shard.start_serving(to_peers);
    }

    /// Tells every peer that holds linked objects about `batch` (every peer, if it tells of a pin change).
    async fn send_cascades(&self, batch: &[Cascade]) {
        let counts = &self.link_counts;
        let everyone = batch.iter().any(|cascade| cascade.kind.is_pin_change());
        for (&peer, link) in &self.links {
            if everyone || counts.of(peer) > 0 {
                // A peer that is shutting down has nothing left to cascade into.
                let _ = link.cascades.send(batch.to_vec()).await;
            }
        }
    }

    /// Sends `op` on `key` to shard `owner` and waits for its reply.
    pub async fn call(&self, owner: u32, key: &[u8], op: ForwardOp) -> ForwardReply {
        let failed = ForwardReply::failed;
        let Some(link) = self.links.get(&owner) else { return failed(Status::Invalid) };
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let (sender, receiver) = local_channel::new_bounded(1);
        link.pending.borrow_mut().insert(id, sender);
        if link.requests.send(Forward { id, key: key.to_vec(), op }).await.is_err() {
            link.pending.borrow_mut().remove(&id);
            return failed(Status::ShuttingDown);
        }
        receiver.recv().await.unwrap_or_else(|| failed(Status::ShuttingDown))
    }
}

/// The owner's side: runs a forwarded item on its shard.
async fn serve(shard: &Rc<Shard>, request: Forward) -> ForwardReply {
    let mut reply = ForwardReply { id: request.id, ..ForwardReply::failed(Status::Ok) };
    let key = &request.key;
    match request.op {
        ForwardOp::Put { value, value_crc, options, parent, group } => {
            let links = strata_proto::Links { parent: parent.as_deref(), group: group.as_deref() };
            let put = shard.put_value(key, &value, value_crc, options, links).await;
            reply.status = put.err().map_or(Status::Ok, |error| error.status());
        }
        ForwardOp::Get(range, wait) => match shard.get(key, range, wait).await {
            Ok(hit) => {
                reply.data = hit.slices().concat();
                reply.data_crc = hit.data_crc;
                reply.object_len = hit.object_len;
                reply.version = hit.version;
            }
            Err(error) => reply.status = error.status(),
        },
        ForwardOp::Exists { lease } => match if lease { shard.exists_leased(key) } else { shard.exists(key) } {
            Ok(len) => reply.object_len = len,
            Err(error) => reply.status = error.status(),
        },
        ForwardOp::Locate => match shard.locate(key) {
            Ok((len, tiers)) => (reply.object_len, reply.data_crc) = (len, tiers),
            Err(error) => reply.status = error.status(),
        },
        ForwardOp::Remove => {
            if let Err(error) = shard.remove(key).await {
                reply.status = error.status();
            }
        }
    }
    reply
}
