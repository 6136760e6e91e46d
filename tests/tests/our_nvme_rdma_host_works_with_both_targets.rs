//! Strata's NVMe/RDMA host (`NvmfDevice` with `trtype=rdma`) against the Linux kernel's nvmet-rdma target
//! (configured through configfs over a memory-backed null_blk) and against Strata's own target, both over
//! soft-RoCE: it connects the admin and I/O queues, identifies the controller and namespace, and what it
//! writes (4 KiB to 1 MiB, several queues' worth in flight) reads back byte for byte, including what another
//! connection wrote; a target that is gone fails the connect with a typed error, not a hang. A host that
//! connects a queue pair to our target and sends no Connect is disconnected once the handshake timeout
//! passed. And a storage node whose NVMe tier is a namespace reached by RDMA serves from it what no longer
//! fits its DRAM.
//!
//! Needs an RDMA device and the kernel's nvmet-rdma: tests/lab/rdma-tests runs it in the soft-RoCE guest.

mod common;

use std::process::Command;
use std::time::Duration;

use glommio::{LocalExecutorBuilder, Placement};
use strata_nvme::rdma::cm::ConnectRequest;
use strata_nvme::target::{self, NamespaceBackend, NamespaceConfig, SubsystemConfig, TargetConfig};
use strata_nvme::{BlockDevice, HostOptions, NvmfAddress, NvmfDevice, NvmfTransport};
use strata_transfer::verbs::{CmConnection, CompletionQueue, Device, ProtectionDomain, QueuePair, QueuePairOptions};

const KERNEL_NQN: &str = "nqn.2026-12.io.strata:kernel-rdma";
const OUR_NQN: &str = "nqn.2026-12.io.strata:our-rdma";
/// Writes of several sizes at once, then each read back.
const SPANS: [(u64, usize); 5] =
    [(0, 4096), (1 << 20, 64 << 10), (2 << 20, 1 << 20), (5 << 20, 12 << 10), (8 << 20, 128 << 10)];

fn address_of_device() -> std::net::Ipv4Addr {
    std::env::var("STRATA_RDMA_ADDRESS").expect("STRATA_RDMA_ADDRESS: the device's IPv4").parse().expect("an IPv4")
}

/// The kernel's target: subsystem KERNEL_NQN with a 256 MiB memory-backed null_blk, on `port`.
fn start_kernel_target(address: std::net::Ipv4Addr, port: u16) {
    let config = "/sys/kernel/config/nvmet";
    let script = format!(
        "set -e
modprobe null_blk nr_devices=1 gb=1 bs=4096 memory_backed=1 irqmode=0 queue_mode=2
modprobe nvmet-rdma
mkdir {config}/subsystems/{KERNEL_NQN} {config}/subsystems/{KERNEL_NQN}/namespaces/1 {config}/ports/7
echo 1 >{config}/subsystems/{KERNEL_NQN}/attr_allow_any_host
echo -n /dev/nullb0 >{config}/subsystems/{KERNEL_NQN}/namespaces/1/device_path
echo 1 >{config}/subsystems/{KERNEL_NQN}/namespaces/1/enable
echo rdma >{config}/ports/7/addr_trtype; echo ipv4 >{config}/ports/7/addr_adrfam
echo {address} >{config}/ports/7/addr_traddr; echo {port} >{config}/ports/7/addr_trsvcid
ln -s {config}/subsystems/{KERNEL_NQN} {config}/ports/7/subsystems/{KERNEL_NQN}"
    );
    let output = Command::new("sh").args(["-c", &script]).output().expect("sh runs");
    assert!(output.status.success(), "nvmet-rdma setup: {}", String::from_utf8_lossy(&output.stderr));
}

/// Strata's target: subsystem `nqn` with one memory namespace of `bytes`, listening on RDMA at `listen`.
fn start_our_target(nqn: &str, bytes: u64, listen: std::net::SocketAddrV4) -> target::TargetHandle {
    target::start(our_target_config(nqn, bytes, listen)).expect("our target starts with an RDMA listener")
}

fn our_target_config(nqn: &str, bytes: u64, listen: std::net::SocketAddrV4) -> TargetConfig {
    let namespace = NamespaceConfig { backend: NamespaceBackend::Memory { bytes }, block_bytes: 4096 };
    let subsystem = SubsystemConfig { nqn: nqn.into(), namespaces: vec![namespace], allowed_hosts: Vec::new() };
    TargetConfig { rdma_listen: Some(listen), ..TargetConfig::new("127.0.0.1:0".parse().unwrap(), vec![subsystem]) }
}

/// The byte a write at `offset` puts at `index` of its span.
fn pattern(offset: u64, index: usize, salt: u8) -> u8 {
    ((offset as usize + index).wrapping_mul(2_654_435_761) >> 13) as u8 ^ salt
}

/// Writes SPANS concurrently through `device`, then reads each back (through `reader`) and checks it.
async fn write_and_read_back(device: &NvmfDevice, reader: &NvmfDevice, salt: u8) {
    let writes = SPANS.iter().map(|&(offset, len)| {
        let mut buffer = device.alloc_buffer(len);
        for (index, byte) in buffer.as_mut_slice().iter_mut().enumerate() {
            *byte = pattern(offset, index, salt);
        }
        device.write(buffer, offset)
    });
    for (_, written) in join_all(writes).await {
        written.expect("a write through our host");
    }
    for (offset, len) in SPANS {
        let (buffer, read) = reader.read(reader.alloc_buffer(len), offset).await;
        read.expect("a read through our host");
        let wrong =
            buffer.as_slice().iter().enumerate().position(|(index, byte)| *byte != pattern(offset, index, salt));
        assert_eq!(wrong, None, "span at {offset} of {len} bytes: first wrong byte");
    }
}

/// Polls every future to completion on this task, in order of readiness.
async fn join_all<F: std::future::Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<_> = futures.map(Box::pin).map(Some).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|context| {
        for (slot, future) in pending.iter_mut().enumerate() {
            if let Some(running) = future
                && let std::task::Poll::Ready(output) = running.as_mut().poll(context)
            {
                outputs[slot] = Some(output);
                *future = None;
            }
        }
        if pending.iter().all(Option::is_none) { std::task::Poll::Ready(()) } else { std::task::Poll::Pending }
    })
    .await;
    outputs.into_iter().map(|output| output.expect("every future finished")).collect()
}

#[test]
#[ignore = "needs an RDMA device and the kernel's nvmet-rdma: tests/lab/rdma-tests runs it in a soft-RoCE guest"]
fn our_host_reads_back_what_it_wrote_on_the_kernels_target_and_ours() {
    let address = address_of_device();
    start_kernel_target(address, 4430);
    let ours = start_our_target(OUR_NQN, 64 << 20, std::net::SocketAddrV4::new(address, 4431));
    let kernel = NvmfAddress::parse(&format!("trtype=rdma,traddr={address},trsvcid=4430,subnqn={KERNEL_NQN},ns=1"))
        .expect("an address");
    let strata =
        NvmfAddress { subnqn: OUR_NQN.into(), addr: std::net::SocketAddr::from((address, 4431)), ..kernel.clone() };
    assert_eq!(strata.transport, NvmfTransport::Rdma);
    LocalExecutorBuilder::new(Placement::Unbound)
        .spawn(move || async move {
            for (name, address, salt) in [("nvmet-rdma", &kernel, 0x5a), ("strata", &strata, 0xa5)] {
                let options = HostOptions { queue_entries: 32, ..HostOptions::default() };
                let device =
                    NvmfDevice::connect(address, &options, 1).await.unwrap_or_else(|error| panic!("{name}: {error}"));
                let info = device.controller().expect("the controller's identity");
                assert_ne!(info.identity.sgls & (1 << 2), 0, "{name} offers keyed SGLs");
                assert_eq!(device.geometry().logical_block_bytes, 4096, "{name}: Identify Namespace over RDMA");
                let second = NvmfDevice::connect(address, &options, 1).await.expect("a second controller");
                write_and_read_back(&device, &second, salt).await;
                write_and_read_back(&second, &device, salt ^ 0xff).await;
            }
        })
        .expect("executor")
        .join()
        .expect("the host's checks");
    ours.stop();
    // A target that is gone: connecting fails with a typed error within the connection manager's wait.
    LocalExecutorBuilder::new(Placement::Unbound)
        .spawn(move || async move {
            let gone =
                NvmfAddress::parse(&format!("trtype=rdma,traddr={address},trsvcid=4431,subnqn={OUR_NQN}")).unwrap();
            let options = HostOptions { controller_loss_timeout: Duration::ZERO, ..HostOptions::default() };
            let started = std::time::Instant::now();
            let error = NvmfDevice::connect(&gone, &options, 1).await.err().expect("nothing listens there");
            assert!(error.to_string().contains("RDMA"), "{error}");
            assert!(started.elapsed() < Duration::from_secs(30), "failed after {:?}", started.elapsed());
        })
        .expect("executor")
        .join()
        .expect("the refusal's checks");
}

/// A queue pair connected through RDMA_CM to `peer` as the admin queue, with nothing sent on it.
fn connect_silent_queue(peer: std::net::SocketAddrV4) -> (CmConnection, QueuePair) {
    let wait = Duration::from_secs(10);
    let mut connection = CmConnection::resolve(peer, wait).expect("the route to our target");
    let device = Device::open(&connection.device_name().expect("a device routes there")).expect("the device");
    let domain = ProtectionDomain::new(&device).expect("a protection domain");
    let completions = CompletionQueue::new(&device, 64).expect("a completion queue");
    let options = QueuePairOptions { send_queue_depth: 32, receive_queue_depth: 32, ..QueuePairOptions::default() };
    let pair = QueuePair::new(&domain, &completions, options).expect("a queue pair");
    let request =
        ConnectRequest { queue_id: 0, host_receive_queue_size: 32, host_send_queue_size: 31, controller_id: 0xffff };
    connection.connect(&pair, &request.encode(), 4, wait).expect("our target accepts the queue pair");
    (connection, pair)
}

#[test]
#[ignore = "needs an RDMA device: tests/lab/rdma-tests runs it in a soft-RoCE guest"]
fn a_queue_pair_that_sends_no_connect_in_time_is_disconnected_and_a_connected_one_is_not() {
    const NQN: &str = "nqn.2026-12.io.strata:silent-rdma";
    let address = address_of_device();
    let listen = std::net::SocketAddrV4::new(address, 4434);
    let timeout = Duration::from_millis(500);
    let config = TargetConfig { handshake_timeout: timeout, ..our_target_config(NQN, 16 << 20, listen) };
    let target = target::start(config).expect("our target starts with an RDMA listener");
    let strata = NvmfAddress::parse(&format!("trtype=rdma,traddr={address},trsvcid=4434,subnqn={NQN},ns=1")).unwrap();
    LocalExecutorBuilder::new(Placement::Unbound)
        .spawn(move || async move {
            let accepted = std::time::Instant::now();
            let (mut silent, _pair) = connect_silent_queue(listen);
            // Not before the timeout, and not much after it.
            assert!(!silent.wait_disconnected(timeout / 2).expect("the event channel"), "disconnected early");
            let device = NvmfDevice::connect(&strata, &HostOptions::default(), 1).await.expect("a host connects");
            let connected = std::time::Instant::now();
            assert!(silent.wait_disconnected(timeout * 20).expect("the event channel"), "never disconnected");
            let took = accepted.elapsed();
            assert!(took >= timeout && took < timeout * 20, "disconnected after {took:?}");
            // The host that connected in time still reads and writes once its own queues' timeout passed.
            glommio::timer::sleep((timeout * 2).saturating_sub(connected.elapsed())).await;
            let mut buffer = device.alloc_buffer(4096);
            buffer.as_mut_slice().fill(0x3c);
            let (_, written) = device.write(buffer, 8192).await;
            written.expect("a write after the timeout");
            let (read, result) = device.read(device.alloc_buffer(4096), 8192).await;
            result.expect("a read after the timeout");
            assert!(read.as_slice().iter().all(|&byte| byte == 0x3c), "the write reads back");
        })
        .expect("executor")
        .join()
        .expect("the timeout's checks");
    target.stop();
}

#[test]
#[ignore = "needs an RDMA device: tests/lab/rdma-tests runs it in a soft-RoCE guest"]
fn a_node_serves_its_tier_from_a_namespace_reached_by_rdma() {
    const NQN: &str = "nqn.2026-12.io.strata:node-tier";
    const VALUES: usize = 400;
    let address = address_of_device();
    let pool = start_our_target(NQN, 128 << 20, std::net::SocketAddrV4::new(address, 4433));
    let mut config = common::config(&[0], 8 << 20);
    let spec = format!("nvmf:trtype=rdma,traddr={address},trsvcid=4433,subnqn={NQN},ns=1");
    config.nvme = vec![strata_nvme::DeviceSpec::parse(&spec, |_| None).expect("an nvmf spec")];
    let node = common::start(config);
    let mut client =
        strata_client::Client::connect(node.local_addr(), strata_client::ClientOptions::default()).expect("a client");
    // 25 MiB of values through 8 MiB of DRAM: most of them live on the RDMA namespace only.
    let keys: Vec<Vec<u8>> = (0..VALUES).map(|index| format!("tier-{index}").into_bytes()).collect();
    for (index, key) in keys.iter().enumerate() {
        client.put(key, &common::value_of(index as u64, 64 << 10)).expect("a put");
    }
    let located = client.batch_locate(&keys.iter().map(Vec::as_slice).collect::<Vec<_>>());
    let on_tier_only =
        located.iter().filter(|location| location.as_ref().is_ok_and(|at| at.on_nvme && !at.in_dram)).count();
    assert!(on_tier_only > VALUES / 2, "most values on the tier only: {on_tier_only} of {VALUES}");
    for (index, key) in keys.iter().enumerate() {
        let value = client.get(key).expect("a get");
        assert!(value == common::value_of(index as u64, 64 << 10), "value {index} read back whole");
    }
    node.shutdown().expect("shutdown");
    pool.stop();
}
