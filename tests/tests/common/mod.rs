//! Starting nodes for tests: loopback, free ports, a scratch directory that is removed afterwards.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use strata_engine::{EngineConfig, Node};
use strata_nvme::DeviceSpec;

/// A scratch directory under the target directory (a real file system: O_DIRECT needs one, tmpfs has none).
pub struct Scratch(pub PathBuf);

/// Scratch directories made by this test process: tests of one binary run in parallel threads of one
/// process, and two that asked for the same name must still get directories of their own.
static SCRATCH_COUNT: AtomicU64 = AtomicU64::new(0);

impl Scratch {
    /// A fresh, empty directory whose name starts with `name`, unique to this call.
    pub fn new(name: &str) -> Self {
        let count = SCRATCH_COUNT.fetch_add(1, Ordering::Relaxed);
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}-{count}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("scratch directory");
        Scratch(path)
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A node config on loopback with free ports, `dram` bytes of DRAM, no metrics, normal pages, on every
/// CPU of `cpus`.
pub fn config(cpus: &[usize], dram: u64) -> EngineConfig {
    EngineConfig {
        listen: "127.0.0.1:0".parse().expect("address"),
        cpus: cpus.to_vec(),
        dram_bytes: dram,
        hugepages: false,
        metrics: None,
        region_bytes: 1 << 20,
        read_lease: Duration::ZERO,
        ..EngineConfig::default()
    }
}

/// The same with a file-backed NVMe tier of `size` bytes at `path`.
pub fn with_file(mut config: EngineConfig, path: &std::path::Path, size: u64) -> EngineConfig {
    config.nvme = vec![DeviceSpec::File { path: path.to_path_buf(), size_bytes: Some(size) }];
    config
}

pub fn start(config: EngineConfig) -> Node {
    strata_engine::start(config).expect("node starts")
}

pub fn client(node: &Node) -> strata_client::Client {
    strata_client::Client::connect(node.local_addr(), strata_client::ClientOptions::default()).expect("client connects")
}

/// A value derived from a key index: reproducible, distinct per key and per byte position.
pub fn value_of(index: u64, len: usize) -> Vec<u8> {
    let mut state = index.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

pub fn key_of(index: u64) -> Vec<u8> {
    format!("block-{index:016x}").into_bytes()
}

/// Sums a counter over the node's shards.
pub fn total(
    node: &Node,
    field: impl Fn(&strata_engine::metrics::ShardMetrics) -> &std::sync::atomic::AtomicU64,
) -> u64 {
    node.metrics.iter().map(|shard| field(shard).load(std::sync::atomic::Ordering::Relaxed)).sum()
}

/// Spans (offset, length) laid end to end from `start`, one per size.
pub fn spans_from(sizes: &[usize], start: usize) -> Vec<(usize, usize)> {
    let mut at = start;
    sizes
        .iter()
        .map(|&len| {
            let span = (at, len);
            at += len;
            span
        })
        .collect()
}

/// Says `hello` on a raw connection (TCP or a shard's Unix socket) and reads the node's reply: its header
/// and its body, whatever its status.
pub fn say_hello(
    stream: &mut (impl std::io::Read + std::io::Write),
    hello: &strata_proto::HelloRequest,
) -> (strata_proto::FrameHeader, Vec<u8>) {
    use strata_proto::{FrameHeader, Opcode};
    let mut frame = Vec::new();
    FrameHeader::request(Opcode::Hello, 1, 1, hello.encoded_len() as u64).encode_into(&mut frame);
    hello.encode_into(&mut frame);
    stream.write_all(&frame).expect("hello");
    read_frame(stream)
}

/// Reads one reply frame's header.
pub fn read_header(stream: &mut impl std::io::Read) -> strata_proto::FrameHeader {
    let mut bytes = [0u8; strata_proto::FRAME_HEADER_BYTES];
    stream.read_exact(&mut bytes).expect("reply header");
    strata_proto::FrameHeader::decode(&bytes).expect("a reply header")
}

/// Reads one reply frame whose body length its header gives: the header and the body.
pub fn read_frame(stream: &mut impl std::io::Read) -> (strata_proto::FrameHeader, Vec<u8>) {
    let header = read_header(stream);
    let mut body = vec![0u8; header.body_len as usize];
    stream.read_exact(&mut body).expect("reply body");
    (header, body)
}
