//! The `ring` backend: our own io_uring per device, for executors that do nothing but block I/O, and for
//! busy-polled executors that serve sockets too.
//!
//! Why a second io_uring backend: glommio's reactor pays a heavy price every time its executor parks (a
//! `membarrier`, timer re-arming, linking its three rings, several `io_uring_enter`s), which costs 20% of
//! the IOPS fio reaches at queue depth 32 and 30% at depth 1 on this machine (docs/BENCHMARKS.md). This
//! backend's reaper task collects completions from the ring's memory and, when nothing has completed,
//! waits one of two ways ([`RingWait`]):
//! - **Block**: it *blocks the executor* in `io_uring_enter` until a completion arrives, as fio's engine
//!   does. Right for an executor dedicated to I/O (a bench job, an I/O core); wrong for one that also serves
//!   the network, whose events would wait behind the block.
//! - **Polled**: it never blocks; it yields to the executor's other tasks and looks again, as a busy-polled
//!   executor's sockets do (`tcp::stream::idle_poll`, whose cadence also gives glommio's reactor its turns).
//!   A busy-polled node's disk completions are then seen on the next pass of its executor, where through
//!   glommio's reactor they waited for its next turn and its park: a 4 KiB tier get at one in flight went
//!   from p50 79–86 µs to 55–63 µs, alternated in one hour.
//!
//! Each entry goes to the kernel as it is queued, as fio's engine does by default, whenever other I/O is in
//! flight: the disk then starts on the first read of a round while the tasks still queue the rest. Gathered
//! into one `io_uring_enter` per pass instead, a round's 32 reads reached this disk only at the call's end
//! (the kernel plugs a call's entries) and came back together, so its queue drained before it refilled:
//! 0.80 × fio's IOPS at queue depth 32 in the block bench, 0.97 × submitted at once (the current figure is
//! in docs/BENCHMARKS.md).
//! The one exception is a blocking ring's lone entry: with nothing else in flight, the reaper's call that
//! waits for a completion submits it, one system call per I/O at depth 1 against fio's two. That call's
//! entries are stamped just before it, so their `clat` includes the submission's kernel work (fio puts that
//! in `slat`): our completion latency errs long, never short.
//!
//! Registered buffers: `alloc_buffer` lends chunks registered in the ring's table of fixed buffers, which
//! go to the kernel as `READ_FIXED`/`WRITE_FIXED` (pages pinned once, not at every I/O: fio's `fixedbufs`).
//! A dropped one returns to the ring's pool, still registered; a ring keeps at most 128 MiB registered
//! (`FIXED_BYTES_MAX`), past which buffers come from the heap. Any other buffer goes as a plain operation.
//!
//! Safety of buffers: while an operation is in flight its buffer is owned by the ring's slot table, not by
//! the future that issued it, so a future that is dropped never frees memory the kernel is writing into;
//! the slot gives the buffer back when the completion arrives. Dropping the ring waits for every in-flight
//! operation first.

use std::cell::RefCell;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Instant;

use io_uring::{IoUring, opcode, squeue, types};

use crate::buffer::{FixedChunk, FixedPool, IoBuffer};
use crate::device::{BlockDevice, Geometry, IoTiming};
use crate::environment::check_direct_io;
use crate::error::{BlockError, BlockErrorKind, BlockOp, BlockResult};
use crate::uring::{UringOptions, prepare_file};

const MAX_TRANSFER_BYTES: u64 = 8 << 20;

/// Most entries in a ring's table of fixed buffers (the kernel allows 16,384). A bench job holds two buffers
/// per worker (one to read into, one to write from); later allocations fall back to the heap.
const FIXED_TABLE_MAX: u32 = 4096;

/// Most bytes a ring keeps registered (pinned, and kept once used): a node's three 16 MiB region buffers
/// and its reads fit; beyond it buffers come from the heap, whose pages the kernel pins per I/O. Without it
/// a target's namespace (a table of 528 entries of up to 1 MiB) could keep half a GiB pinned after a peer's
/// burst of large writes.
const FIXED_BYTES_MAX: usize = 128 << 20;

#[derive(Default)]
struct Slot {
    result: Option<i32>,
    waker: Option<Waker>,
    /// The buffer the kernel reads from or writes into, owned here while the operation is in flight.
    buffer: Option<IoBuffer>,
    /// The future that issued the operation was dropped: the reaper frees the slot on completion.
    abandoned: bool,
    /// When `io_uring_enter` returned having taken the entry (set by the reaper's submission).
    submitted: Option<Instant>,
    /// When `reap` saw the completion (one clock read per reap, as fio reads one per batch of events).
    completed: Option<Instant>,
}

struct RingState {
    ring: IoUring,
    /// Kept open for as long as operations may be in flight on it.
    file: File,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    /// Operations queued or submitted whose completion has not been reaped.
    in_flight: u32,
    /// Slots whose entries are queued in the submission ring but not yet submitted.
    unsubmitted: Vec<u32>,
    reaper_running: bool,
    /// The reaper, waiting for the first submission after the ring went idle.
    idle_reaper: Option<Waker>,
    /// Tasks waiting for a free slot.
    slot_waiters: Vec<Waker>,
    /// Completions copied out of the queue by `reap`, kept to avoid an allocation per reap.
    completions: Vec<(u64, i32)>,
    /// Registered buffers not lent out (declared after `ring`, so the ring closes first).
    fixed: Rc<FixedPool>,
    /// Entries of the sparse fixed-buffer table registered at open (0: registration failed, none used).
    fixed_table_len: u32,
    /// Entries handed out so far (each registered at first use, then reused through `fixed`, or registered
    /// again for a chunk of another size).
    fixed_registered: u32,
    /// Bytes of the chunks registered in the table now (at most [`FIXED_BYTES_MAX`]).
    fixed_bytes: usize,
    /// Reads and writes submitted as `READ_FIXED`/`WRITE_FIXED`.
    fixed_operations: u64,
    /// Why buffers stopped being registered (the table, or a chunk, was refused), once that happened.
    fixed_refused: Option<String>,
    /// How the reaper waits for completions.
    wait: RingWait,
}

impl RingState {
    /// Submits every queued entry in one system call and stamps their slots. A failed submission leaves
    /// the entries queued, for the next pass (or the blocking wait, which submits too).
    fn submit_queued(&mut self) {
        if self.unsubmitted.is_empty() || self.ring.submit().is_err() {
            return;
        }
        self.stamp_submitted();
    }

    /// Marks every queued entry submitted now.
    fn stamp_submitted(&mut self) {
        let now = Instant::now();
        for slot in self.unsubmitted.drain(..) {
            self.slots[slot as usize].submitted = Some(now);
        }
    }

    /// Moves every available completion to its slot and wakes its task. Returns how many there were.
    fn reap(&mut self) -> usize {
        let mut completions = std::mem::take(&mut self.completions);
        completions.extend(self.ring.completion().map(|completion| (completion.user_data(), completion.result())));
        let now = if completions.is_empty() { None } else { Some(Instant::now()) };
        let mut reaped = 0;
        for &(user_data, result) in &completions {
            let Some(slot) = self.slots.get_mut(user_data as usize) else {
                continue;
            };
            self.in_flight -= 1;
            reaped += 1;
            if slot.abandoned {
                self.release_slot(user_data as u32);
                continue;
            }
            slot.result = Some(result);
            slot.completed = now;
            if let Some(waker) = slot.waker.take() {
                waker.wake();
            }
        }
        completions.clear();
        self.completions = completions;
        reaped
    }

    /// Returns a slot to the free list and wakes one task waiting for a slot.
    fn release_slot(&mut self, slot: u32) {
        self.slots[slot as usize] = Slot::default();
        self.free_slots.push(slot);
        if let Some(waiter) = self.slot_waiters.pop() {
            waiter.wake();
        }
    }
}

impl Drop for RingState {
    fn drop(&mut self) {
        // Never free a buffer the kernel may still write into: wait for everything in flight. Bounded by the
        // device completing what it was given.
        while self.in_flight > 0 {
            if self.ring.submit_and_wait(1).is_err() {
                break;
            }
            self.reap();
        }
    }
}

/// How a ring's reaper waits while I/O is in flight and nothing has completed (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingWait {
    /// In `io_uring_enter`, blocking the executor: for an executor that does nothing but block I/O.
    Block,
    /// By yielding to the executor's other tasks and looking again: for a busy-polled executor.
    Polled,
}

/// A file or block device on our own io_uring, O_DIRECT. Must be opened and used on one glommio executor,
/// dedicated to I/O or busy-polled (see the module doc).
pub struct RingDevice {
    name: String,
    path: PathBuf,
    geometry: Geometry,
    state: Rc<RefCell<RingState>>,
}

/// The logical block size of the device holding `path` (from sysfs; 512 when it cannot be read).
fn logical_block_bytes(path: &Path) -> u64 {
    let Ok(metadata) = std::fs::metadata(path) else {
        return 512;
    };
    let device = if metadata.file_type().is_file() { metadata.dev() } else { metadata.rdev() };
    let (major, minor) = (libc::major(device), libc::minor(device));
    for candidate in [
        format!("/sys/dev/block/{major}:{minor}/queue/logical_block_size"),
        format!("/sys/dev/block/{major}:{minor}/../queue/logical_block_size"),
    ] {
        if let Some(bytes) = std::fs::read_to_string(candidate).ok().and_then(|text| text.trim().parse::<u64>().ok()) {
            return bytes.max(512);
        }
    }
    512
}

impl RingDevice {
    /// Opens `path` with O_DIRECT on a ring of `queue_depth_max` entries (operations beyond it wait), for an
    /// executor dedicated to I/O ([`RingWait::Block`]).
    pub fn open(path: &Path, options: &UringOptions, queue_depth_max: u32) -> BlockResult<Self> {
        Self::open_with(path, options, queue_depth_max, RingWait::Block)
    }

    /// Opens `path` as [`open`](Self::open) does, its reaper waiting as `wait` says.
    pub fn open_with(path: &Path, options: &UringOptions, queue_depth_max: u32, wait: RingWait) -> BlockResult<Self> {
        let name = path.display().to_string();
        let open_error = |kind| BlockError::new(BlockOp::Open, &name, 0, kind);
        let capacity_bytes = prepare_file(path, options).map_err(|error| open_error(BlockErrorKind::Io(error)))?;
        check_direct_io(path)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(!options.read_only)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map_err(|error| open_error(BlockErrorKind::Io(error)))?;
        let depth = queue_depth_max.clamp(1, 4096).next_power_of_two();
        let ring = IoUring::new(depth).map_err(|error| open_error(BlockErrorKind::Io(error)))?;
        // A sparse table, filled as buffers are allocated. Without it (an old kernel, no memlock budget)
        // every buffer is plain heap memory and I/O pins its pages each time, as fio's default does.
        let fixed_table_len = (2 * depth + 16).min(FIXED_TABLE_MAX);
        let (fixed_table_len, fixed_refused) = match ring.submitter().register_buffers_sparse(fixed_table_len) {
            Ok(()) => (fixed_table_len, None),
            Err(error) => (0, Some(format!("the fixed-buffer table was refused: {error}"))),
        };
        let logical_block_bytes = logical_block_bytes(path);
        let capacity_bytes = capacity_bytes - capacity_bytes % logical_block_bytes;
        if capacity_bytes == 0 {
            return Err(open_error(BlockErrorKind::Environment(format!(
                "{name} is empty: give a size (e.g. --size) to create or extend it"
            ))));
        }
        let state = RingState {
            ring,
            file,
            slots: (0..depth).map(|_| Slot::default()).collect(),
            free_slots: (0..depth).rev().collect(),
            in_flight: 0,
            unsubmitted: Vec::with_capacity(depth as usize),
            reaper_running: false,
            idle_reaper: None,
            slot_waiters: Vec::new(),
            completions: Vec::with_capacity(depth as usize),
            fixed: Rc::new(FixedPool::default()),
            fixed_table_len,
            fixed_registered: 0,
            fixed_bytes: 0,
            fixed_operations: 0,
            fixed_refused,
            wait,
        };
        Ok(Self {
            geometry: Geometry {
                capacity_bytes,
                logical_block_bytes,
                max_transfer_bytes: MAX_TRANSFER_BYTES,
                buffer_alignment_bytes: logical_block_bytes,
            },
            name,
            path: path.to_path_buf(),
            state: Rc::new(RefCell::new(state)),
        })
    }

    /// The path opened.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many buffers are registered with the ring (fixed buffers: `alloc_buffer` hands them out).
    pub fn fixed_buffers_registered(&self) -> u32 {
        self.state.borrow().fixed_registered
    }

    /// Bytes of the buffers registered with the ring now (pinned; at most 128 MiB).
    pub fn fixed_buffer_bytes(&self) -> usize {
        self.state.borrow().fixed_bytes
    }

    /// How many reads and writes went to the kernel as fixed-buffer operations (their pages pinned once).
    pub fn fixed_operations(&self) -> u64 {
        self.state.borrow().fixed_operations
    }

    /// Why this ring stopped registering buffers, if it did (no table, or a chunk refused: the memlock
    /// budget, most likely); buffers asked for since then came from the heap and moved as plain reads and
    /// writes, which pin their pages at every I/O.
    pub fn fixed_buffers_refused(&self) -> Option<String> {
        self.state.borrow().fixed_refused.clone()
    }

    /// A registered buffer of `len` bytes: an idle one of about that size, else a new chunk registered in
    /// the next free entry of the table or, once the table or its byte budget ([`FIXED_BYTES_MAX`]) is
    /// used, in the entry of an idle chunk of another size (a table left full of one size by one
    /// kind of I/O would otherwise send every later I/O of another size to the heap, pinning its pages each
    /// time). Chunks are cut in powers of two, so an idle one serves every size within a factor of two.
    /// `None` when neither fits or registration fails.
    fn alloc_fixed(&self, len: usize, alignment: usize) -> Option<IoBuffer> {
        let mut state = self.state.borrow_mut();
        let pool = Rc::clone(&state.fixed);
        if let Some(chunk) = pool.take(len) {
            return Some(IoBuffer::from_fixed(chunk, len, pool));
        }
        if len == 0 || state.fixed_table_len == 0 {
            return None;
        }
        let capacity = len.next_power_of_two().max(alignment);
        let fresh_entry =
            state.fixed_registered < state.fixed_table_len && state.fixed_bytes + capacity <= FIXED_BYTES_MAX;
        // Kept until its entry points at the new chunk (an idle chunk is in no operation's hands).
        let replaced = if fresh_entry { None } else { Some(pool.take_any_size()?) };
        let freed = replaced.as_ref().map_or(0, FixedChunk::capacity);
        if state.fixed_bytes - freed + capacity > FIXED_BYTES_MAX {
            pool.give_back(replaced?);
            return None;
        }
        let index = match &replaced {
            Some(old) => old.index(),
            None => u16::try_from(state.fixed_registered).ok()?,
        };
        let mut chunk = FixedChunk::new(capacity, alignment, index);
        let iovec = chunk.iovec();
        // SAFETY: the chunk's memory stays allocated for as long as the registration can be used: it lives in
        // an `IoBuffer` or in `state.fixed`, which the ring state holds until its last operation completed
        // (RingState's Drop waits for them), and the table entry is used only while the chunk is lent.
        #[allow(unsafe_code)]
        let registered = unsafe { state.ring.submitter().register_buffers_update(u32::from(index), &[iovec], None) };
        drop(replaced);
        if let Err(error) = registered {
            // Out of memlock budget, most likely: stop trying; buffers come from the heap from now on.
            state.fixed_table_len = 0;
            state.fixed_refused = Some(format!("a {} KiB buffer was refused: {error}", iovec.iov_len >> 10));
            return None;
        }
        state.fixed_registered += u32::from(fresh_entry);
        state.fixed_bytes = state.fixed_bytes - freed + capacity;
        Some(IoBuffer::from_fixed(chunk, len, pool))
    }

    /// Submits one operation built by `build` (given the fd and the buffer's address) and waits for it.
    /// Returns the buffer, the kernel's result (bytes, or a negative errno) and when it was submitted and
    /// reaped.
    async fn run(
        &self,
        mut buffer: Option<IoBuffer>,
        build: impl FnOnce(types::Fd, *mut u8, Option<u16>) -> squeue::Entry,
    ) -> (Option<IoBuffer>, i32, IoTiming) {
        let called = Instant::now();
        let slot = loop {
            if let Some(slot) = self.state.borrow_mut().free_slots.pop() {
                break slot;
            }
            let state = &self.state;
            let mut registered = false;
            std::future::poll_fn(|context| {
                if registered {
                    return Poll::Ready(());
                }
                registered = true;
                state.borrow_mut().slot_waiters.push(context.waker().clone());
                Poll::Pending
            })
            .await;
        };
        // The address is taken once the buffer is writable (a read-only buffer is copied to the heap first);
        // moving the `IoBuffer` into the slot below does not move the bytes it points to.
        let address = buffer.as_mut().map_or(std::ptr::null_mut(), |buffer| buffer.as_mut_slice().as_mut_ptr());
        {
            let mut state = self.state.borrow_mut();
            let fd = types::Fd(state.file.as_raw_fd());
            let fixed_index = buffer.as_ref().and_then(|buffer| buffer.fixed_index(&state.fixed));
            state.fixed_operations += u64::from(fixed_index.is_some());
            let entry = build(fd, address, fixed_index).user_data(u64::from(slot));
            state.slots[slot as usize] = Slot { buffer: buffer.take(), ..Slot::default() };
            // SAFETY: the entry's buffer (if any) is owned by slot `slot` until its completion is reaped, and the
            // file by the state, which outlives every in-flight operation (RingState's Drop waits for them).
            #[allow(unsafe_code)]
            let pushed = unsafe { state.ring.submission().push(&entry) };
            if pushed.is_err() {
                // Cannot happen: slots never outnumber the ring's entries. Give everything back.
                let buffer = state.slots[slot as usize].buffer.take();
                state.release_slot(slot);
                return (buffer, -libc::EBUSY, IoTiming { submitted: called, completed: Instant::now() });
            }
            state.unsubmitted.push(slot);
            state.in_flight += 1;
            // At once (see the module doc), except a blocking ring's lone entry, which the reaper's waiting
            // call submits.
            if state.wait == RingWait::Polled || state.in_flight > 1 {
                state.submit_queued();
            }
            if let Some(reaper) = state.idle_reaper.take() {
                reaper.wake();
            }
        }
        self.ensure_reaper();
        let mut guard = SlotGuard { state: &self.state, slot, finished: false };
        let state = &self.state;
        let result = std::future::poll_fn(|context| {
            let mut state = state.borrow_mut();
            let entry = &mut state.slots[slot as usize];
            match entry.result {
                Some(result) => Poll::Ready(result),
                None => {
                    entry.waker = Some(context.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await;
        guard.finished = true;
        let mut state = self.state.borrow_mut();
        let entry = &mut state.slots[slot as usize];
        let buffer = entry.buffer.take();
        let submitted = entry.submitted.unwrap_or(called);
        let timing = IoTiming { submitted, completed: entry.completed.unwrap_or_else(Instant::now) };
        state.release_slot(slot);
        (buffer, result, timing)
    }

    fn ensure_reaper(&self) {
        if std::mem::replace(&mut self.state.borrow_mut().reaper_running, true) {
            return;
        }
        glommio::spawn_local(reap(Rc::downgrade(&self.state))).detach();
    }

    fn result(&self, op: BlockOp, offset: u64, len: u64, result: i32) -> BlockResult<()> {
        if result < 0 {
            let error = std::io::Error::from_raw_os_error(-result);
            return Err(BlockError::new(op, &self.name, offset, BlockErrorKind::Io(error)));
        }
        if op != BlockOp::Flush && op != BlockOp::WriteZeroes && op != BlockOp::Deallocate && result as u64 != len {
            let kind = BlockErrorKind::ShortTransfer { done: result as u64, len };
            return Err(BlockError::new(op, &self.name, offset, kind));
        }
        Ok(())
    }
}

/// The ring's reaper: it moves completions to their tasks and submits what they queue next; with nothing in
/// flight it sleeps until an operation is queued, and with I/O in flight and nothing completed it waits as
/// the ring's [`RingWait`] says. It ends once the device is gone.
async fn reap(state: std::rc::Weak<RefCell<RingState>>) {
    let mut misses = 0u32;
    loop {
        let Some(shared) = state.upgrade() else {
            return;
        };
        let reaped = shared.borrow_mut().reap();
        if reaped > 0 {
            misses = 0;
            // Whatever is still queued (an entry whose own submission failed) goes out now.
            shared.borrow_mut().submit_queued();
            drop(shared);
            // Let the woken tasks run (and queue their next I/O) before looking again.
            yield_once().await;
            continue;
        }
        if shared.borrow().in_flight == 0 {
            let mut waiting = false;
            std::future::poll_fn(|context| {
                if waiting {
                    return Poll::Ready(());
                }
                waiting = true;
                shared.borrow_mut().idle_reaper = Some(context.waker().clone());
                Poll::Pending
            })
            .await;
            continue;
        }
        let wait = shared.borrow().wait;
        match wait {
            // Nothing completed and I/O is in flight: submit what is queued and block in the kernel until
            // something completes, in one `io_uring_enter` (at depth 1: one system call per I/O, where fio's
            // engine makes two). The entries are stamped just before the call, so their `clat` includes the
            // kernel's submission work that fio counts in `slat`: ours errs long.
            RingWait::Block => {
                let mut state = shared.borrow_mut();
                state.stamp_submitted();
                let _ = state.ring.submit_and_wait(1);
            }
            // Submit what is still queued (an entry whose own submission failed) and yield; one look in
            // REAPER_LOOKS_PER_POLL counts as a polled socket's miss (see the constant).
            RingWait::Polled => {
                shared.borrow_mut().submit_queued();
                drop(shared);
                misses += 1;
                if misses.is_multiple_of(REAPER_LOOKS_PER_POLL) {
                    crate::tcp::stream::idle_poll(misses / REAPER_LOOKS_PER_POLL).await;
                } else {
                    yield_once().await;
                }
            }
        }
    }
}

/// A polled reaper's looks at the completion queue per polled socket's miss (`idle_poll`). A look reads the
/// ring's memory, where a socket's miss is a system call, about ten times longer; `idle_poll` spaces the
/// kernel's and glommio's reactor's turns (a `sched_yield`, a park on a 1 µs timer) by socket misses, and
/// counted per look they came ten times too often: a busy-polled node waiting ~500 µs for a batch's reads
/// made 70 `sched_yield`s and parked 3 times.
const REAPER_LOOKS_PER_POLL: u32 = 8;

/// Frees an operation's slot if the future waiting for it is dropped: at once when the result is already
/// in, else when the reaper sees the completion (the buffer stays owned by the slot until then).
struct SlotGuard<'a> {
    state: &'a RefCell<RingState>,
    slot: u32,
    finished: bool,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let Ok(mut state) = self.state.try_borrow_mut() else {
            return;
        };
        if state.slots[self.slot as usize].result.is_some() {
            state.release_slot(self.slot);
        } else {
            state.slots[self.slot as usize].abandoned = true;
        }
    }
}

/// Returns `Pending` once after waking itself, so the executor runs the other ready tasks first.
async fn yield_once() {
    let mut yielded = false;
    std::future::poll_fn(|context| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        context.waker().wake_by_ref();
        Poll::Pending
    })
    .await;
}

impl Drop for RingDevice {
    fn drop(&mut self) {
        // Wake an idle reaper so it sees the device is gone and ends.
        if let Ok(mut state) = self.state.try_borrow_mut()
            && let Some(reaper) = state.idle_reaper.take()
        {
            reaper.wake();
        }
    }
}

impl BlockDevice for RingDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn alloc_buffer(&self, len: usize) -> IoBuffer {
        let alignment = self.geometry.buffer_alignment_bytes.max(4096) as usize;
        self.alloc_fixed(len, alignment).unwrap_or_else(|| IoBuffer::aligned(len, alignment))
    }

    async fn read(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>) {
        let (buf, result, _) = self.read_timed(buf, offset).await;
        (buf, result)
    }

    async fn write(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>) {
        let (buf, result, _) = self.write_timed(buf, offset).await;
        (buf, result)
    }

    async fn read_timed(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>, IoTiming) {
        let len = buf.len() as u64;
        if let Err(error) = self.geometry.check(BlockOp::Read, &self.name, offset, len, Some(&buf)) {
            let now = Instant::now();
            return (buf, Err(error), IoTiming { submitted: now, completed: now });
        }
        let (buffer, result, timing) = self
            .run(Some(buf), |fd, address, fixed| match fixed {
                Some(index) => opcode::ReadFixed::new(fd, address, len as u32, index).offset(offset).build(),
                None => opcode::Read::new(fd, address, len as u32).offset(offset).build(),
            })
            .await;
        let result = self.result(BlockOp::Read, offset, len, result);
        (buffer.unwrap_or_else(|| IoBuffer::aligned(0, 1)), result, timing)
    }

    async fn write_timed(&self, buf: IoBuffer, offset: u64) -> (IoBuffer, BlockResult<()>, IoTiming) {
        let len = buf.len() as u64;
        if let Err(error) = self.geometry.check(BlockOp::Write, &self.name, offset, len, Some(&buf)) {
            let now = Instant::now();
            return (buf, Err(error), IoTiming { submitted: now, completed: now });
        }
        let (buffer, result, timing) = self
            .run(Some(buf), |fd, address, fixed| match fixed {
                Some(index) => {
                    opcode::WriteFixed::new(fd, address.cast_const(), len as u32, index).offset(offset).build()
                }
                None => opcode::Write::new(fd, address.cast_const(), len as u32).offset(offset).build(),
            })
            .await;
        let result = self.result(BlockOp::Write, offset, len, result);
        (buffer.unwrap_or_else(|| IoBuffer::aligned(0, 1)), result, timing)
    }

    async fn flush(&self) -> BlockResult<()> {
        let (_, result, _) =
            self.run(None, |fd, _, _| opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build()).await;
        self.result(BlockOp::Flush, 0, 0, result)
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.geometry.check(BlockOp::WriteZeroes, &self.name, offset, len, None)?;
        let (_, result, _) = self
            .run(None, |fd, _, _| {
                opcode::Fallocate::new(fd, len).offset(offset).mode(libc::FALLOC_FL_ZERO_RANGE).build()
            })
            .await;
        self.result(BlockOp::WriteZeroes, offset, len, result)
    }

    async fn deallocate(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.geometry.check(BlockOp::Deallocate, &self.name, offset, len, None)?;
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        let (_, result, _) =
            self.run(None, |fd, _, _| opcode::Fallocate::new(fd, len).offset(offset).mode(mode).build()).await;
        self.result(BlockOp::Deallocate, offset, len, result)
    }
}
