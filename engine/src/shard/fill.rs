//! Progressive puts readable while their parts arrive, and reads that wait for a key still being put.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use super::reads::{DramPin, ReadData, ReadHit};
use super::{FILL_WAIT, Shard};
use crate::backend::{Backend, Clock};
use crate::error::EngineError;
use crate::metrics::add;
use crate::segment::SegmentRange;

/// What is on its way: progressive puts receiving their parts, readable as far as they arrived, and readers
/// waiting for keys not stored yet (reads with `ITEM_WAIT`), both by key.
#[derive(Default)]
pub struct Arrivals {
    pub(super) filling: RefCell<HashMap<Vec<u8>, Rc<Fill>>>,
    awaited: RefCell<HashMap<Vec<u8>, Rc<Arrival>>>,
}

impl Arrivals {
    /// Wakes the readers waiting for `key` (a put of it committed, or a progressive put of it started).
    pub(super) fn key_arrived(&self, key: &[u8]) {
        if self.awaited.borrow().is_empty() {
            return;
        }
        let Some(arrival) = self.awaited.borrow_mut().remove(key) else { return };
        arrival.arrived.set(true);
        for waker in arrival.wakers.take() {
            waker.wake();
        }
    }
}

/// A progressive put's object while its parts arrive: its DRAM reservation, how much of its value is in
/// (and checked against its part's crc), and the readers waiting for more.
pub struct Fill {
    pub(super) slot: u32,
    /// The value's bytes in the reservation.
    pub(super) value: SegmentRange,
    pub(super) value_len: u32,
    pub(super) filled: Cell<u32>,
    pub(super) open: Cell<bool>,
    pub(super) wakers: RefCell<Vec<std::task::Waker>>,
}

impl Fill {
    pub(super) fn wake(&self) {
        for waker in self.wakers.borrow_mut().drain(..) {
            waker.wake();
        }
    }

    /// Resolves once `need` bytes are in or the put ended.
    pub(super) fn reached(&self, need: u32) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |context| {
            if self.filled.get() >= need || !self.open.get() {
                std::task::Poll::Ready(())
            } else {
                self.wakers.borrow_mut().push(context.waker().clone());
                std::task::Poll::Pending
            }
        })
    }
}

/// Readers waiting for one key to arrive.
#[derive(Default)]
pub(super) struct Arrival {
    pub(super) arrived: Cell<bool>,
    pub(super) wakers: RefCell<Vec<std::task::Waker>>,
}

/// The receiving end of a progressive put: says how far the value arrived, and takes the object out of the
/// filling table when dropped (the put committed, failed, or its connection went away).
pub struct FillGuard {
    pub(super) arrivals: Rc<Arrivals>,
    pub(super) key: Vec<u8>,
    pub(super) fill: Rc<Fill>,
}

impl FillGuard {
    /// The value's first `filled` bytes are in and checked.
    pub fn advance(&self, filled: u32) {
        self.fill.filled.set(filled.min(self.fill.value_len));
        self.fill.wake();
    }
}

impl Drop for FillGuard {
    fn drop(&mut self) {
        let mut filling = self.arrivals.filling.borrow_mut();
        if filling.get(&self.key).is_some_and(|fill| Rc::ptr_eq(fill, &self.fill)) {
            filling.remove(&self.key);
        }
        self.fill.open.set(false);
        self.fill.wake();
    }
}

impl<E: Backend> Shard<E> {
    /// Waits up to `wait` for `key` to arrive; whether it did.
    pub(super) async fn wait_for_arrival(&self, key: &[u8], wait: Duration) -> bool {
        let awaited = &self.arrivals.awaited;
        let arrival = Rc::clone(awaited.borrow_mut().entry(key.to_vec()).or_default());
        let arrived = futures_lite::future::or(
            std::future::poll_fn(|context| {
                if arrival.arrived.get() {
                    std::task::Poll::Ready(true)
                } else {
                    arrival.wakers.borrow_mut().push(context.waker().clone());
                    std::task::Poll::Pending
                }
            }),
            async {
                self.clock.sleep(wait).await;
                false
            },
        )
        .await;
        if !arrived {
            // The last reader to give up takes the entry out, so waits that end leave nothing behind.
            let mut awaited = awaited.borrow_mut();
            if awaited.get(key).is_some_and(|entry| Rc::ptr_eq(entry, &arrival) && Rc::strong_count(&arrival) == 2) {
                awaited.remove(key);
            }
        }
        arrived
    }

    /// Reads `range` of a progressive put's object once those bytes are in (a whole-value read waits for the
    /// put to end); `None` if the put ended first (the caller looks the key up again).
    pub(super) async fn read_fill(
        self: &Rc<Self>,
        fill: &Rc<Fill>,
        range: Option<(u32, u32)>,
    ) -> Result<Option<ReadHit>, EngineError> {
        let (offset, len) = range.unwrap_or((0, fill.value_len));
        if u64::from(offset) + u64::from(len) > u64::from(fill.value_len) {
            return Err(EngineError::Invalid("a range past the value"));
        }
        // A whole value is served from the index once committed (with its crc); a range as soon as it is in.
        let need = if range.is_none() { u32::MAX } else { offset + len };
        let arrived = futures_lite::future::or(
            async {
                fill.reached(need).await;
                true
            },
            async {
                self.clock.sleep(FILL_WAIT).await;
                false
            },
        )
        .await;
        if !arrived {
            return Err(EngineError::NotFound);
        }
        if !fill.open.get() || fill.filled.get() < need {
            return Ok(None);
        }
        let pin = DramPin::new(&self.dram, fill.slot, fill.value.sub(offset as usize, len as usize));
        let data_crc = strata_proto::crc32c(pin.bytes());
        add(&self.metrics.dram_hits, 1);
        add(&self.metrics.bytes_out, u64::from(len));
        // A put still arriving is not stored yet, so it has no version a reader could copy.
        Ok(Some(ReadHit { data: ReadData::Dram(pin), data_crc, object_len: fill.value_len, version: None }))
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;
    use std::time::Duration;

    use strata_proto::{Pin, Status, WritePolicy};

    use crate::sim::testing::{TestTier, put, value};

    #[test]
    fn a_read_that_waits_for_a_key_gets_it_when_it_is_put_or_gives_up_when_the_clock_says() {
        let tier = TestTier::new(|_| {});
        tier.life(async |shard, _| {
            let waiting = Rc::clone(&shard);
            let arrives = glommio::spawn_local(async move {
                waiting
                    .get(b"later", None, Duration::from_secs(5))
                    .await
                    .map(|hit| hit.slices().concat())
                    .map_err(|error| error.status())
            });
            futures_lite::future::yield_now().await;
            put(&shard, b"later", &value(1, 100), WritePolicy::WriteThrough, Pin::None).await.expect("put");
            assert_eq!(arrives.await, Ok(value(1, 100)));

            let waiting = Rc::clone(&shard);
            let answer = Rc::new(std::cell::Cell::new(None));
            let answered = Rc::clone(&answer);
            glommio::spawn_local(async move {
                answered
                    .set(waiting.get(b"never", None, Duration::from_secs(5)).await.err().map(|error| error.status()));
            })
            .detach();
            futures_lite::future::yield_now().await;
            tier.world.clock.advance(Duration::from_secs(4));
            futures_lite::future::yield_now().await;
            assert_eq!(answer.get(), None, "still waiting after 4 s");
            tier.world.clock.advance(Duration::from_secs(1));
            futures_lite::future::yield_now().await;
            assert_eq!(answer.get(), Some(Status::NotFound));
        });
    }
}
