//! The I/O queues: Read, Write (in-capsule or R2T-driven), Flush, Write Zeroes, Dataset Management and
//! the Reservation commands, each command in its own task so that a slow device does not hold up the
//! queue. Every data command first passes its namespace's reservation (`reservations.rs`).

use std::rc::Rc;

use super::connection::Queue;
use super::registry::QueueCounters;
use crate::any_device::AnyDevice;
use crate::buffer::IoBuffer;
use crate::device::{BlockDevice, Geometry};
use crate::error::{BlockError, BlockErrorKind, BlockOp};
use crate::spec::{
    Command, IoOpcode, NvmeStatus, RESERVATION_KEYS_BYTES, SglDescriptor, decode_keys, get_u32, get_u64,
};

/// Dataset Management ranges are 16 bytes: context attributes, length in blocks, starting LBA.
const DSM_RANGE_BYTES: usize = 16;

pub(crate) async fn command(queue: Rc<Queue>, command: Command, data: Option<IoBuffer>) {
    let status = execute(&queue, &command, data).await;
    if let Err(status) = status {
        queue.log_error(&command, status);
        queue.respond(command.cid, status, 0);
    }
}

/// Runs a command; `Ok` when it has already been answered.
async fn execute(queue: &Rc<Queue>, command: &Command, data: Option<IoBuffer>) -> Result<(), NvmeStatus> {
    let device = queue.device(command.nsid).ok_or(NvmeStatus::INVALID_NAMESPACE.with_dnr())?;
    // LBAs are in the namespace's block size, which may be larger than the backing device's.
    let (block_bytes, capacity_bytes) = queue.namespace_format(command.nsid).ok_or(NvmeStatus::INVALID_NAMESPACE)?;
    let geometry = Geometry { logical_block_bytes: block_bytes, capacity_bytes, ..device.geometry() };
    let counters = &queue.counters;
    let (reservations, host) = queue.reservations(command.nsid).ok_or(NvmeStatus::INVALID_NAMESPACE)?;
    if let Some(write) = access(command.opcode) {
        reservations.check(&host, write)?;
    }
    match command.opcode {
        op if op == IoOpcode::Read as u8 => {
            let (offset, len) = transfer_range(queue, command, geometry)?;
            if command.sgl.identifier != SglDescriptor::TRANSPORT {
                return Err(NvmeStatus::SGL_TYPE_INVALID.with_dnr());
            }
            let (buffer, result) = device.read(queue.ctx.buffer_for(&device, len as usize), offset).await;
            result.map_err(|error| media_status(counters, &error))?;
            QueueCounters::add(&counters.reads, 1);
            QueueCounters::add(&counters.bytes_read, len);
            queue.respond_with_data(command, buffer);
        }
        op if op == IoOpcode::Write as u8 => {
            let (offset, len) = transfer_range(queue, command, geometry)?;
            let buffer = receive_data(queue, command, data, len as usize, &device).await?;
            let (buffer, result) = device.write(buffer, offset).await;
            queue.ctx.buffers.give(buffer);
            result.map_err(|error| media_status(counters, &error))?;
            QueueCounters::add(&counters.writes, 1);
            QueueCounters::add(&counters.bytes_written, len);
            queue.respond(command.cid, NvmeStatus::SUCCESS, 0);
        }
        op if op == IoOpcode::Flush as u8 => {
            device.flush().await.map_err(|error| media_status(counters, &error))?;
            queue.respond(command.cid, NvmeStatus::SUCCESS, 0);
        }
        op if op == IoOpcode::WriteZeroes as u8 => {
            let (offset, len) = lba_range(command.slba(), command.block_count(), geometry)?;
            device.write_zeroes(offset, len).await.map_err(|error| media_status(counters, &error))?;
            queue.respond(command.cid, NvmeStatus::SUCCESS, 0);
        }
        op if op == IoOpcode::DatasetManagement as u8 => {
            let ranges = (command.cdw(10) & 0xff) as usize + 1;
            let deallocate = command.cdw(11) & (1 << 2) != 0;
            let bytes = receive_data(queue, command, data, ranges * DSM_RANGE_BYTES, &device).await?;
            if deallocate {
                for range in bytes.as_slice().chunks_exact(DSM_RANGE_BYTES) {
                    let blocks = get_u32(range, 4);
                    if blocks == 0 {
                        continue;
                    }
                    let (offset, len) = lba_range(get_u64(range, 8), blocks, geometry)?;
                    device.deallocate(offset, len).await.map_err(|error| media_status(counters, &error))?;
                }
            }
            queue.respond(command.cid, NvmeStatus::SUCCESS, 0);
        }
        op if op == IoOpcode::ReservationRegister as u8 => {
            let (current, new) = keys(queue, command, data, RESERVATION_KEYS_BYTES, &device).await?;
            let cdw10 = command.cdw(10);
            let cntlid = queue.connected().map_or(0, |connected| connected.cntlid);
            let action = ((cdw10 & 7) as u8, cdw10 & 8 != 0, (cdw10 >> 30) as u8);
            reservations.register((&host, cntlid), action, (current, new))?;
            queue.respond(command.cid, NvmeStatus::SUCCESS, 0);
        }
        op if op == IoOpcode::ReservationAcquire as u8 => {
            let (current, preempt) = keys(queue, command, data, RESERVATION_KEYS_BYTES, &device).await?;
            reservations.acquire(&host, reservation_action(command), (current, preempt))?;
            queue.respond(command.cid, NvmeStatus::SUCCESS, 0);
        }
        op if op == IoOpcode::ReservationRelease as u8 => {
            let (current, _) = keys(queue, command, data, 8, &device).await?;
            reservations.release(&host, reservation_action(command), current)?;
            queue.respond(command.cid, NvmeStatus::SUCCESS, 0);
        }
        op if op == IoOpcode::ReservationReport as u8 => {
            // Hosts over Fabrics have 128-bit identifiers: only the extended structure (EDS) names them.
            if command.cdw(11) & 1 == 0 {
                return Err(NvmeStatus::HOST_ID_INCONSISTENT_FORMAT.with_dnr());
            }
            let wanted = (command.cdw(10) as usize + 1) * 4;
            if command.sgl.length as usize != wanted || wanted > queue.ctx.config.max_transfer_bytes as usize {
                return Err(NvmeStatus::SGL_LENGTH_INVALID.with_dnr());
            }
            let report = reservations.report().encode();
            let mut buffer = queue.ctx.buffer_for(&device, wanted);
            let len = report.len().min(wanted);
            buffer.as_mut_slice()[..len].copy_from_slice(&report[..len]);
            buffer.as_mut_slice()[len..].fill(0);
            queue.respond_with_data(command, buffer);
        }
        _ => return Err(NvmeStatus::INVALID_OPCODE.with_dnr()),
    }
    Ok(())
}

/// Whether a command is checked against the reservation as a write (`Some(true)`) or a read; `None` for
/// the Reservation commands themselves and opcodes this target does not serve (answered as such).
fn access(opcode: u8) -> Option<bool> {
    let writes = [IoOpcode::Write, IoOpcode::Flush, IoOpcode::WriteZeroes, IoOpcode::DatasetManagement];
    if opcode == IoOpcode::Read as u8 {
        Some(false)
    } else {
        writes.into_iter().any(|write| write as u8 == opcode).then_some(true)
    }
}

/// The action, Ignore Existing Key and type of an Acquire or Release (CDW10).
fn reservation_action(command: &Command) -> (u8, bool, u8) {
    let cdw10 = command.cdw(10);
    ((cdw10 & 7) as u8, cdw10 & 8 != 0, (cdw10 >> 8) as u8)
}

/// The keys a Reservation command carries as `len` bytes of data.
async fn keys(
    queue: &Rc<Queue>,
    command: &Command,
    data: Option<IoBuffer>,
    len: usize,
    device: &AnyDevice,
) -> Result<(u64, u64), NvmeStatus> {
    let bytes = receive_data(queue, command, data, len, device).await?;
    let keys = decode_keys(bytes.as_slice());
    queue.ctx.buffers.give(bytes);
    Ok(keys)
}

/// The byte range of a Read or Write, checked against the namespace, the SGL and MDTS.
fn transfer_range(queue: &Queue, command: &Command, geometry: Geometry) -> Result<(u64, u64), NvmeStatus> {
    let (offset, len) = lba_range(command.slba(), command.block_count(), geometry)?;
    if len > u64::from(queue.ctx.config.max_transfer_bytes) {
        return Err(NvmeStatus::INVALID_FIELD.with_dnr());
    }
    if u64::from(command.sgl.length) != len {
        return Err(NvmeStatus::SGL_LENGTH_INVALID.with_dnr());
    }
    Ok((offset, len))
}

fn lba_range(slba: u64, blocks: u32, geometry: Geometry) -> Result<(u64, u64), NvmeStatus> {
    let block_bytes = geometry.logical_block_bytes;
    let capacity_blocks = geometry.capacity_bytes / block_bytes;
    match slba.checked_add(u64::from(blocks)) {
        Some(end) if end <= capacity_blocks => Ok((slba * block_bytes, u64::from(blocks) * block_bytes)),
        _ => Err(NvmeStatus::LBA_OUT_OF_RANGE.with_dnr()),
    }
}

/// A write's data: the in-capsule data, or the data the host sends after an R2T.
async fn receive_data(
    queue: &Rc<Queue>,
    command: &Command,
    data: Option<IoBuffer>,
    len: usize,
    device: &AnyDevice,
) -> Result<IoBuffer, NvmeStatus> {
    if command.sgl.length as usize != len {
        return Err(NvmeStatus::SGL_LENGTH_INVALID.with_dnr());
    }
    match (command.sgl.identifier, data) {
        (SglDescriptor::IN_CAPSULE, Some(data)) if data.len() == len && command.sgl.address == 0 => Ok(data),
        (SglDescriptor::IN_CAPSULE, _) => Err(NvmeStatus::SGL_LENGTH_INVALID.with_dnr()),
        (SglDescriptor::TRANSPORT, None) => {
            let receiver = queue.request_data(command.cid, queue.ctx.buffer_for(device, len));
            // `None`: the connection ended before the data came; nobody is left to answer.
            receiver.recv().await.ok_or(NvmeStatus::ABORTED_SQ_DELETION)?
        }
        (SglDescriptor::TRANSPORT, Some(_)) => Err(NvmeStatus::SGL_OFFSET_INVALID.with_dnr()),
        _ => Err(NvmeStatus::SGL_TYPE_INVALID.with_dnr()),
    }
}

/// The NVMe status for a device error, counted as a media error when the medium failed.
fn media_status(counters: &QueueCounters, error: &BlockError) -> NvmeStatus {
    match error.kind {
        BlockErrorKind::OutOfRange { .. } => NvmeStatus::LBA_OUT_OF_RANGE.with_dnr(),
        BlockErrorKind::Unaligned { .. } | BlockErrorKind::TooLarge { .. } => NvmeStatus::INVALID_FIELD.with_dnr(),
        _ => {
            QueueCounters::add(&counters.media_errors, 1);
            match error.op {
                BlockOp::Read => NvmeStatus::UNRECOVERED_READ_ERROR,
                _ => NvmeStatus::WRITE_FAULT,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_pass_the_reservation_and_nothing_else_does() {
        assert_eq!(access(IoOpcode::Read as u8), Some(false));
        for write in [IoOpcode::Write, IoOpcode::Flush, IoOpcode::WriteZeroes, IoOpcode::DatasetManagement] {
            assert_eq!(access(write as u8), Some(true), "{write:?}");
        }
        for other in [IoOpcode::ReservationRegister as u8, IoOpcode::ReservationReport as u8, 0x7c] {
            assert_eq!(access(other), None, "{other:#x}");
        }
    }
}
