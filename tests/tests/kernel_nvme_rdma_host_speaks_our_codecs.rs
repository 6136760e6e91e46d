//! The Linux kernel's NVMe/RDMA host (`nvme connect -t rdma`) connecting to an RDMA_CM listener of ours:
//! its connection request's private data, its first command capsule (the admin queue's Fabrics Connect,
//! whose Connect data lies in host memory behind a Keyed SGL), that data fetched with an RDMA READ, and our
//! response capsule, which the host takes as it should: its next command is the Property Get of CAP that
//! follows a successful Connect. Each is read or written with strata-nvme's and strata-transfer's own
//! codecs; the kernel is the oracle of the bytes. Nothing answers the Property Get: the connection is
//! dropped and the host gives up.
//!
//! Needs an RDMA device and the kernel's nvme-rdma: tests/lab/rdma-tests runs it in the soft-RoCE guest.

use std::net::SocketAddrV4;
use std::process::Stdio;
use std::time::Duration;

use strata_nvme::rdma::KeyedSgl;
use strata_nvme::rdma::cm::{ADMIN_QUEUE_DEPTH_MAX, ConnectAccept, ConnectRequest};
use strata_nvme::spec::{Command, Completion, ConnectData, FABRICS_OPCODE, FabricsType, NvmeStatus};
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
/// Where the response capsule is sent from.
const RESPONSE_AT: usize = CONNECT_DATA_AT + 4096;

/// The command in the receive of `work_request_id`: its 64 bytes and their decoding.
fn received_command(buffer: &RegisteredBuffer, work_request_id: u64) -> ([u8; 64], Command) {
    let at = work_request_id as usize * RECEIVE_BYTES;
    let mut bytes = [0u8; 64];
    bytes.copy_from_slice(&buffer.as_slice()[at..at + 64]);
    (bytes, Command::decode(&bytes))
}

#[test]
#[ignore = "needs an RDMA device and the kernel's nvme-rdma: tests/lab/rdma-tests runs it in a soft-RoCE guest"]
fn the_kernels_host_sends_what_our_codecs_read() {
    let name = std::env::var("STRATA_RDMA_DEVICE").expect("STRATA_RDMA_DEVICE names the device");
    let address: std::net::Ipv4Addr =
        std::env::var("STRATA_RDMA_ADDRESS").expect("STRATA_RDMA_ADDRESS: the device's IPv4").parse().expect("an IPv4");
    let device = Device::open(&name).expect("device");
    let mut listener = CmListener::bind(SocketAddrV4::new(address, 4420)).expect("listening");
    let mut host = std::process::Command::new("nvme")
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
    let mut buffer = RegisteredBuffer::new(&domain, RESPONSE_AT + 64, Access::Local).expect("buffer");
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
    let (bytes, command) = received_command(&buffer, capsule.work_request_id);
    assert_eq!(command.opcode, FABRICS_OPCODE, "a Fabrics command");
    assert_eq!(FabricsType::from_byte(command.nsid as u8), Some(FabricsType::Connect));
    let sgl = KeyedSgl::decode(&bytes[24..40]).expect("the Connect data behind a keyed SGL");
    assert_eq!(sgl.length, ConnectData::BYTES as u32, "the Connect data's 1,024 bytes");

    let local = buffer.region().local_span(CONNECT_DATA_AT as u64, 1024).expect("span");
    let remote = RemoteSpan { address: sgl.address, length: sgl.length, remote_key: sgl.key };
    // SAFETY: the buffer is read only after the READ's completion.
    unsafe { pair.post_read(1000, local, remote) }.expect("post read");
    done.clear();
    assert_eq!(completions.wait(&mut done, 1, WAIT).expect("completions"), 1);
    assert_eq!((done[0].work_request_id, done[0].result.clone()), (1000, Ok(1024)), "{:?}", done[0]);
    let data = ConnectData::decode(&buffer.as_slice()[CONNECT_DATA_AT..CONNECT_DATA_AT + ConnectData::BYTES])
        .expect("the Connect data");
    assert_eq!(data.subnqn, NQN, "the subsystem the host asked for");
    assert!(data.hostnqn.starts_with("nqn."), "the host's own NQN: {}", data.hostnqn);
    assert_eq!(data.cntlid, ConnectData::DYNAMIC_CNTLID, "an admin queue under the dynamic controller model");

    // Our response capsule: success, controller 1. A host that reads it as such goes on to Property Get.
    let response = Completion { dw0: 1, sq_head: 1, ..Completion::new(command.cid, NvmeStatus::SUCCESS) };
    buffer.as_mut_slice()[RESPONSE_AT..RESPONSE_AT + 16].copy_from_slice(&response.encode());
    let local = buffer.region().local_span(RESPONSE_AT as u64, 16).expect("span");
    // SAFETY: the response's bytes are not written again until the send's completion.
    unsafe { pair.post_send(2000, local) }.expect("post send");
    done.clear();
    for _ in 0..2 {
        if done.len() < 2 {
            let missing = 2 - done.len();
            completions.wait(&mut done, missing, WAIT).expect("completions");
        }
    }
    let sent = done.iter().find(|completion| completion.work_request_id == 2000).expect("the response was sent");
    assert_eq!((sent.kind, sent.result.clone()), (CompletionKind::Send, Ok(16)));
    let next =
        done.iter().find(|completion| completion.kind == CompletionKind::Receive).expect("the host's next command");
    let (_, command) = received_command(&buffer, next.work_request_id);
    assert_eq!(command.opcode, FABRICS_OPCODE);
    assert_eq!(FabricsType::from_byte(command.nsid as u8), Some(FabricsType::PropertyGet), "{command:?}");

    drop(pair);
    drop(request);
    // Reaped on a thread of its own: nvme-cli sits in the kernel until the host's admin timeout (60 s)
    // gives up on the Property Get, and a kill takes effect only then.
    let _ = host.kill();
    std::thread::spawn(move || host.wait());
}
