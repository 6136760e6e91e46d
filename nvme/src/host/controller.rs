//! Bringing a controller up (Connect, the enable handshake, Identify, Set Features), its admin commands,
//! keep-alive, and discovery.

use std::net::SocketAddr;
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

use super::queue::HostQueue;
use super::{HostOptions, NvmfError, NvmfTransport};
use crate::buffer::IoBuffer;
use crate::spec::{
    AdminOpcode, Command, Completion, ConnectData, ControllerIdentity, DISCOVERY_NQN, DiscoveryLog, FABRICS_OPCODE,
    FabricsType, NamespaceIdentity, Property, cap, cc, csts,
};

/// Admin queue entries (NVMe-oF's minimum admin submission queue size, as Linux uses).
const ADMIN_QUEUE_ENTRIES: u16 = 32;
const FEATURE_NUMBER_OF_QUEUES: u32 = 0x07;

/// What the host learnt about a controller.
#[derive(Clone, Debug)]
pub struct ControllerInfo {
    /// Its controller ID.
    pub cntlid: u16,
    /// CAP.
    pub cap: u64,
    /// Identify Controller data.
    pub identity: ControllerIdentity,
    /// I/O queues granted by Set Features (Number of Queues).
    pub io_queues: u16,
}

/// A controller's admin queue on this executor.
pub(crate) struct AdminQueue {
    pub(crate) queue: Rc<HostQueue>,
    pub(crate) info: ControllerInfo,
}

/// Builds a Fabrics command.
fn fabrics(kind: FabricsType) -> Command {
    let mut command = Command::new(FABRICS_OPCODE, 0);
    command.nsid = kind as u32;
    command
}

/// Submits and turns an error status into [`NvmfError::Status`].
pub(crate) async fn run(
    queue: &HostQueue,
    name: &'static str,
    command: Command,
    write: Option<IoBuffer>,
    read: Option<IoBuffer>,
) -> Result<(Completion, Option<IoBuffer>), NvmfError> {
    let (result, buffer) = queue.submit(command, write, read).await;
    let completion = result?;
    if !completion.status.is_success() {
        return Err(NvmfError::Status { command: name, status: completion.status });
    }
    Ok((completion, buffer))
}

/// Fabrics Connect of queue `qid` (0: admin) to `subnqn`; returns the controller ID.
pub(crate) async fn connect_queue(
    queue: &HostQueue,
    options: &HostOptions,
    subnqn: &str,
    qid: u16,
    entries: u16,
    cntlid: u16,
) -> Result<u16, NvmfError> {
    let mut command = fabrics(FabricsType::Connect);
    command.set_cdw(10, u32::from(qid) << 16); // RECFMT 0
    let cattr = if options.disable_sq_flow_control { 1u32 << 2 } else { 0 };
    command.set_cdw(11, u32::from(entries - 1) | (cattr << 16));
    command.set_cdw(12, if qid == 0 { options.keep_alive_ms } else { 0 });
    let data =
        ConnectData { host_id: options.host_id, cntlid, subnqn: subnqn.into(), hostnqn: options.hostnqn.clone() };
    let (completion, _) = run(queue, "Connect", command, Some(IoBuffer::from_vec(data.encode())), None).await?;
    Ok(completion.dw0 as u16)
}

async fn property_get(queue: &HostQueue, property: Property) -> Result<u64, NvmfError> {
    let mut command = fabrics(FabricsType::PropertyGet);
    command.set_cdw(10, u32::from(property.size() == 8));
    command.set_cdw(11, property.offset());
    let (completion, _) = run(queue, "Property Get", command, None, None).await?;
    Ok(u64::from(completion.dw0) | (u64::from(completion.dw1) << 32))
}

async fn property_set(queue: &HostQueue, property: Property, value: u32) -> Result<(), NvmfError> {
    let mut command = fabrics(FabricsType::PropertySet);
    command.set_cdw(11, property.offset());
    command.set_cdw(12, value);
    run(queue, "Property Set", command, None, None).await.map(drop)
}

/// Identify with CNS `cns` for `nsid`: 4096 bytes.
pub(crate) async fn identify(queue: &HostQueue, cns: u8, nsid: u32) -> Result<Vec<u8>, NvmfError> {
    let mut command = Command::new(AdminOpcode::Identify as u8, 0);
    command.nsid = nsid;
    command.set_cdw(10, u32::from(cns));
    let (_, buffer) = run(queue, "Identify", command, None, Some(IoBuffer::aligned(4096, 8))).await?;
    Ok(buffer.map(|buffer| buffer.as_slice().to_vec()).unwrap_or_default())
}

/// Get Log Page `lid`: `len` bytes (a multiple of 4) from `offset`.
pub(crate) async fn get_log_page(queue: &HostQueue, lid: u8, offset: u64, len: usize) -> Result<Vec<u8>, NvmfError> {
    let dwords = (len / 4) as u32 - 1;
    let mut command = Command::new(AdminOpcode::GetLogPage as u8, 0);
    command.nsid = u32::MAX;
    command.set_cdw(10, u32::from(lid) | ((dwords & 0xffff) << 16));
    command.set_cdw(11, dwords >> 16);
    command.set_cdw(12, offset as u32);
    command.set_cdw(13, (offset >> 32) as u32);
    let (_, buffer) = run(queue, "Get Log Page", command, None, Some(IoBuffer::aligned(len, 8))).await?;
    Ok(buffer.map(|buffer| buffer.as_slice().to_vec()).unwrap_or_default())
}

impl AdminQueue {
    /// Connects the admin queue, enables the controller, identifies it and asks for `io_queues` I/O queues
    /// (none for a discovery controller).
    pub(crate) async fn connect(
        (transport, addr): (NvmfTransport, SocketAddr),
        subnqn: &str,
        options: &HostOptions,
        io_queues: u16,
    ) -> Result<Self, NvmfError> {
        let queue = match transport {
            NvmfTransport::Tcp => {
                HostQueue::open(addr, options.digests, ADMIN_QUEUE_ENTRIES, false, None, options.command_timeout)
                    .await?
            }
            NvmfTransport::Rdma => HostQueue::open_rdma(addr, 0, ADMIN_QUEUE_ENTRIES, options.command_timeout)?,
        };
        let result = Self::bring_up(&queue, subnqn, options, io_queues).await;
        match result {
            Ok(info) => {
                if options.keep_alive_ms > 0 {
                    let interval =
                        Duration::from_millis(u64::from(options.keep_alive_ms) / 2).max(Duration::from_millis(50));
                    glommio::spawn_local(keep_alive(Rc::downgrade(&queue), interval)).detach();
                }
                Ok(Self { queue, info })
            }
            Err(error) => {
                queue.close();
                Err(error)
            }
        }
    }

    async fn bring_up(
        queue: &HostQueue,
        subnqn: &str,
        options: &HostOptions,
        io_queues: u16,
    ) -> Result<ControllerInfo, NvmfError> {
        let cntlid = connect_queue(queue, options, subnqn, 0, ADMIN_QUEUE_ENTRIES, ConnectData::DYNAMIC_CNTLID).await?;
        let cap_value = property_get(queue, Property::Cap).await?;
        property_set(queue, Property::Cc, cc::ENABLE | cc::IO_QUEUE_ENTRY_SIZES).await?;
        let deadline = Instant::now() + Duration::from_millis(cap::timeout_ms(cap_value).max(500));
        loop {
            let status = property_get(queue, Property::Csts).await? as u32;
            if status & csts::FATAL != 0 {
                return Err(NvmfError::Protocol("controller reports a fatal status (CSTS.CFS)".into()));
            }
            if status & csts::READY != 0 {
                break;
            }
            if Instant::now() > deadline {
                return Err(NvmfError::Timeout("waiting for CSTS.RDY"));
            }
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
        let bytes = identify(queue, 0x01, 0).await?;
        let identity = ControllerIdentity::decode(&bytes)
            .ok_or_else(|| NvmfError::Protocol("short Identify Controller data".into()))?;
        if identity.sgls & 0b11 == 0 {
            return Err(NvmfError::Protocol("controller does not support SGLs, which NVMe-oF requires".into()));
        }
        let mut granted = 0;
        if io_queues > 0 {
            let mut command = Command::new(AdminOpcode::SetFeatures as u8, 0);
            command.set_cdw(10, FEATURE_NUMBER_OF_QUEUES);
            let wanted = u32::from(io_queues - 1);
            command.set_cdw(11, wanted | (wanted << 16));
            let (completion, _) = run(queue, "Set Features (Number of Queues)", command, None, None).await?;
            granted = ((completion.dw0 & 0xffff).min(completion.dw0 >> 16) + 1).min(u32::from(io_queues)) as u16;
        }
        Ok(ControllerInfo { cntlid, cap: cap_value, identity, io_queues: granted })
    }

    /// Identify Namespace.
    pub(crate) async fn namespace(&self, nsid: u32) -> Result<NamespaceIdentity, NvmfError> {
        let bytes = identify(&self.queue, 0x00, nsid).await?;
        NamespaceIdentity::decode(&bytes).ok_or_else(|| NvmfError::Protocol("short Identify Namespace data".into()))
    }
}

impl Drop for AdminQueue {
    fn drop(&mut self) {
        self.queue.close();
    }
}

/// Sends Keep Alive every `interval` until the queue goes away or breaks.
async fn keep_alive(queue: Weak<HostQueue>, interval: Duration) {
    loop {
        glommio::timer::sleep(interval).await;
        let Some(queue) = queue.upgrade() else { return };
        if queue.broken().is_some() {
            return;
        }
        let command = Command::new(AdminOpcode::KeepAlive as u8, 0);
        if run(&queue, "Keep Alive", command, None, None).await.is_err() {
            return;
        }
    }
}

/// Reads the discovery log of the discovery controller at `addr`, as `nvme discover` does: the header
/// first, then every record.
pub async fn discover(addr: SocketAddr, options: &HostOptions) -> Result<DiscoveryLog, NvmfError> {
    let options = HostOptions { keep_alive_ms: 0, ..options.clone() };
    let admin = AdminQueue::connect((NvmfTransport::Tcp, addr), DISCOVERY_NQN, &options, 0).await?;
    let header = get_log_page(&admin.queue, 0x70, 0, DiscoveryLog::HEADER_BYTES).await?;
    let records = DiscoveryLog::record_count(&header).unwrap_or(0).min(1024) as usize;
    let bytes = get_log_page(&admin.queue, 0x70, 0, DiscoveryLog::HEADER_BYTES + records * 1024).await?;
    DiscoveryLog::decode(&bytes).ok_or_else(|| NvmfError::Protocol("short discovery log".into()))
}
