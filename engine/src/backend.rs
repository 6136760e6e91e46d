//! What a shard runs over: its block devices and its clock.
//!
//! The shard is generic over both (as TigerBeetle's replica is over its `Storage` and `Time`), so that one
//! code runs in production — [`Production`]: any of `strata-nvme`'s devices, the wall clock and glommio's
//! timers — and in the seeded simulation (`sim`), over memory namespaces that inject faults and a clock
//! that moves only when the simulation says so. Nothing else in the engine reads the time or touches a
//! device.

use std::future::Future;
use std::time::{Duration, Instant};

use strata_nvme::{AnyDevice, BlockDevice};

/// A monotonic clock and its timers.
pub trait Clock: 'static {
    /// Time since the clock started.
    fn now(&self) -> Duration;

    /// Completes once `duration` has passed on this clock.
    fn sleep(&self, duration: Duration) -> impl Future<Output = ()>;
}

/// The pair of a device type and a clock type a shard runs over.
pub trait Backend: 'static {
    /// Each namespace of the tier, as this shard's executor holds it.
    type Device: BlockDevice + 'static;
    /// The shard's clock.
    type Clock: Clock;
}

/// The node's backend: any device `strata-nvme` opens, and the wall clock.
pub struct Production;

impl Backend for Production {
    type Device = AnyDevice;
    type Clock = WallClock;
}

/// The wall clock, from when the shard started, with glommio's timers.
pub struct WallClock {
    started: Instant,
}

impl WallClock {
    /// A clock that reads zero now.
    pub fn new() -> Self {
        Self { started: Instant::now() }
    }
}

impl Default for WallClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for WallClock {
    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> {
        glommio::timer::sleep(duration)
    }
}
