//! Who holds a node's NVMe tier on a shared pool: `/strata/<cluster>/tiers/<node id>`, a [`TierRecord`]
//! (JSON) with the tier's namespaces, its owner and a fencing epoch (docs/PROTOCOL.md, "NVMe-oF takeover").
//!
//! The unit of ownership is a node's whole tier, not one namespace: the tier's regions are dealt across
//! its namespaces and its region log is recovered from all of them together. Every change is an etcd
//! transaction that compares the record's revision, so two nodes never both believe they claimed it:
//! the node claims its own tier at start ([`claim_own`]), a survivor claims a dead node's
//! ([`claim_dead`]), and the survivor hands it back once its keys have moved ([`release`]). Each claim
//! raises the epoch, which is also the claimer's NVMe reservation key, so the target fences every earlier
//! holder.

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, Txn, TxnOp};

use crate::error::{ClusterError, bounded};

/// Where a tier is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TierState {
    /// Its node serves from it.
    Owned,
    /// A survivor fenced its node off it and moves its keys to their new owners.
    TakingOver,
    /// Nobody holds it; its keys moved away, and the next node to claim it erases it.
    Released,
}

/// A node's NVMe tier on shared namespaces, and who holds it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TierRecord {
    /// The node whose tier it is (the record's key).
    pub node: String,
    /// Its namespaces, as `nvmf:` specs any node can open.
    pub namespaces: Vec<String>,
    /// Shards it was formatted for (a recovery must start as many).
    pub shards: u32,
    /// Its region size.
    pub region_bytes: u64,
    /// The node holding it; none when released.
    pub owner: Option<String>,
    /// Raised by every claim; the holder's NVMe reservation key.
    pub epoch: u64,
    /// Its state.
    pub state: TierState,
}

/// A claim that succeeded: the record as claimed, the etcd revision that wrote it (what the holder's
/// registration compares, so it notices being fenced), and the key of the holder it fences.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The record as written.
    pub record: TierRecord,
    /// Its etcd mod revision.
    pub revision: i64,
    /// The previous holder's reservation key (0: none), to preempt at the target. Holders keep their
    /// reservation after a release, so this is the last claim's epoch even for a released tier.
    pub previous_key: u64,
    /// The tier was released (its keys moved away): erase it rather than recover it.
    pub erase: bool,
}

/// Why a claim failed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// etcd failed or did not answer.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// Another node holds the tier.
    #[error(
        "the NVMe tier of node {node:?} is held by node {owner:?} (epoch {epoch}, {state:?}): it took the tier over \
         and releases it once the keys have moved; start again after that"
    )]
    HeldByAnother {
        /// The tier's node.
        node: String,
        /// Who holds it.
        owner: String,
        /// Its epoch.
        epoch: u64,
        /// Its state.
        state: TierState,
    },
    /// The record changed between the read and the transaction (another claim won).
    #[error("the NVMe tier record of {0:?} changed during the claim: another node claimed it")]
    Lost(String),
    /// The record in etcd is not a tier record.
    #[error("the NVMe tier record at {key}: {reason}")]
    Malformed {
        /// Its key.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

/// The prefix of every tier record of `cluster`.
pub fn tiers_prefix(cluster: &str) -> String {
    format!("/strata/{cluster}/tiers/")
}

/// Node `id`'s tier record key in `cluster`.
pub fn tier_key(cluster: &str, id: &str) -> String {
    format!("{}{id}", tiers_prefix(cluster))
}

/// The tier records of one cluster, for a plain thread: an etcd client on a runtime of its own, each call
/// bounded by `limit`.
pub struct TierRecords {
    runtime: tokio::runtime::Runtime,
    client: Client,
    cluster: String,
    limit: Duration,
}

impl TierRecords {
    /// Connects to etcd at `endpoints` for `cluster`'s records.
    pub fn connect(endpoints: &[String], cluster: &str, limit: Duration) -> Result<Self, ClaimError> {
        crate::member::validate_name("cluster name", cluster).map_err(ClusterError::from)?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(ClusterError::from)?;
        let options = ConnectOptions::new().with_connect_timeout(limit).with_timeout(limit);
        let client = runtime.block_on(bounded(limit, Client::connect(endpoints, Some(options))))?;
        Ok(Self { runtime, client, cluster: cluster.to_string(), limit })
    }

    /// Every tier record, each with its mod revision.
    pub fn read(&mut self) -> Result<Vec<(TierRecord, i64)>, ClaimError> {
        self.runtime.block_on(read_tiers(&mut self.client, &self.cluster, self.limit))
    }

    /// [`claim_own`].
    pub fn claim_own(&mut self, mine: TierRecord) -> Result<Claim, ClaimError> {
        self.runtime.block_on(claim_own(&mut self.client, &self.cluster, mine, self.limit))
    }

    /// [`claim_dead`].
    pub fn claim_dead(&mut self, me: &str, found: (&TierRecord, i64)) -> Result<Claim, ClaimError> {
        self.runtime.block_on(claim_dead(&mut self.client, &self.cluster, me, found, self.limit))
    }

    /// [`release`].
    pub fn release(&mut self, claim: &Claim) -> Result<i64, ClaimError> {
        self.runtime.block_on(release(&mut self.client, &self.cluster, claim, self.limit))
    }
}

/// Every tier record of `cluster` that decodes, each with its mod revision. One that does not (written by
/// hand, or by another build) is left out with a warning: no takeover happens for that tier, while the
/// others' still do.
pub async fn read_tiers(
    client: &mut Client,
    cluster: &str,
    limit: Duration,
) -> Result<Vec<(TierRecord, i64)>, ClaimError> {
    let prefix = tiers_prefix(cluster);
    let answer = bounded(limit, client.get(prefix.as_str(), Some(GetOptions::new().with_prefix()))).await?;
    Ok(decodable(answer.kvs().iter().map(|kv| (kv.key(), kv.value(), kv.mod_revision()))))
}

/// The records among `(key, value, mod revision)` that decode; the others are logged.
fn decodable<'a>(kvs: impl IntoIterator<Item = (&'a [u8], &'a [u8], i64)>) -> Vec<(TierRecord, i64)> {
    kvs.into_iter()
        .filter_map(|(key, value, revision)| match decode(key, value) {
            Ok(record) => Some((record, revision)),
            Err(error) => {
                tracing::warn!(%error, "a tier record is malformed: that tier is never taken over until it is fixed");
                None
            }
        })
        .collect()
}

/// The node `me` claims its own tier, described by `mine` (owner, epoch and state are set here): a new
/// record at epoch 1; its own record at the next epoch (a restart); a released one at the next epoch, to
/// be erased. Refused while another node holds it.
pub async fn claim_own(
    client: &mut Client,
    cluster: &str,
    mine: TierRecord,
    limit: Duration,
) -> Result<Claim, ClaimError> {
    let key = tier_key(cluster, &mine.node);
    let answer = bounded(limit, client.get(key.as_str(), None)).await?;
    let Some(kv) = answer.kvs().first() else {
        let record = TierRecord { owner: Some(mine.node.clone()), epoch: 1, state: TierState::Owned, ..mine };
        let when = Compare::create_revision(key.as_str(), CompareOp::Equal, 0);
        let revision = write_if(client, &key, when, &record, limit).await?;
        return Ok(Claim { record, revision, previous_key: 0, erase: false });
    };
    let found = decode(kv.key(), kv.value())?;
    let erase = match (&found.owner, found.state) {
        (_, TierState::Released) => true,
        (Some(owner), TierState::Owned) if *owner == mine.node => false,
        (owner, state) => {
            let owner = owner.clone().unwrap_or_default();
            return Err(ClaimError::HeldByAnother { node: mine.node, owner, epoch: found.epoch, state });
        }
    };
    // A released tier's last claimer still holds its reservation (so the node it fenced stays fenced).
    let previous_key = found.epoch;
    let record = TierRecord { owner: Some(mine.node.clone()), epoch: found.epoch + 1, state: TierState::Owned, ..mine };
    let when = Compare::mod_revision(key.as_str(), CompareOp::Equal, kv.mod_revision());
    let revision = write_if(client, &key, when, &record, limit).await?;
    Ok(Claim { record, revision, previous_key, erase })
}

/// The survivor `me` claims the tier of a node that left (`found`, read at `revision`): it holds it, at the
/// next epoch, to move its keys away.
pub async fn claim_dead(
    client: &mut Client,
    cluster: &str,
    me: &str,
    (found, revision): (&TierRecord, i64),
    limit: Duration,
) -> Result<Claim, ClaimError> {
    let key = tier_key(cluster, &found.node);
    let record = TierRecord {
        owner: Some(me.to_string()),
        epoch: found.epoch + 1,
        state: TierState::TakingOver,
        ..found.clone()
    };
    let when = Compare::mod_revision(key.as_str(), CompareOp::Equal, revision);
    let written = write_if(client, &key, when, &record, limit).await?;
    Ok(Claim { record, revision: written, previous_key: found.epoch, erase: false })
}

/// Hands a taken-over tier back: nobody holds it, and the next claim erases it.
pub async fn release(client: &mut Client, cluster: &str, claim: &Claim, limit: Duration) -> Result<i64, ClaimError> {
    let key = tier_key(cluster, &claim.record.node);
    let record = TierRecord { owner: None, state: TierState::Released, ..claim.record.clone() };
    let when = Compare::mod_revision(key.as_str(), CompareOp::Equal, claim.revision);
    write_if(client, &key, when, &record, limit).await
}

/// Puts `record` at `key` if `when` holds; the revision it was written at.
async fn write_if(
    client: &mut Client,
    key: &str,
    when: Compare,
    record: &TierRecord,
    limit: Duration,
) -> Result<i64, ClaimError> {
    // A struct of strings and numbers always serialises.
    let value = serde_json::to_string(record).unwrap_or_default();
    let txn = Txn::new().when([when]).and_then([TxnOp::put(key, value, None)]);
    let answer = bounded(limit, client.txn(txn)).await?;
    if !answer.succeeded() {
        return Err(ClaimError::Lost(record.node.clone()));
    }
    Ok(answer.header().map_or(0, |header| header.revision()))
}

fn decode(key: &[u8], value: &[u8]) -> Result<TierRecord, ClaimError> {
    serde_json::from_slice(value).map_err(|error| ClaimError::Malformed {
        key: String::from_utf8_lossy(key).into_owned(),
        reason: error.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_is_the_documented_json() {
        let record = TierRecord {
            node: "n2".into(),
            namespaces: vec!["nvmf:trtype=tcp,traddr=10.0.0.9,trsvcid=4420,subnqn=nqn.p:a,ns=2".into()],
            shards: 1,
            region_bytes: 16 << 20,
            owner: Some("n1".into()),
            epoch: 4,
            state: TierState::TakingOver,
        };
        let json = serde_json::to_string(&record).unwrap();
        assert_eq!(
            json,
            r#"{"node":"n2","namespaces":["nvmf:trtype=tcp,traddr=10.0.0.9,trsvcid=4420,subnqn=nqn.p:a,ns=2"],"shards":1,"region_bytes":16777216,"owner":"n1","epoch":4,"state":"taking_over"}"#
        );
        assert_eq!(decode(b"k", json.as_bytes()).unwrap(), record);
        assert!(matches!(decode(b"k", b"{}"), Err(ClaimError::Malformed { .. })));
        assert_eq!(tier_key("prod", "n2"), "/strata/prod/tiers/n2");
    }

    #[test]
    fn a_malformed_record_is_left_out_and_the_others_are_read() {
        let record = TierRecord {
            node: "n1".into(),
            namespaces: Vec::new(),
            shards: 1,
            region_bytes: 1 << 20,
            owner: Some("n1".into()),
            epoch: 2,
            state: TierState::Owned,
        };
        let json = serde_json::to_vec(&record).unwrap();
        let kvs: [(&[u8], &[u8], i64); 3] =
            [(b"/t/n0", b"not json", 5), (b"/t/n1", &json, 7), (b"/t/n2", br#"{"node":"n2"}"#, 9)];
        assert_eq!(decodable(kvs), vec![(record, 7)]);
    }
}
