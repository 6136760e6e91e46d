//! An opened RDMA device: its context, its port 1, and the GID a connection sends from.

use std::ffi::CStr;
use std::sync::Arc;

use rdma_sys as sys;

use super::last_error;
use crate::{PathMtu, TransferError};

/// The port every queue pair uses. Multi-port NICs are opened once per port device on RoCE (each netdev
/// is its own device), so port 1 is the one there is.
pub(super) const PORT: u8 = 1;
/// `IBV_LINK_LAYER_INFINIBAND`: GID index 0 and the LID address the port.
const LINK_LAYER_INFINIBAND: u8 = 1;

/// What a connection needs to know of the port.
#[derive(Clone, Copy, Debug)]
pub struct PortInfo {
    /// The port's LID (InfiniBand; 0 on RoCE).
    pub local_id: u16,
    /// The port's active MTU.
    pub mtu: PathMtu,
    /// The GID table index packets are sent from.
    pub gid_index: u8,
    /// That GID.
    pub gid: [u8; 16],
    /// Outstanding RDMA READs a queue pair may issue (`max_qp_init_rd_atom`).
    pub max_reads_issued: u8,
    /// Outstanding RDMA READs a queue pair may answer (`max_qp_rd_atom`).
    pub max_reads_answered: u8,
}

/// An opened RDMA device. Cheap to clone; closed when the last clone and everything made from it is
/// dropped.
#[derive(Clone)]
pub struct Device {
    pub(super) context: Arc<DeviceContext>,
}

pub(super) struct DeviceContext {
    pub(super) raw: *mut sys::ibv_context,
    pub(super) name: String,
    pub(super) port: PortInfo,
}

// SAFETY: libibverbs contexts may be used from any thread; the context is only closed on drop.
unsafe impl Send for DeviceContext {}
// SAFETY: as above: verbs calls on a context are thread-safe.
unsafe impl Sync for DeviceContext {}

impl Drop for DeviceContext {
    fn drop(&mut self) {
        // SAFETY: `raw` came from ibv_open_device and everything made from it holds this context alive.
        unsafe { sys::ibv_close_device(self.raw) };
    }
}

impl Device {
    /// The names of the RDMA devices libibverbs lists here (empty when there are none).
    pub fn names() -> Vec<String> {
        DeviceList::get().map(|list| list.names()).unwrap_or_default()
    }

    /// Opens the device called `name` (as `ibv_devices` lists it) and reads its port.
    pub fn open(name: &str) -> Result<Device, TransferError> {
        let list = DeviceList::get()?;
        let names = list.names();
        let Some(index) = names.iter().position(|candidate| candidate == name) else {
            return Err(if names.is_empty() {
                TransferError::NoDevices
            } else {
                TransferError::NoSuchDevice { name: name.to_owned(), available: names }
            });
        };
        // SAFETY: `index` is within the list, which stays alive until after the call.
        let raw = unsafe { sys::ibv_open_device(*list.devices.add(index)) };
        if raw.is_null() {
            return Err(last_error("ibv_open_device", name));
        }
        let mut context = DeviceContext { raw, name: name.to_owned(), port: placeholder_port() };
        context.port = query_port(&context)?;
        Ok(Device { context: Arc::new(context) })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.context.name
    }

    /// Its port, as a connection sees it.
    pub fn port(&self) -> PortInfo {
        self.context.port
    }
}

fn placeholder_port() -> PortInfo {
    PortInfo { local_id: 0, mtu: PathMtu::MAX, gid_index: 0, gid: [0; 16], max_reads_issued: 1, max_reads_answered: 1 }
}

fn query_port(context: &DeviceContext) -> Result<PortInfo, TransferError> {
    // SAFETY: plain-data structs the calls fill in; `raw` is an open context.
    let mut device: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
    if unsafe { sys::ibv_query_device(context.raw, &mut device) } != 0 {
        return Err(last_error("ibv_query_device", &context.name));
    }
    // SAFETY: as above.
    let mut port: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
    if unsafe { sys::___ibv_query_port(context.raw, PORT, &mut port) } != 0 {
        return Err(last_error("ibv_query_port", &context.name));
    }
    let (gid_index, gid) = choose_gid(context, port.link_layer, port.gid_tbl_len)?;
    let clamp = |value: i32| value.clamp(1, 16) as u8;
    Ok(PortInfo {
        local_id: port.lid,
        mtu: PathMtu::from_code(port.active_mtu as u8).unwrap_or(PathMtu::MAX),
        gid_index,
        gid,
        max_reads_issued: clamp(device.max_qp_init_rd_atom),
        max_reads_answered: clamp(device.max_qp_rd_atom),
    })
}

/// The GID to send from: index 0 on InfiniBand; on RoCE the first RoCE v2 GID that carries an IPv4 address
/// (routable, and what the kernel's own NVMe/RDMA picks), else the first RoCE v2 one, else the first set.
fn choose_gid(context: &DeviceContext, link_layer: u8, table_len: i32) -> Result<(u8, [u8; 16]), TransferError> {
    let mut candidates = Vec::new();
    for index in 0..table_len.clamp(0, 256) {
        // SAFETY: a plain-data union the call fills in.
        let mut gid: sys::ibv_gid = unsafe { std::mem::zeroed() };
        if unsafe { sys::ibv_query_gid(context.raw, PORT, index, &mut gid) } != 0 {
            continue;
        }
        // SAFETY: every bit pattern of the union is a valid byte array.
        let raw = unsafe { gid.raw };
        if raw != [0; 16] {
            candidates.push((index as u8, raw));
        }
    }
    let no_gid = || TransferError::NoUsableGid { device: context.name.clone(), port: PORT };
    if link_layer == LINK_LAYER_INFINIBAND {
        return candidates.into_iter().next().ok_or_else(no_gid);
    }
    let roce_v2 = |index: u8| gid_type(&context.name, index).is_some_and(|kind| kind == "RoCE v2");
    let ipv4_mapped = |gid: &[u8; 16]| gid[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];
    let best = candidates
        .iter()
        .find(|(index, gid)| roce_v2(*index) && ipv4_mapped(gid))
        .or_else(|| candidates.iter().find(|(index, _)| roce_v2(*index)))
        .or_else(|| candidates.first());
    best.copied().ok_or_else(no_gid)
}

/// The GID's type as the kernel reports it ("IB/RoCE v1", "RoCE v2"), which libibverbs 1.x has no public
/// call for.
fn gid_type(device: &str, index: u8) -> Option<String> {
    let path = format!("/sys/class/infiniband/{device}/ports/{PORT}/gid_attrs/types/{index}");
    std::fs::read_to_string(path).ok().map(|kind| kind.trim().to_owned())
}

/// `ibv_get_device_list`'s array, freed on drop.
struct DeviceList {
    devices: *mut *mut sys::ibv_device,
    count: usize,
}

impl DeviceList {
    fn get() -> Result<DeviceList, TransferError> {
        let mut count = 0;
        // SAFETY: the call writes the count and returns an array it owns, or null with errno.
        let devices = unsafe { sys::ibv_get_device_list(&mut count) };
        if devices.is_null() {
            // ENOSYS: the kernel has no RDMA (no ib_uverbs), which to the caller is no device at all.
            let error = last_error("ibv_get_device_list", "(any)");
            return Err(match &error {
                TransferError::Verbs { source, .. } if source.raw_os_error() == Some(libc::ENOSYS) => {
                    TransferError::NoDevices
                }
                _ => error,
            });
        }
        Ok(DeviceList { devices, count: count.max(0) as usize })
    }

    fn names(&self) -> Vec<String> {
        (0..self.count)
            .map(|index| {
                // SAFETY: `index` < count; libibverbs returns a NUL-terminated name owned by the device.
                unsafe { CStr::from_ptr(sys::ibv_get_device_name(*self.devices.add(index))) }
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the array came from ibv_get_device_list; opened contexts stay valid after it is freed.
        unsafe { sys::ibv_free_device_list(self.devices) };
    }
}
