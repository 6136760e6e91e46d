//! A client on the node's host moves values through shared memory: round trips from 1 byte to 4 MiB either
//! way and mixed with TCP, a span too small for its value, spans no connection registered, memory that is
//! not a sealed memfd, tenants kept apart, a client that goes away mid-transfer, who is told that the node
//! checks its copies, and a value damaged in the node's DRAM.

mod common;

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::time::{Duration, Instant};

use common::{Scratch, config, read_header, say_hello, spans_from, start, total, value_of, with_file};
use strata_client::{Client, ClientError, ClientOptions, PutOptions, SharedBuffer, Transport};
use strata_proto::{
    FrameHeader, HELLO_REPLY_BYTES, HelloReply, HelloRequest, ITEM_SHARED, Opcode, REQUEST_ITEM_BYTES,
    RESPONSE_ITEM_BYTES, RequestItemHeader, ResponseItemHeader, SharedSpan, Status,
};

const SIZES: [usize; 6] = [1, 100, 4096, 65_537, 1 << 20, 4 << 20];

fn shared_client(node: &strata_engine::Node, token: Option<&str>) -> Client {
    let options = ClientOptions { token: token.map(|token| token.as_bytes().to_vec()), ..ClientOptions::default() };
    Client::connect(node.local_addr(), options).expect("client connects")
}

#[test]
fn values_round_trip_through_shared_memory_and_mix_with_tcp() {
    let scratch = Scratch::new("shared-round-trip");
    let node = start(with_file(config(&[0, 1], 64 << 20), &scratch.file("ns0.img"), 128 << 20));
    let mut client = shared_client(&node, None);
    assert_eq!(client.shared_transport(), Transport::SharedMemory, "a node on this host offers the path");
    let keys: Vec<Vec<u8>> = (0..SIZES.len()).map(|index| format!("shm-{index}").into_bytes()).collect();
    let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let spans = spans_from(&SIZES, 0);
    let total_len: usize = SIZES.iter().sum();
    let mut source = SharedBuffer::new(total_len).expect("buffer");
    for (index, &(offset, len)) in spans.iter().enumerate() {
        source.as_mut_slice()[offset..offset + len].copy_from_slice(&value_of(index as u64, len));
    }
    for result in client.batch_put_from_shared(&keys, &source, &spans, PutOptions::default()) {
        result.expect("a shared put");
    }
    // Read back through shared memory, into a buffer of another layout, and over TCP by another client.
    let mut into = SharedBuffer::new(total_len + 4096).expect("buffer");
    let shifted: Vec<(usize, usize)> = spans.iter().map(|&(offset, len)| (offset + 4096, len)).collect();
    let read = client.batch_get_into_shared(&keys, &mut into, &shifted);
    let mut tcp =
        Client::connect(node.local_addr(), ClientOptions { shared_memory: false, ..ClientOptions::default() })
            .expect("a TCP client");
    assert_eq!(tcp.shared_transport(), Transport::Tcp, "not offered: the client did not ask");
    for (index, (result, &(offset, len))) in read.into_iter().zip(&shifted).enumerate() {
        assert_eq!(result.expect("a shared get"), len);
        let expected = value_of(index as u64, len);
        assert!(into.as_slice()[offset..offset + len] == expected[..], "value {index} read through shared memory");
        assert_eq!(tcp.get(keys[index]).expect("a TCP get"), expected, "value {index} read over TCP");
    }
    // A value put over TCP reads through shared memory; a TCP client's shared-buffer calls use TCP.
    tcp.put(b"over-tcp", &value_of(99, 70_000)).expect("a TCP put");
    let mut one = SharedBuffer::new(70_000).expect("buffer");
    assert_eq!(client.batch_get_into_shared(&[b"over-tcp"], &mut one, &[(0, 70_000)])[0].as_ref().ok(), Some(&70_000));
    assert!(one.as_slice() == &value_of(99, 70_000)[..]);
    let mut again = SharedBuffer::new(70_000).expect("buffer");
    assert_eq!(tcp.batch_get_into_shared(&[b"over-tcp"], &mut again, &[(0, 70_000)])[0].as_ref().ok(), Some(&70_000));
    assert!(again.as_slice() == one.as_slice(), "the TCP path fills the same buffer");
    // A miss is a miss; an existing key refuses a plain put, as over TCP.
    let missing = client.batch_get_into_shared(&[b"never-put"], &mut one, &[(0, 100)]);
    assert!(matches!(missing[0], Err(ClientError::NotFound)), "{:?}", missing[0]);
    let again = client.batch_put_from_shared(&keys[..1], &source, &spans[..1], PutOptions::default());
    assert!(matches!(again[0], Err(ClientError::Exists)), "{:?}", again[0]);
    node.shutdown().expect("shutdown");
}

#[test]
fn a_span_smaller_than_its_value_is_refused_and_left_untouched() {
    let node = start(config(&[0], 16 << 20));
    let mut client = shared_client(&node, None);
    client.put(b"big", &value_of(1, 10_000)).expect("put");
    let mut buffer = SharedBuffer::new(16_384).expect("buffer");
    buffer.as_mut_slice().fill(0xAB);
    let read = client.batch_get_into_shared(&[b"big"], &mut buffer, &[(100, 9_999)]);
    assert!(matches!(read[0], Err(ClientError::BufferTooSmall { needed: 10_000, available: 9_999 })), "{:?}", read[0]);
    assert!(buffer.as_slice().iter().all(|&byte| byte == 0xAB), "nothing was written");
    // Spans outside the buffer, or overlapping, are refused by the client before anything is sent.
    let outside = client.batch_put_from_shared(&[b"k"], &buffer, &[(16_000, 1_000)], PutOptions::default());
    assert!(outside[0].is_err());
    node.shutdown().expect("shutdown");
}

/// The node checks every shared get's copy in the client's memory (TRANSFER_CHECKSUM when it differs,
/// `shared_regions`' own test); a client that takes that check skips its own pass, and only such a
/// client is told, so an older one never meets the flag (it refuses flags it does not know).
#[test]
fn the_node_tells_only_a_client_that_takes_them_that_it_checks_its_copies() {
    let node = start(config(&[0], 16 << 20));
    let hello = |offers_shared: bool, takes_checked_copies: bool| {
        let mut stream = std::net::TcpStream::connect(node.local_addr()).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let request = HelloRequest { offers_shared, takes_checked_copies, ..HelloRequest::default() };
        let (header, body) = say_hello(&mut stream, &request);
        assert_eq!(header.status, Status::Ok, "HELLO");
        HelloReply::decode(&body[..HELLO_REPLY_BYTES]).expect("a HELLO reply")
    };
    let taken = hello(true, true);
    assert!(taken.shared_socket && taken.checked_copies, "{taken:?}");
    let older = hello(true, false);
    assert!(older.shared_socket && !older.checked_copies, "{older:?}");
    let over_tcp = hello(false, true);
    assert!(!over_tcp.shared_socket && !over_tcp.checked_copies, "{over_tcp:?}");
    node.shutdown().expect("shutdown");
}

/// The abstract Unix socket shard 0 of `node` listens on (the name its HELLO gives).
fn shard_socket(node: &strata_engine::Node) -> SocketAddr {
    let name = format!("strata-{}-0", node.local_addr());
    SocketAddr::from_abstract_name(name.as_bytes()).expect("name")
}

/// A raw connection to shard 0's Unix socket, past its HELLO.
fn raw_local(node: &strata_engine::Node, token: &[u8]) -> UnixStream {
    let mut stream = UnixStream::connect_addr(&shard_socket(node)).expect("the shard's Unix socket");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let hello = HelloRequest { token: token.to_vec(), ..HelloRequest::default() };
    let (header, _) = say_hello(&mut stream, &hello);
    assert_eq!(header.status, Status::Ok, "HELLO over the Unix socket");
    stream
}

/// Sends one GET naming `span` for `key` and returns its item's status.
fn shared_get(stream: &mut UnixStream, key: &[u8], span: SharedSpan) -> Status {
    let mut body = Vec::new();
    RequestItemHeader { key_len: key.len() as u16, flags: ITEM_SHARED, ..Default::default() }.encode_into(&mut body);
    body.extend_from_slice(key);
    span.encode_into(&mut body);
    let mut frame = Vec::new();
    FrameHeader::request(Opcode::Get, 7, 1, body.len() as u64).encode_into(&mut frame);
    frame.extend_from_slice(&body);
    stream.write_all(&frame).expect("get");
    let header = read_header(stream);
    assert_eq!(header.body_len, RESPONSE_ITEM_BYTES as u64, "no data follows a shared item's reply");
    let mut item = [0u8; RESPONSE_ITEM_BYTES];
    stream.read_exact(&mut item).expect("reply item");
    ResponseItemHeader::decode(&item).expect("item").status
}

/// Sends a REGISTER with `fd` attached and returns its item's status.
fn register(stream: &mut UnixStream, fd: i32) -> Status {
    let mut frame = Vec::new();
    FrameHeader::request(Opcode::Register, 8, 1, REQUEST_ITEM_BYTES as u64 + 1).encode_into(&mut frame);
    RequestItemHeader { key_len: 1, ..Default::default() }.encode_into(&mut frame);
    frame.push(b'*');
    let mut control = [0u64; 4];
    let mut iov = libc::iovec { iov_base: frame.as_mut_ptr().cast(), iov_len: frame.len() };
    // SAFETY: the message points at `iov`, `frame` and `control`, which outlive the call; one descriptor's
    // control message fits in `control`.
    let sent = unsafe {
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = libc::CMSG_SPACE(4) as usize;
        let header = libc::CMSG_FIRSTHDR(&message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(4) as usize;
        libc::CMSG_DATA(header).cast::<i32>().write_unaligned(fd);
        libc::sendmsg(stream.as_raw_fd(), &message, 0)
    };
    assert_eq!(sent as usize, frame.len());
    let header = read_header(stream);
    let mut item = [0u8; RESPONSE_ITEM_BYTES];
    assert_eq!(header.body_len, RESPONSE_ITEM_BYTES as u64);
    stream.read_exact(&mut item).expect("reply item");
    ResponseItemHeader::decode(&item).expect("item").status
}

#[test]
fn the_node_writes_only_into_memory_the_connection_registered() {
    let mut node_config = config(&[0], 16 << 20);
    node_config.tenants = ["alpha", "beta"]
        .into_iter()
        .map(|name| strata_engine::tenants::TenantConfig {
            name: name.into(),
            token: name.as_bytes().to_vec(),
            dram_quota: None,
            nvme_quota: None,
            max_pinned: None,
        })
        .collect();
    let node = start(node_config);
    let mut alpha = shared_client(&node, Some("alpha"));
    let mut buffer = SharedBuffer::new(8192).expect("buffer");
    buffer.as_mut_slice()[..4096].fill(7);
    alpha.batch_put_from_shared(&[b"alpha-key"], &buffer, &[(0, 4096)], PutOptions::default())[0]
        .as_ref()
        .expect("alpha's shared put");
    // Alpha's connection holds region 1. Beta's connection names region 1, which beta never registered,
    // and the key alpha stored (which beta cannot see anyway): refused, not read, not written.
    let mut beta = raw_local(&node, b"beta");
    let span = SharedSpan { region: 1, len: 4096, offset: 4096 };
    assert_eq!(shared_get(&mut beta, b"alpha-key", span), Status::NotFound, "beta does not see alpha's keys");
    let mut beta_client = shared_client(&node, Some("beta"));
    beta_client.put(b"beta-key", &[9u8; 4096]).expect("beta's put");
    assert_eq!(
        shared_get(&mut beta, b"beta-key", span),
        Status::Invalid,
        "a region beta's connection never registered"
    );
    assert!(buffer.as_slice()[4096..].iter().all(|&byte| byte == 0), "alpha's memory untouched");
    // Alpha's own region, named past its end, is refused too.
    let mut alpha_raw = raw_local(&node, b"alpha");
    let past = SharedSpan { region: 1, len: 4096, offset: 8192 };
    assert_eq!(shared_get(&mut alpha_raw, b"alpha-key", past), Status::Invalid, "no region 1 on this connection");
    // Memory that is not a sealed memfd is refused: a plain file, and a memfd with no seal.
    let file = std::fs::File::open("/proc/self/exe").expect("a file");
    assert_eq!(register(&mut alpha_raw, file.as_raw_fd()), Status::Invalid, "a plain file");
    // SAFETY: memfd_create with a NUL-terminated name; the descriptor is closed with `unsealed`.
    let unsealed = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(unsealed >= 0);
    // SAFETY: ftruncate on the descriptor just made.
    assert_eq!(unsafe { libc::ftruncate(unsealed, 8192) }, 0);
    assert_eq!(register(&mut alpha_raw, unsealed), Status::Invalid, "a memfd that could shrink under the node");
    // SAFETY: closes the descriptor made above, once.
    unsafe { libc::close(unsealed) };
    // Shared items over TCP are refused: TCP has no regions.
    let mut tcp_view = Client::connect(
        node.local_addr(),
        ClientOptions { token: Some(b"alpha".to_vec()), shared_memory: false, ..ClientOptions::default() },
    )
    .expect("client");
    assert_eq!(tcp_view.get(b"alpha-key").expect("alpha's key over TCP"), vec![7u8; 4096]);
    node.shutdown().expect("shutdown");
}

/// Mappings of memfds named `name` in this process (the node runs in it; the test never maps its own).
fn mappings_of(name: &str) -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .expect("maps")
        .lines()
        .filter(|line| line.contains(&format!("memfd:{name}")))
        .count()
}

/// A memfd of `len` bytes sealed against shrinking, as a client would register.
fn sealed_memfd(name: &std::ffi::CStr, len: i64) -> i32 {
    // SAFETY: memfd_create with a NUL-terminated name; ftruncate and fcntl on the descriptor it made.
    unsafe {
        let fd = libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, len), 0);
        assert_eq!(libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
        fd
    }
}

#[test]
fn a_client_that_goes_away_mid_transfer_leaves_the_node_serving_and_unmapped() {
    let node = start(config(&[0], 64 << 20));
    let mut writer = shared_client(&node, None);
    let keys: Vec<Vec<u8>> = (0..8).map(|index| format!("gone-{index}").into_bytes()).collect();
    for (index, key) in keys.iter().enumerate() {
        writer.put(key, &value_of(index as u64, 4 << 20)).expect("put");
    }
    // A client registers 32 MiB, asks for 32 MiB of gets into it, and goes away at once: its socket
    // closed and its memfd closed before the node has answered.
    let memory = sealed_memfd(c"gone-client", 32 << 20);
    let mut stream = raw_local(&node, b"");
    assert_eq!(register(&mut stream, memory), Status::Ok);
    assert_eq!(mappings_of("gone-client"), 1, "the node maps what was registered");
    let mut body = Vec::new();
    for (index, key) in keys.iter().enumerate() {
        RequestItemHeader { key_len: key.len() as u16, flags: ITEM_SHARED, ..Default::default() }
            .encode_into(&mut body);
        body.extend_from_slice(key);
        SharedSpan { region: 1, len: 4 << 20, offset: (index as u64) << 22 }.encode_into(&mut body);
    }
    let mut frame = Vec::new();
    FrameHeader::request(Opcode::Get, 9, keys.len() as u32, body.len() as u64).encode_into(&mut frame);
    frame.extend_from_slice(&body);
    stream.write_all(&frame).expect("gets");
    drop(stream);
    // SAFETY: closes the descriptor `sealed_memfd` made, once.
    unsafe { libc::close(memory) };
    // The node closes the connection and unmaps the memory; it serves others meanwhile.
    let started = Instant::now();
    while mappings_of("gone-client") > 0 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(mappings_of("gone-client"), 0, "the node unmapped the memory of a client that went away");
    let mut after = shared_client(&node, None);
    let mut buffer = SharedBuffer::new(4 << 20).expect("buffer");
    let read = after.batch_get_into_shared(&[keys[3].as_slice()], &mut buffer, &[(0, 4 << 20)]);
    assert_eq!(read[0].as_ref().ok(), Some(&(4 << 20)));
    assert!(buffer.as_slice() == &value_of(3, 4 << 20)[..]);
    // The writer's TCP connection, and this client's TCP and Unix ones.
    let open = total(&node, |metrics| &metrics.connections);
    assert!(open <= 3, "{open} connections open: the gone client's was closed");
    node.shutdown().expect("shutdown");
}

/// A value whose bytes go bad in the node's DRAM (a bit flipped in place, as memory damage would) fails
/// its shared get with CHECKSUM, and is then dropped: the next get misses rather than failing again, and
/// never returns the damaged bytes. Over TCP the client's own check fails each get.
#[test]
fn a_value_damaged_in_dram_is_dropped_at_its_shared_get_and_never_served() {
    let node = start(config(&[0], 16 << 20));
    let tcp_options = ClientOptions { shared_memory: false, ..ClientOptions::default() };
    let mut tcp = Client::connect(node.local_addr(), tcp_options).expect("client connects");
    let (shared_key, tcp_key) = (&b"damaged-shared"[..], &b"damaged-tcp"[..]);
    tcp.put(shared_key, &value_of(7001, 65_536)).expect("put");
    tcp.put(tcp_key, &value_of(7002, 65_536)).expect("put");
    // Node and test share this process: the node's copy is the one outside the needle itself (stale copies
    // a put left in freed memory are damaged too, to no effect).
    for index in [7001, 7002] {
        assert!(damage_every_copy(&value_of(index, 65_536)) >= 1, "the node's copy of value {index} was found");
    }
    let mut shared = shared_client(&node, None);
    assert_eq!(shared.shared_transport(), Transport::SharedMemory);
    let mut buffer = SharedBuffer::new(65_536).expect("buffer");
    let first = shared.batch_get_into_shared(&[shared_key], &mut buffer, &[(0, 65_536)]);
    assert!(matches!(first[0], Err(ClientError::Checksum)), "{:?}", first[0]);
    let again = shared.batch_get_into_shared(&[shared_key], &mut buffer, &[(0, 65_536)]);
    assert!(matches!(again[0], Err(ClientError::NotFound)), "the damaged copy was dropped: {:?}", again[0]);
    for _ in 0..2 {
        assert!(matches!(tcp.get(tcp_key), Err(ClientError::Checksum)), "the client's check fails it");
    }
    node.shutdown().expect("shutdown");
}

/// Flips a bit in every copy of `needle` in this process's writable memory except `needle` itself (through
/// `/proc/self/mem`, as a fault outside the program would); how many copies there were.
fn damage_every_copy(needle: &[u8]) -> usize {
    use std::os::unix::fs::FileExt;
    let memory = std::fs::OpenOptions::new().read(true).write(true).open("/proc/self/mem").expect("/proc/self/mem");
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    let own = needle.as_ptr() as u64..needle.as_ptr() as u64 + needle.len() as u64;
    let mut found = Vec::new();
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else { continue };
        let Some((start, end)) = range.split_once('-') else { continue };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16)) else { continue };
        if !perms.starts_with("rw") || end - start > 1 << 30 {
            continue;
        }
        let mut bytes = vec![0u8; (end - start) as usize];
        if memory.read_exact_at(&mut bytes, start).is_err() {
            continue;
        }
        let mut at = 0;
        while let Some(offset) = bytes[at..].windows(64).position(|window| window == &needle[..64]) {
            let address = start + (at + offset) as u64;
            let whole = bytes.get(at + offset..at + offset + needle.len()) == Some(needle);
            if whole && !own.contains(&address) {
                found.push(address);
            }
            at += offset + 1;
        }
    }
    for &address in &found {
        let mut byte = [0u8];
        memory.read_exact_at(&mut byte, address + 1000).expect("read back");
        memory.write_all_at(&[byte[0] ^ 0x10], address + 1000).expect("damage");
    }
    found.len()
}

#[test]
fn a_node_without_the_path_is_served_over_tcp_with_the_same_calls() {
    let mut node_config = config(&[0], 16 << 20);
    node_config.shared_memory = false;
    let node = start(node_config);
    let mut client = shared_client(&node, None);
    assert_eq!(client.shared_transport(), Transport::Tcp, "nothing offered");
    let mut buffer = SharedBuffer::new(8192).expect("buffer");
    buffer.as_mut_slice()[..5000].copy_from_slice(&value_of(5, 5000));
    let stored = client.batch_put_from_shared(&[b"tcp-shared"], &buffer, &[(0, 5000)], PutOptions::default());
    stored[0].as_ref().expect("a put over TCP from a shared buffer");
    let read = client.batch_get_into_shared(&[b"tcp-shared"], &mut buffer, &[(5000, 3000)]);
    assert!(matches!(read[0], Err(ClientError::BufferTooSmall { needed: 5000, available: 3000 })), "{:?}", read[0]);
    let mut into = SharedBuffer::new(5000).expect("buffer");
    assert_eq!(client.batch_get_into_shared(&[b"tcp-shared"], &mut into, &[(0, 5000)])[0].as_ref().ok(), Some(&5000));
    assert!(into.as_slice() == &value_of(5, 5000)[..]);
    // The node has no Unix socket to reach.
    assert!(UnixStream::connect_addr(&shard_socket(&node)).is_err(), "no socket listens");
    node.shutdown().expect("shutdown");
}

#[test]
fn a_released_buffer_is_unmapped_by_the_node_and_registered_again_on_use() {
    let node = start(config(&[0], 16 << 20));
    let mut client = shared_client(&node, None);
    client.put(b"released", &value_of(8, 3000)).expect("put");
    let mut buffer = SharedBuffer::new(4096).expect("buffer");
    // This process maps the buffer once itself; the node (in this process too) once more while it holds it.
    // Mappings are told apart by the memfd's inode: other tests of this binary map buffers meanwhile.
    let inode = inode_mapped_at(buffer.as_ptr() as usize);
    let mappings = || mappings_of_inode(&inode);
    let alone = mappings();
    assert_eq!(alone, 1);
    assert_eq!(client.batch_get_into_shared(&[b"released"], &mut buffer, &[(0, 4096)])[0].as_ref().ok(), Some(&3000));
    assert_eq!(mappings(), alone + 1, "the node maps the buffer it was given");
    client.release_shared(&buffer).expect("release");
    assert_eq!(mappings(), alone, "the node unmapped it");
    buffer.as_mut_slice().fill(0);
    assert_eq!(client.batch_get_into_shared(&[b"released"], &mut buffer, &[(0, 4096)])[0].as_ref().ok(), Some(&3000));
    assert!(buffer.as_slice()[..3000] == value_of(8, 3000)[..], "registered again on its next use");
    node.shutdown().expect("shutdown");
}

/// The inode field of the mapping that starts at `address` in /proc/self/maps.
fn inode_mapped_at(address: usize) -> String {
    let start = format!("{address:x}-");
    let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
    let line = maps.lines().find(|line| line.starts_with(&start)).expect("the buffer's mapping");
    line.split_whitespace().nth(4).expect("inode").to_string()
}

/// Mappings of memfds with inode `inode` in this process.
fn mappings_of_inode(inode: &str) -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .expect("maps")
        .lines()
        .filter(|line| line.contains("memfd:") && line.split_whitespace().nth(4) == Some(inode))
        .count()
}
