//! The Linux kernel's NVMe/RDMA host (`nvme discover` and `nvme connect -t rdma`) on Strata's target over
//! soft-RoCE: discovery lists the subsystem on its RDMA port; the host connects the admin and I/O queues,
//! identifies the controller, and its block device then reads back,
//! byte for byte, what it wrote through it. Writes of every size cross both ways the binding moves data
//! (in-capsule up to the controller's IOCCSZ, by RDMA READ beyond it) and reads come back by RDMA WRITE;
//! the whole region is read back, so a write that landed anywhere else shows. The host then disconnects.
//!
//! Needs an RDMA device and the kernel's nvme-rdma: tests/lab/rdma-tests runs it in the soft-RoCE guest.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::process::Command;
use std::time::{Duration, Instant};

use strata_nvme::target::{self, NamespaceBackend, NamespaceConfig, SubsystemConfig, TargetConfig};

const NQN: &str = "nqn.2026-12.io.strata:rdma-target";
const NAMESPACE_BYTES: u64 = 64 << 20;
/// The region written and read back whole.
const REGION_BYTES: usize = 24 << 20;
/// Writes of several sizes: in-capsule ones (≤ 16 KiB here), keyed ones, the largest transfer.
const WRITES: [(u64, usize); 6] =
    [(0, 4096), (12 << 10, 8192), (1 << 20, 16 << 10), (3 << 20, 64 << 10), (5 << 20, 1 << 20), (9 << 20, 516 << 10)];

/// A page-aligned buffer for O_DIRECT.
struct Aligned {
    pointer: *mut u8,
    layout: Layout,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = Layout::from_size_align(len, 4096).expect("a layout");
        // SAFETY: a non-zero size.
        let pointer = unsafe { alloc_zeroed(layout) };
        assert!(!pointer.is_null());
        Aligned { pointer, layout }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the allocation of `layout.size()` bytes this owns.
        unsafe { std::slice::from_raw_parts_mut(self.pointer, self.layout.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { dealloc(self.pointer, self.layout) };
    }
}

/// The byte that a write at `offset` puts at `index` of its span.
fn pattern(offset: u64, index: usize) -> u8 {
    let value = (offset + index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (value >> 56) as u8 ^ (offset >> 12) as u8
}

/// The block device of the namespace of `nqn`, once the host has it.
fn block_device(nqn: &str, wait: Duration) -> Option<String> {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        for entry in std::fs::read_dir("/sys/block").into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let subsystem = std::fs::read_to_string(entry.path().join("device/subsysnqn")).unwrap_or_default();
            // Not a multipath controller path (nvmeXcYnZ): the namespace's own device.
            let path = name.strip_prefix("nvme").is_some_and(|rest| rest.contains('c'));
            if name.starts_with("nvme") && !path && subsystem.trim() == nqn {
                return Some(format!("/dev/{name}"));
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

/// The controller (`/sys/class/nvme/nvmeN`) connected to `nqn`.
fn controller(nqn: &str) -> Option<std::path::PathBuf> {
    std::fs::read_dir("/sys/class/nvme")
        .ok()?
        .flatten()
        .map(|entry| entry.path())
        .find(|path| std::fs::read_to_string(path.join("subsysnqn")).is_ok_and(|subsystem| subsystem.trim() == nqn))
}

fn nvme_cli(args: &[&str]) -> String {
    let output = Command::new("nvme").args(args).output().expect("nvme-cli runs");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "nvme {args:?}: {text}");
    text
}

#[test]
#[ignore = "needs an RDMA device and the kernel's nvme-rdma: tests/lab/rdma-tests runs it in a soft-RoCE guest"]
fn the_kernels_host_writes_and_reads_back_through_our_target() {
    let address: std::net::Ipv4Addr =
        std::env::var("STRATA_RDMA_ADDRESS").expect("STRATA_RDMA_ADDRESS: the device's IPv4").parse().expect("an IPv4");
    let namespace = NamespaceConfig { backend: NamespaceBackend::Memory { bytes: NAMESPACE_BYTES }, block_bytes: 4096 };
    let subsystem = SubsystemConfig { nqn: NQN.into(), namespaces: vec![namespace], allowed_hosts: Vec::new() };
    let config = TargetConfig {
        rdma_listen: Some(std::net::SocketAddrV4::new(address, 4421)),
        ..TargetConfig::new("127.0.0.1:0".parse().unwrap(), vec![subsystem])
    };
    let handle = target::start(config).expect("the target starts with an RDMA listener");

    // Discovery over RDMA lists the subsystem on its RDMA port, as `nvme connect-all -t rdma` needs.
    let discovered = nvme_cli(&["discover", "-t", "rdma", "-a", &address.to_string(), "-s", "4421"]);
    let listed = discovered
        .split("=====Discovery Log Entry")
        .any(|record| record.contains(NQN) && record.contains("trtype:  rdma") && record.contains("trsvcid: 4421"));
    assert!(listed, "the subsystem's RDMA entry: {discovered}");
    nvme_cli(&["connect", "-t", "rdma", "-a", &address.to_string(), "-s", "4421", "-n", NQN]);
    let sysfs = controller(NQN).expect("the host lists a controller of our subsystem");
    let read = |name: &str| std::fs::read_to_string(sysfs.join(name)).unwrap_or_default().trim().to_string();
    assert_eq!(read("transport"), "rdma");
    assert_eq!(read("model"), "Strata NVMe/RDMA target", "Identify Controller came back over RDMA");
    let device = block_device(NQN, Duration::from_secs(30)).expect("the namespace's block device");
    let disk = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&device)
        .unwrap_or_else(|error| panic!("{device}: {error}"));

    for (offset, len) in WRITES {
        let mut buffer = Aligned::new(len);
        for (index, byte) in buffer.bytes().iter_mut().enumerate() {
            *byte = pattern(offset, index);
        }
        disk.write_all_at(buffer.bytes(), offset).unwrap_or_else(|error| panic!("write {len} at {offset}: {error}"));
    }
    let mut expected = vec![0u8; REGION_BYTES];
    for (offset, len) in WRITES {
        for index in 0..len {
            expected[offset as usize + index] = pattern(offset, index);
        }
    }
    // Read back in spans unlike the writes', so that each read crosses their edges.
    let mut span = Aligned::new(768 << 10);
    for start in (0..REGION_BYTES).step_by(768 << 10) {
        let len = (768 << 10).min(REGION_BYTES - start);
        disk.read_exact_at(&mut span.bytes()[..len], start as u64).expect("read back");
        let first_wrong = (0..len).find(|&index| span.bytes()[index] != expected[start + index]);
        assert_eq!(first_wrong, None, "byte {} of the region", start + first_wrong.unwrap_or(0));
    }
    drop(disk);

    let started = Instant::now();
    nvme_cli(&["disconnect", "-n", NQN]);
    assert!(controller(NQN).is_none(), "the controller is gone after disconnect");
    assert!(started.elapsed() < Duration::from_secs(30), "disconnect took {:?}", started.elapsed());
    handle.stop();
}
