//! `strata-cluster`: a node's membership of a Strata cluster on etcd.
//!
//! A node registers `/strata/<cluster>/nodes/<id>` ([`Member`], JSON) under an etcd lease and keeps it
//! alive from its own thread and tokio runtime ([`Registration`]): the glommio shards never wait on etcd.
//! When etcd is unreachable the node keeps serving its keys, says so in `/healthz` and `/metrics`, and
//! registers again (same start epoch, new lease) once etcd answers. Where keys live is
//! `strata_proto::placement`, computed from the members alone; a client reads them through a
//! [`MembersWatch`] and routes by its [`View`].
//!
//! Feature `node` (on by default) builds the registration, which reports through the engine's metrics;
//! clients build without it.
#![deny(missing_docs, unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod endpoints;
mod error;
mod member;
#[cfg(feature = "node")]
mod ownership;
#[cfg(feature = "node")]
mod registration;
mod tier_claim;
mod view;
mod watch;

pub use endpoints::{EndpointsError, etcd_endpoints};
pub use error::ClusterError;
pub use member::{Member, MemberState, NameError, TierSpace, member_key, members_prefix, validate_name};
#[cfg(feature = "node")]
pub use ownership::{feed_ownership, owns_under};
#[cfg(feature = "node")]
pub use registration::{ClusterConfig, Registration, TierHold};
pub use tier_claim::{
    Claim, ClaimError, TierRecord, TierRecords, TierState, claim_dead, claim_own, read_tiers, release, tier_key,
    tiers_prefix,
};
pub use view::{MembersDocument, View, weight};
pub use watch::{Fetch, MembersWatch, OnChange, WatchConfig, read_members};
