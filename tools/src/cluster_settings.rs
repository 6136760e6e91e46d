//! `strata-node`'s cluster settings as flags (`--cluster etcd://…`, …) and as the TOML table `[cluster]`.
use std::time::Duration;

use anyhow::{Context, bail};
use strata_cluster::{ClusterConfig, etcd_endpoints};

use crate::byte_size::parse_byte_size;
use crate::pool::parse_duration;
use crate::rebalance::RebalanceConfig;

/// The `--cluster*` flags, or the `[cluster]` table (`etcd`, `name`, `node-id`, `lease-ttl`, `zone`,
/// `max-replicas`, `replicas`, `repair-rate`).
#[derive(Clone, Debug, Default, PartialEq, clap::Args, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ClusterSettings {
    /// Join a cluster on etcd: etcd://HOST:PORT[,HOST:PORT…]. [default: none, the node runs alone]
    #[arg(long = "cluster", id = "cluster_etcd")]
    pub etcd: Option<String>,
    /// The cluster's name (its members are /strata/NAME/nodes/ID in etcd). [default: strata]
    #[arg(long = "cluster-name", id = "cluster_name")]
    pub name: Option<String>,
    /// This node's id in the cluster, unique: letters, digits, '.', '_', '-'. [required with --cluster]
    #[arg(long = "node-id", id = "node_id")]
    pub node_id: Option<String>,
    /// The etcd lease of the node's entry: silent this long, a node is gone. [default: 5s]
    #[arg(long = "lease-ttl", id = "lease_ttl")]
    pub lease_ttl: Option<String>,
    /// The node's zone: replicas go to distinct zones first. [default: none]
    #[arg(long = "zone", id = "zone")]
    pub zone: Option<String>,
    /// The most replicas a put asks for in the cluster: the node owns the keys it is among the first this
    /// many nodes of, and answers MOVED to an older membership's requests for the others. [default: 3]
    #[arg(long = "max-replicas", id = "max_replicas")]
    pub max_replicas: Option<usize>,
    /// The cluster's replica count: the node re-creates a key's lost replicas, from the first survivor
    /// that holds it, until it has this many. [default: 1]
    #[arg(long = "replicas", id = "replicas")]
    pub replicas: Option<usize>,
    /// Bytes per second that repairs and migrations may copy, e.g. 256MiB; 0 turns them off (a drain
    /// still moves every key). [default: 256MiB]
    #[arg(long = "repair-rate", id = "repair_rate")]
    pub repair_rate: Option<String>,
}

impl ClusterSettings {
    /// These settings over those of `file` (flags win).
    pub fn over(self, file: ClusterSettings) -> ClusterSettings {
        ClusterSettings {
            etcd: self.etcd.or(file.etcd),
            name: self.name.or(file.name),
            node_id: self.node_id.or(file.node_id),
            lease_ttl: self.lease_ttl.or(file.lease_ttl),
            zone: self.zone.or(file.zone),
            max_replicas: self.max_replicas.or(file.max_replicas),
            replicas: self.replicas.or(file.replicas),
            repair_rate: self.repair_rate.or(file.repair_rate),
        }
    }

    /// The registration these settings ask for, if any.
    pub fn config(&self) -> anyhow::Result<Option<ClusterConfig>> {
        let Some(etcd) = &self.etcd else {
            if *self != ClusterSettings::default() {
                bail!(
                    "the cluster settings (--node-id, --cluster-name, --lease-ttl, --zone, --max-replicas, \
                     --replicas, --repair-rate) need --cluster etcd://…"
                );
            }
            return Ok(None);
        };
        let endpoints = etcd_endpoints(etcd).context("--cluster")?;
        let Some(node_id) = self.node_id.clone() else { bail!("--cluster needs --node-id") };
        let lease_ttl = match &self.lease_ttl {
            Some(text) => parse_duration(text)?,
            None => Duration::from_secs(5),
        };
        Ok(Some(ClusterConfig {
            endpoints,
            cluster: self.name.clone().unwrap_or_else(|| "strata".into()),
            node_id,
            lease_ttl,
            zone: self.zone.clone().unwrap_or_default(),
            max_replicas: self.max_replicas.unwrap_or(3).max(1),
        }))
    }
}

impl ClusterSettings {
    /// The rebalancer's settings (meaningful with `--cluster`).
    pub fn rebalance_config(&self) -> anyhow::Result<RebalanceConfig> {
        let rate = match &self.repair_rate {
            Some(text) => parse_byte_size(text).with_context(|| format!("--repair-rate {text}"))?,
            None => 256 << 20,
        };
        let replicas = self.replicas.unwrap_or(1).max(1);
        if replicas > self.max_replicas.unwrap_or(3).max(1) {
            bail!("--replicas {replicas} is more than --max-replicas: the extra replicas would not own their keys");
        }
        Ok(RebalanceConfig { replicas, rate, settle: Duration::from_secs(1) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_needs_etcd_and_an_id() {
        assert_eq!(ClusterSettings::default().config().unwrap(), None);
        let id_alone = ClusterSettings { node_id: Some("n1".into()), ..Default::default() };
        assert!(id_alone.config().is_err());
        let no_id = ClusterSettings { etcd: Some("etcd://127.0.0.1:2379".into()), ..Default::default() };
        assert!(no_id.config().is_err());
        let no_scheme =
            ClusterSettings { etcd: Some("127.0.0.1:2379".into()), node_id: Some("n1".into()), ..Default::default() };
        assert!(no_scheme.config().is_err());
        let two = ClusterSettings {
            etcd: Some("etcd://127.0.0.1:2379,127.0.0.2:2379".into()),
            node_id: Some("n1".into()),
            lease_ttl: Some("2s".into()),
            ..Default::default()
        };
        let config = two.config().unwrap().unwrap();
        assert_eq!(config.endpoints, ["http://127.0.0.1:2379", "http://127.0.0.2:2379"]);
        assert_eq!((config.cluster.as_str(), config.lease_ttl), ("strata", Duration::from_secs(2)));
        let rebalance = two.rebalance_config().unwrap();
        assert_eq!((rebalance.replicas, rebalance.rate), (1, 256 << 20));
        let too_many = ClusterSettings { replicas: Some(4), ..two.clone() };
        assert!(too_many.rebalance_config().is_err());
        let off = ClusterSettings { repair_rate: Some("0".into()), replicas: Some(2), ..two };
        assert_eq!(off.rebalance_config().unwrap().rate, 0);
    }
}
