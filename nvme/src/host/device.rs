//! [`NvmfDevice`]: a namespace of a remote controller as a [`BlockDevice`].

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Instant;

use glommio::sync::Semaphore;

use super::controller::{AdminQueue, ControllerInfo, connect_queue};
use super::queue::HostQueue;
use super::{HostOptions, NvmfAddress, NvmfError, NvmfTransport};
use crate::buffer::IoBuffer;
use crate::device::{BlockDevice, Geometry};
use crate::error::{BlockError, BlockErrorKind, BlockOp, BlockResult};
use crate::spec::{Command, Completion, IoOpcode, cap};

/// The most blocks one Read / Write / Write Zeroes names (NLB is 16 bits, 0's based).
const MAX_BLOCKS_PER_COMMAND: u64 = 1 << 16;
/// Transfers are capped here even when the controller sets no MDTS.
const MAX_TRANSFER_CAP: u64 = 8 << 20;
/// How many times a block command is sent again after its queue broke under it (Linux's
/// `nvme_max_retries`): enough to ride out a reconnect or two, few enough to end on a path that keeps breaking.
const SENDS_AFTER_A_BREAK: u32 = 5;

/// What the executors using one controller share: where it is and which queue IDs are taken.
#[derive(Debug)]
struct ControllerShare {
    address: NvmfAddress,
    options: HostOptions,
    geometry: Geometry,
    in_capsule_bytes: usize,
    io_queues: u16,
    cntlid: AtomicU16,
    next_qid: AtomicU16,
}

/// A `Send` handle for opening more I/O queues of a controller on other executors
/// ([`NvmfDevice::attach`]).
#[derive(Clone, Debug)]
pub struct IoQueueHandle(Arc<ControllerShare>);

/// A remote namespace: one I/O queue on this executor (and, for the device that connected, the
/// controller's admin queue and keep-alive).
pub struct NvmfDevice {
    name: String,
    share: Arc<ControllerShare>,
    qid: u16,
    admin: RefCell<Option<AdminQueue>>,
    io: RefCell<Rc<HostQueue>>,
    reconnecting: Semaphore,
}

fn remote_error(op: BlockOp, name: &str, offset: u64, error: NvmfError) -> BlockError {
    let kind = match error {
        NvmfError::Status { status, .. } => BlockErrorKind::Nvme(status),
        other => BlockErrorKind::Remote(other.to_string()),
    };
    BlockError::new(op, name, offset, kind)
}

impl NvmfDevice {
    /// Connects to the controller of `address`, asks for `io_queues` I/O queues (one per executor that
    /// will use it), identifies the namespace and opens I/O queue 1 on this executor.
    /// The address's own settings ([`NvmfAddress::settings`]) override `options`.
    pub async fn connect(address: &NvmfAddress, options: &HostOptions, io_queues: u16) -> Result<Self, NvmfError> {
        let options = &address.settings.apply(options);
        let admin =
            AdminQueue::connect((address.transport, address.addr), &address.subnqn, options, io_queues.max(1)).await?;
        let namespace = admin.namespace(address.nsid).await?;
        if namespace.nsze == 0 {
            // Identify returns zeroes for an NSID that is valid but not active.
            return Err(NvmfError::Protocol(format!(
                "namespace {} is not active on {} ({} namespaces at most)",
                address.nsid, address.subnqn, admin.info.identity.nn
            )));
        }
        let block_bytes = namespace
            .logical_block_bytes()
            .ok_or_else(|| NvmfError::Protocol(format!("namespace {} has no usable LBA format", address.nsid)))?;
        let info = &admin.info;
        let max_transfer = info
            .identity
            .max_transfer_bytes()
            .unwrap_or(MAX_TRANSFER_CAP)
            .min(MAX_TRANSFER_CAP)
            .min(MAX_BLOCKS_PER_COMMAND * block_bytes);
        let geometry = Geometry {
            capacity_bytes: namespace.nsze * block_bytes,
            logical_block_bytes: block_bytes,
            max_transfer_bytes: max_transfer,
            buffer_alignment_bytes: 8,
        };
        // A deeper queue than the controller offers would be refused at Connect; use what it offers.
        let queue_entries = options.queue_entries.min(cap::max_queue_entries(info.cap).min(u32::from(u16::MAX)) as u16);
        let share = Arc::new(ControllerShare {
            address: address.clone(),
            options: HostOptions { queue_entries, ..options.clone() },
            geometry,
            in_capsule_bytes: info.identity.in_capsule_data_bytes(),
            io_queues: info.io_queues,
            cntlid: AtomicU16::new(info.cntlid),
            next_qid: AtomicU16::new(2),
        });
        let io = open_io_queue(&share, 1).await?;
        Ok(Self {
            name: format!("nvmf:{}/{}/ns{}", address.addr, address.subnqn, address.nsid),
            share,
            qid: 1,
            admin: RefCell::new(Some(admin)),
            io: RefCell::new(io),
            reconnecting: Semaphore::new(1),
        })
    }

    /// A handle to open more I/O queues of this controller on other executors.
    pub fn io_queue_handle(&self) -> IoQueueHandle {
        IoQueueHandle(Arc::clone(&self.share))
    }

    /// Opens another I/O queue of the controller behind `handle`, on this executor.
    pub async fn attach(handle: &IoQueueHandle) -> Result<Self, NvmfError> {
        let share = Arc::clone(&handle.0);
        let qid = share.next_qid.fetch_add(1, Ordering::SeqCst);
        if qid > share.io_queues {
            return Err(NvmfError::Protocol(format!(
                "the controller granted {} I/O queues; connect with more for more executors",
                share.io_queues
            )));
        }
        let io = open_io_queue(&share, qid).await?;
        let address = &share.address;
        Ok(Self {
            name: format!("nvmf:{}/{}/ns{}", address.addr, address.subnqn, address.nsid),
            share,
            qid,
            admin: RefCell::new(None),
            io: RefCell::new(io),
            reconnecting: Semaphore::new(1),
        })
    }

    /// The controller as Identify described it (on the device that connected it).
    pub fn controller(&self) -> Option<ControllerInfo> {
        self.admin.borrow().as_ref().map(|admin| admin.info.clone())
    }

    /// The queue to use, reconnecting first when the current one broke.
    async fn queue(&self) -> Result<Rc<HostQueue>, NvmfError> {
        let current = Rc::clone(&self.io.borrow());
        let Some(reason) = current.broken() else { return Ok(current) };
        let _permit = self.reconnecting.acquire_permit(1).await.map_err(|_| NvmfError::Disconnected(reason.clone()))?;
        let current = Rc::clone(&self.io.borrow());
        if current.broken().is_none() {
            return Ok(current); // another task reconnected while this one waited
        }
        let options = &self.share.options;
        let deadline = Instant::now() + options.controller_loss_timeout;
        let mut last;
        loop {
            match self.reconnect().await {
                Ok(queue) => {
                    *self.io.borrow_mut() = Rc::clone(&queue);
                    return Ok(queue);
                }
                Err(error) => last = error.to_string(),
            }
            if Instant::now() + options.reconnect_delay > deadline {
                return Err(NvmfError::ControllerLost { after: options.controller_loss_timeout, last });
            }
            glommio::timer::sleep(options.reconnect_delay).await;
        }
    }

    async fn reconnect(&self) -> Result<Rc<HostQueue>, NvmfError> {
        let share = &self.share;
        let owns_admin = self.admin.borrow().is_some();
        if owns_admin {
            let admin_broken = self.admin.borrow().as_ref().and_then(|admin| admin.queue.broken()).is_some();
            if admin_broken {
                let admin = AdminQueue::connect(
                    (share.address.transport, share.address.addr),
                    &share.address.subnqn,
                    &share.options,
                    share.io_queues,
                )
                .await?;
                share.cntlid.store(admin.info.cntlid, Ordering::SeqCst);
                *self.admin.borrow_mut() = Some(admin);
            }
        }
        let opened = open_io_queue(share, self.qid).await;
        if owns_admin && matches!(opened, Err(NvmfError::Status { .. })) {
            // The controller refused the queue: it still holds the old one (its connection's end never
            // reached it, as across a partition). The next try starts a new association, as Linux's
            // host resets the controller.
            if let Some(admin) = self.admin.borrow().as_ref() {
                admin.queue.close();
            }
        }
        opened
    }

    /// Sends a block command, and sends it again on a new connection when its queue broke while it was
    /// in flight: reads, writes, flushes, Write Zeroes and deallocation leave the same blocks whether they
    /// ran once or twice (the caller does not race its own commands to one block), so, as Linux's host
    /// does, a break costs time rather than an error while the controller can be reached again.
    async fn submit(
        &self,
        op: BlockOp,
        offset: u64,
        command: Command,
        mut write: Option<IoBuffer>,
        mut read: Option<IoBuffer>,
    ) -> (BlockResult<Completion>, Option<IoBuffer>) {
        let (read_len, writes) = (read.as_ref().map(IoBuffer::len), write.is_some());
        let mut sends = 0;
        loop {
            let queue = match self.queue().await {
                Ok(queue) => queue,
                Err(error) => return (Err(remote_error(op, &self.name, offset, error)), write.or(read)),
            };
            let (result, buffer) = queue.submit(command, write, read).await;
            sends += 1;
            let result = match result {
                Ok(completion) if completion.status.is_success() => Ok(completion),
                Ok(completion) => Err(BlockError::new(op, &self.name, offset, BlockErrorKind::Nvme(completion.status))),
                // A write goes again only with its data.
                Err(NvmfError::Disconnected(_)) if sends <= SENDS_AFTER_A_BREAK && (!writes || buffer.is_some()) => {
                    (write, read) = match read_len {
                        // A read whose data was arriving when the connection broke lost its buffer with it.
                        Some(len) => (None, Some(buffer.unwrap_or_else(|| IoBuffer::aligned(len, 4096)))),
                        // A write's data, or nothing (a flush).
                        None => (buffer, None),
                    };
                    continue;
                }
                Err(error) => Err(remote_error(op, &self.name, offset, error)),
            };
            return (result, buffer);
        }
    }

    /// The namespace this device is.
    pub(crate) fn nsid(&self) -> u32 {
        self.share.address.nsid
    }

    /// Sends a command that is not a block transfer (the Reservation commands): its status as an error
    /// named for `name`, and the buffer back.
    pub(crate) async fn submit_raw(
        &self,
        name: &'static str,
        command: Command,
        write: Option<IoBuffer>,
        read: Option<IoBuffer>,
    ) -> Result<Option<IoBuffer>, NvmfError> {
        let _pending = crate::tcp::stream::ReactorIo::start();
        let queue = self.queue().await?;
        let (result, buffer) = queue.submit(command, write, read).await;
        let completion = result?;
        if !completion.status.is_success() {
            return Err(NvmfError::Status { command: name, status: completion.status });
        }
        Ok(buffer)
    }

    fn command(&self, opcode: IoOpcode, offset: u64, len: u64) -> Command {
        let mut command = Command::new(opcode as u8, 0);
        command.nsid = self.share.address.nsid;
        let block = self.share.geometry.logical_block_bytes;
        command.set_lba_range(offset / block, (len / block) as u32);
        command
    }
}

async fn open_io_queue(share: &ControllerShare, qid: u16) -> Result<Rc<HostQueue>, NvmfError> {
    let options = &share.options;
    let queue = match share.address.transport {
        NvmfTransport::Tcp => {
            HostQueue::open(
                share.address.addr,
                options.digests,
                options.queue_entries,
                options.busy_poll,
                options.tcp_congestion.as_deref(),
                options.command_timeout,
            )
            .await?
        }
        NvmfTransport::Rdma => {
            HostQueue::open_rdma(share.address.addr, qid, options.queue_entries, options.command_timeout)?
        }
    };
    queue.set_in_capsule_bytes(share.in_capsule_bytes);
    let cntlid = share.cntlid.load(Ordering::SeqCst);
    match connect_queue(&queue, options, &share.address.subnqn, qid, options.queue_entries, cntlid).await {
        Ok(_) => Ok(queue),
        Err(error) => {
            queue.close();
            Err(error)
        }
    }
}

impl Drop for NvmfDevice {
    fn drop(&mut self) {
        self.io.borrow().close();
    }
}

impl BlockDevice for NvmfDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn geometry(&self) -> Geometry {
        self.share.geometry
    }

    fn alloc_buffer(&self, len: usize) -> IoBuffer {
        IoBuffer::aligned(len, 4096)
    }

    async fn read(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>) {
        // Its queue's socket may be driven by the reactor: polled sockets of the executor must let it run.
        let _pending = crate::tcp::stream::ReactorIo::start();
        let geometry = self.share.geometry;
        if let Err(error) = geometry.check(BlockOp::Read, &self.name, offset, buf.len() as u64, Some(&buf)) {
            return (buf, Err(error));
        }
        let command = self.command(IoOpcode::Read, offset, buf.len() as u64);
        let len = buf.len();
        let (result, buffer) = self.submit(BlockOp::Read, offset, command, None, Some(buf)).await;
        (buffer.unwrap_or_else(|| IoBuffer::aligned(len, 4096)), result.map(drop))
    }

    async fn write(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>) {
        // Its queue's socket may be driven by the reactor: polled sockets of the executor must let it run.
        let _pending = crate::tcp::stream::ReactorIo::start();
        let geometry = self.share.geometry;
        if let Err(error) = geometry.check(BlockOp::Write, &self.name, offset, buf.len() as u64, Some(&buf)) {
            return (buf, Err(error));
        }
        let command = self.command(IoOpcode::Write, offset, buf.len() as u64);
        let len = buf.len();
        let (result, buffer) = self.submit(BlockOp::Write, offset, command, Some(buf), None).await;
        (buffer.unwrap_or_else(|| IoBuffer::aligned(len, 4096)), result.map(drop))
    }

    async fn flush(&self) -> BlockResult<()> {
        // Its queue's socket may be driven by the reactor: polled sockets of the executor must let it run.
        let _pending = crate::tcp::stream::ReactorIo::start();
        let mut command = Command::new(IoOpcode::Flush as u8, 0);
        command.nsid = self.share.address.nsid;
        self.submit(BlockOp::Flush, 0, command, None, None).await.0.map(drop)
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> BlockResult<()> {
        let geometry = self.share.geometry;
        geometry.check(BlockOp::WriteZeroes, &self.name, offset, len, None)?;
        let chunk = MAX_BLOCKS_PER_COMMAND * geometry.logical_block_bytes;
        let mut at = offset;
        while at < offset + len {
            let this = chunk.min(offset + len - at);
            let command = self.command(IoOpcode::WriteZeroes, at, this);
            self.submit(BlockOp::WriteZeroes, at, command, None, None).await.0?;
            at += this;
        }
        Ok(())
    }

    async fn deallocate(&self, offset: u64, len: u64) -> BlockResult<()> {
        let geometry = self.share.geometry;
        geometry.check(BlockOp::Deallocate, &self.name, offset, len, None)?;
        let block = geometry.logical_block_bytes;
        let chunk = u64::from(u32::MAX) * block;
        let mut at = offset;
        while at < offset + len {
            let this = chunk.min(offset + len - at);
            let mut range = vec![0u8; 16];
            range[4..8].copy_from_slice(&((this / block) as u32).to_le_bytes());
            range[8..16].copy_from_slice(&(at / block).to_le_bytes());
            let mut command = Command::new(IoOpcode::DatasetManagement as u8, 0);
            command.nsid = self.share.address.nsid;
            command.set_cdw(10, 0); // one range
            command.set_cdw(11, 1 << 2); // AD: deallocate
            self.submit(BlockOp::Deallocate, at, command, Some(IoBuffer::from_vec(range)), None).await.0?;
            at += this;
        }
        Ok(())
    }
}
