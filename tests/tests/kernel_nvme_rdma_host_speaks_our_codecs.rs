//! The Linux kernel's NVMe/RDMA host (`nvme connect -t rdma`) connecting to an RDMA_CM listener of ours:
//! its connection request's private data, its first command capsule (the admin queue's Fabrics Connect,
//! whose Connect data lies in host memory behind a Keyed SGL), and that data fetched with an RDMA READ,
//! each read with strata-nvme's and strata-transfer's own codecs. The kernel is the oracle of the bytes.
//! Nothing answers the Connect: the connection is dropped and the host gives up.
//!
//! Needs an RDMA device and the kernel's nvme-rdma: tests/lab/rdma-tests runs it in the soft-RoCE guest.

use std::net::SocketAddrV4;
use std::process::{Command, Stdio};
use std::time::Duration;

use strata_nvme::rdma::KeyedSgl;
use strata_nvme::rdma::cm::{ADMIN_QUEUE_DEPTH_MAX, ConnectAccept, ConnectRequest};
use strata_transfer::RemoteSpan;
use strata_transfer::verbs::{
    Access, CmListener, CompletionKind, CompletionQueue, Device, ProtectionDomain, QueuePair, QueuePairOptions,
    RegisteredBuffer,
};

const NQN: &str = "nqn.2026-12.io.strata:cm-oracle";
const WAIT: Duration = Duration::from_secs(60);
/// A receive per admin command the host may send: 64-byte commands, with room to spare.
const RECEIVE_BYTES: usize = 4096;
/// Where the Connect data is read to, after the receives.
const CONNECT_DATA_AT: usize = ADMIN_QUEUE_DEPTH_MAX as usize * RECEIVE_BYTES;

#[test]
#[ignore = "needs an RDMA device and the kernel's nvme-rdma: tests/lab/rdma-tests runs it in a soft-RoCE guest"]
fn the_kernels_host_sends_what_our_codecs_read() {
    let name = std::env::var("STRATA_RDMA_DEVICE").expect("STRATA_RDMA_DEVICE names the device");
    let address: std::net::Ipv4Addr =
        std::env::var("STRATA_RDMA_ADDRESS").expect("STRATA_RDMA_ADDRESS: the device's IPv4").parse().expect("an IPv4");
    let device = Device::open(&name).expect("device");
    let mut listener = CmListener::bind(SocketAddrV4::new(address, 4420)).expect("listening");
    let mut host = Command::new("nvme")
        .args(["connect", "-t", "rdma", "-a", &address.to_string(), "-s", "4420", "-n", NQN])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nvme-cli starts");

    let request = listener.next_request(WAIT).expect("the channel").expect("the host's connection request");
    let connect = ConnectRequest::decode(&request.private_data, 128).expect("the kernel's private data is valid");
    assert_eq!(connect.queue_id, 0, "the admin queue first");
    assert_eq!(connect.commands_in_flight(), ADMIN_QUEUE_DEPTH_MAX);
    assert_eq!(connect.host_receive_queue_size, ADMIN_QUEUE_DEPTH_MAX);

    let domain = ProtectionDomain::new(&device).expect("domain");
    let completions = CompletionQueue::new(&device, 128).expect("queue");
    let options =
        QueuePairOptions { receive_queue_depth: u32::from(ADMIN_QUEUE_DEPTH_MAX), ..QueuePairOptions::default() };
    let pair = QueuePair::new(&domain, &completions, options).expect("queue pair");
    let buffer = RegisteredBuffer::new(&domain, CONNECT_DATA_AT + 4096, Access::Local).expect("buffer");
    for slot in 0..ADMIN_QUEUE_DEPTH_MAX as usize {
        let local = buffer.region().local_span((slot * RECEIVE_BYTES) as u64, RECEIVE_BYTES as u32).expect("span");
        // SAFETY: the buffer outlives the queue pair's receives and is read only after their completions.
        unsafe { pair.post_receive(slot as u64, local) }.expect("post receive");
    }
    let accept = ConnectAccept { controller_receive_queue_size: ADMIN_QUEUE_DEPTH_MAX };
    listener.accept(&request, &pair, (&accept.encode(), 16), WAIT).expect("established");

    let mut done = Vec::new();
    assert_eq!(completions.wait(&mut done, 1, WAIT).expect("completions"), 1, "the host's first capsule");
    let capsule = &done[0];
    assert_eq!((capsule.kind, capsule.result.clone()), (CompletionKind::Receive, Ok(64)), "a 64-byte command");
    let at = capsule.work_request_id as usize * RECEIVE_BYTES;
    let command = buffer.as_slice()[at..at + 64].to_vec();
    assert_eq!(command[0], 0x7f, "a Fabrics command");
    assert_eq!(command[4], 0x01, "Connect");
    let sgl = KeyedSgl::decode(&command[24..40]).expect("the Connect data behind a keyed SGL");
    assert_eq!(sgl.length, 1024, "the Connect data's 1,024 bytes");

    let local = buffer.region().local_span(CONNECT_DATA_AT as u64, 1024).expect("span");
    let remote = RemoteSpan { address: sgl.address, length: sgl.length, remote_key: sgl.key };
    // SAFETY: the buffer is read only after the READ's completion.
    unsafe { pair.post_read(1000, local, remote) }.expect("post read");
    done.clear();
    assert_eq!(completions.wait(&mut done, 1, WAIT).expect("completions"), 1);
    assert_eq!((done[0].work_request_id, done[0].result.clone()), (1000, Ok(1024)), "{:?}", done[0]);
    let data = &buffer.as_slice()[CONNECT_DATA_AT..CONNECT_DATA_AT + 1024];
    let text =
        |bytes: &[u8]| String::from_utf8_lossy(bytes.split(|&byte| byte == 0).next().unwrap_or(&[])).into_owned();
    assert_eq!(text(&data[256..512]), NQN, "the subsystem the host asked for");
    assert!(text(&data[512..768]).starts_with("nqn."), "the host's own NQN: {}", text(&data[512..768]));

    drop(pair);
    drop(request);
    let _ = host.kill();
    let _ = host.wait();
}
