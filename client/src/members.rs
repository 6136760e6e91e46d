//! Learning a cluster from one of its nodes: the MEMBERS request, and a client that starts from node
//! addresses and keeps its view current by asking the nodes again (no etcd address needed).

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use strata_cluster::{MembersDocument, MembersWatch, View};
use strata_proto::{Opcode, RequestItemHeader, Status};

use crate::client::{Client, ClientOptions};
use crate::cluster::ClusterOptions;
use crate::error::ClientError;

/// The longest MEMBERS answer read (a thousand members take about 300 KiB).
const MAX_MEMBERS_BYTES: u32 = 16 << 20;
/// How long a client learning its cluster waits for a node that sees no serving member yet.
const LEARN_WAIT: Duration = Duration::from_secs(2);
/// How often a client that learnt the cluster from a node asks again.
const RESYNC: Duration = Duration::from_secs(2);

impl Client {
    /// The node's view of its cluster (MEMBERS), asked of the first shard this client reaches; `None`
    /// from a node that runs alone.
    pub fn members(&mut self) -> Result<Option<MembersDocument>, ClientError> {
        let request_id = self.next_request_id;
        self.next_request_id += 1;
        let connection = self.connection(0)?;
        let (item, json) =
            connection.ask_one(Opcode::Members, request_id, RequestItemHeader::default(), MAX_MEMBERS_BYTES)?;
        if item.status == Status::NotFound {
            return Ok(None);
        }
        serde_json::from_slice(&json).map(Some).map_err(|error| ClientError::Protocol(format!("MEMBERS: {error}")))
    }

    /// Connects to the first of `addresses` that answers. A node in a cluster makes this a client of its
    /// cluster, routed by the members the node reports and kept current by asking the nodes again every
    /// 2 s and after a failure or MOVED; a node that runs alone gives a client of that node, as
    /// [`Client::connect`]. `options.etcd` is not used.
    pub fn connect_learning(addresses: &[String], options: &ClusterOptions) -> Result<Self, ClientError> {
        let mut last = ClientError::Connection("no address given".into());
        for address in addresses {
            let mut client = match Client::connect(address.as_str(), options.client.clone()) {
                Ok(client) => client,
                Err(error) => {
                    last = error;
                    continue;
                }
            };
            let Some(document) = members_once_serving(&mut client)? else { return Ok(client) };
            let seeds: Vec<String> = addresses.to_vec();
            let node_options = options.client.clone();
            let fetch = move |last: &View| ask_any(last, &seeds, &node_options);
            let watch = MembersWatch::polled(document.into_view(), Box::new(fetch), RESYNC)
                .map_err(|error| ClientError::Connection(error.to_string()))?;
            return Client::connect_watched(Arc::new(watch), options);
        }
        Err(last)
    }
}

/// The node's members once they include a serving one, asked again every 50 ms for at most `LEARN_WAIT`:
/// a node that has just started, or whose cluster has just formed, sees its members a moment after etcd
/// does (its watch's events lag a read by up to etcd's 100 ms watcher sync). After that, its view as it
/// stands.
fn members_once_serving(client: &mut Client) -> Result<Option<MembersDocument>, ClientError> {
    let deadline = std::time::Instant::now() + LEARN_WAIT;
    loop {
        let document = client.members()?;
        let serving = |document: &MembersDocument| {
            document.members.iter().any(|member| member.state == strata_cluster::MemberState::Serving)
        };
        if document.as_ref().is_none_or(serving) || std::time::Instant::now() >= deadline {
            return Ok(document);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The members as the first node that answers reports them: the serving members of `last`, then `seeds`.
fn ask_any(last: &View, seeds: &[String], options: &ClientOptions) -> Option<View> {
    let known: Vec<SocketAddr> = last.serving().map(|member| member.shards[0]).collect();
    let seeds = seeds.iter().filter_map(|seed| seed.to_socket_addrs().ok()?.next());
    let quick = ClientOptions { timeout: options.timeout.min(Duration::from_secs(2)), ..options.clone() };
    known.into_iter().chain(seeds).find_map(|addr| {
        let mut client = Client::connect(addr, quick.clone()).ok()?;
        Some(client.members().ok()??.into_view())
    })
}
