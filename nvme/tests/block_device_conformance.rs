//! One conformance suite, run for every backend (`memory`, `uring`, `ring` blocking and polled, and `nvmf` against our own
//! NVMe/TCP target over loopback, with and without digests) and through every wrapper: read after
//! write, unaligned and out-of-range requests refused with typed errors that change nothing, flush,
//! write_zeroes, deallocate.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use glommio::{LocalExecutorBuilder, Placement};
use strata_nvme::target::{self, NamespaceBackend, NamespaceConfig, SubsystemConfig, TargetConfig};
use strata_nvme::tcp::Digests;
use strata_nvme::{
    AnyDevice, BlockDevice, BlockErrorKind, BlockOp, DeviceSpec, FaultConfig, FaultDevice, FileIo, HostOptions,
    IoBuffer, MemoryDevice, NvmfAddress, NvmfDevice, QueueDepthLimit, RingDevice, StatsDevice, UringDevice,
    UringOptions, VolatileDisk,
};

const CAPACITY: u64 = 4 << 20;

fn run<F: Future<Output = ()> + 'static>(make: impl FnOnce() -> F + Send + 'static) {
    LocalExecutorBuilder::new(Placement::Unbound).spawn(make).unwrap().join().unwrap();
}

/// A fresh scratch file of `CAPACITY` bytes on a blocking ring of `queue_depth` entries.
fn scratch_ring(name: &str, queue_depth: u32) -> (PathBuf, RingDevice) {
    let path = scratch_file(name);
    let options = UringOptions { size_bytes: Some(CAPACITY), read_only: false };
    let device = RingDevice::open(&path, &options, queue_depth).unwrap();
    (path, device)
}

fn scratch_file(name: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "conformance-{name}-{}-{}.img",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&path);
    path
}

async fn uring(name: &str) -> (UringDevice, PathBuf) {
    let path = scratch_file(name);
    let device =
        UringDevice::open(&path, &UringOptions { size_bytes: Some(CAPACITY), read_only: false }).await.unwrap();
    (device, path)
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|index| (index as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

async fn write_bytes(device: &impl BlockDevice, offset: u64, bytes: &[u8]) {
    let mut buf = device.alloc_buffer(bytes.len());
    buf.as_mut_slice().copy_from_slice(bytes);
    let (_, result) = device.write(buf, offset).await;
    result.unwrap();
}

async fn read_bytes(device: &impl BlockDevice, offset: u64, len: usize) -> Vec<u8> {
    let (buf, result) = device.read(device.alloc_buffer(len), offset).await;
    result.unwrap();
    assert_eq!(buf.len(), len);
    buf.as_slice().to_vec()
}

/// The whole suite, for any device of at least `CAPACITY` bytes.
async fn conformance(device: &impl BlockDevice) {
    let geometry = device.geometry();
    let block = geometry.logical_block_bytes;
    assert!(geometry.capacity_bytes >= CAPACITY);
    assert!(block >= 512 && block.is_power_of_two());
    assert!(geometry.max_transfer_bytes >= 1 << 20);

    // Read after write: single blocks, multi-block transfers, the last block, overwrites.
    let blocks = [(0u64, block as usize), (block * 3, 8 * block as usize), (CAPACITY - block, block as usize)];
    for (seed, &(offset, len)) in blocks.iter().enumerate() {
        write_bytes(device, offset, &pattern(seed as u8, len)).await;
    }
    for (seed, &(offset, len)) in blocks.iter().enumerate() {
        assert_eq!(read_bytes(device, offset, len).await, pattern(seed as u8, len), "offset {offset}");
    }
    write_bytes(device, block * 3, &pattern(99, block as usize)).await;
    let mixed = read_bytes(device, block * 3, 2 * block as usize).await;
    assert_eq!(&mixed[..block as usize], &pattern(99, block as usize)[..]);
    assert_eq!(&mixed[block as usize..], &pattern(1, 8 * block as usize)[block as usize..2 * block as usize]);
    let large = pattern(7, 1 << 20);
    write_bytes(device, 1 << 20, &large).await;
    assert_eq!(read_bytes(device, 1 << 20, 1 << 20).await, large);
    // Unaligned offset or length: a typed error naming the operation, device and offset; nothing written.
    let before = read_bytes(device, 0, 2 * block as usize).await;
    let mut buf = device.alloc_buffer(block as usize);
    buf.as_mut_slice().fill(0xEE);
    let (buf, result) = device.write(buf, 1).await;
    let error = result.unwrap_err();
    assert!(matches!(error.kind, BlockErrorKind::Unaligned { offset: 1, .. }), "{error}");
    assert_eq!((error.op, error.offset), (BlockOp::Write, 1));
    assert!(error.to_string().contains(device.name()), "{error}");
    let (_, result) = device.read(device.alloc_buffer(100), 0).await;
    assert!(matches!(result.unwrap_err().kind, BlockErrorKind::Unaligned { len: 100, .. }));
    // An unaligned buffer address (a view starting one byte in).
    let mut misaligned = IoBuffer::aligned(block as usize + 1, 4096);
    misaligned.advance(1);
    let (_, result) = device.write(misaligned, 0).await;
    assert!(matches!(result.unwrap_err().kind, BlockErrorKind::MisalignedBuffer { .. }));
    drop(buf);
    assert_eq!(read_bytes(device, 0, 2 * block as usize).await, before, "a refused write changed data");

    // Out of range.
    for offset in [CAPACITY, CAPACITY - block] {
        let (_, result) = device.read(device.alloc_buffer(2 * block as usize), offset).await;
        let error = result.unwrap_err();
        assert!(matches!(error.kind, BlockErrorKind::OutOfRange { .. }), "{error}");
        assert_eq!(error.offset, offset);
    }
    assert!(matches!(device.write_zeroes(CAPACITY, block).await.unwrap_err().kind, BlockErrorKind::OutOfRange { .. }));
    assert!(matches!(
        device.deallocate(u64::MAX - block + 1, block).await.unwrap_err().kind,
        BlockErrorKind::OutOfRange { .. }
    ));

    // Flush.
    device.flush().await.unwrap();

    // Write zeroes and deallocate: the range reads as zeroes, its neighbours are untouched.
    for (index, zeroing) in ["write_zeroes", "deallocate"].into_iter().enumerate() {
        let base = 2 << 20;
        let offset = base + index as u64 * (256 << 10);
        let around = pattern(40 + index as u8, 64 * block as usize);
        write_bytes(device, offset, &around).await;
        let (start, len) = (offset + 8 * block, 16 * block);
        match zeroing {
            "write_zeroes" => device.write_zeroes(start, len).await.unwrap(),
            _ => device.deallocate(start, len).await.unwrap(),
        }
        let after = read_bytes(device, offset, 64 * block as usize).await;
        let (zeroed_from, zeroed_to) = (8 * block as usize, 24 * block as usize);
        assert!(after[zeroed_from..zeroed_to].iter().all(|&byte| byte == 0), "{zeroing} left data");
        assert_eq!(&after[..zeroed_from], &around[..zeroed_from], "{zeroing} touched the blocks before");
        assert_eq!(&after[zeroed_to..], &around[zeroed_to..], "{zeroing} touched the blocks after");
    }
}

#[test]
fn memory_device_conforms() {
    run(|| async { conformance(&MemoryDevice::new(CAPACITY, 512)).await });
    run(|| async { conformance(&MemoryDevice::new(CAPACITY, 4096)).await });
}

#[test]
fn volatile_device_conforms() {
    run(|| async { conformance(&VolatileDisk::new(CAPACITY, 4096).handle()).await });
    run(|| async {
        let config = FaultConfig { seed: 3, max_yields: 4, ..FaultConfig::default() };
        conformance(&FaultDevice::new(VolatileDisk::new(CAPACITY, 512).handle(), config)).await
    });
}

#[test]
fn uring_device_conforms() {
    run(|| async {
        let (device, path) = uring("plain").await;
        conformance(&device).await;
        drop(device);
        std::fs::remove_file(path).unwrap();
    });
}

#[test]
fn ring_device_conforms() {
    run(|| async {
        let (path, device) = scratch_ring("ring", 8);
        conformance(&device).await;
        drop(device);
        std::fs::remove_file(path).unwrap();
    });
}

/// A busy-polled executor's file (`FileIo::Polled`): a ring whose reaper never blocks. Beside it, a task
/// that only ever yields, as a polled socket does: the executor never parks, and the ring's reads and
/// writes still complete, with the right bytes, while that task keeps running.
#[test]
fn a_polled_ring_conforms_beside_a_task_that_never_sleeps() {
    run(|| async {
        let path = scratch_file("ring-polled");
        let spec = DeviceSpec::File { path: path.clone(), size_bytes: Some(CAPACITY) };
        let device = AnyDevice::open_with(&spec, &HostOptions::default(), FileIo::Polled { queue_depth: 4 })
            .await
            .expect("opens");
        assert!(matches!(device, AnyDevice::PolledFile(_)), "a polled file is a ring of its own");
        let spinning = std::rc::Rc::new(std::cell::Cell::new(true));
        let spins = std::rc::Rc::new(std::cell::Cell::new(0u64));
        let spinner = glommio::spawn_local({
            let (spinning, spins) = (spinning.clone(), spins.clone());
            async move {
                while spinning.get() {
                    spins.set(spins.get() + 1);
                    futures_lite::future::yield_now().await;
                }
            }
        });
        conformance(&device).await;
        spinning.set(false);
        spinner.await;
        assert!(spins.get() > 0, "the spinning task ran beside the I/O");
        drop(device);
        std::fs::remove_file(path).unwrap();
    });
}

#[test]
fn ring_device_bounds_concurrency_by_its_depth_and_survives_dropped_futures() {
    run(|| async {
        let (path, ring) = scratch_ring("ring-depth", 4);
        let probe = InFlightProbe { inner: ring, in_flight: Default::default(), most: Default::default() };
        let device = std::rc::Rc::new(probe);
        // 16 tasks on a ring of 4 slots: every read completes, with the right bytes.
        write_bytes(&*device, 0, &pattern(5, 64 * 4096)).await;
        let mut tasks = Vec::new();
        for task in 0..16u64 {
            let device = device.clone();
            tasks.push(glommio::spawn_local(async move {
                for round in 0..4u64 {
                    let block = (task * 4 + round) as usize;
                    let bytes = read_bytes(&*device, block as u64 * 4096, 4096).await;
                    assert_eq!(bytes, pattern(5, 64 * 4096)[block * 4096..(block + 1) * 4096]);
                }
            }));
        }
        for task in tasks {
            task.await;
        }
        // A read whose future is dropped while in flight: its buffer stays owned by the ring, and the ring keeps
        // working afterwards.
        {
            let pending = std::pin::pin!(device.read(device.alloc_buffer(4096), 0));
            let waker = std::task::Waker::noop();
            let _ = pending.poll(&mut std::task::Context::from_waker(waker));
        }
        assert_eq!(read_bytes(&*device, 8192, 4096).await, pattern(5, 64 * 4096)[8192..12288]);
        drop(device);
        std::fs::remove_file(path).unwrap();
    });
}

#[test]
fn ring_device_moves_registered_buffers_with_fixed_operations() {
    run(|| async {
        let path = scratch_file("ring-fixed");
        let options = UringOptions { size_bytes: Some(CAPACITY), read_only: false };
        let device = RingDevice::open(&path, &options, 4).unwrap();
        let other = RingDevice::open(&path, &options, 4).unwrap();
        let bytes = pattern(11, 8 * 4096);
        assert_eq!(device.fixed_buffers_registered(), 0);

        // Allocated buffers are registered, written and read with fixed operations; the written one, dropped,
        // goes back to the ring's pool and is lent again, still registered, for the read.
        let mut source = device.alloc_buffer(4 * 4096);
        source.as_mut_slice().copy_from_slice(&bytes[..4 * 4096]);
        let (_, result) = device.write(source, 0).await;
        result.unwrap();
        let (read, result) = device.read(device.alloc_buffer(4 * 4096), 0).await;
        result.unwrap();
        assert_eq!(read.as_slice(), &bytes[..4 * 4096]);
        assert_eq!(device.fixed_buffers_registered(), 1);
        assert_eq!(device.fixed_operations(), 2);
        assert!(device.fixed_buffers_refused().is_none());

        // A view into a registered buffer (not at its start) reads into the right bytes of it.
        let mut view = device.alloc_buffer(3 * 4096);
        view.advance(4096);
        let (view, result) = device.read(view, 2 * 4096).await;
        result.unwrap();
        assert_eq!(view.as_slice(), &bytes[2 * 4096..4 * 4096]);
        assert_eq!(device.fixed_operations(), 3);

        assert_eq!(device.fixed_buffers_registered(), 2);
        // A dropped buffer goes back to the pool: the next one of that size reuses its registration.
        drop(read);
        let again = device.alloc_buffer(4 * 4096);
        assert_eq!(device.fixed_buffers_registered(), 2, "a new registration instead of the idle one");

        // Heap buffers, and registered buffers of another ring, still work, as plain operations.
        let (heap, result) = device.read(IoBuffer::aligned(4096, 4096), 4096).await;
        result.unwrap();
        assert_eq!(heap.as_slice(), &bytes[4096..2 * 4096]);
        let (foreign, result) = device.read(other.alloc_buffer(4096), 3 * 4096).await;
        result.unwrap();
        assert_eq!(foreign.as_slice(), &bytes[3 * 4096..4 * 4096]);
        assert_eq!(device.fixed_operations(), 3);

        // Buffers outlive their ring: the memory is theirs until they drop.
        drop(device);
        drop(other);
        assert_eq!(view.as_slice(), &bytes[2 * 4096..4 * 4096]);
        assert_eq!(foreign.as_slice(), &bytes[3 * 4096..4 * 4096]);
        drop(again);
        std::fs::remove_file(path).unwrap();
    });
}

#[test]
fn a_full_table_of_idle_buffers_of_one_size_still_lends_a_registered_buffer_of_another() {
    run(|| async {
        // Queue depth 1: a table of 18 entries (2 × depth + 16).
        let (path, device) = scratch_ring("ring-fixed-full", 1);
        let bytes = pattern(12, 2 * 4096);
        let mut source = IoBuffer::aligned(2 * 4096, 4096);
        source.as_mut_slice().copy_from_slice(&bytes);
        device.write(source, 0).await.1.unwrap();

        // Every entry taken by a 4 KiB buffer, then all of them idle: what a node's small writes leave behind.
        let small: Vec<IoBuffer> = (0..64).map(|_| device.alloc_buffer(4096)).collect();
        let table = device.fixed_buffers_registered();
        assert_eq!(table, 18, "the table is full");
        drop(small);

        // An 8 KiB read still goes as a fixed operation: an idle entry is registered again at the new size.
        let (read, result) = device.read(device.alloc_buffer(2 * 4096), 0).await;
        result.unwrap();
        assert_eq!(read.as_slice(), &bytes[..]);
        assert_eq!(device.fixed_operations(), 1, "the read went through a registered buffer");
        assert_eq!(device.fixed_buffers_registered(), table, "no entry beyond the table");
        assert!(device.fixed_buffers_refused().is_none());
        drop(read);
        std::fs::remove_file(path).unwrap();
    });
}

#[test]
fn a_ring_keeps_at_most_128_mib_registered() {
    run(|| async {
        // Queue depth 64: a table of 144 entries, more than 128 buffers of 1 MiB.
        let (path, device) = scratch_ring("ring-fixed-budget", 64);
        let held: Vec<IoBuffer> = (0..129).map(|_| device.alloc_buffer(1 << 20)).collect();
        assert_eq!(device.fixed_buffer_bytes(), 128 << 20);
        assert_eq!(device.fixed_buffers_registered(), 128, "the 129th comes from the heap");
        let (_, result) = device.read(held.into_iter().last().unwrap(), 0).await;
        result.unwrap();
        assert_eq!(device.fixed_operations(), 0, "a heap buffer moves as a plain read");

        // All idle now; a 2 MiB buffer would take the oldest 1 MiB entry past the budget: the heap again.
        let big = device.alloc_buffer(2 << 20);
        assert_eq!(device.fixed_buffer_bytes(), 128 << 20);
        let (_, result) = device.read(big, 0).await;
        result.unwrap();
        assert_eq!(device.fixed_operations(), 0);
        // A 1 MiB buffer still reuses a registered one.
        let (_, result) = device.read(device.alloc_buffer(1 << 20), 0).await;
        result.unwrap();
        assert_eq!(device.fixed_operations(), 1);
        assert!(device.fixed_buffers_refused().is_none());
        std::fs::remove_file(path).unwrap();
    });
}

/// Set in the child process of [`ring_says_when_its_buffers_cannot_be_registered`].
const MEMLOCK_CHILD: &str = "STRATA_CONFORMANCE_MEMLOCK_CHILD";

/// Without `CAP_IPC_LOCK` and with a memlock budget smaller than a buffer, the ring's registration is
/// refused: the buffer comes from the heap (and works), and the ring says why, so that a benchmark can tell
/// its user it did not run with registered buffers. The test runs itself again in a child process from
/// which `setpriv` removed the capability (root's processes have it; lowering a limit needs none).
#[test]
fn ring_says_when_its_buffers_cannot_be_registered() {
    if std::env::var_os(MEMLOCK_CHILD).is_some() {
        let limit = libc::rlimit { rlim_cur: 64 << 10, rlim_max: 64 << 10 };
        // SAFETY: setrlimit reads one rlimit struct we own; lowering a limit affects only this process.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) };
        assert_eq!(rc, 0, "setrlimit");
        let path = scratch_file("ring-refused");
        let device =
            RingDevice::open(&path, &UringOptions { size_bytes: Some(CAPACITY), read_only: false }, 4).unwrap();
        assert!(device.fixed_buffers_refused().is_none(), "nothing refused before a buffer is asked for");
        let mut buffer = device.alloc_buffer(1 << 20);
        buffer.as_mut_slice().fill(7);
        assert_eq!(buffer.len(), 1 << 20);
        assert_eq!(device.fixed_buffers_registered(), 0);
        let why = device.fixed_buffers_refused().expect("the refusal is recorded");
        assert!(why.contains("1024 KiB buffer was refused"), "{why}");
        std::fs::remove_file(path).unwrap();
        return;
    }
    let status = std::process::Command::new("setpriv")
        .args(["--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock"])
        .arg(std::env::current_exe().expect("test binary"))
        .args(["--exact", "ring_says_when_its_buffers_cannot_be_registered", "--test-threads=1", "--nocapture"])
        .env(MEMLOCK_CHILD, "1")
        .status()
        .expect("setpriv (util-linux) runs the child");
    assert!(status.success(), "the child failed: {status}");
}

#[test]
fn ring_device_times_each_operation_between_its_call_and_its_return() {
    run(|| async {
        let (path, ring) = scratch_ring("ring-timing", 2);
        let device = std::rc::Rc::new(ring);
        write_bytes(&*device, 0, &pattern(9, 16 * 4096)).await;
        // Eight readers on two slots: six wait for a slot first, which is submission time, not completion time.
        let mut tasks = Vec::new();
        for task in 0..8u64 {
            let device = device.clone();
            tasks.push(glommio::spawn_local(async move {
                let called = std::time::Instant::now();
                let (buffer, result, timing) = device.read_timed(device.alloc_buffer(4096), task * 4096).await;
                let returned = std::time::Instant::now();
                result.unwrap();
                assert_eq!(buffer.as_slice(), &pattern(9, 16 * 4096)[task as usize * 4096..(task as usize + 1) * 4096]);
                assert!(called <= timing.submitted, "submitted before it was called");
                assert!(timing.submitted <= timing.completed, "completed before it was submitted");
                assert!(timing.completed <= returned, "completed after the call returned");
                timing
            }));
        }
        let mut timings = Vec::new();
        for task in tasks {
            timings.push(task.await);
        }
        // Six reads waited for a slot, which only a completion frees: their submission time comes after the
        // first completion (a ring that stamped the call instead would fail here).
        let first_completion = timings.iter().map(|timing| timing.completed).min().unwrap();
        let submitted_after = timings.iter().filter(|timing| timing.submitted >= first_completion).count();
        assert!(submitted_after >= 6, "only {submitted_after} of 8 reads were submitted after a slot freed");
        drop(device);
        std::fs::remove_file(path).unwrap();
    });
}

#[test]
fn uring_device_accepts_heap_buffers_too() {
    run(|| async {
        let (device, path) = uring("heap").await;
        let mut buf = IoBuffer::aligned(8192, 4096);
        buf.as_mut_slice().copy_from_slice(&pattern(3, 8192));
        let (_, result) = device.write(buf, 8192).await;
        result.unwrap();
        assert_eq!(read_bytes(&device, 8192, 8192).await, pattern(3, 8192));
        std::fs::remove_file(path).unwrap();
    });
}

#[test]
fn wrapped_devices_conform_and_count() {
    run(|| async {
        let device = StatsDevice::new(QueueDepthLimit::new(
            FaultDevice::new(MemoryDevice::new(CAPACITY, 4096), FaultConfig::default()),
            4,
        ));
        conformance(&device).await;
        let stats = device.stats();
        assert!(stats.write.count >= 5 && stats.read.count >= 5, "{stats:?}");
        assert!(stats.write.errors >= 2 && stats.read.errors >= 3, "refused requests are counted as errors: {stats:?}");
        assert!(stats.read.bytes >= 1 << 20);
        assert_eq!(stats.read.latency_ns.len(), stats.read.count);
        assert_eq!((stats.flush.count, stats.write_zeroes.count, stats.deallocate.count), (1, 2, 2));
        assert_eq!(device.inner().inner().fault_stats().injected_errors, 0);
    });
    run(|| async {
        let (device, path) = uring("wrapped").await;
        conformance(&StatsDevice::new(QueueDepthLimit::new(device, 2))).await;
        std::fs::remove_file(path).unwrap();
    });
}

/// Counts operations in flight beneath the bound, and the most seen at once.
struct InFlightProbe<D> {
    inner: D,
    in_flight: std::cell::Cell<u64>,
    most: std::cell::Cell<u64>,
}

impl<D: BlockDevice> InFlightProbe<D> {
    fn enter(&self) {
        self.in_flight.set(self.in_flight.get() + 1);
        self.most.set(self.most.get().max(self.in_flight.get()));
    }

    fn leave(&self) {
        self.in_flight.set(self.in_flight.get() - 1);
    }
}

impl<D: BlockDevice> BlockDevice for InFlightProbe<D> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn geometry(&self) -> strata_nvme::Geometry {
        self.inner.geometry()
    }
    fn alloc_buffer(&self, len: usize) -> IoBuffer {
        self.inner.alloc_buffer(len)
    }
    async fn read(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, strata_nvme::BlockResult<()>) {
        self.enter();
        let result = self.inner.read(buf, offset).await;
        self.leave();
        result
    }
    async fn write(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, strata_nvme::BlockResult<()>) {
        self.enter();
        let result = self.inner.write(buf, offset).await;
        self.leave();
        result
    }
    async fn flush(&self) -> strata_nvme::BlockResult<()> {
        self.inner.flush().await
    }
    async fn write_zeroes(&self, offset: u64, len: u64) -> strata_nvme::BlockResult<()> {
        self.inner.write_zeroes(offset, len).await
    }
    async fn deallocate(&self, offset: u64, len: u64) -> strata_nvme::BlockResult<()> {
        self.inner.deallocate(offset, len).await
    }
}

#[test]
fn the_queue_depth_bound_holds_under_concurrency() {
    run(|| async {
        let (device, path) = uring("depth").await;
        let probe = InFlightProbe { inner: device, in_flight: Default::default(), most: Default::default() };
        let device = std::rc::Rc::new(QueueDepthLimit::new(probe, 3));
        let mut tasks = Vec::new();
        for task in 0..16u64 {
            let device = device.clone();
            tasks.push(glommio::spawn_local(async move {
                for round in 0..8u64 {
                    let offset = (task * 8 + round) * 4096;
                    let (_, result) = device.read(device.alloc_buffer(4096), offset).await;
                    result.unwrap();
                }
            }));
        }
        for task in tasks {
            task.await;
        }
        assert_eq!(device.available(), 3, "every slot is returned");
        assert_eq!(device.inner().most.get(), 3, "16 tasks on 3 slots: exactly 3 in flight at most");
        std::fs::remove_file(path).unwrap();
    });
}

/// The `nvmf` host against our target on loopback: every block operation crosses a real NVMe/TCP byte
/// stream (in-capsule writes up to 16 KiB, R2T-driven ones above, C2HData reads). `target_busy_poll`:
/// the target polls its sockets (its files stay on glommio's reactor, which the polling must let turn).
fn nvmf_conforms(namespace: NamespaceConfig, digests: Digests, target_busy_poll: std::time::Duration) {
    let nqn = "nqn.2026-12.io.strata:conformance";
    let subsystem = SubsystemConfig { nqn: nqn.into(), namespaces: vec![namespace], allowed_hosts: Vec::new() };
    let config = TargetConfig {
        busy_poll: target_busy_poll,
        ..TargetConfig::new("127.0.0.1:0".parse().unwrap(), vec![subsystem])
    };
    let target = target::start(config).unwrap();
    let address = NvmfAddress::tcp(target.local_addr(), nqn, 1);
    run(move || async move {
        let options = HostOptions { digests, ..HostOptions::default() };
        let device = NvmfDevice::connect(&address, &options, 1).await.unwrap();
        assert!(device.name().starts_with("nvmf:127.0.0.1:"), "{}", device.name());
        conformance(&device).await;
    });
    target.stop();
}

#[test]
fn nvmf_device_on_a_memory_namespace_conforms() {
    for block_bytes in [512, 4096] {
        let namespace = NamespaceConfig { backend: NamespaceBackend::Memory { bytes: CAPACITY }, block_bytes };
        nvmf_conforms(namespace, Digests::default(), std::time::Duration::ZERO);
    }
}

#[test]
fn nvmf_device_with_header_and_data_digests_conforms() {
    let namespace = NamespaceConfig { backend: NamespaceBackend::Memory { bytes: CAPACITY }, block_bytes: 4096 };
    nvmf_conforms(namespace, Digests { header: true, data: true }, std::time::Duration::ZERO);
}

/// [`nvmf_conforms`] on a namespace backed by a scratch file.
fn nvmf_on_a_file_namespace_conforms(name: &str, digests: Digests, target_busy_poll: std::time::Duration) {
    let path = scratch_file(name);
    let namespace = NamespaceConfig {
        backend: NamespaceBackend::File { path: path.clone(), bytes: Some(CAPACITY) },
        block_bytes: 4096,
    };
    nvmf_conforms(namespace, digests, target_busy_poll);
    std::fs::remove_file(path).unwrap();
}

#[test]
fn nvmf_device_on_a_file_namespace_conforms() {
    nvmf_on_a_file_namespace_conforms("nvmf-file", Digests { header: true, data: false }, std::time::Duration::ZERO);
}

#[test]
fn nvmf_device_on_a_busy_polled_target_with_a_file_namespace_conforms() {
    nvmf_on_a_file_namespace_conforms("nvmf-file-polled", Digests::default(), std::time::Duration::from_secs(1));
}
