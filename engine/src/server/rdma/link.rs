//! One connection's RDMA: its queue pair and completion queue, the spans its client registered, and a
//! staging buffer for values that do not lie in the registered DRAM segment.
//!
//! Work requests are posted up to the queue's depth and then drained; each carries the index of its item,
//! so a failed completion fails that item. Once any request fails, the queue pair is in the error state
//! (the device flushes the rest) and the link stays failed: its later items answer `Transfer` at once.
//!
//! A transfer's future is only ever dropped with its connection, and the link (so the queue pair) drops in
//! the same synchronous drop: the device stops before any task could reuse a DRAM slot it was reading or
//! writing.

use std::rc::Rc;
use std::time::{Duration, Instant};

use strata_proto::{SharedSpan, Status};
use strata_transfer::RemoteSpan;
use strata_transfer::verbs::{Access, Completion, CompletionQueue, LocalSpan, QueuePair, RegisteredBuffer};

use super::shard::ShardRdma;
use super::{Transfer, completions};
use crate::metrics::add;

/// Spans one connection may register at most: each is a remote key and a bound the node keeps.
const MAX_REMOTE_REGIONS: usize = 64;
/// Work requests in flight per connection at most.
pub(super) const QUEUE_DEPTH: u32 = 128;
/// Bytes of a connection's staging buffer (allocated at its first value outside the DRAM segment); a
/// larger value goes through it in pieces.
const STAGING_BYTES: usize = 4 << 20;
/// How long a drain waits for its completions before failing the queue pair (which flushes them). The
/// queue pair's own retries end a request to a dead peer well before (about half a second).
const COMPLETION_DEADLINE: Duration = Duration::from_secs(30);

#[derive(Clone, Copy)]
enum Direction {
    /// Node memory to the client's (a get).
    Write,
    /// The client's memory to the node's (a put).
    Read,
}

/// A connection's queue pair and what its client registered.
pub(crate) struct RdmaLink {
    shard: Rc<ShardRdma>,
    pair: QueuePair,
    completions: CompletionQueue,
    regions: Vec<(u32, RemoteSpan)>,
    next_region: u32,
    staging: Option<RegisteredBuffer>,
    /// Bytes of the staging buffer in use by requests in flight.
    staged: usize,
    in_flight: u32,
    failed: bool,
    polled: Vec<Completion>,
}

impl RdmaLink {
    pub(super) fn new(shard: Rc<ShardRdma>, pair: QueuePair, completions: CompletionQueue) -> RdmaLink {
        RdmaLink {
            shard,
            pair,
            completions,
            regions: Vec::new(),
            next_region: 0,
            staging: None,
            staged: 0,
            in_flight: 0,
            failed: false,
            polled: Vec::new(),
        }
    }

    /// Records a span the client registered (`span`: its 16 bytes); returns its region's id.
    pub(crate) fn register(&mut self, span: &[u8]) -> Result<u32, Status> {
        let span = RemoteSpan::decode(span).map_err(|_| Status::Invalid)?;
        if span.length == 0 {
            return Err(Status::Invalid);
        }
        if self.regions.len() >= MAX_REMOTE_REGIONS {
            return Err(Status::Quota);
        }
        self.next_region += 1;
        self.regions.push((self.next_region, span));
        Ok(self.next_region)
    }

    /// Forgets region `region`; false if there is none.
    pub(crate) fn release(&mut self, region: u32) -> bool {
        let before = self.regions.len();
        self.regions.retain(|(id, _)| *id != region);
        self.regions.len() != before
    }

    /// The client's memory `span` names, if it lies within one of the connection's regions.
    fn resolve(&self, span: &SharedSpan) -> Option<RemoteSpan> {
        let (_, region) = self.regions.iter().find(|(id, _)| *id == span.region)?;
        (span.end()? <= u64::from(region.length)).then(|| RemoteSpan {
            address: region.address + span.offset,
            length: span.len,
            remote_key: region.remote_key,
        })
    }

    /// Writes each transfer's value at the start of its span (which the caller checked it fits); the
    /// outcome of each: `Invalid` for a span that is not the connection's, `Transfer` for a failed write.
    pub(crate) async fn write(&mut self, transfers: &[Transfer<'_>]) -> Vec<Result<(), Status>> {
        let mut outcome = vec![Ok(()); transfers.len()];
        for (index, transfer) in transfers.iter().enumerate() {
            let Some(remote) = self.resolve(&transfer.span) else {
                outcome[index] = Err(Status::Invalid);
                continue;
            };
            let mut at = 0u64;
            for piece in &transfer.pieces {
                self.write_piece(index, piece, offset_by(remote, at), &mut outcome).await;
                at += piece.len() as u64;
            }
        }
        self.drain(&mut outcome).await;
        outcome
    }

    async fn write_piece(
        &mut self,
        index: usize,
        piece: &[u8],
        remote: RemoteSpan,
        outcome: &mut [Result<(), Status>],
    ) {
        if piece.is_empty() {
            return;
        }
        if let Some(local) = self.shard.segment_span(piece) {
            self.post(Direction::Write, index, local, remote, outcome).await;
            return;
        }
        let mut at = 0u64;
        for chunk in piece.chunks(STAGING_BYTES) {
            if self.staged + chunk.len() > STAGING_BYTES {
                self.drain(outcome).await;
            }
            let Some(local) = self.stage(chunk) else {
                outcome[index] = Err(Status::NoSpace);
                return;
            };
            self.post(Direction::Write, index, local, offset_by(remote, at), outcome).await;
            at += chunk.len() as u64;
        }
    }

    /// Copies `chunk` into the staging buffer after what is in flight; its span there.
    fn stage(&mut self, chunk: &[u8]) -> Option<LocalSpan> {
        let at = self.staged;
        let staging = self.staging_buffer()?;
        staging.as_mut_slice()[at..at + chunk.len()].copy_from_slice(chunk);
        let local = staging.region().local_span(at as u64, chunk.len() as u32).ok()?;
        self.staged += chunk.len();
        Some(local)
    }

    fn staging_buffer(&mut self) -> Option<&mut RegisteredBuffer> {
        if self.staging.is_none() {
            match RegisteredBuffer::new(self.shard.domain(), STAGING_BYTES, Access::Local) {
                Ok(buffer) => self.staging = Some(buffer),
                Err(error) => tracing::warn!("an RDMA staging buffer: {error}"),
            }
        }
        self.staging.as_mut()
    }

    /// Reads the client's `span` into `destination` (as long as the span's length).
    pub(crate) async fn read(&mut self, span: &SharedSpan, destination: &mut [u8]) -> Result<(), Status> {
        let remote = self.resolve(span).filter(|_| destination.len() == span.len as usize).ok_or(Status::Invalid)?;
        let mut outcome = [Ok(())];
        if let Some(local) = self.shard.segment_span(destination) {
            self.post(Direction::Read, 0, local, remote, &mut outcome).await;
            self.drain(&mut outcome).await;
            return outcome[0];
        }
        let mut at = 0u64;
        for chunk in destination.chunks_mut(STAGING_BYTES) {
            self.staged = 0;
            let local = self
                .staging_buffer()
                .and_then(|staging| staging.region().local_span(0, chunk.len() as u32).ok())
                .ok_or(Status::NoSpace)?;
            self.post(Direction::Read, 0, local, offset_by(remote, at), &mut outcome).await;
            self.drain(&mut outcome).await;
            outcome[0]?;
            if let Some(staging) = &self.staging {
                chunk.copy_from_slice(&staging.as_slice()[..chunk.len()]);
            }
            at += chunk.len() as u64;
        }
        outcome[0]
    }

    /// Posts one request for item `index`, draining first when the queue is full.
    async fn post(
        &mut self,
        direction: Direction,
        index: usize,
        local: LocalSpan,
        remote: RemoteSpan,
        outcome: &mut [Result<(), Status>],
    ) {
        if self.failed {
            outcome[index] = Err(Status::Transfer);
            return;
        }
        if self.in_flight >= QUEUE_DEPTH {
            self.drain(outcome).await;
        }
        // SAFETY: `local` is the DRAM segment under the caller's pin or reservation, or the staging buffer,
        // and neither is touched or released before `drain` has polled this request's completion (see the
        // module's doc for a dropped future).
        #[allow(unsafe_code)]
        let posted = unsafe {
            match direction {
                Direction::Write => self.pair.post_write(index as u64, local, remote),
                Direction::Read => self.pair.post_read(index as u64, local, remote),
            }
        };
        match posted {
            Ok(()) => {
                self.in_flight += 1;
                add(&self.shard.metrics.rdma_work_requests, 1);
            }
            Err(error) => {
                tracing::warn!("posting an RDMA request: {error}");
                outcome[index] = Err(Status::Transfer);
                self.fail();
            }
        }
    }

    /// Waits for every request in flight; a failed one fails its item and the link.
    async fn drain(&mut self, outcome: &mut [Result<(), Status>]) {
        let mut deadline = Instant::now() + COMPLETION_DEADLINE;
        let mut flushed_by_us = false;
        while self.in_flight > 0 {
            self.polled.clear();
            let limit = self.in_flight as usize;
            let waiting = (self.shard.busy_poll, &self.shard.metrics.rdma_waits);
            match completions::next(&self.completions, &mut self.polled, limit, waiting, deadline).await {
                Ok(0) if !flushed_by_us => {
                    // Nothing within the deadline: fail the queue pair, which flushes what is queued.
                    flushed_by_us = true;
                    self.fail();
                    deadline = Instant::now() + COMPLETION_DEADLINE;
                }
                Ok(0) | Err(_) => {
                    // The device flushes nothing either: the queue pair is failed (it touches no memory),
                    // and the requests are given up.
                    self.fail();
                    outcome.iter_mut().for_each(|item| *item = Err(Status::Transfer));
                    self.in_flight = 0;
                }
                Ok(_) => {
                    for completion in self.polled.drain(..) {
                        self.in_flight -= 1;
                        if let Err(error) = completion.result {
                            add(&self.shard.metrics.rdma_failures, 1);
                            if !self.failed {
                                tracing::warn!("an RDMA transfer failed: {error}");
                            }
                            if let Some(item) = outcome.get_mut(completion.work_request_id as usize) {
                                *item = Err(Status::Transfer);
                            }
                            self.failed = true;
                        }
                    }
                }
            }
        }
        self.staged = 0;
    }

    fn fail(&mut self) {
        self.failed = true;
        let _ = self.pair.fail();
    }
}

/// `remote` from `at` bytes on.
fn offset_by(remote: RemoteSpan, at: u64) -> RemoteSpan {
    RemoteSpan {
        address: remote.address + at,
        length: remote.length.saturating_sub(at as u32),
        remote_key: remote.remote_key,
    }
}
