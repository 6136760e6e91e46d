//! What can go wrong between a node or client and etcd.

use std::time::Duration;

use crate::member::NameError;

/// Why a registration or a members' watch failed to start, or why one session with etcd ended.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The cluster name or the node id cannot be a key segment.
    #[error(transparent)]
    Name(#[from] NameError),
    /// A lease TTL under one second (etcd counts in seconds).
    #[error("lease TTL {0:?}: at least 1 s")]
    Ttl(Duration),
    /// An etcd call failed.
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    /// An etcd call did not answer within the time allowed (the lease TTL, or the watch's timeout).
    #[error("etcd did not answer within {0:?}")]
    Timeout(Duration),
    /// etcd ended the members' watch.
    #[error("the members' watch ended: {0}")]
    WatchEnded(String),
    /// etcd says the lease is gone (the node was silent past its TTL).
    #[error("the lease expired")]
    LeaseExpired,
    /// No members' view came within the time allowed (etcd unreachable, or no node registered).
    #[error("no view of cluster {cluster:?} within {waited:?}: {reason}")]
    NoView {
        /// The cluster's name.
        cluster: String,
        /// How long the watch waited.
        waited: Duration,
        /// The last failure, or that no node is serving.
        reason: String,
    },
    /// The thread or its runtime could not be started.
    #[error("starting the registration thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// `call`, or [`ClusterError::Timeout`] after `limit`.
pub(crate) async fn bounded<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, ClusterError> {
    match tokio::time::timeout(limit, call).await {
        Ok(answer) => Ok(answer?),
        Err(_) => Err(ClusterError::Timeout(limit)),
    }
}
