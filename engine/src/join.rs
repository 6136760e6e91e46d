//! Running a few futures of one task together, each output kept in the order given: what a shard's batch
//! of device reads, or a frame's items that wait, need without spawning a task each.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

/// A future of one task, boxed so that futures of different types run together.
pub(crate) type LocalFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Runs `futures` together; their outputs in the order given.
pub(crate) async fn join_in_order<'a, T>(futures: Vec<LocalFuture<'a, T>>) -> Vec<T> {
    let mut in_order = InOrder::new(futures);
    let mut outputs = Vec::with_capacity(in_order.outputs.len());
    while let Some(output) = in_order.next().await {
        outputs.push(output);
    }
    outputs
}

/// Futures that run together whenever one of them is awaited, their outputs taken in the order given,
/// each as soon as it and those before it are done: a streamed reply sends an item while later ones are
/// still being read.
pub(crate) struct InOrder<'a, T> {
    futures: Vec<LocalFuture<'a, T>>,
    outputs: Vec<Option<T>>,
    /// The next output to take.
    next: usize,
}

impl<'a, T> InOrder<'a, T> {
    pub(crate) fn new(futures: Vec<LocalFuture<'a, T>>) -> Self {
        let outputs = futures.iter().map(|_| None).collect();
        Self { futures, outputs, next: 0 }
    }

    /// The next output in order, once it is done (every future not done is polled while it is waited
    /// for); `None` when all were taken.
    pub(crate) async fn next(&mut self) -> Option<T> {
        if self.next_is_pending() {
            std::future::poll_fn(|context| {
                self.poll_all(context);
                if self.next_is_pending() { Poll::Pending } else { Poll::Ready(()) }
            })
            .await;
        }
        self.take_next()
    }

    /// The next output if it is done, without waiting: when it is not, every future not done is polled
    /// once first (which starts those not started). Outputs already done are taken without polling, so
    /// taking a run of them costs one pass over the futures, not one per output.
    pub(crate) async fn next_if_done(&mut self) -> Option<T> {
        if self.next_is_pending() {
            std::future::poll_fn(|context| {
                self.poll_all(context);
                Poll::Ready(())
            })
            .await;
        }
        self.take_next()
    }

    /// Whether an output is left to take and not done yet.
    fn next_is_pending(&self) -> bool {
        self.outputs.get(self.next).is_some_and(Option::is_none)
    }

    fn poll_all(&mut self, context: &mut std::task::Context<'_>) {
        for (future, output) in self.futures.iter_mut().zip(self.outputs.iter_mut()).skip(self.next) {
            if output.is_none()
                && let Poll::Ready(value) = future.as_mut().poll(context)
            {
                *output = Some(value);
            }
        }
    }

    fn take_next(&mut self) -> Option<T> {
        let output = self.outputs.get_mut(self.next)?.take()?;
        self.next += 1;
        Some(output)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    /// A future ready after `polls` polls, which wakes itself each time it is not.
    fn ready_after<'a>(polls: usize, value: u32, seen: Rc<Cell<usize>>) -> LocalFuture<'a, u32> {
        let mut left = polls;
        Box::pin(std::future::poll_fn(move |context| {
            seen.set(seen.get() + 1);
            if left == 0 {
                return Poll::Ready(value);
            }
            left -= 1;
            context.waker().wake_by_ref();
            Poll::Pending
        }))
    }

    #[test]
    fn outputs_come_in_the_order_given_and_each_as_soon_as_those_before_it_are_done() {
        let executor = glommio::LocalExecutorBuilder::default().make().expect("an executor");
        executor.run(async {
            let polls = Rc::new(Cell::new(0));
            // The first is slow, the second is done at once.
            let mut in_order =
                InOrder::new(vec![ready_after(3, 10, Rc::clone(&polls)), ready_after(0, 20, Rc::clone(&polls))]);
            assert_eq!(in_order.next_if_done().await, None, "the first is not done");
            assert_eq!(polls.get(), 2, "both were started by one poll");
            assert_eq!(in_order.next().await, Some(10));
            let before = polls.get();
            assert_eq!(in_order.next_if_done().await, Some(20), "done earlier, taken now");
            assert_eq!(polls.get(), before, "a done future is not polled again");
            assert_eq!(in_order.next().await, None);
            assert_eq!(
                join_in_order(vec![ready_after(2, 1, Rc::clone(&polls)), ready_after(0, 2, polls)]).await,
                [1, 2]
            );
        });
    }
}
