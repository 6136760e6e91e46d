//! The stall sweeper's view of each connection: a connection holds resources only in the middle of a
//! frame (a put's DRAM reservation, a reply's pinned buffers), so only then can a peer that stops sending
//! or reading hurt the others. The sweeper closes, mid-frame, a connection whose peer moved no byte for the
//! stall timeout or moved slower than the minimum transfer rate (`peer_limits`).

use std::cell::Cell;
use std::future::Future;
use std::os::fd::RawFd;
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

use super::ShardServer;
use crate::metrics::add;
use crate::peer_limits::RateJudge;

/// What the shard's stall sweeper sees of one connection. A connection holds resources only in the middle
/// of a frame (a put's DRAM reservation, a reply's pinned buffers), so only then can a peer that stops
/// sending or reading hurt the others; between frames an idle connection costs nothing and stays open.
pub struct ConnectionWatch {
    fd: RawFd,
    /// A frame is being handled.
    pub(super) in_frame: Cell<bool>,
    /// The handler is blocked on the socket (waiting for the peer's bytes or for room to send), as opposed to
    /// waiting for the node's own work (a device read, another shard, a progressive put's next part).
    on_socket: Cell<bool>,
    /// The number of the frame being handled (a new number tells the sweeper a new frame began).
    pub(super) frame: Cell<u64>,
    /// The frame streams at the node's pace (a subscription): no minimum rate applies to it.
    pub(super) streaming: Cell<bool>,
    /// The kernel's byte counters when the sweeper last saw them move, and when that was.
    seen: Cell<(u64, u64)>,
    still_since: Cell<Option<Instant>>,
    /// The sweeper's judgement of the frame's rate.
    rate: Cell<RateJudge>,
}

impl ConnectionWatch {
    /// A watch on the connection whose socket is `fd`.
    pub(super) fn new(fd: RawFd) -> Self {
        Self {
            fd,
            in_frame: Cell::new(false),
            on_socket: Cell::new(false),
            frame: Cell::new(0),
            streaming: Cell::new(false),
            seen: Cell::new((0, 0)),
            still_since: Cell::new(None),
            rate: Cell::new(RateJudge::default()),
        }
    }

    /// The kernel's counts of bytes received from and acknowledged by the peer (TCP_INFO): progress at the
    /// wire, whatever the handler's calls look like. `None` if the socket cannot say (then it is never judged).
    fn wire_progress(&self) -> Option<(u64, u64)> {
        // SAFETY: `info` is a plain struct the kernel fills up to `len` bytes; `fd` is this connection's open
        // socket (the watch is dropped before the socket is closed, and the sweeper runs on the same thread).
        #[allow(unsafe_code)]
        unsafe {
            let mut info: libc::tcp_info = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
            let result =
                libc::getsockopt(self.fd, libc::IPPROTO_TCP, libc::TCP_INFO, (&raw mut info).cast(), &raw mut len);
            (result == 0).then_some((info.tcpi_bytes_received, info.tcpi_bytes_acked))
        }
    }
}

/// Awaits a socket operation, marked for the sweeper as waiting on the peer.
pub(super) async fn on_socket<T>(watch: &ConnectionWatch, operation: impl Future<Output = T>) -> T {
    watch.on_socket.set(true);
    let result = operation.await;
    watch.on_socket.set(false);
    result
}

/// Shuts every open connection of the shard down (the node is stopping): their peers see the end of the
/// stream at once, instead of a socket held open by a task that the stopped executor never runs again.
pub fn close_connections(server: &ShardServer) {
    for watch in server.watches.borrow().iter().filter_map(Weak::upgrade) {
        crate::sys::shutdown_socket(watch.fd);
    }
}

/// Closes the connections blocked on their peer mid-frame that either sat for `stall_timeout` with no byte
/// moving either way, or moved slower than the minimum transfer rate after the frame's grace
/// (`peer_limits`): shutting the socket down fails the handler's pending read or write, so the connection
/// ends through its usual path and frees what it held. One task per shard, one system call per connection
/// that is mid-frame per sweep; runs until the node stops.
pub async fn sweep_stalled_connections(server: Weak<ShardServer>) {
    let Some(period) = server.upgrade().and_then(|server| sweep_period(&server.shard.config)) else { return };
    loop {
        glommio::timer::sleep(period).await;
        let Some(server) = server.upgrade() else { return };
        let shard = &server.shard;
        let now = Instant::now();
        server.watches.borrow_mut().retain(|watch| {
            let Some(watch) = watch.upgrade() else { return false };
            if let Some(verdict) = judge(&watch, &shard.config, now, period) {
                // Counted before the peer can see the connection end (a test reads the counter as soon as
                // its read returns; this thread may be preempted in between).
                add(
                    if verdict == Verdict::Stalled {
                        &shard.metrics.stalled_connections
                    } else {
                        &shard.metrics.slow_connections
                    },
                    1,
                );
                // Shut down, not closed: the connection's owner closes it.
                crate::sys::shutdown_socket(watch.fd);
                watch.still_since.set(None);
            }
            true
        });
    }
}

/// How often the sweeper looks, or `None` when neither a stall timeout nor a minimum rate is set.
fn sweep_period(config: &crate::EngineConfig) -> Option<Duration> {
    let stall = (!config.stall_timeout.is_zero()).then_some(config.stall_timeout);
    let rate = (config.peers.min_transfer_rate > 0).then_some(config.peers.frame_grace);
    let shortest = [stall, rate].into_iter().flatten().min()?;
    Some((shortest / 4).clamp(Duration::from_millis(10), Duration::from_secs(1)))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Stalled,
    TooSlow,
}

/// One sweep's look at one connection: whether to close it, and why.
fn judge(watch: &ConnectionWatch, config: &crate::EngineConfig, now: Instant, period: Duration) -> Option<Verdict> {
    if !(watch.in_frame.get() && watch.on_socket.get()) {
        watch.still_since.set(None);
        return None;
    }
    let progress = watch.wire_progress()?;
    let mut rate = watch.rate.get();
    let too_slow =
        !watch.streaming.get() && rate.too_slow(watch.frame.get(), progress.0 + progress.1, period, &config.peers);
    watch.rate.set(rate);
    let stalled = match watch.still_since.get() {
        Some(since) if progress == watch.seen.get() => {
            !config.stall_timeout.is_zero() && now.duration_since(since) >= config.stall_timeout
        }
        _ => {
            watch.seen.set(progress);
            watch.still_since.set(Some(now));
            false
        }
    };
    // A peer that moves nothing at all is stalled, whatever its rate says.
    if stalled {
        Some(Verdict::Stalled)
    } else if too_slow {
        Some(Verdict::TooSlow)
    } else {
        None
    }
}

/// Keeps `watch` among the connections the sweeper looks at.
pub(super) fn enlist(server: &ShardServer, watch: &Rc<ConnectionWatch>) {
    // The sweeper prunes the list as it goes; without one (no stall timeout) it is pruned here whenever its
    // length reaches a power of two (a `Weak` keeps its allocation alive), at amortised O(1).
    let mut watches = server.watches.borrow_mut();
    if watches.len() >= 64 && watches.len().is_power_of_two() {
        watches.retain(|watch| watch.strong_count() > 0);
    }
    watches.push(Rc::downgrade(watch));
}
