//! What the target's and the host's NVMe/RDMA queue pairs share (feature `rdma`): the RDMA READ depth they
//! connect with, receives tagged by slot and posted again, and waiting for completions on the executor's
//! reactor.

use strata_transfer::TransferError;
use strata_transfer::verbs::{Completion, CompletionQueue, QueuePair, RegisteredBuffer};

/// RDMA READs in flight each way on a queue pair (what soft-RoCE and most NICs allow).
pub(crate) const READS_IN_FLIGHT: u8 = 16;
/// Completions taken per poll.
pub(crate) const POLL_BATCH: usize = 32;
/// A receive's work request ID has this bit, and its slot below it; other work requests never do.
const RECEIVE: u64 = 1 << 63;

/// Posts the receive of `slot`, the `slot_bytes` of `receives` at `slot * slot_bytes`.
pub(crate) fn post_receive(
    pair: &QueuePair,
    receives: &RegisteredBuffer,
    slot: usize,
    slot_bytes: usize,
) -> Result<(), TransferError> {
    let local = receives.region().local_span((slot * slot_bytes) as u64, slot_bytes as u32)?;
    // SAFETY: the caller keeps the receives' buffer alive as long as the queue pair (declared after it, so
    // dropped after it), and reads a slot only once its receive completed, then posts it again.
    #[allow(unsafe_code)]
    let posted = unsafe { pair.post_receive(RECEIVE | slot as u64, local) };
    posted
}

/// The slot of a receive's completion; `None` for any other work request.
pub(crate) fn received_slot(completion: &Completion) -> Option<usize> {
    (completion.work_request_id & RECEIVE != 0).then_some((completion.work_request_id & !RECEIVE) as usize)
}

/// Moves up to `limit` completions of `queue` into `into`, waiting on the reactor while there are none:
/// poll; when empty, arm and poll again (a completion that landed before the arm raises no event); when
/// still empty, wait for the channel's descriptor and take its one event.
pub(crate) async fn next(
    queue: &CompletionQueue,
    into: &mut Vec<Completion>,
    limit: usize,
) -> Result<usize, TransferError> {
    loop {
        let taken = queue.poll_or_arm(into, limit)?;
        if taken > 0 {
            return Ok(taken);
        }
        crate::readiness::readable(queue.event_fd()).await;
        queue.take_event()?;
    }
}
