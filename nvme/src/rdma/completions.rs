//! Waiting for a queue pair's completions on the executor's reactor (feature `rdma`), for the target's and
//! the host's NVMe/RDMA queues alike.

use strata_transfer::TransferError;
use strata_transfer::verbs::{Completion, CompletionQueue};

/// Moves up to `limit` completions of `queue` into `into`, waiting on the reactor while there are none:
/// poll; when empty, arm and poll again (a completion that landed before the arm raises no event); when
/// still empty, wait for the channel's descriptor and take its one event.
pub(crate) async fn next(
    queue: &CompletionQueue,
    into: &mut Vec<Completion>,
    limit: usize,
) -> Result<usize, TransferError> {
    loop {
        let taken = queue.poll(into, limit)?;
        if taken > 0 {
            return Ok(taken);
        }
        queue.arm()?;
        let taken = queue.poll(into, limit)?;
        if taken > 0 {
            return Ok(taken);
        }
        crate::readiness::readable(queue.event_fd()).await;
        queue.take_event()?;
    }
}
