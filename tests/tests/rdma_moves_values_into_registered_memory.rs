//! Values moved by RDMA between a real node and a client on a real verbs device: batch puts and gets of
//! 4 KiB to 16 MiB, from DRAM and from the NVMe tier; a span too small; a connection that names another
//! client's memory (its key is refused by the device, and that memory is left as it was); a client killed
//! in the middle of transfers (the node keeps serving, and releases the queue pair and the memory the
//! connection held).
//!
//! Needs an RDMA device: tests/lab/rdma-tests runs these inside a soft-RoCE guest (`STRATA_RDMA_DEVICE`).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{config, read_frame, say_hello, spans_from, start, value_of};
use strata_client::{Client, ClientError, ClientOptions, PutOptions, Transport};
use strata_engine::Node;
use strata_nvme::DeviceSpec;
use strata_proto::{
    FrameHeader, HelloReply, HelloRequest, ITEM_SHARED, Opcode, REGISTER_REMOTE, REQUEST_ITEM_BYTES,
    RESPONSE_ITEM_BYTES, RequestItemHeader, ResponseItemHeader, SharedSpan, Status,
};
use strata_transfer::Endpoint;
use strata_transfer::verbs::{
    Access, CompletionQueue, Device, ProtectionDomain, QueuePair, QueuePairOptions, RegisteredBuffer,
};

const MIB: usize = 1 << 20;
const SIZES: [usize; 5] = [4096, 65_537, MIB, 4 * MIB, 16 * MIB];

fn device_name() -> String {
    std::env::var("STRATA_RDMA_DEVICE").expect("STRATA_RDMA_DEVICE names the device")
}

/// A node on CPU 0 with 64 MiB of DRAM and a 256 MiB memory-backed NVMe tier (regions of 32 MiB, room for
/// the 16 MiB values), moving values by RDMA.
fn rdma_node() -> Node {
    let mut config = config(&[0], 64 << 20);
    config.region_bytes = 32 << 20;
    config.nvme = vec![DeviceSpec::Memory { capacity_bytes: 256 << 20 }];
    config.rdma_device = Some(device_name());
    start(config)
}

fn rdma_client(node: &Node) -> Client {
    let options = ClientOptions { rdma_device: Some(device_name()), ..ClientOptions::default() };
    Client::connect(node.local_addr(), options).expect("client connects")
}

#[test]
#[ignore = "needs an RDMA device: tests/lab/rdma-tests runs it in a soft-RoCE guest"]
fn values_move_both_ways_from_dram_and_from_the_tier() {
    let node = rdma_node();
    let mut client = rdma_client(&node);
    assert_eq!(client.rdma_transport(), Transport::Rdma, "{:?}", client.rdma_unavailable());
    let keys: Vec<Vec<u8>> = (0..SIZES.len()).map(|index| format!("rdma-{index}").into_bytes()).collect();
    let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let total: usize = SIZES.iter().sum();
    let mut source = client.rdma_buffer(total).expect("buffer");
    let put_spans = spans_from(&SIZES, 0);
    for (index, &(offset, len)) in put_spans.iter().enumerate() {
        source.as_mut_slice()[offset..offset + len].copy_from_slice(&value_of(index as u64, len));
    }
    for result in client.batch_put_from_rdma(&keys, &source, &put_spans, PutOptions::default()) {
        result.expect("an RDMA put");
    }
    let mut tcp = Client::connect(node.local_addr(), ClientOptions::default()).expect("a TCP client");
    let check = |client: &mut Client, tcp: &mut Client, from: &str| {
        let shifted = spans_from(&SIZES, 4096);
        let mut into = client.rdma_buffer(total + 4096).expect("buffer");
        let read = client.batch_get_into_rdma(&keys, &mut into, &shifted);
        for (index, (result, &(offset, len))) in read.into_iter().zip(&shifted).enumerate() {
            assert_eq!(result.expect("an RDMA get"), len, "{from}");
            let expected = value_of(index as u64, len);
            assert!(into.as_slice()[offset..offset + len] == expected[..], "value {index} by RDMA, {from}");
            assert_eq!(tcp.get(keys[index]).expect("a TCP get"), expected, "value {index} over TCP, {from}");
        }
    };
    check(&mut client, &mut tcp, "from DRAM");
    // 160 MiB more push the first values out of the 64 MiB of DRAM, onto the tier: their reads come from
    // the device's buffers, through the connection's staging buffer.
    let filler = client.rdma_buffer(4 * MIB).expect("buffer");
    for round in 0..40 {
        let key = format!("filler-{round}");
        client.batch_put_from_rdma(&[key.as_bytes()], &filler, &[(0, 4 * MIB)], PutOptions::default())[0]
            .as_ref()
            .expect("a filler put");
    }
    let located = client.batch_locate(&keys);
    assert!(
        located.iter().any(|location| location.as_ref().is_ok_and(|location| !location.in_dram && location.on_nvme)),
        "some values live on the tier only: {located:?}"
    );
    check(&mut client, &mut tcp, "from the tier");
    node.shutdown().expect("shutdown");
}

#[test]
#[ignore = "needs an RDMA device: tests/lab/rdma-tests runs it in a soft-RoCE guest"]
fn a_span_smaller_than_its_value_is_refused_and_left_untouched() {
    let node = rdma_node();
    let mut client = rdma_client(&node);
    client.put(b"big", &value_of(1, 10_000)).expect("put");
    let mut buffer = client.rdma_buffer(16_384).expect("buffer");
    buffer.as_mut_slice().fill(0xAB);
    let read = client.batch_get_into_rdma(&[b"big"], &mut buffer, &[(100, 9_999)]);
    assert!(matches!(read[0], Err(ClientError::BufferTooSmall { needed: 10_000, available: 9_999 })), "{:?}", read[0]);
    assert!(buffer.as_slice().iter().all(|&byte| byte == 0xAB), "nothing was written");
    assert_eq!(client.batch_get_into_rdma(&[b"big"], &mut buffer, &[(0, 10_000)])[0].as_ref().ok(), Some(&10_000));
    assert!(buffer.as_slice()[..10_000] == value_of(1, 10_000)[..]);
    node.shutdown().expect("shutdown");
}

#[test]
#[ignore = "needs an RDMA device: tests/lab/rdma-tests runs it in a soft-RoCE guest"]
fn the_callers_own_memory_is_read_and_written_in_place() {
    let node = rdma_node();
    let mut client = rdma_client(&node);
    // An engine's own memory (a KV pool it allocated), registered as it is.
    let mut pool = vec![0u8; 3 * MIB];
    pool[..MIB].copy_from_slice(&value_of(7, MIB));
    // SAFETY: `pool` outlives `registered` (dropped first, below) and is not touched during the calls.
    #[allow(unsafe_code)]
    let mut registered = unsafe { client.register_rdma_memory(pool.as_mut_ptr(), pool.len()) }.expect("registered");
    let put = client.batch_put_from_rdma(&[b"engine-block"], &registered, &[(0, MIB)], PutOptions::default());
    put[0].as_ref().expect("a put read from the engine's memory");
    let read = client.batch_get_into_rdma(&[b"engine-block"], &mut registered, &[(2 * MIB, MIB)]);
    assert_eq!(read[0].as_ref().ok(), Some(&MIB));
    drop(registered);
    assert!(pool[2 * MIB..] == value_of(7, MIB)[..], "the node wrote straight into the engine's memory");
    assert!(pool[MIB..2 * MIB].iter().all(|&byte| byte == 0), "and nowhere else");
    node.shutdown().expect("shutdown");
}

/// A raw connection to shard 0 that has said HELLO offering RDMA; the node's HELLO reply.
fn raw_connection(node: &Node) -> (TcpStream, HelloReply) {
    let mut stream = TcpStream::connect(node.local_addr()).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    let hello = HelloRequest { offers_rdma: true, ..HelloRequest::default() };
    let (_, body) = say_hello(&mut stream, &hello);
    (stream, HelloReply::decode(&body).expect("hello reply"))
}

/// Sends one item (`item`, `key`, then `tail`) of `opcode`; the reply's first item and its data.
fn ask(
    stream: &mut TcpStream,
    opcode: Opcode,
    (item, key, tail): (RequestItemHeader, &[u8], &[u8]),
) -> (ResponseItemHeader, Vec<u8>) {
    let mut frame = Vec::new();
    let body_len = REQUEST_ITEM_BYTES + key.len() + tail.len();
    FrameHeader::request(opcode, 7, 1, body_len as u64).encode_into(&mut frame);
    RequestItemHeader { key_len: key.len() as u16, ..item }.encode_into(&mut frame);
    frame.extend_from_slice(key);
    frame.extend_from_slice(tail);
    stream.write_all(&frame).expect("send");
    let (header, body) = read_frame(stream);
    assert_eq!(header.status, Status::Ok, "{opcode:?} frame");
    let answer = ResponseItemHeader::decode(&body[..RESPONSE_ITEM_BYTES]).expect("item");
    (answer, body[RESPONSE_ITEM_BYTES..].to_vec())
}

#[test]
#[ignore = "needs an RDMA device: tests/lab/rdma-tests runs it in a soft-RoCE guest"]
fn a_connection_naming_another_clients_memory_is_refused_by_the_device() {
    let node = rdma_node();
    let mut owner = rdma_client(&node);
    owner.put(b"secret-sized", &value_of(3, 8192)).expect("put");
    let device = Device::open(&device_name()).expect("device");
    // Another client's memory, registered for remote access in its own protection domain.
    let victim_domain = ProtectionDomain::new(&device).expect("domain");
    let mut victim = RegisteredBuffer::new(&victim_domain, 64 * 1024, Access::RemoteReadWrite).expect("victim");
    victim.as_mut_slice().fill(0x5a);
    let stolen = victim.region().remote_span(0, 64 * 1024).expect("span");

    // An attacker's connection: its own queue pair (in its own domain), and the victim's address and key.
    let (mut stream, hello) = raw_connection(&node);
    assert!(hello.rdma, "the node offers RDMA");
    let domain = ProtectionDomain::new(&device).expect("domain");
    let completions = CompletionQueue::new(&device, 4).expect("queue");
    let options = QueuePairOptions { remote_access: true, send_queue_depth: 1, ..QueuePairOptions::default() };
    let pair = QueuePair::new(&domain, &completions, options).expect("queue pair");
    let (answer, data) =
        ask(&mut stream, Opcode::RdmaConnect, (RequestItemHeader::default(), &pair.endpoint().encode(), &[]));
    assert_eq!(answer.status, Status::Ok);
    pair.connect(&Endpoint::decode(&data).expect("endpoint")).expect("connect");
    let register = RequestItemHeader { flags: REGISTER_REMOTE, ..Default::default() };
    let (answer, _) = ask(&mut stream, Opcode::Register, (register, &stolen.encode(), &[]));
    assert_eq!(answer.status, Status::Ok, "the node cannot tell a key apart: it only records it");
    let region = answer.object_len;
    let mut span = Vec::new();
    SharedSpan { region, len: 8192, offset: 0 }.encode_into(&mut span);
    let get = RequestItemHeader { flags: ITEM_SHARED, ..Default::default() };
    let (answer, _) = ask(&mut stream, Opcode::Get, (get, b"secret-sized", &span));
    assert_eq!(answer.status, Status::Transfer, "the victim's domain refuses the attacker's queue pair");
    assert!(victim.as_slice().iter().all(|&byte| byte == 0x5a), "the victim's memory is untouched");
    let (answer, _) = ask(&mut stream, Opcode::Get, (get, b"secret-sized", &span));
    assert_eq!(answer.status, Status::Transfer, "the connection's RDMA stays failed");
    // A span outside what the connection registered is refused before any transfer.
    let mut outside = Vec::new();
    SharedSpan { region, len: 8192, offset: 60 * 1024 }.encode_into(&mut outside);
    let (answer, _) = ask(&mut stream, Opcode::Get, (get, b"secret-sized", &outside));
    assert_eq!(answer.status, Status::Invalid);
    // The node goes on serving everyone else by RDMA.
    let mut buffer = owner.rdma_buffer(8192).expect("buffer");
    assert_eq!(owner.batch_get_into_rdma(&[b"secret-sized"], &mut buffer, &[(0, 8192)])[0].as_ref().ok(), Some(&8192));
    assert!(buffer.as_slice() == &value_of(3, 8192)[..]);
    node.shutdown().expect("shutdown");
}

/// The kernel's count of `kind` ("qp", "mr") resources on the device, as `rdma res show` reports them.
fn resources(kind: &str) -> usize {
    let output = Command::new("rdma").args(["res", "show", kind]).output().expect("the rdma tool");
    String::from_utf8_lossy(&output.stdout).lines().filter(|line| !line.trim().is_empty()).count()
}

/// The child of `a_client_killed_mid_transfer...`: reads 16 MiB values by RDMA until it is killed.
fn run_dying_client(address: &str) {
    let options = ClientOptions { rdma_device: Some(device_name()), ..ClientOptions::default() };
    let mut client = Client::connect(address, options).expect("child connects");
    let keys: Vec<Vec<u8>> = (0..4).map(|index| format!("large-{index}").into_bytes()).collect();
    let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let spans = spans_from(&[16 * MIB; 4], 0);
    let mut buffer = client.rdma_buffer(64 * MIB).expect("buffer");
    // Its queue pairs are connected before it says so.
    assert_eq!(client.rdma_transport(), Transport::Rdma);
    println!("child ready");
    for _ in 0..10_000 {
        let _ = client.batch_get_into_rdma(&keys, &mut buffer, &spans);
    }
}

#[test]
#[ignore = "needs an RDMA device: tests/lab/rdma-tests runs it in a soft-RoCE guest"]
fn a_client_killed_mid_transfer_leaves_the_node_serving_and_holding_nothing() {
    if let Ok(address) = std::env::var("STRATA_RDMA_DYING_CLIENT") {
        return run_dying_client(&address);
    }
    let node = rdma_node();
    let mut client = rdma_client(&node);
    let source = {
        let mut source = client.rdma_buffer(16 * MIB).expect("buffer");
        source.as_mut_slice().copy_from_slice(&value_of(5, 16 * MIB));
        source
    };
    for index in 0..4 {
        let key = format!("large-{index}");
        client.batch_put_from_rdma(&[key.as_bytes()], &source, &[(0, 16 * MIB)], PutOptions::default())[0]
            .as_ref()
            .expect("put");
    }
    let (queue_pairs, regions) = (resources("qp"), resources("mr"));
    let mut child = Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--exact", "a_client_killed_mid_transfer_leaves_the_node_serving_and_holding_nothing", "--ignored"])
        .args(["--nocapture", "--test-threads=1"])
        .env("STRATA_RDMA_DYING_CLIENT", node.local_addr().to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the child starts");
    let mut ready = [0u8; 256];
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let stdout = child.stdout.as_mut().expect("stdout");
    while !seen.contains("child ready") && Instant::now() < deadline {
        let read = stdout.read(&mut ready).expect("child output");
        assert!(read > 0, "the child ended early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&ready[..read]));
    }
    assert!(resources("qp") > queue_pairs, "the child's queue pairs are up");
    // Killed while the node writes 16 MiB values into its memory (a batch takes seconds here).
    std::thread::sleep(Duration::from_millis(1500));
    child.kill().expect("kill");
    child.wait().expect("reaped");
    let deadline = Instant::now() + Duration::from_secs(60);
    while (resources("qp"), resources("mr")) != (queue_pairs, regions) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(resources("qp"), queue_pairs, "the node destroyed the dead connection's queue pair");
    assert_eq!(resources("mr"), regions, "and released what it registered for it (its staging buffer)");
    let mut into = client.rdma_buffer(16 * MIB).expect("buffer");
    assert_eq!(
        client.batch_get_into_rdma(&[b"large-2"], &mut into, &[(0, 16 * MIB)])[0].as_ref().ok(),
        Some(&(16 * MIB))
    );
    assert!(into.as_slice() == source.as_slice(), "the node still serves, byte for byte");
    node.shutdown().expect("shutdown");
}
