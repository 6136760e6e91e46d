//! Tenants: who a connection is, which keys it may name, and how many bytes it may hold per tier.
//!
//! A connection authenticates at HELLO with its tenant's token (compared in constant time against every
//! configured token, so the time taken says nothing about which one, if any, came close). From then on
//! every key it sends is *scoped*: the node prefixes it with the tenant's 4-byte id before hashing,
//! storing or comparing it, and strips the prefix from what it sends back (events). A tenant therefore
//! cannot name, read, remove, test for or observe another tenant's keys: they are different keys.
//!
//! The id is a hash of the tenant's name (not its position in the config), so reordering the config does
//! not reassign stored data; two names with one id are refused at start-up. Without configured tenants the
//! node is open: keys are not prefixed (id 0) and the start-up summary says so.

use std::borrow::Cow;

/// A tenant as configured (quotas are for the whole node; each shard enforces its share).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantConfig {
    /// Its name (metrics, logs; its id is derived from it).
    pub name: String,
    /// The token its clients present in HELLO.
    pub token: Vec<u8>,
    /// The most DRAM bytes (keys and values) its objects may take; none: no limit but the tier's.
    pub dram_quota: Option<u64>,
    /// The most NVMe bytes its objects may take.
    pub nvme_quota: Option<u64>,
    /// The most bytes of its objects that may be pinned.
    pub max_pinned: Option<u64>,
}

/// The id of the open node's single implicit tenant.
pub const OPEN_TENANT: u32 = 0;
/// Bytes of the prefix a tenant's keys carry inside the node.
pub const TENANT_PREFIX_BYTES: usize = 4;

/// The id of the tenant named `name`: 32 bits of FNV-1a, never 0.
pub fn tenant_id(name: &str) -> u32 {
    let hash = strata_proto::fnv1a_64(name.as_bytes());
    ((hash ^ (hash >> 32)) as u32).max(1)
}

/// What a connection acts as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    /// The tenant's id (0: open node).
    pub id: u32,
    /// The tenant's name ("open" on an open node).
    pub name: String,
    prefix: Vec<u8>,
    /// This shard's share of the tenant's quotas.
    pub quotas: Quotas,
}

/// A tenant's limits on one shard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quotas {
    /// DRAM bytes.
    pub dram: Option<u64>,
    /// NVMe bytes.
    pub nvme: Option<u64>,
    /// Pinned bytes.
    pub pinned: Option<u64>,
}

impl Scope {
    /// The open node's scope: keys as they are.
    pub fn open() -> Self {
        Self { id: OPEN_TENANT, name: "open".into(), prefix: Vec::new(), quotas: Quotas::default() }
    }

    /// `key` as the node stores it.
    pub fn scoped<'a>(&self, key: &'a [u8]) -> Cow<'a, [u8]> {
        if self.prefix.is_empty() { Cow::Borrowed(key) } else { Cow::Owned(self.prefixed(key)) }
    }

    /// `key`, received into a vector of its own, as the node stores it (no copy on an open node).
    pub fn scoped_owned(&self, key: Vec<u8>) -> Vec<u8> {
        if self.prefix.is_empty() { key } else { self.prefixed(&key) }
    }

    fn prefixed(&self, key: &[u8]) -> Vec<u8> {
        let mut scoped = Vec::with_capacity(self.prefix.len() + key.len());
        scoped.extend_from_slice(&self.prefix);
        scoped.extend_from_slice(key);
        scoped
    }

    /// The prefix of this tenant's stored keys (empty on an open node).
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }
}

/// The tenant a stored (scoped) key belongs to.
pub fn tenant_of(key: &[u8], tenanted: bool) -> u32 {
    match key.get(..TENANT_PREFIX_BYTES) {
        Some(prefix) if tenanted => u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]),
        _ => OPEN_TENANT,
    }
}

/// Why a set of tenants is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TenantError {
    /// A tenant has no token.
    #[error("tenant {0:?} has an empty token")]
    EmptyToken(String),
    /// Two tenants' names give the same id.
    #[error("tenants {0:?} and {1:?} have the same id: rename one")]
    SameId(String, String),
    /// Two tenants have one token.
    #[error("tenant {0:?} shares its token with another tenant")]
    SharedToken(String),
}

/// The node's tenants.
#[derive(Clone, Debug, Default)]
pub struct Tenancy {
    scopes: Vec<(Vec<u8>, Scope)>,
}

impl Tenancy {
    /// The tenants of `configs`, each quota split between `shards`; refuses duplicate names, empty
    /// tokens and ids that collide.
    pub fn new(configs: &[TenantConfig], shards: u32) -> Result<Self, TenantError> {
        let mut scopes: Vec<(Vec<u8>, Scope)> = Vec::new();
        let share = |quota: Option<u64>| quota.map(|bytes| bytes / u64::from(shards.max(1)));
        for config in configs {
            if config.token.is_empty() {
                return Err(TenantError::EmptyToken(config.name.clone()));
            }
            let id = tenant_id(&config.name);
            if let Some((_, other)) = scopes.iter().find(|(_, scope)| scope.id == id) {
                return Err(TenantError::SameId(other.name.clone(), config.name.clone()));
            }
            if scopes.iter().any(|(token, _)| *token == config.token) {
                return Err(TenantError::SharedToken(config.name.clone()));
            }
            let quotas = Quotas {
                dram: share(config.dram_quota),
                nvme: share(config.nvme_quota),
                pinned: share(config.max_pinned),
            };
            let scope = Scope { id, name: config.name.clone(), prefix: id.to_le_bytes().to_vec(), quotas };
            scopes.push((config.token.clone(), scope));
        }
        Ok(Self { scopes })
    }

    /// Whether tenants are configured (else the node is open).
    pub fn is_tenanted(&self) -> bool {
        !self.scopes.is_empty()
    }

    /// The scope of the tenant whose token is `presented`. Every token is compared in full, whatever
    /// matched, so the time does not depend on which one did.
    pub fn authenticate(&self, presented: &[u8]) -> Option<Scope> {
        if self.scopes.is_empty() {
            return Some(Scope::open());
        }
        let mut found = None;
        for (token, scope) in &self.scopes {
            if tokens_match(token, presented) {
                found = Some(scope);
            }
        }
        found.cloned()
    }

    /// The names of the tenants, for the start-up summary.
    pub fn names(&self) -> Vec<&str> {
        self.scopes.iter().map(|(_, scope)| scope.name.as_str()).collect()
    }

    /// A tenant's name by id (metrics).
    pub fn name_of(&self, id: u32) -> Option<&str> {
        self.scopes.iter().find(|(_, scope)| scope.id == id).map(|(_, scope)| scope.name.as_str())
    }

    /// A tenant's quotas on one shard, by id.
    pub fn quotas_of(&self, id: u32) -> Quotas {
        self.scopes.iter().find(|(_, scope)| scope.id == id).map_or_else(Quotas::default, |(_, scope)| scope.quotas)
    }
}

/// Constant time in the tokens' content: every byte is compared, whatever the first difference.
fn tokens_match(expected: &[u8], presented: &[u8]) -> bool {
    let mut difference = u8::from(expected.len() != presented.len());
    for index in 0..expected.len().max(presented.len()) {
        difference |= expected.get(index).copied().unwrap_or(0) ^ presented.get(index).copied().unwrap_or(0xff);
    }
    difference == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str, token: &str) -> TenantConfig {
        TenantConfig {
            name: name.into(),
            token: token.as_bytes().to_vec(),
            dram_quota: Some(1000),
            nvme_quota: None,
            max_pinned: None,
        }
    }

    #[test]
    fn tokens_pick_their_tenant_and_scope_keys_apart() {
        let tenancy = Tenancy::new(&[tenant("a", "token-a"), tenant("b", "token-b")], 2).expect("tenancy");
        let a = tenancy.authenticate(b"token-a").expect("a");
        let b = tenancy.authenticate(b"token-b").expect("b");
        assert!(tenancy.authenticate(b"token-c").is_none());
        assert!(tenancy.authenticate(b"token-").is_none());
        assert!(tenancy.authenticate(b"").is_none());
        assert_ne!(a.scoped(b"key"), b.scoped(b"key"));
        assert_eq!(tenant_of(&a.scoped(b"key"), true), a.id);
        assert_eq!(a.quotas.dram, Some(500), "half per shard");
        let open = Tenancy::default().authenticate(b"anything").expect("open");
        assert_eq!(open.scoped(b"key"), &b"key"[..]);
        assert!(Tenancy::new(&[tenant("a", "x"), tenant("a", "y")], 1).is_err());
        assert!(Tenancy::new(&[tenant("a", "x"), tenant("b", "x")], 1).is_err());
        assert!(Tenancy::new(&[tenant("a", "")], 1).is_err());
    }
}
