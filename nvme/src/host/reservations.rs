//! Reservations from the host's side (NVMe Base 2.0, 8.19): a node that takes a namespace over registers
//! its key, preempts the previous owner's, and so fences it at the target. The host is named by
//! `HostOptions::host_id`, which Connect gives the controller.

use super::NvmfError;
use super::device::NvmfDevice;
use crate::buffer::IoBuffer;
use crate::spec::{
    AcquireAction, Command, IoOpcode, RESERVATION_KEYS_BYTES, RegisterAction, ReleaseAction, ReservationStatus,
    ReservationType, encode_keys, reservation_cdw10,
};

/// Bytes asked for by a report: the header and up to 63 registrants.
const REPORT_BYTES: usize = 4096;

impl NvmfDevice {
    /// Reservation Register: register `new`, unregister, or replace `current` with `new`
    /// (`ignore_existing_key`: without checking `current`).
    pub async fn reservation_register(
        &self,
        action: RegisterAction,
        ignore_existing_key: bool,
        current: u64,
        new: u64,
    ) -> Result<(), NvmfError> {
        let cdw10 = reservation_cdw10(action as u8, ignore_existing_key, None);
        let data = encode_keys(current, new);
        self.reservation_command("Reservation Register", IoOpcode::ReservationRegister, cdw10, &data).await.map(drop)
    }

    /// Reservation Acquire of type `rtype` with this host's key `current`: acquire, or preempt the
    /// registrants of key `preempt` (the holder's key: take the reservation from it).
    pub async fn reservation_acquire(
        &self,
        action: AcquireAction,
        rtype: ReservationType,
        current: u64,
        preempt: u64,
    ) -> Result<(), NvmfError> {
        let cdw10 = reservation_cdw10(action as u8, false, Some(rtype));
        let data = encode_keys(current, preempt);
        self.reservation_command("Reservation Acquire", IoOpcode::ReservationAcquire, cdw10, &data).await.map(drop)
    }

    /// Reservation Release of type `rtype` with this host's key `current`: release, or clear every
    /// registration.
    pub async fn reservation_release(
        &self,
        action: ReleaseAction,
        rtype: ReservationType,
        current: u64,
    ) -> Result<(), NvmfError> {
        let cdw10 = reservation_cdw10(action as u8, false, Some(rtype));
        let data = encode_keys(current, 0);
        self.reservation_command("Reservation Release", IoOpcode::ReservationRelease, cdw10, &data[..8]).await.map(drop)
    }

    /// Reservation Report (the extended structure: 128-bit Host Identifiers).
    pub async fn reservation_report(&self) -> Result<ReservationStatus, NvmfError> {
        let mut command = Command::new(IoOpcode::ReservationReport as u8, 0);
        command.nsid = self.nsid();
        command.set_cdw(10, (REPORT_BYTES / 4 - 1) as u32);
        command.set_cdw(11, 1);
        let buffer = IoBuffer::aligned(REPORT_BYTES, 4096);
        let data = self.submit_raw("Reservation Report", command, None, Some(buffer)).await?;
        let data = data.ok_or_else(|| NvmfError::Protocol("a Reservation Report without its data".into()))?;
        ReservationStatus::decode(data.as_slice())
            .ok_or_else(|| NvmfError::Protocol("a Reservation Report shorter than its header".into()))
    }

    async fn reservation_command(
        &self,
        name: &'static str,
        opcode: IoOpcode,
        cdw10: u32,
        keys: &[u8],
    ) -> Result<Option<IoBuffer>, NvmfError> {
        debug_assert!(keys.len() <= RESERVATION_KEYS_BYTES);
        let mut command = Command::new(opcode as u8, 0);
        command.nsid = self.nsid();
        command.set_cdw(10, cdw10);
        let mut data = IoBuffer::aligned(keys.len(), 8);
        data.as_mut_slice().copy_from_slice(keys);
        self.submit_raw(name, command, Some(data), None).await
    }
}
