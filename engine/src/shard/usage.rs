//! What each tenant's objects take on this shard, by tier, against its quotas.

use std::cell::RefCell;
use std::collections::HashMap;

use super::Shard;
use crate::backend::Backend;
use crate::tenants::{Quotas, Tenancy, tenant_of};

/// The node's tenants and what each one's objects take on this shard.
pub struct TenantBook {
    /// The tenants, their tokens and quotas.
    pub(super) tenancy: Tenancy,
    /// Usage by tenant id.
    pub(super) usage: RefCell<HashMap<u32, TenantUsage>>,
}

impl TenantBook {
    pub(super) fn new(tenancy: Tenancy) -> Self {
        Self { tenancy, usage: RefCell::new(HashMap::new()) }
    }
}

/// Bytes (keys and values) a tenant's objects take on this shard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantUsage {
    /// In the DRAM tier.
    pub dram: u64,
    /// On the NVMe tier.
    pub nvme: u64,
    /// Pinned (hard or soft).
    pub pinned: u64,
}

/// A tier whose usage changes.
#[derive(Clone, Copy)]
pub(super) enum Use {
    Dram,
    Nvme,
    Pinned,
}

impl<E: Backend> Shard<E> {
    /// Adds (or with `charge` false, takes back) `bytes` of `key`'s tenant's usage of `tier`.
    pub(super) fn account(&self, key: &[u8], tier: Use, bytes: u64, charge: bool) {
        // An open node has no quotas and exports no per-tenant usage: nothing to count (a few percent of
        // a small put's CPU otherwise).
        if !self.tenants.tenancy.is_tenanted() {
            return;
        }
        self.account_tenant(tenant_of(key, true), tier, bytes, charge);
    }

    /// Counts `bytes` of `tier` to (or, not `charge`, off) `tenant`'s usage.
    pub(super) fn account_tenant(&self, tenant: u32, tier: Use, bytes: u64, charge: bool) {
        let mut usage = self.tenants.usage.borrow_mut();
        let entry = usage.entry(tenant).or_default();
        let field = match tier {
            Use::Dram => &mut entry.dram,
            Use::Nvme => &mut entry.nvme,
            Use::Pinned => &mut entry.pinned,
        };
        *field = if charge { *field + bytes } else { field.saturating_sub(bytes) };
    }

    /// Bytes each tenant's objects take on this shard (metrics).
    #[cfg(test)]
    pub fn tenant_usage(&self) -> Vec<(u32, TenantUsage)> {
        self.tenants.usage.borrow().iter().map(|(&tenant, &usage)| (tenant, usage)).collect()
    }

    pub(super) fn usage_of(&self, key: &[u8]) -> (TenantUsage, Quotas) {
        if !self.tenants.tenancy.is_tenanted() {
            return (TenantUsage::default(), Quotas::default());
        }
        let tenant = tenant_of(key, true);
        (self.tenants.usage.borrow().get(&tenant).copied().unwrap_or_default(), self.tenants.tenancy.quotas_of(tenant))
    }
}

#[cfg(test)]
mod tests {
    use strata_proto::{Pin, Status, WritePolicy};

    use crate::sim::testing::{TestTier, put, value};
    use crate::tenants::TenantConfig;

    fn tenant(name: &str, dram_quota: Option<u64>) -> TenantConfig {
        TenantConfig {
            name: name.into(),
            token: format!("token-{name}").into_bytes(),
            dram_quota,
            nvme_quota: None,
            max_pinned: None,
        }
    }

    #[test]
    fn each_tenant_is_charged_for_its_own_objects_and_held_to_its_quota() {
        let tier = TestTier::new(|config| config.tenants = vec![tenant("a", Some(64 << 10)), tenant("b", None)]);
        tier.life(async |shard, _| {
            let a = shard.tenancy().authenticate(b"token-a").expect("a");
            let b = shard.tenancy().authenticate(b"token-b").expect("b");
            let key_a = a.scoped(b"k").into_owned();
            put(&shard, &key_a, &value(1, 40_000), WritePolicy::WriteThrough, Pin::None).await.expect("a's put");
            put(&shard, &b.scoped(b"k"), &value(2, 100_000), WritePolicy::WriteThrough, Pin::None).await.expect("b's");
            let usage: std::collections::HashMap<u32, _> = shard.tenant_usage().into_iter().collect();
            let of = |scope: &crate::tenants::Scope| usage[&crate::tenants::tenant_of(&scope.scoped(b"k"), true)];
            assert_eq!(of(&a).dram, key_a.len() as u64 + 40_000);
            assert_eq!(of(&b).dram, key_a.len() as u64 + 100_000);
            // a's second object is past its 64 KiB quota together with the first: the first makes room.
            put(&shard, &a.scoped(b"k2"), &value(3, 40_000), WritePolicy::WriteThrough, Pin::None).await.expect("put");
            let usage: std::collections::HashMap<u32, _> = shard.tenant_usage().into_iter().collect();
            assert!(usage[&crate::tenants::tenant_of(&key_a, true)].dram <= 64 << 10);
            let too_big = put(&shard, &a.scoped(b"big"), &value(4, 70_000), WritePolicy::WriteThrough, Pin::None).await;
            assert_eq!(too_big, Err(Status::Quota));
        });
    }
}
