//! Waiting for a connection's RDMA completions on the shard's reactor.
//!
//! The completion channel's descriptor is awaited on the reactor (`strata_nvme::readiness`: a `dup`, one
//! poll on the reactor's ring and a `close`), only when the queue was empty after it was armed; a busy
//! connection finds completions by polling and never waits. A busy-polled node polls the queue between
//! yields instead (`idle_poll`), as it does its sockets.

use std::sync::atomic::AtomicU64;
use std::time::Instant;

use strata_transfer::TransferError;
use strata_transfer::verbs::{Completion, CompletionQueue};

/// Moves up to `limit` completions into `into`, waiting for the first until `deadline` (busy-polled, or on
/// the reactor, each wait counted in `waits`); `Ok(0)` when it passed.
pub(super) async fn next(
    queue: &CompletionQueue,
    into: &mut Vec<Completion>,
    limit: usize,
    (polled, waits): (bool, &AtomicU64),
    deadline: Instant,
) -> Result<usize, TransferError> {
    let mut misses = 0u32;
    loop {
        let taken = queue.poll(into, limit)?;
        if taken > 0 {
            return Ok(taken);
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(0);
        }
        if polled {
            misses += 1;
            strata_nvme::tcp::stream::idle_poll(misses).await;
            continue;
        }
        queue.arm()?;
        let taken = queue.poll(into, limit)?;
        if taken > 0 {
            return Ok(taken);
        }
        crate::metrics::add(waits, 1);
        futures_lite::future::or(
            strata_nvme::readiness::readable(queue.event_fd()),
            glommio::timer::sleep(deadline - now),
        )
        .await;
        queue.take_events()?;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use strata_transfer::verbs::{
        Access, CompletionQueue, Device, ProtectionDomain, QueuePair, QueuePairOptions, RegisteredBuffer,
    };

    use super::next;

    /// A completion that comes late (a write to a peer that is gone fails only once its retries ran out)
    /// wakes a task waiting on the reactor: one wait, well before the deadline.
    #[test]
    #[ignore = "needs an RDMA device: tests/lab/rdma-tests runs it in a soft-RoCE guest"]
    fn a_late_completion_wakes_the_reactor() {
        let name = std::env::var("STRATA_RDMA_DEVICE").expect("STRATA_RDMA_DEVICE names the device");
        let device = Device::open(&name).expect("device");
        let executor = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).spawn(move || async move {
            let domain = ProtectionDomain::new(&device).expect("domain");
            let completions = CompletionQueue::new(&device, 8).expect("queue");
            // 4.096 µs × 2^14 ≈ 67 ms per try, 2 tries: the failure arrives about 0.2 s after the post.
            let options = QueuePairOptions { ack_timeout_exponent: 14, retry_count: 1, ..QueuePairOptions::default() };
            let pair = QueuePair::new(&domain, &completions, options).expect("queue pair");
            let peer_completions = CompletionQueue::new(&device, 8).expect("queue");
            let peer_options = QueuePairOptions { remote_access: true, ..options };
            let peer = QueuePair::new(&domain, &peer_completions, peer_options).expect("queue pair");
            pair.connect(&peer.endpoint()).expect("connect");
            peer.connect(&pair.endpoint()).expect("connect");
            let source = RegisteredBuffer::new(&domain, 4096, Access::Local).expect("buffer");
            let target = RegisteredBuffer::new(&domain, 4096, Access::RemoteReadWrite).expect("buffer");
            let remote = target.region().remote_span(0, 4096).expect("span");
            drop(peer);
            let local = source.region().local_span(0, 4096).expect("span");
            // SAFETY: the source buffer outlives the request's completion, awaited below.
            #[allow(unsafe_code)]
            unsafe { pair.post_write(1, local, remote) }.expect("post");
            let (waits, started, mut done) = (AtomicU64::new(0), Instant::now(), Vec::new());
            let deadline = started + Duration::from_secs(20);
            let got = next(&completions, &mut done, 1, (false, &waits), deadline).await.expect("completions");
            assert_eq!(got, 1, "the completion came before the deadline");
            assert!(done[0].result.is_err(), "the write to a peer that is gone failed: {:?}", done[0]);
            assert!(started.elapsed() < Duration::from_secs(10), "woken when it came: {:?}", started.elapsed());
            let waits = waits.load(Ordering::Relaxed);
            assert!((1..=3).contains(&waits), "waited on the reactor, without spinning: {waits} waits");
        });
        executor.expect("executor").join().expect("the test ran");
    }
}
