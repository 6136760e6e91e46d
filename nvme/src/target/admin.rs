//! The admin queue: properties (the enable and shutdown handshake), Identify, log pages, features, Keep
//! Alive and Asynchronous Event Requests.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use super::connection::{Connected, Queue, Reply, Transport};
use super::registry::{ERROR_LOG_ENTRIES, Shared};
use crate::buffer::IoBuffer;
use crate::spec::{
    AdminOpcode, Command, ControllerIdentity, ControllerType, DISCOVERY_NQN, DiscoveryEntry, DiscoveryLog, LogPage,
    NamespaceIdentity, NvmeStatus, Property, SmartLog, active_namespace_list, cap, cc, csts, namespace_descriptors,
};

/// NVMe version the controllers report: 1.3, the version whose admin command set Strata implements.
pub(crate) const VERSION: u32 = 0x0001_0300;
/// CAP.TO: how long a host waits for CSTS.RDY, in 500 ms units.
const READY_TIMEOUT_500MS: u8 = 10;
/// Asynchronous Event Requests held at once (AERL + 1).
const ASYNC_EVENT_REQUESTS: usize = 4;

/// Feature identifiers served.
const FEATURE_VOLATILE_WRITE_CACHE: u8 = 0x06;
const FEATURE_NUMBER_OF_QUEUES: u8 = 0x07;
const FEATURE_ASYNC_EVENT_CONFIG: u8 = 0x0b;
const FEATURE_KEEP_ALIVE_TIMER: u8 = 0x0f;

pub(crate) fn property(queue: &Rc<Queue>, command: &Command, connected: Connected) -> Reply {
    let set = command.fabrics_type() == crate::spec::FabricsType::PropertySet as u8;
    let size_8 = command.cdw(10) & 0x7 == 1;
    let Some(property) = Property::from_offset(command.cdw(11)) else {
        return Reply::status(NvmeStatus::INVALID_FIELD.with_dnr());
    };
    if size_8 != (property.size() == 8) {
        return Reply::status(NvmeStatus::INVALID_FIELD.with_dnr());
    }
    let mut registry = queue.ctx.shared.registry();
    let Some(controller) = registry.controllers.get_mut(&connected.cntlid) else {
        return Reply::status(NvmeStatus::INTERNAL_ERROR);
    };
    if set {
        if property != Property::Cc {
            return Reply::status(NvmeStatus::INVALID_FIELD.with_dnr());
        }
        let value = command.cdw(12);
        let was_enabled = controller.cc & cc::ENABLE != 0;
        controller.cc = value;
        if value & cc::ENABLE != 0 && !was_enabled {
            controller.csts = csts::READY;
        } else if value & cc::ENABLE == 0 {
            controller.csts = 0;
        }
        if value & cc::SHUTDOWN_MASK != 0 {
            // Nothing is cached in the target; writes are complete when acknowledged.
            controller.csts = (controller.csts & !(0b11 << 2)) | csts::SHUTDOWN_COMPLETE;
        }
        return Reply::success(0);
    }
    let value: u64 = match property {
        Property::Cap => cap::encode(queue.ctx.config.queue_entries, READY_TIMEOUT_500MS),
        Property::Vs => u64::from(VERSION),
        Property::Cc => u64::from(controller.cc),
        Property::Csts => u64::from(controller.csts),
    };
    Reply { status: NvmeStatus::SUCCESS, dw0: value as u32, dw1: (value >> 32) as u32, data: None }
}

pub(crate) fn command(queue: &Rc<Queue>, command: &Command, data: Option<IoBuffer>) {
    let Some(connected) = queue.connected() else { return };
    let reply = match command.opcode {
        op if op == AdminOpcode::Identify as u8 => identify(queue, command, connected),
        op if op == AdminOpcode::GetLogPage as u8 => get_log_page(queue, command, connected),
        op if op == AdminOpcode::SetFeatures as u8 => set_features(queue, command, connected),
        op if op == AdminOpcode::GetFeatures as u8 => get_features(queue, command, connected),
        op if op == AdminOpcode::KeepAlive as u8 => {
            if let Some(controller) = queue.ctx.shared.registry().controllers.get_mut(&connected.cntlid) {
                controller.last_keep_alive = std::time::Instant::now();
            }
            Reply::success(0)
        }
        op if op == AdminOpcode::AsyncEventRequest as u8 => {
            // Held: Strata raises no asynchronous events yet, so the command completes only when the
            // controller goes away. Beyond AERL the host gets the limit error.
            if queue.held_async_events() >= ASYNC_EVENT_REQUESTS {
                Reply::status(NvmeStatus::AER_LIMIT_EXCEEDED.with_dnr())
            } else {
                queue.hold_async_event();
                return;
            }
        }
        op if op == AdminOpcode::Abort as u8 => Reply::success(1), // bit 0 set: the command was not aborted
        _ => Reply::status(NvmeStatus::INVALID_OPCODE.with_dnr()),
    };
    drop(data);
    if !reply.status.is_success() {
        queue.log_error(command, reply.status);
    }
    queue.reply(command, reply);
}

fn controller_identity(queue: &Rc<Queue>, connected: Connected) -> ControllerIdentity {
    let shared = &queue.ctx.shared;
    let config = &queue.ctx.config;
    let subsystem = &shared.subsystems[connected.subsystem];
    let discovery = subsystem.discovery;
    let mdts = (config.max_transfer_bytes / 4096).max(1).ilog2() as u8;
    ControllerIdentity {
        vid: 0,
        serial: subsystem.serial.clone(),
        model: match queue.transport() {
            Transport::Tcp => "Strata NVMe/TCP target".into(),
            Transport::Rdma => "Strata NVMe/RDMA target".into(),
        },
        firmware: env!("CARGO_PKG_VERSION").into(),
        mdts,
        cntlid: connected.cntlid,
        version: VERSION,
        oaes: 0,
        controller_type: if discovery { ControllerType::Discovery } else { ControllerType::Io },
        aerl: (ASYNC_EVENT_REQUESTS - 1) as u8,
        lpa: ControllerIdentity::LPA_EXTENDED_DATA,
        elpe: (ERROR_LOG_ENTRIES - 1) as u8,
        kas: 1,
        sqes: if discovery { 0 } else { 0x66 },
        cqes: if discovery { 0 } else { 0x44 },
        maxcmd: config.queue_entries,
        nn: subsystem.namespaces.len() as u32,
        oncs: if discovery {
            0
        } else {
            ControllerIdentity::ONCS_DSM | ControllerIdentity::ONCS_WRITE_ZEROES | ControllerIdentity::ONCS_RESERVATIONS
        },
        vwc: if discovery { 0 } else { 1 },
        sgls: ControllerIdentity::SGLS_FABRICS
            | if queue.transport() == Transport::Rdma { ControllerIdentity::SGLS_KEYED } else { 0 },
        subnqn: subsystem.nqn.clone(),
        ioccsz: if discovery { 0 } else { (crate::spec::COMMAND_BYTES as u32 + config.in_capsule_data_bytes) / 16 },
        iorcsz: if discovery { 0 } else { 1 },
        icdoff: 0,
        msdbd: if discovery { 0 } else { 1 },
    }
}

fn identify(queue: &Rc<Queue>, command: &Command, connected: Connected) -> Reply {
    let cns = command.cdw(10) as u8;
    let subsystem = &queue.ctx.shared.subsystems[connected.subsystem];
    let namespace = |nsid: u32| (nsid as usize).checked_sub(1).and_then(|index| subsystem.namespaces.get(index));
    match cns {
        0x01 => Reply::data(controller_identity(queue, connected).encode()),
        0x00 => match namespace(command.nsid) {
            Some(info) => {
                let blocks = info.capacity_bytes / info.block_bytes;
                Reply::data(
                    NamespaceIdentity {
                        nsze: blocks,
                        ncap: blocks,
                        nuse: blocks,
                        // Shared by every controller of the subsystem; every reservation type, Ignore
                        // Existing Key as NVMe 1.3 defines it, no persistence through power loss.
                        nmic: 1,
                        rescap: 0xfe,
                        dlfeat: 0x09,
                        nguid: info.nguid,
                        lba_shift: info.block_bytes.trailing_zeros() as u8,
                    }
                    .encode(),
                )
            }
            None => Reply::status(NvmeStatus::INVALID_NAMESPACE.with_dnr()),
        },
        0x02 => {
            if command.nsid >= 0xffff_fffe {
                return Reply::status(NvmeStatus::INVALID_NAMESPACE.with_dnr());
            }
            Reply::data(active_namespace_list(1..=subsystem.namespaces.len() as u32, command.nsid))
        }
        0x03 => match namespace(command.nsid) {
            Some(info) => Reply::data(namespace_descriptors(&info.nguid, &info.uuid)),
            None => Reply::status(NvmeStatus::INVALID_NAMESPACE.with_dnr()),
        },
        _ => Reply::status(NvmeStatus::INVALID_FIELD.with_dnr()),
    }
}

fn get_log_page(queue: &Rc<Queue>, command: &Command, connected: Connected) -> Reply {
    let lid = command.cdw(10) as u8;
    let dwords = ((u64::from(command.cdw(11) & 0xffff) << 16) | u64::from(command.cdw(10) >> 16)) + 1;
    let offset = u64::from(command.cdw(12)) | (u64::from(command.cdw(13)) << 32);
    if !offset.is_multiple_of(4) {
        return Reply::status(NvmeStatus::INVALID_FIELD.with_dnr());
    }
    let shared = &queue.ctx.shared;
    let discovery = shared.subsystems[connected.subsystem].discovery;
    let page = match LogPage::from_id(lid) {
        Some(LogPage::Discovery) if discovery => discovery_log(queue, connected).encode(),
        Some(LogPage::Error) => {
            let registry = shared.registry();
            let mut bytes = Vec::with_capacity(ERROR_LOG_ENTRIES * 64);
            if let Some(controller) = registry.controllers.get(&connected.cntlid) {
                controller.errors.iter().for_each(|entry| entry.encode_into(&mut bytes));
            }
            bytes.resize(ERROR_LOG_ENTRIES * 64, 0);
            bytes
        }
        Some(LogPage::Smart) if !discovery => smart_log(shared, connected).encode(),
        _ => return Reply::status(NvmeStatus::INVALID_LOG_PAGE.with_dnr()),
    };
    if offset > page.len() as u64 {
        return Reply::status(NvmeStatus::INVALID_FIELD.with_dnr());
    }
    // Bytes asked for beyond the end of the page read as zeroes.
    let mut bytes = page[offset as usize..].to_vec();
    bytes.resize((dwords * 4).min(1 << 20) as usize, 0);
    Reply::data(bytes)
}

/// The discovery log for this host: the subsystems it may connect to, and this discovery subsystem, on each
/// transport the target listens on (TCP port 1; RDMA port 2).
fn discovery_log(queue: &Queue, connected: Connected) -> DiscoveryLog {
    let shared = &queue.ctx.shared;
    let hostnqn = shared.registry().controllers.get(&connected.cntlid).map(|controller| controller.hostnqn.clone());
    let tcp = (DiscoveryEntry::TRTYPE_TCP, 1, queue.ctx.listen, DiscoveryEntry::TSAS_TCP);
    let rdma = queue
        .ctx
        .config
        .rdma_listen
        .map(|listen| (DiscoveryEntry::TRTYPE_RDMA, 2, listen.into(), DiscoveryEntry::TSAS_RDMA));
    let entry = |(trtype, portid, listen, tsas): (u8, u16, SocketAddr, [u8; 3]), nqn: &str, subtype| DiscoveryEntry {
        trtype,
        adrfam: if listen.is_ipv4() { 1 } else { 2 },
        subtype,
        treq: 0,
        portid,
        cntlid: 0xffff,
        asqsz: 32,
        trsvcid: listen.port().to_string(),
        subnqn: nqn.to_string(),
        traddr: listen.ip().to_string(),
        tsas,
    };
    let ports: Vec<_> = [Some(tcp), rdma].into_iter().flatten().collect();
    let allowed = shared
        .subsystems
        .iter()
        .filter(|subsystem| !subsystem.discovery && hostnqn.as_deref().is_some_and(|host| subsystem.allows(host)))
        .map(|subsystem| (subsystem.nqn.as_str(), DiscoveryEntry::SUBTYPE_NVM));
    let listed = allowed.chain([(DISCOVERY_NQN, DiscoveryEntry::SUBTYPE_CURRENT_DISCOVERY)]);
    let entries = listed.flat_map(|(nqn, subtype)| ports.iter().map(move |&port| entry(port, nqn, subtype))).collect();
    // The configuration is fixed for the target's life, so one generation describes it.
    DiscoveryLog { generation: 1, entries }
}

fn smart_log(shared: &Shared, connected: Connected) -> SmartLog {
    let registry = shared.registry();
    let mut log = SmartLog { available_spare: 100, ..SmartLog::default() };
    let (mut bytes_read, mut bytes_written) = (0, 0);
    for counters in &registry.counters[connected.subsystem] {
        log.host_reads += counters.reads.load(Ordering::Relaxed);
        log.host_writes += counters.writes.load(Ordering::Relaxed);
        log.media_errors += counters.media_errors.load(Ordering::Relaxed);
        bytes_read += counters.bytes_read.load(Ordering::Relaxed);
        bytes_written += counters.bytes_written.load(Ordering::Relaxed);
    }
    log.data_units_read = SmartLog::data_units(bytes_read);
    log.data_units_written = SmartLog::data_units(bytes_written);
    log.power_on_hours = shared.started.elapsed().as_secs() / 3600;
    log.error_entries = registry.controllers.get(&connected.cntlid).map_or(0, |controller| controller.error_count);
    log
}

fn set_features(queue: &Rc<Queue>, command: &Command, connected: Connected) -> Reply {
    let fid = command.cdw(10) as u8;
    if command.cdw(10) & (1 << 31) != 0 {
        return Reply::status(NvmeStatus::FEATURE_NOT_SAVEABLE.with_dnr());
    }
    let value = command.cdw(11);
    let shared = &queue.ctx.shared;
    let mut registry = shared.registry();
    let Some(controller) = registry.controllers.get_mut(&connected.cntlid) else {
        return Reply::status(NvmeStatus::INTERNAL_ERROR);
    };
    match fid {
        FEATURE_NUMBER_OF_QUEUES => {
            let requested = (value & 0xffff).min(value >> 16) + 1;
            if value & 0xffff == 0xffff || value >> 16 == 0xffff {
                return Reply::status(NvmeStatus::INVALID_FIELD.with_dnr());
            }
            let granted = requested.min(u32::from(MAX_IO_QUEUES));
            controller.io_queues_granted = granted as u16;
            Reply::success(((granted - 1) << 16) | (granted - 1))
        }
        FEATURE_KEEP_ALIVE_TIMER => {
            let start_watch = controller.kato_ms == 0 && value != 0;
            controller.kato_ms = value;
            controller.last_keep_alive = std::time::Instant::now();
            drop(registry);
            if start_watch {
                glommio::spawn_local(super::connection::watch_keep_alive(
                    std::sync::Arc::clone(shared),
                    connected.cntlid,
                ))
                .detach();
            }
            Reply::success(0)
        }
        FEATURE_ASYNC_EVENT_CONFIG => {
            controller.async_event_config = value;
            Reply::success(0)
        }
        FEATURE_VOLATILE_WRITE_CACHE => Reply::success(0),
        _ => Reply::status(NvmeStatus::INVALID_FIELD.with_dnr()),
    }
}

/// I/O queues one controller may have.
pub(crate) const MAX_IO_QUEUES: u16 = 64;

fn get_features(queue: &Rc<Queue>, command: &Command, connected: Connected) -> Reply {
    let fid = command.cdw(10) as u8;
    let registry = queue.ctx.shared.registry();
    let Some(controller) = registry.controllers.get(&connected.cntlid) else {
        return Reply::status(NvmeStatus::INTERNAL_ERROR);
    };
    match fid {
        FEATURE_NUMBER_OF_QUEUES => {
            let granted = u32::from(controller.io_queues_granted.max(1)) - 1;
            Reply::success((granted << 16) | granted)
        }
        FEATURE_KEEP_ALIVE_TIMER => Reply::success(controller.kato_ms),
        FEATURE_ASYNC_EVENT_CONFIG => Reply::success(controller.async_event_config),
        FEATURE_VOLATILE_WRITE_CACHE => Reply::success(1),
        _ => Reply::status(NvmeStatus::INVALID_FIELD.with_dnr()),
    }
}
