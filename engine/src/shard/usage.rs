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
