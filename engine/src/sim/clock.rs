//! The simulation's clock: it moves only when the simulation advances it, and wakes the timers that fall
//! due. One clock serves every life of a simulated node, so time never goes back across a restart.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::backend::Clock;

/// A clock the simulation drives; clones share it.
#[derive(Clone, Default)]
pub struct SimClock {
    time: Rc<SimTime>,
}

#[derive(Default)]
struct SimTime {
    now: Cell<Duration>,
    timers: RefCell<Vec<(Duration, Waker)>>,
}

impl SimClock {
    /// A clock at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves time forward by `by` and wakes the timers now due.
    pub fn advance(&self, by: Duration) {
        let now = self.time.now.get() + by;
        self.time.now.set(now);
        let due: Vec<Waker> = {
            let mut timers = self.time.timers.borrow_mut();
            let (due, pending): (Vec<_>, Vec<_>) = timers.drain(..).partition(|(deadline, _)| *deadline <= now);
            *timers = pending;
            due.into_iter().map(|(_, waker)| waker).collect()
        };
        for waker in due {
            waker.wake();
        }
    }

    /// Drops every timer without waking it: the executor whose tasks set them is gone (a crash).
    pub fn forget_timers(&self) {
        self.time.timers.borrow_mut().clear();
    }

    /// Timers waiting.
    pub fn timers(&self) -> usize {
        self.time.timers.borrow().len()
    }
}

impl Clock for SimClock {
    fn now(&self) -> Duration {
        self.time.now.get()
    }

    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> {
        Sleep { time: Rc::clone(&self.time), deadline: self.time.now.get() + duration }
    }
}

/// A timer of the simulated clock.
struct Sleep {
    time: Rc<SimTime>,
    deadline: Duration,
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        if self.time.now.get() >= self.deadline {
            return Poll::Ready(());
        }
        self.time.timers.borrow_mut().push((self.deadline, context.waker().clone()));
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sleep_ends_when_the_clock_passes_its_deadline_and_not_before() {
        let clock = SimClock::new();
        let mut sleep = std::pin::pin!(clock.sleep(Duration::from_millis(10)));
        let waker = Waker::noop();
        let mut context = Context::from_waker(waker);
        assert!(sleep.as_mut().poll(&mut context).is_pending());
        clock.advance(Duration::from_millis(9));
        assert!(sleep.as_mut().poll(&mut context).is_pending());
        assert_eq!(clock.now(), Duration::from_millis(9));
        clock.advance(Duration::from_millis(1));
        assert!(sleep.as_mut().poll(&mut context).is_ready());
        assert_eq!(clock.timers(), 0, "a due timer is taken off when woken");
    }
}
