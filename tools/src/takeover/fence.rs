//! Fencing at the target with NVMe reservations: the holder of a tier registers its key (the claim's epoch)
//! on each namespace and holds an Exclusive Access reservation, so the target refuses every other host's
//! reads and writes; a claimer preempts the previous holder's key, which fences that holder at once. A
//! holder never releases: a node that took a tier over and released it in etcd keeps the reservation, so
//! the fenced node stays fenced until the next claimer preempts it in turn.

use anyhow::{Context, anyhow};
use strata_nvme::host::node_host_id;
use strata_nvme::spec::{AcquireAction, RegisterAction, ReservationType};
use strata_nvme::{HostOptions, NvmfAddress, NvmfDevice};

use crate::pool::run_on_executor;

/// Exclusive Access: only the holder reads or writes, so a fenced node cannot even serve stale reads.
const RTYPE: ReservationType = ReservationType::ExclusiveAccess;

/// Who node `node_id` of `cluster` is to a target: the machine's Host NQN (what allow-lists name), and a
/// Host Identifier of its own, so that nodes sharing a machine are distinct reservation holders.
pub fn node_host(cluster: &str, node_id: &str) -> HostOptions {
    let machine = HostOptions::default();
    let host_id = node_host_id(&machine.host_id, &format!("{cluster}/{node_id}"));
    // Fencing's connections are short: no keep-alive (the engine's own keep theirs, `engine_host`).
    HostOptions { host_id, keep_alive_ms: 0, ..machine }
}

/// The same host, as the engine connects it: with the default keep-alive.
pub fn engine_host(host: &HostOptions) -> HostOptions {
    HostOptions { keep_alive_ms: HostOptions::default().keep_alive_ms, ..host.clone() }
}

/// Takes each namespace's reservation with `key`, preempting `previous` (0: nobody to preempt).
pub fn hold(namespaces: &[NvmfAddress], host: &HostOptions, key: u64, previous: u64) -> anyhow::Result<()> {
    let (namespaces, host) = (namespaces.to_vec(), host.clone());
    run_on_executor(move || async move {
        for address in &namespaces {
            let device = NvmfDevice::connect(address, &host, 1).await.with_context(|| format!("connect {address}"))?;
            device.reservation_register(RegisterAction::Replace, true, 0, key).await?;
            let acquired = device.reservation_acquire(AcquireAction::Acquire, RTYPE, key, 0).await;
            if let Err(error) = acquired {
                if previous == 0 || previous == key {
                    return Err(anyhow!("{address}: another host holds the reservation: {error}"));
                }
                device
                    .reservation_acquire(AcquireAction::Preempt, RTYPE, key, previous)
                    .await
                    .with_context(|| format!("{address}: preempting key {previous}"))?;
            }
        }
        Ok(())
    })
}
