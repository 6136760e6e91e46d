//! The publisher's settings as flags (`--kv-events ENDPOINT` …) and as the TOML table `[kv-events]`.
use anyhow::bail;

use super::KvEventsConfig;

/// The `--kv-events*` flags, or the `[kv-events]` table (`endpoint`, `replay-endpoint`, `topic`, `token`,
/// `block-size`).
#[derive(Clone, Debug, Default, PartialEq, clap::Args, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct KvEventsSettings {
    /// Publish the stored and removed blocks as vLLM's KV events (`KVEventBatch`, msgpack on a ZeroMQ PUB
    /// socket) at this endpoint, e.g. tcp://127.0.0.1:5557 (tcp://*:5557: every interface).
    #[arg(long = "kv-events", id = "kv_events_endpoint")]
    pub endpoint: Option<String>,
    /// vLLM's replay socket (ROUTER) beside it, e.g. tcp://127.0.0.1:5558: a subscriber asks for the batches
    /// it missed.
    #[arg(long = "kv-events-replay", id = "kv_events_replay")]
    pub replay_endpoint: Option<String>,
    /// The topic frame of every message. [default: empty, as vLLM's]
    #[arg(long = "kv-events-topic", id = "kv_events_topic")]
    pub topic: Option<String>,
    /// Token of the tenant whose blocks are published (one publisher, one tenant). [default: --token]
    #[arg(long = "kv-events-token", id = "kv_events_token")]
    pub token: Option<String>,
    /// The serving engine's block size, carried in `BlockStored`. [default: 0, not known to the node]
    #[arg(long = "kv-events-block-size", id = "kv_events_block_size")]
    pub block_size: Option<u32>,
}

impl KvEventsSettings {
    /// These settings over those of `file` (flags win).
    pub fn over(self, file: KvEventsSettings) -> KvEventsSettings {
        KvEventsSettings {
            endpoint: self.endpoint.or(file.endpoint),
            replay_endpoint: self.replay_endpoint.or(file.replay_endpoint),
            topic: self.topic.or(file.topic),
            token: self.token.or(file.token),
            block_size: self.block_size.or(file.block_size),
        }
    }

    /// The publisher to start, if any. `node_token`: the node's `--token`; `has_tenants`: whether the node
    /// has `[[tenants]]` (then the tenant must be named: a publisher serves one).
    pub fn config(&self, node_token: Option<&str>, has_tenants: bool) -> anyhow::Result<Option<KvEventsConfig>> {
        let Some(endpoint) = self.endpoint.clone() else {
            if *self != KvEventsSettings::default() {
                bail!("the --kv-events-* settings need --kv-events (the PUB socket's endpoint)");
            }
            return Ok(None);
        };
        let token = self.token.as_deref().or(node_token);
        if token.is_none() && has_tenants {
            bail!("--kv-events needs --kv-events-token on a node with [[tenants]]: it publishes one tenant's blocks");
        }
        Ok(Some(KvEventsConfig {
            endpoint,
            replay_endpoint: self.replay_endpoint.clone(),
            topic: self.topic.clone().unwrap_or_default(),
            token: token.map(|token| token.as_bytes().to_vec()),
            block_size: self.block_size.unwrap_or(0),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publisher_is_configured_only_with_an_endpoint_and_knows_its_tenant() {
        assert_eq!(KvEventsSettings::default().config(None, false).ok().flatten(), None);
        let topic_alone = KvEventsSettings { topic: Some("kv".into()), ..Default::default() };
        assert!(topic_alone.config(None, false).is_err());
        let open = KvEventsSettings { endpoint: Some("tcp://127.0.0.1:5557".into()), ..Default::default() };
        assert!(open.config(None, true).is_err(), "a node with tenants must say whose blocks");
        let config = open.config(Some("secret"), false).ok().flatten();
        assert_eq!(config.map(|config| config.token), Some(Some(b"secret".to_vec())));
    }
}
