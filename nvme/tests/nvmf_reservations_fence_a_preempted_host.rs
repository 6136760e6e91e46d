//! Reservations between Strata's host and target, the way a node takes over a dead node's namespace: the
//! owner registers its key and holds the namespace Exclusive Access - Registrants Only; a survivor
//! registers, preempts the owner's key and takes the reservation; from then on the owner's writes and
//! reads fail with Reservation Conflict (its registration is gone, and it does not come back with a new
//! connection), while the survivor reads what the owner wrote. A host that never registered is refused
//! throughout; Report names the registrants by their Host Identifiers; Release and Clear free the namespace.

use glommio::{LocalExecutorBuilder, Placement};
use strata_nvme::spec::{
    AcquireAction, ControllerIdentity, NvmeStatus, RegisterAction, ReleaseAction, ReservationType,
};
use strata_nvme::target::{self, NamespaceBackend, NamespaceConfig, SubsystemConfig, TargetConfig};
use strata_nvme::{BlockDevice, BlockErrorKind, HostOptions, NvmfAddress, NvmfDevice, NvmfError};

const NQN: &str = "nqn.2026-12.io.strata:pool";
const EA_RO: ReservationType = ReservationType::ExclusiveAccessRegistrantsOnly;
const OWNER: [u8; 16] = [0xa; 16];
const SURVIVOR: [u8; 16] = [0xb; 16];
const STRANGER: [u8; 16] = [0xc; 16];

fn host(id: [u8; 16], name: &str) -> HostOptions {
    HostOptions { host_id: id, hostnqn: format!("nqn.2026-12.io.strata:{name}"), ..HostOptions::default() }
}

fn conflict<T: std::fmt::Debug>(result: Result<T, NvmfError>) -> bool {
    matches!(result, Err(NvmfError::Status { status, .. }) if status == NvmeStatus::RESERVATION_CONFLICT)
}

fn io_conflict(result: strata_nvme::BlockResult<()>) -> bool {
    matches!(result, Err(error) if matches!(error.kind, BlockErrorKind::Nvme(status) if status == NvmeStatus::RESERVATION_CONFLICT))
}

#[test]
fn a_preempted_owner_is_fenced_and_the_survivor_serves_its_data() {
    let namespace = NamespaceConfig { backend: NamespaceBackend::Memory { bytes: 16 << 20 }, block_bytes: 4096 };
    let subsystem = SubsystemConfig { nqn: NQN.into(), namespaces: vec![namespace], allowed_hosts: Vec::new() };
    let target = target::start(TargetConfig::new("127.0.0.1:0".parse().unwrap(), vec![subsystem])).unwrap();
    let address = NvmfAddress::tcp(target.local_addr(), NQN, 1);
    LocalExecutorBuilder::new(Placement::Unbound)
        .spawn(move || async move {
            let owner = NvmfDevice::connect(&address, &host(OWNER, "owner"), 1).await.unwrap();
            let survivor = NvmfDevice::connect(&address, &host(SURVIVOR, "survivor"), 1).await.unwrap();
            let stranger = NvmfDevice::connect(&address, &host(STRANGER, "stranger"), 1).await.unwrap();
            let oncs = owner.controller().unwrap().identity.oncs;
            assert_ne!(oncs & ControllerIdentity::ONCS_RESERVATIONS, 0, "the controller says it has reservations");

            owner.reservation_register(RegisterAction::Register, false, 0, 0xa11ce).await.unwrap();
            owner.reservation_acquire(AcquireAction::Acquire, EA_RO, 0xa11ce, 0).await.unwrap();
            let mut block = owner.alloc_buffer(4096);
            block.as_mut_slice().fill(0x5a);
            let (_, written) = owner.write(block, 0).await;
            written.unwrap();
            assert!(io_conflict(stranger.read(stranger.alloc_buffer(4096), 0).await.1), "not a registrant");
            assert!(conflict(stranger.reservation_acquire(AcquireAction::Acquire, EA_RO, 1, 0).await));

            survivor.reservation_register(RegisterAction::Register, false, 0, 0xb0b).await.unwrap();
            assert!(conflict(survivor.reservation_acquire(AcquireAction::Acquire, EA_RO, 0xb0b, 0).await));
            assert!(conflict(survivor.reservation_acquire(AcquireAction::Preempt, EA_RO, 0xbad, 0xa11ce).await));
            survivor.reservation_acquire(AcquireAction::Preempt, EA_RO, 0xb0b, 0xa11ce).await.unwrap();

            // The owner is fenced: its writes and reads conflict, on this connection and a new one.
            let (_, write) = owner.write(owner.alloc_buffer(4096), 0).await;
            assert!(io_conflict(write), "a fenced owner's write");
            assert!(io_conflict(owner.read(owner.alloc_buffer(4096), 0).await.1), "a fenced owner's read");
            assert!(io_conflict(owner.flush().await), "a fenced owner's flush");
            let again = NvmfDevice::connect(&address, &host(OWNER, "owner"), 1).await.unwrap();
            assert!(io_conflict(again.write(again.alloc_buffer(4096), 4096).await.1), "after reconnecting");
            assert!(conflict(again.reservation_acquire(AcquireAction::Acquire, EA_RO, 0xa11ce, 0).await));

            let (data, read) = survivor.read(survivor.alloc_buffer(4096), 0).await;
            read.unwrap();
            assert!(data.as_slice().iter().all(|&byte| byte == 0x5a), "the survivor reads what the owner wrote");
            let report = survivor.reservation_report().await.unwrap();
            assert_eq!(report.rtype, Some(EA_RO));
            let registrants: Vec<([u8; 16], u64, bool)> =
                report.registrants.iter().map(|r| (r.host_id, r.key, r.holds)).collect();
            assert_eq!(registrants, vec![(SURVIVOR, 0xb0b, true)]);
            assert_eq!(report.generation, 3, "two registrations and a preemption");

            // Release frees the namespace; the owner may register and take it again, then Clear ends all.
            survivor.reservation_release(ReleaseAction::Release, EA_RO, 0xb0b).await.unwrap();
            again.write(again.alloc_buffer(4096), 4096).await.1.unwrap();
            again.reservation_register(RegisterAction::Register, false, 0, 0xa11ce).await.unwrap();
            again.reservation_acquire(AcquireAction::Acquire, EA_RO, 0xa11ce, 0).await.unwrap();
            assert!(io_conflict(stranger.write(stranger.alloc_buffer(4096), 0).await.1));
            again.reservation_release(ReleaseAction::Clear, EA_RO, 0xa11ce).await.unwrap();
            stranger.write(stranger.alloc_buffer(4096), 0).await.1.unwrap();
            assert!(survivor.reservation_report().await.unwrap().registrants.is_empty());
        })
        .unwrap()
        .join()
        .unwrap();
    target.stop();
}
