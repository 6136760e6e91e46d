//! Runs one job on one device: `iodepth` workers on the job's executor, each with one I/O in flight.
//!
//! Generic over the device, so the same loop drives `uring` for benchmarks and a `faults`-wrapped memory
//! namespace in tests. Latency is split as fio splits it (`BlockDevice::read_timed`): `slat` from the call
//! to the submission, `clat` from the submission to the reaped completion, `lat` both. A backend that cannot
//! see its submission (`uring`: glommio submits when its reactor parks) reports it all as `clat`.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use strata_nvme::{BlockDevice, IoBuffer, IoTiming, latency_histogram};

use super::options::{JobOptions, Verify};
use super::verify::{MismatchKind, check_block, fill_block};
use super::workload::BlockPicker;

/// Counters a job updates as it runs, for the live status line.
#[derive(Debug, Default)]
pub struct JobProgress {
    /// Reads completed.
    pub read_ios: AtomicU64,
    /// Bytes read.
    pub read_bytes: AtomicU64,
    /// Writes completed.
    pub write_ios: AtomicU64,
    /// Bytes written.
    pub write_bytes: AtomicU64,
}

/// What one direction of a job did while measured.
#[derive(Clone, Debug)]
pub struct DirectionResult {
    /// I/Os completed.
    pub ios: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Submission latencies, ns: from the call to the device having the operation.
    pub slat_ns: Histogram<u64>,
    /// Completion latencies, ns: from the submission to the completion.
    pub clat_ns: Histogram<u64>,
    /// Total latencies, ns: from the call to the completion.
    pub lat_ns: Histogram<u64>,
}

impl Default for DirectionResult {
    fn default() -> Self {
        Self {
            ios: 0,
            bytes: 0,
            slat_ns: latency_histogram(),
            clat_ns: latency_histogram(),
            lat_ns: latency_histogram(),
        }
    }
}

impl DirectionResult {
    /// Adds another direction's figures (for `group_reporting`).
    pub fn merge(&mut self, other: &DirectionResult) {
        self.ios += other.ios;
        self.bytes += other.bytes;
        let _ = self.slat_ns.add(&other.slat_ns);
        let _ = self.clat_ns.add(&other.clat_ns);
        let _ = self.lat_ns.add(&other.lat_ns);
    }

    /// Records one I/O's latencies, called at `called` and timed by the device.
    fn record(&mut self, bytes: u64, called: Instant, timing: IoTiming) {
        let nanos = |from: Instant, to: Instant| (to.saturating_duration_since(from).as_nanos() as u64).max(1);
        self.ios += 1;
        self.bytes += bytes;
        let _ = self.slat_ns.record(nanos(called, timing.submitted));
        let _ = self.clat_ns.record(nanos(timing.submitted, timing.completed));
        let _ = self.lat_ns.record(nanos(called, timing.completed));
    }
}

/// A block that failed verification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// Where.
    pub offset: u64,
    /// What was wrong.
    pub kind: MismatchKind,
}

/// The first mismatches kept for the report; all are counted.
const MISMATCHES_KEPT: usize = 16;

/// What a job did.
#[derive(Clone, Debug)]
pub struct JobResult {
    /// The job's name.
    pub name: String,
    /// Reads.
    pub read: DirectionResult,
    /// Writes.
    pub write: DirectionResult,
    /// Measured time (after `ramp_time`).
    pub runtime: Duration,
    /// CPU time in user mode of the job's thread while measured.
    pub usr_cpu: Duration,
    /// CPU time in kernel mode of the job's thread while measured.
    pub sys_cpu: Duration,
    /// Blocks that failed verification.
    pub mismatch_count: u64,
    /// The first of them.
    pub mismatches: Vec<Mismatch>,
    /// Blocks checked by verification.
    pub verified_blocks: u64,
    /// The error that ended the job, if one did.
    pub error: Option<String>,
}

/// Why a job could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The job's region does not fit the device, or is empty.
    #[error("job {job}: {message}")]
    Region {
        /// The job.
        job: String,
        /// What is wrong.
        message: String,
    },
}

/// The job's region of the device, in blocks of `bs`.
#[derive(Clone, Copy, Debug)]
pub struct Region {
    /// First byte.
    pub start: u64,
    /// Blocks of `bs`.
    pub blocks: u64,
    /// Block size.
    pub bs: u64,
}

impl Region {
    /// The region a job covers on a device of `capacity_bytes` with `logical_block_bytes` blocks.
    pub fn of(job: &JobOptions, capacity_bytes: u64, logical_block_bytes: u64) -> Result<Self, RunError> {
        let error = |message: String| Err(RunError::Region { job: job.name.clone(), message });
        if !job.offset.is_multiple_of(logical_block_bytes) || !job.bs.is_multiple_of(logical_block_bytes) {
            return error(format!(
                "offset {} and bs {} must be multiples of the device's {logical_block_bytes}-byte block",
                job.offset, job.bs
            ));
        }
        if job.offset >= capacity_bytes {
            return error(format!("offset {} is beyond the device's {capacity_bytes} bytes", job.offset));
        }
        let size = job.size.unwrap_or(capacity_bytes - job.offset);
        if job.offset + size > capacity_bytes {
            return error(format!("offset {} + size {size} is beyond the device's {capacity_bytes} bytes", job.offset));
        }
        let blocks = size / job.bs;
        if blocks == 0 {
            return error(format!("size {size} holds no block of {} bytes", job.bs));
        }
        if job.verify == Verify::Crc32c && blocks < u64::from(job.iodepth) {
            return error(format!("verify needs a region of at least iodepth ({}) blocks", job.iodepth));
        }
        Ok(Self { start: job.offset, blocks, bs: job.bs })
    }

    fn offset_of(&self, block: u64) -> u64 {
        self.start + block * self.bs
    }
}

/// What a worker does next.
enum NextIo {
    /// The job is done.
    Done,
    /// Every candidate block is busy (verify); yield and try again.
    Busy,
    /// An I/O: read (true) or write, of this block.
    Io { is_read: bool, block: u64 },
}

struct JobState {
    picker: BlockPicker,
    rng: ChaCha8Rng,
    read_share: f64,
    verify: bool,
    /// Generation last written per block (0: not written by this job). Only with verify and writes.
    written_generation: Vec<u64>,
    /// Blocks with a write or read in flight (verify only), so two I/Os never race on one block.
    busy: Vec<bool>,
    next_generation: u64,
    bytes_issued: u64,
    size_limit: Option<u64>,
    deadline: Option<Instant>,
    measuring_since: Option<Instant>,
    stop: bool,
    read: DirectionResult,
    write: DirectionResult,
    mismatch_count: u64,
    mismatches: Vec<Mismatch>,
    verified_blocks: u64,
    error: Option<String>,
}

impl JobState {
    fn record_mismatch(&mut self, offset: u64, kind: MismatchKind) {
        self.mismatch_count += 1;
        if self.mismatches.len() < MISMATCHES_KEPT {
            self.mismatches.push(Mismatch { offset, kind });
        }
    }

    fn next_io(&mut self, region: &Region) -> NextIo {
        if self.stop
            || self.deadline.is_some_and(|deadline| Instant::now() >= deadline)
            || self.size_limit.is_some_and(|limit| self.bytes_issued >= limit)
        {
            self.stop = true;
            return NextIo::Done;
        }
        let is_read = self.read_share >= 1.0 || (self.read_share > 0.0 && self.rng.random_bool(self.read_share));
        let mut block = self.picker.next(&mut self.rng);
        if self.verify {
            // At least iodepth blocks exist and at most iodepth - 1 others are busy, so this ends; the bound
            // is a guard, after which a busy block is skipped for this turn.
            let mut tries = 0;
            while self.busy[block as usize] && tries < 4096 {
                block = self.picker.next(&mut self.rng);
                tries += 1;
            }
            if self.busy[block as usize] {
                return NextIo::Busy;
            }
            self.busy[block as usize] = true;
        }
        self.bytes_issued += region.bs;
        NextIo::Io { is_read, block }
    }
}

/// Snapshot of this thread's CPU times (user, system).
fn thread_cpu_times() -> (Duration, Duration) {
    let mut usage: libc::rusage = zeroed_rusage();
    // SAFETY: getrusage writes one rusage struct we own.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    if rc != 0 {
        return (Duration::ZERO, Duration::ZERO);
    }
    let to_duration = |time: libc::timeval| Duration::new(time.tv_sec as u64, (time.tv_usec as u32) * 1000);
    (to_duration(usage.ru_utime), to_duration(usage.ru_stime))
}

fn zeroed_rusage() -> libc::rusage {
    // SAFETY: rusage is a plain C struct of integers, for which all-zero bytes are a valid value.
    #[allow(unsafe_code)]
    unsafe {
        std::mem::zeroed()
    }
}

/// Runs `job` (clone `job_index`) on `device`, inside the current glommio executor.
pub async fn run_job<D: BlockDevice + 'static>(
    device: Rc<D>,
    job: &JobOptions,
    job_index: u32,
    progress: Arc<JobProgress>,
) -> Result<JobResult, RunError> {
    let geometry = device.geometry();
    let region = Region::of(job, geometry.capacity_bytes, geometry.logical_block_bytes)?;
    let verify = job.verify == Verify::Crc32c;
    let writes = job.rw.writes();
    let started = Instant::now();
    let state = Rc::new(RefCell::new(JobState {
        picker: BlockPicker::new(region.blocks, job.rw.is_random(), job.random_distribution),
        rng: ChaCha8Rng::seed_from_u64(job.randseed ^ u64::from(job_index).wrapping_mul(0x9E37_79B9)),
        read_share: job.rw.read_share(job.rwmixread),
        verify,
        written_generation: if verify && writes { vec![0; region.blocks as usize] } else { Vec::new() },
        busy: if verify { vec![false; region.blocks as usize] } else { Vec::new() },
        next_generation: 1,
        bytes_issued: 0,
        size_limit: if job.time_based { None } else { Some(region.blocks * region.bs) },
        deadline: job.runtime.map(|runtime| started + job.ramp_time + runtime),
        measuring_since: None,
        stop: false,
        read: DirectionResult::default(),
        write: DirectionResult::default(),
        mismatch_count: 0,
        mismatches: Vec::new(),
        verified_blocks: 0,
        error: None,
    }));

    let cpu_at_start = Rc::new(RefCell::new(thread_cpu_times()));
    if job.ramp_time.is_zero() {
        state.borrow_mut().measuring_since = Some(started);
    } else {
        let state = state.clone();
        let cpu_at_start = cpu_at_start.clone();
        let ramp_time = job.ramp_time;
        glommio::spawn_local(async move {
            glommio::timer::sleep(ramp_time).await;
            *cpu_at_start.borrow_mut() = thread_cpu_times();
            state.borrow_mut().measuring_since = Some(Instant::now());
        })
        .detach();
    }

    let mut workers = Vec::with_capacity(job.iodepth as usize);
    for _ in 0..job.iodepth {
        let device = device.clone();
        let state = state.clone();
        let progress = progress.clone();
        let mut write_buffer = device.alloc_buffer(region.bs as usize);
        // Incompressible contents, as fio writes by default; rewritten per I/O only with verify.
        state.borrow_mut().rng.fill(write_buffer.as_mut_slice());
        workers.push(glommio::spawn_local(async move {
            worker(&*device, &state, &region, job_index, write_buffer, &progress).await;
        }));
    }
    for worker in workers {
        worker.await;
    }
    let ended = Instant::now();
    let (usr_end, sys_end) = thread_cpu_times();
    let (usr_start, sys_start) = *cpu_at_start.borrow();

    if verify && writes && state.borrow().error.is_none() {
        verify_written_blocks(&device, &state, &region, job.iodepth).await;
    }

    // The ramp timer task may still hold the state; take what the result needs rather than unwrap it.
    let mut state = state.borrow_mut();
    Ok(JobResult {
        name: job.name.clone(),
        runtime: state.measuring_since.map_or(Duration::ZERO, |since| ended.saturating_duration_since(since)),
        read: std::mem::take(&mut state.read),
        write: std::mem::take(&mut state.write),
        usr_cpu: usr_end.saturating_sub(usr_start),
        sys_cpu: sys_end.saturating_sub(sys_start),
        mismatch_count: state.mismatch_count,
        mismatches: std::mem::take(&mut state.mismatches),
        verified_blocks: state.verified_blocks,
        error: state.error.take(),
    })
}

async fn worker<D: BlockDevice>(
    device: &D,
    state: &RefCell<JobState>,
    region: &Region,
    job_index: u32,
    mut write_buffer: IoBuffer,
    progress: &JobProgress,
) {
    let mut read_buffer: Option<IoBuffer> = None;
    loop {
        let next = state.borrow_mut().next_io(region);
        let (is_read, block) = match next {
            NextIo::Done => return,
            NextIo::Busy => {
                glommio::executor().yield_now().await;
                continue;
            }
            NextIo::Io { is_read, block } => (is_read, block),
        };
        let offset = region.offset_of(block);
        let verify = state.borrow().verify;
        let (called, timing, result) = if is_read {
            let called = Instant::now();
            // The worker's read buffer goes round: backends that read into it (memory, ring) reuse it, and
            // `uring` hands back glommio's buffer, which then only carries the length. No allocation per I/O.
            let buffer = read_buffer.take().unwrap_or_else(|| device.alloc_buffer(region.bs as usize));
            let (buffer, result, timing) = device.read_timed(buffer, offset).await;
            let result = result.map(|()| {
                if verify {
                    let mut state = state.borrow_mut();
                    // A job that writes checks the blocks it wrote (their content is known); blocks it has not
                    // written are not its to judge, as in fio. A read-only job checks every block's header.
                    let job_writes = !state.written_generation.is_empty();
                    let expected =
                        state.written_generation.get(block as usize).copied().filter(|&generation| generation != 0);
                    if !job_writes || expected.is_some() {
                        state.verified_blocks += 1;
                        if let Err(kind) = check_block(buffer.as_slice(), offset, expected) {
                            state.record_mismatch(offset, kind);
                        }
                    }
                }
            });
            read_buffer = Some(buffer);
            (called, timing, result)
        } else {
            let generation = if verify {
                let mut state = state.borrow_mut();
                let generation = state.next_generation;
                state.next_generation += 1;
                fill_block(write_buffer.as_mut_slice(), offset, generation, job_index);
                generation
            } else {
                0
            };
            // Filling the block with its verify header is not the device's time.
            let called = Instant::now();
            let (buffer, result, timing) = device.write_timed(write_buffer, offset).await;
            write_buffer = buffer;
            if verify && result.is_ok() {
                state.borrow_mut().written_generation[block as usize] = generation;
            }
            (called, timing, result)
        };
        let mut state = state.borrow_mut();
        if verify {
            state.busy[block as usize] = false;
        }
        if let Err(error) = result {
            if state.error.is_none() {
                state.error = Some(error.to_string());
            }
            state.stop = true;
            return;
        }
        let (ios, bytes) = if is_read {
            (&progress.read_ios, &progress.read_bytes)
        } else {
            (&progress.write_ios, &progress.write_bytes)
        };
        ios.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add(region.bs, Ordering::Relaxed);
        if state.measuring_since.is_some() {
            let direction = if is_read { &mut state.read } else { &mut state.write };
            direction.record(region.bs, called, timing);
        }
    }
}

/// After a job that wrote with verify: reads back every block it wrote and checks it is the generation it
/// wrote last (fio's verify phase). Not part of the measured figures.
async fn verify_written_blocks<D: BlockDevice + 'static>(
    device: &Rc<D>,
    state: &Rc<RefCell<JobState>>,
    region: &Region,
    iodepth: u32,
) {
    let next_block = Rc::new(std::cell::Cell::new(0u64));
    let mut readers = Vec::new();
    for _ in 0..iodepth {
        let next_block = next_block.clone();
        let state = state.clone();
        let device = device.clone();
        let region = *region;
        readers.push(glommio::spawn_local(async move {
            // One buffer per reader, reused as the workers reuse theirs.
            let mut buffer = device.alloc_buffer(region.bs as usize);
            loop {
                let block = next_block.get();
                if block >= region.blocks {
                    return;
                }
                next_block.set(block + 1);
                let expected = state.borrow().written_generation[block as usize];
                if expected == 0 {
                    continue;
                }
                let offset = region.offset_of(block);
                let (returned, result) = device.read(buffer, offset).await;
                buffer = returned;
                let mut state = state.borrow_mut();
                state.verified_blocks += 1;
                if let Err(error) = result {
                    state.error.get_or_insert_with(|| error.to_string());
                    return;
                }
                if let Err(kind) = check_block(buffer.as_slice(), offset, Some(expected)) {
                    state.record_mismatch(offset, kind);
                }
            }
        }));
    }
    for reader in readers {
        reader.await;
    }
}
