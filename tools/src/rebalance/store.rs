//! What a pass needs of the nodes, as traits: the client implements them over the network, and the
//! seeded simulation (`sim.rs`) over nodes in memory, so that the same pass code runs in both.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

pub use strata_client::VersionedValue;
use strata_client::{Client, ClientError, ClientOptions, PutOptions, ScanPage};
use strata_cluster::Member;
use strata_proto::{Version, WritePolicy};

/// A copy to make: the key, its value, and what its put said that the copy says again.
#[derive(Clone, Copy, Debug)]
pub struct CopyItem<'a> {
    /// The key.
    pub key: &'a [u8],
    /// Its value.
    pub value: &'a [u8],
    /// The version it was upserted with.
    pub version: Option<Version>,
    /// The replica count its put asked for (0: not said).
    pub replicas: u8,
}

/// The calls a pass makes of one node.
pub trait KeyStore {
    /// Shards of the node.
    fn shard_count(&self) -> usize;
    /// A page of a shard's keys.
    fn scan_shard(&mut self, shard: usize, cursor: u32, max_keys: u32) -> Result<ScanPage, ClientError>;
    /// Whether each key is stored.
    fn batch_exists(&mut self, keys: &[&[u8]]) -> Vec<Result<bool, ClientError>>;
    /// Each key's value and version.
    fn batch_get(&mut self, keys: &[&[u8]]) -> Vec<Result<VersionedValue, ClientError>>;
    /// Each stored key's version (none: never upserted with one); `NotFound` for a key not stored. For the
    /// few upserted keys only: it reads their values.
    fn batch_versions(&mut self, keys: &[&[u8]]) -> Vec<Result<Option<Version>, ClientError>> {
        self.batch_get(keys).into_iter().map(|result| result.map(|(_, version)| version)).collect()
    }
    /// Stores each value with `policy` (none: the node's default): one with no version unless its key is
    /// stored (`Exists`), one with a version unless the key is stored at that version or a newer one
    /// (`Superseded`), replacing an older one.
    fn batch_put(&mut self, items: &[CopyItem<'_>], policy: Option<WritePolicy>) -> Vec<Result<(), ClientError>>;
    /// Removes each key.
    fn batch_remove(&mut self, keys: &[&[u8]]) -> Vec<Result<(), ClientError>>;
}

impl KeyStore for Client {
    fn shard_count(&self) -> usize {
        Client::shard_count(self) as usize
    }

    fn scan_shard(&mut self, shard: usize, cursor: u32, max_keys: u32) -> Result<ScanPage, ClientError> {
        Client::scan_shard(self, shard, cursor, max_keys)
    }

    fn batch_exists(&mut self, keys: &[&[u8]]) -> Vec<Result<bool, ClientError>> {
        Client::batch_exists(self, keys)
    }

    fn batch_get(&mut self, keys: &[&[u8]]) -> Vec<Result<VersionedValue, ClientError>> {
        Client::batch_get_versioned(self, keys)
    }

    fn batch_put(&mut self, items: &[CopyItem<'_>], policy: Option<WritePolicy>) -> Vec<Result<(), ClientError>> {
        // A frame's items share their options: one batch per (version, replica count), so unversioned copies
        // (nearly all) go in a batch or a few, and a versioned one (an upserted key) as an upsert of its own.
        let mut groups: BTreeMap<(Option<Version>, u8), Vec<usize>> = BTreeMap::new();
        for (at, item) in items.iter().enumerate() {
            groups.entry((item.version, item.replicas)).or_default().push(at);
        }
        let mut results: Vec<Result<(), ClientError>> = Vec::with_capacity(items.len());
        results.resize_with(items.len(), || Err(ClientError::Protocol("no result".into())));
        for ((version, replicas), ats) in groups {
            let batch: Vec<(&[u8], &[u8])> = ats.iter().map(|&at| (items[at].key, items[at].value)).collect();
            let options = PutOptions { policy, upsert: version.is_some(), version, replicas, ..PutOptions::default() };
            for (at, result) in ats.into_iter().zip(Client::batch_put_with(self, &batch, options)) {
                results[at] = result;
            }
        }
        results
    }

    fn batch_remove(&mut self, keys: &[&[u8]]) -> Vec<Result<(), ClientError>> {
        Client::batch_remove(self, keys)
    }
}

/// The other nodes of the cluster.
pub trait Directory {
    /// How a node is reached.
    type Store: KeyStore;
    /// `member`, if it can be reached.
    fn node(&mut self, member: &Member) -> Option<&mut Self::Store>;
    /// Drops what is held for `member` after it failed.
    fn forget(&mut self, member: &Member);
}

/// Clients of the cluster's nodes as one tenant, each connected when first needed and dropped when it
/// fails.
pub struct Nodes {
    options: ClientOptions,
    clients: HashMap<String, (SocketAddr, Client)>,
}

impl Nodes {
    /// No clients yet; each will connect with `options`.
    pub fn new(options: ClientOptions) -> Self {
        Self { options, clients: HashMap::new() }
    }
}

impl Directory for Nodes {
    type Store = Client;

    fn node(&mut self, member: &Member) -> Option<&mut Client> {
        let address = *member.shards.first()?;
        if self.clients.get(&member.id).is_none_or(|(known, _)| *known != address) {
            match Client::connect(address, self.options.clone()) {
                Ok(client) => {
                    self.clients.insert(member.id.clone(), (address, client));
                }
                Err(error) => {
                    tracing::debug!(node = %member.id, %error, "rebalance: node unreachable");
                    return None;
                }
            }
        }
        self.clients.get_mut(&member.id).map(|(_, client)| client)
    }

    fn forget(&mut self, member: &Member) {
        self.clients.remove(&member.id);
    }
}
