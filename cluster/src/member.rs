//! A node's entry in etcd, `/strata/<cluster>/nodes/<id>`: its shards' addresses, zone, state, start epoch
//! and each tier's capacity and free bytes, as JSON (docs/PROTOCOL.md, "Cluster membership").

use std::net::SocketAddr;

/// Where a node is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemberState {
    /// Registered, not yet serving (recovering its tier).
    Joining,
    /// Serving its keys.
    Serving,
    /// Moving its keys away before it leaves.
    Draining,
}

/// A tier's capacity and free bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TierSpace {
    /// Bytes of the tier.
    pub capacity: u64,
    /// Bytes not in use.
    pub free: u64,
}

/// A node's entry.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Member {
    /// `--node-id`.
    pub id: String,
    /// Shard `i` listens on `shards[i]`.
    pub shards: Vec<SocketAddr>,
    /// `--zone`; empty: unlabelled.
    pub zone: String,
    /// Its state.
    pub state: MemberState,
    /// The etcd revision at which this run of the node first registered: a restarted node has a greater one.
    pub epoch: i64,
    /// The DRAM tier.
    pub dram: TierSpace,
    /// The NVMe tier.
    pub nvme: TierSpace,
    /// Keys the node holds (as of its last refresh; absent from older entries: 0).
    #[serde(default)]
    pub keys: u64,
}

/// A cluster name or node id that cannot be one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} {name:?}: 1 to 64 bytes of letters, digits, '.', '_' or '-'")]
pub struct NameError {
    /// "cluster name" or "node id".
    pub what: &'static str,
    /// The name given.
    pub name: String,
}

/// Checks a cluster name or node id: it becomes a path segment of an etcd key.
pub fn validate_name(what: &'static str, name: &str) -> Result<(), NameError> {
    let allowed = |byte: u8| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-');
    if name.is_empty() || name.len() > 64 || !name.bytes().all(allowed) {
        return Err(NameError { what, name: name.to_string() });
    }
    Ok(())
}

/// The prefix of every member's key in `cluster`.
pub fn members_prefix(cluster: &str) -> String {
    format!("/strata/{cluster}/nodes/")
}

/// Node `id`'s key in `cluster`.
pub fn member_key(cluster: &str, id: &str) -> String {
    format!("{}{id}", members_prefix(cluster))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_path_segments() {
        assert!(validate_name("node id", "node-1.a_b").is_ok());
        for bad in ["", "a/b", "a b", "..\u{e9}", &"x".repeat(65)] {
            assert!(validate_name("node id", bad).is_err(), "{bad:?}");
        }
        assert_eq!(member_key("prod", "n1"), "/strata/prod/nodes/n1");
    }

    #[test]
    fn the_entry_is_the_documented_json() {
        let member = Member {
            id: "n1".into(),
            shards: vec!["10.0.0.1:7600".parse().unwrap()],
            zone: "a".into(),
            state: MemberState::Serving,
            epoch: 7,
            dram: TierSpace { capacity: 100, free: 60 },
            nvme: TierSpace { capacity: 1000, free: 1000 },
            keys: 3,
        };
        let json = serde_json::to_string(&member).unwrap();
        assert_eq!(
            json,
            r#"{"id":"n1","shards":["10.0.0.1:7600"],"zone":"a","state":"serving","epoch":7,"dram":{"capacity":100,"free":60},"nvme":{"capacity":1000,"free":1000},"keys":3}"#
        );
        assert_eq!(serde_json::from_str::<Member>(&json).unwrap(), member);
    }
}
