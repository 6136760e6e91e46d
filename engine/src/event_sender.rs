//! Event frames written to subscribers off the shards' cores.
//!
//! An observed put costs its shard the event's encoding and a share of the frame's send. On loopback the
//! send is the larger part: `tcp_sendmsg` also runs the receiving side's TCP work inline, so the shard's
//! core paid for both ends of the subscriber's connection (about two thirds of what an observed put cost
//! the node, measured by a build that skipped only those writes). A subscriber's frames are
//! therefore handed, through a bounded channel, to a thread of its own that runs on the CPUs no shard is
//! pinned to and writes them with its own system calls on a duplicate of the socket's descriptor. The
//! shard keeps everything else: the event log, the subscriber's cursor, its filter, the gathering of
//! frames, LAGGED when the subscriber falls behind.
//!
//! *Decision:* a thread per subscriber, not one for the node. Subscribers are a node's few routers, each
//! thread blocks on its own socket (no multiplexing to get wrong), and [`MAX_SENDER_THREADS`] bounds them;
//! past it, or where the process may run on no CPU besides the shards' (an operator's `taskset`, a node
//! given every core), frames are written by the shard as before, so nothing runs where it was not allowed.
//!
//! Nothing here can block a shard: a full channel sends the frame back and the shard retries after its
//! gather interval, meanwhile its events wait in the shard's bounded log like any slow subscriber's. A
//! subscriber that stops reading for the node's stall timeout is shut down by its thread (and counted as
//! stalled); the shard learns it at its next hand-off, at the latest at the next heartbeat.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

use crate::config::EventCpus;
use crate::metrics::ShardMetrics;

/// Sender threads a node runs at most; subscribers past them are written to by their shard.
pub const MAX_SENDER_THREADS: usize = 64;

/// Frames a subscriber's channel holds: with a frame every millisecond or two, a few milliseconds of
/// slack before the shard holds its frames back (in its log, which bounds them).
const QUEUED_FRAMES: usize = 4;

/// A thread waiting for a frame or for room in its socket looks up this often to see whether its shard
/// let go of it or the node is stopping.
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// The node's sender threads: which CPUs they run on and how many there are.
pub struct EventSenders {
    cpus: Vec<usize>,
    live: AtomicUsize,
    /// The node is stopping: threads end (a stopped shard never drops its end of their channels).
    stopping: AtomicBool,
}

impl EventSenders {
    /// The senders `setting` asks for, next to shards on `shard_cpus`; reads the calling thread's affinity
    /// for [`EventCpus::Spare`] (call it before any thread pins itself).
    pub fn new(setting: &EventCpus, shard_cpus: &[usize]) -> Self {
        let cpus = match setting {
            EventCpus::Inline => Vec::new(),
            EventCpus::These(cpus) => cpus.clone(),
            EventCpus::Spare => {
                crate::sys::allowed_cpus().into_iter().filter(|cpu| !shard_cpus.contains(cpu)).collect()
            }
        };
        Self { cpus, live: AtomicUsize::new(0), stopping: AtomicBool::new(false) }
    }

    /// The CPUs sender threads run on (none: shards write their subscribers' frames themselves).
    pub fn cpus(&self) -> &[usize] {
        &self.cpus
    }

    /// Ends every thread within [`WAIT_SLICE`] (the node is stopping).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// Sender threads running now.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// A thread that writes frames to the connected socket `fd` (which must stay open until the returned
    /// sender is dropped: the thread works on a duplicate), or `None` when frames are to be written inline:
    /// no CPU for it, [`MAX_SENDER_THREADS`] running, or the system refused a descriptor or a thread.
    pub fn start(
        self: &Arc<Self>,
        fd: RawFd,
        stall_timeout: Duration,
        metrics: Arc<ShardMetrics>,
    ) -> Option<FrameSender> {
        if self.cpus.is_empty() {
            return None;
        }
        if self.live.fetch_add(1, Ordering::Relaxed) >= MAX_SENDER_THREADS {
            self.live.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        // Counted from here: the count goes back when the thread ends, or when any step below fails.
        let count = LiveCount(Arc::clone(self));
        // SAFETY: `dup` has no memory-safety preconditions; it returns a new descriptor or -1.
        #[allow(unsafe_code)]
        let duplicate = unsafe { libc::dup(fd) };
        if duplicate < 0 {
            return None;
        }
        // SAFETY: `duplicate` is a fresh descriptor that nothing else owns.
        #[allow(unsafe_code)]
        let socket = unsafe { OwnedFd::from_raw_fd(duplicate) };
        let (frames, queued) = sync_channel::<Vec<u8>>(QUEUED_FRAMES);
        let (recycle, recycled) = sync_channel::<Vec<u8>>(QUEUED_FRAMES);
        let abandoned = Arc::new(AtomicBool::new(false));
        let thread =
            SenderThread { count, socket, queued, recycle, abandoned: Arc::clone(&abandoned), stall_timeout, metrics };
        match std::thread::Builder::new().name("strata-events".into()).spawn(move || thread.run()) {
            Ok(_) => Some(FrameSender { frames, recycled, abandoned }),
            Err(_) => None,
        }
    }
}

/// One running sender thread, in [`EventSenders::live`] until dropped.
struct LiveCount(Arc<EventSenders>);

impl Drop for LiveCount {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A shard's end of one subscriber's sender thread. Dropping it lets the thread go.
pub struct FrameSender {
    frames: SyncSender<Vec<u8>>,
    recycled: Receiver<Vec<u8>>,
    abandoned: Arc<AtomicBool>,
}

/// Why a frame was not handed over.
pub enum HandOffRefused {
    /// The channel is full (the subscriber reads slower than frames come): here is the frame back.
    Full(Vec<u8>),
    /// The thread ended: the socket failed, or the subscriber stalled and was shut down.
    Closed,
}

impl FrameSender {
    /// An empty buffer for the next frame: one the thread has finished with, or a new one.
    pub fn buffer(&self, capacity: usize) -> Vec<u8> {
        match self.recycled.try_recv() {
            Ok(mut buffer) => {
                buffer.clear();
                buffer
            }
            Err(_) => Vec::with_capacity(capacity),
        }
    }

    /// Queues `frame` for the thread to write.
    pub fn hand_off(&self, frame: Vec<u8>) -> Result<(), HandOffRefused> {
        self.frames.try_send(frame).map_err(|error| match error {
            TrySendError::Full(frame) => HandOffRefused::Full(frame),
            TrySendError::Disconnected(_) => HandOffRefused::Closed,
        })
    }
}

impl Drop for FrameSender {
    fn drop(&mut self) {
        // The thread may be waiting for room in the socket rather than on the channel.
        self.abandoned.store(true, Ordering::Relaxed);
    }
}

struct SenderThread {
    /// First, so dropped first: whoever sees the channel closed sees the count already given back.
    count: LiveCount,
    socket: OwnedFd,
    queued: Receiver<Vec<u8>>,
    recycle: SyncSender<Vec<u8>>,
    abandoned: Arc<AtomicBool>,
    stall_timeout: Duration,
    metrics: Arc<ShardMetrics>,
}

/// Why a thread stopped writing.
enum Stop {
    /// Its shard let go of the subscriber, or the node is stopping.
    Abandoned,
    /// No byte left for the stall timeout.
    Stalled,
    /// The socket failed (the subscriber went away).
    Failed,
}

impl SenderThread {
    /// Its shard let go of the subscriber, or the node is stopping.
    fn let_go(&self) -> bool {
        self.abandoned.load(Ordering::Relaxed) || self.count.0.stopping.load(Ordering::Relaxed)
    }

    fn run(self) {
        pin_to(&self.count.0.cpus);
        loop {
            let frame = match self.queued.recv_timeout(WAIT_SLICE) {
                Ok(frame) => frame,
                Err(RecvTimeoutError::Timeout) => {
                    if self.let_go() {
                        break;
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            };
            if self.let_go() {
                break;
            }
            match write_all(self.socket.as_raw_fd(), &frame, self.stall_timeout, || self.let_go()) {
                Ok(()) => {
                    let _ = self.recycle.try_send(frame);
                }
                Err(stop) => {
                    if matches!(stop, Stop::Stalled) {
                        self.metrics.stalled_connections.fetch_add(1, Ordering::Relaxed);
                    }
                    if !matches!(stop, Stop::Abandoned) {
                        // Shut down, not only closed: the shard's own descriptor keeps the connection open.
                        crate::sys::shutdown_socket(self.socket.as_raw_fd());
                    }
                    break;
                }
            }
        }
    }
}

/// Writes all of `bytes` to the socket `fd`, waiting for room as long as bytes keep leaving within
/// `stall_timeout` (zero: forever) and the shard holds on to the subscriber.
fn write_all(fd: RawFd, mut bytes: &[u8], stall_timeout: Duration, let_go: impl Fn() -> bool) -> Result<(), Stop> {
    let mut moved_at = Instant::now();
    while !bytes.is_empty() {
        // Non-blocking whatever the descriptor's flags (shared with the shard's copy, which glommio owns);
        // no SIGPIPE from a subscriber that went away.
        // SAFETY: `bytes` is valid for reads of its length; `fd` is an open socket this thread owns a copy of.
        #[allow(unsafe_code)]
        let sent =
            unsafe { libc::send(fd, bytes.as_ptr().cast(), bytes.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if sent > 0 {
            bytes = &bytes[sent as usize..];
            moved_at = Instant::now();
            continue;
        }
        let error = io::Error::last_os_error();
        match error.kind() {
            io::ErrorKind::WouldBlock => {}
            io::ErrorKind::Interrupted => continue,
            _ => return Err(Stop::Failed),
        }
        if let_go() {
            return Err(Stop::Abandoned);
        }
        if !stall_timeout.is_zero() && moved_at.elapsed() >= stall_timeout {
            return Err(Stop::Stalled);
        }
        let mut poll = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
        // SAFETY: one valid pollfd.
        #[allow(unsafe_code)]
        unsafe {
            libc::poll(&mut poll, 1, WAIT_SLICE.as_millis() as libc::c_int);
        }
    }
    Ok(())
}

/// Restricts the calling thread to `cpus` (best effort: a CPU that is offline or outside the process's
/// cgroup makes the call fail, and the thread then runs where the kernel puts it).
fn pin_to(cpus: &[usize]) {
    // SAFETY: `set` is a plain bit set; CPU_SET writes within it (config validation keeps CPU numbers
    // under CPU_SETSIZE, and this checks again).
    #[allow(unsafe_code)]
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus.iter().filter(|&&cpu| cpu < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    use super::*;

    fn connected() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        (server, client)
    }

    #[test]
    fn spare_cpus_are_the_allowed_ones_no_shard_has() {
        let allowed = crate::sys::allowed_cpus();
        assert!(!allowed.is_empty());
        let spare = EventSenders::new(&EventCpus::Spare, &allowed[..1]);
        assert_eq!(spare.cpus(), &allowed[1..]);
        assert!(EventSenders::new(&EventCpus::Spare, &allowed).cpus().is_empty(), "every CPU has a shard");
        assert!(EventSenders::new(&EventCpus::Inline, &[]).cpus().is_empty());
        assert_eq!(EventSenders::new(&EventCpus::These(vec![0]), &[0]).cpus(), &[0]);
        let (server, _client) = connected();
        let inline = Arc::new(EventSenders::new(&EventCpus::Inline, &[]));
        assert!(inline.start(server.as_raw_fd(), Duration::ZERO, Arc::default()).is_none(), "no CPU: inline");
    }

    /// Hands `frame` over, retrying while the queue is full; false once the thread has ended.
    fn hand_off(sender: &FrameSender, frame: Vec<u8>) -> bool {
        let started = Instant::now();
        let mut pending = frame;
        loop {
            match sender.hand_off(pending) {
                Ok(()) => return true,
                Err(HandOffRefused::Full(back)) => pending = back,
                Err(HandOffRefused::Closed) => return false,
            }
            assert!(started.elapsed() < Duration::from_secs(20), "the queue never moved");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn frames_arrive_whole_and_in_order_and_a_reader_that_stops_is_shut_down() {
        let senders = Arc::new(EventSenders::new(&EventCpus::These(vec![0]), &[]));
        let (server, mut client) = connected();
        let metrics = Arc::new(ShardMetrics::default());
        let sender =
            senders.start(server.as_raw_fd(), Duration::from_millis(300), Arc::clone(&metrics)).expect("a thread");
        assert_eq!(senders.live(), 1);
        // Frames of distinct bytes, up to ~1 MB: more than the socket takes at once, so the thread waits
        // for room, and more than the queue holds, so the hand-off is refused and retried.
        let frames: Vec<Vec<u8>> = (0..20u8).map(|index| vec![index; 1000 + usize::from(index) * 50_000]).collect();
        let expected: Vec<u8> = frames.concat();
        let total = expected.len();
        let reader = std::thread::spawn(move || {
            let mut received = vec![0u8; total];
            client.read_exact(&mut received).expect("every frame's bytes");
            (client, received)
        });
        for frame in frames {
            assert!(hand_off(&sender, frame), "the thread ended while its reader reads");
        }
        let (mut client, received) = reader.join().expect("reader");
        assert!(received == expected, "frames arrive whole and in order");
        assert_eq!(metrics.stalled_connections.load(Ordering::Relaxed), 0);

        // The reader stops: the socket fills, and 300 ms later the thread shuts it down and ends.
        let started = Instant::now();
        let mut handed = 0;
        while hand_off(&sender, vec![7u8; 64 << 10]) {
            handed += 1;
            assert!(started.elapsed() < Duration::from_secs(20), "never shut down ({handed} frames handed over)");
        }
        assert_eq!(metrics.stalled_connections.load(Ordering::Relaxed), 1);
        assert_eq!(senders.live(), 0, "the thread ended");
        let mut rest = Vec::new();
        client.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        client.read_to_end(&mut rest).expect("the connection ends after what was sent");
        assert!(rest.iter().all(|&byte| byte == 7), "only the frames handed over were sent");
        drop(server);
    }

    #[test]
    fn a_stopping_node_ends_its_idle_threads() {
        let senders = Arc::new(EventSenders::new(&EventCpus::These(vec![0]), &[]));
        let (server, _client) = connected();
        let sender = senders.start(server.as_raw_fd(), Duration::ZERO, Arc::default()).expect("a thread");
        assert_eq!(senders.live(), 1);
        senders.stop();
        let started = Instant::now();
        let mut closed = false;
        while !closed && started.elapsed() < Duration::from_secs(10) {
            closed = matches!(sender.hand_off(Vec::new()), Err(HandOffRefused::Closed));
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(closed, "the thread ended though its shard never let go of it");
        assert_eq!(senders.live(), 0);
    }
}
