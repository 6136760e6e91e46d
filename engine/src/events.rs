//! A shard's event log: the encoded events of the last `capacity` bytes, numbered, read by subscribers at
//! their own pace.
//!
//! Producers (the shard's put, eviction, promotion and removal paths) append the wire encoding directly,
//! so a subscriber's frame is a copy of a slice of the log. Nothing is recorded while nobody subscribes:
//! an unobserved node pays one branch per event site. The log is bounded: a subscriber that falls more
//! than `capacity` bytes behind finds its next event gone and gets a `LAGGED` event with the count it
//! missed, then continues from the oldest event kept — bounded memory for the node, an explicit "resync"
//! for the router, never a silent gap. Once every subscriber has sent everything, the log starts over at
//! the front of its buffer: with subscribers that keep up, appends stay within a few cache-hot kilobytes
//! instead of streaming through the whole bound (which slowed every put's index lookups by evicting the
//! index from the cache).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use strata_proto::{Event, EventRef, RemovalReason, Tier};

/// The events of one shard.
pub struct EventLog {
    bytes: Vec<u8>,
    /// Offset in `bytes` of each kept event, oldest first.
    starts: VecDeque<usize>,
    /// Sequence number of `starts[0]`.
    first_sequence: u64,
    next_sequence: u64,
    capacity: usize,
    subscribers: usize,
    /// Each subscriber's id and the cursor it has sent up to.
    cursors: Vec<(u64, u64)>,
    next_subscriber: u64,
    wakers: Vec<Waker>,
}

impl EventLog {
    /// An empty log that keeps about `capacity` bytes of events.
    pub fn new(capacity: usize) -> Self {
        Self {
            bytes: Vec::new(),
            starts: VecDeque::new(),
            first_sequence: 0,
            next_sequence: 0,
            capacity,
            subscribers: 0,
            cursors: Vec::new(),
            next_subscriber: 0,
            wakers: Vec::new(),
        }
    }

    /// Drops every kept event if every subscriber has sent them all (a cheap check: a few subscribers).
    fn trim(&mut self) {
        if self.cursors.iter().all(|&(_, cursor)| cursor >= self.next_sequence) {
            self.bytes.clear();
            self.starts.clear();
            self.first_sequence = self.next_sequence;
        }
    }

    /// Bytes of events kept.
    pub fn kept_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Whether anyone listens (event sites skip their work when not).
    pub fn observed(&self) -> bool {
        self.subscribers > 0
    }

    /// The sequence number the next event will get (where a new subscriber starts).
    pub fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    fn append(&mut self, event: EventRef<'_>) {
        if self.bytes.len() >= self.capacity {
            self.compact();
        }
        self.starts.push_back(self.bytes.len());
        event.encode_into(self.next_sequence, &mut self.bytes);
        self.next_sequence += 1;
        // Usually empty: a subscriber waits only when it has sent everything, so the first event after
        // that wakes it and the rest of a gather interval's events find no one to wake.
        if !self.wakers.is_empty() {
            for waker in self.wakers.drain(..) {
                waker.wake();
            }
        }
    }

    /// Drops the older half of the kept events (amortised: each byte is moved at most once per halving).
    fn compact(&mut self) {
        let drop_events = self.starts.len().div_ceil(2);
        let Some(&cut) = self.starts.get(drop_events) else {
            self.bytes.clear();
            self.first_sequence += self.starts.len() as u64;
            self.starts.clear();
            return;
        };
        self.bytes.drain(..cut);
        self.starts.drain(..drop_events);
        for start in &mut self.starts {
            *start -= cut;
        }
        self.first_sequence += drop_events as u64;
    }

    /// A block was stored in `tier`.
    pub fn stored(&mut self, key: &[u8], parent: Option<&[u8]>, size: u32, tier: Tier) {
        if self.observed() {
            self.append(EventRef::BlockStored { key, parent, size, tier });
        }
    }

    /// A block left the node.
    pub fn removed(&mut self, key: &[u8], reason: RemovalReason) {
        if self.observed() {
            self.append(EventRef::BlockRemoved { key, reason });
        }
    }

    /// A block's fastest tier changed.
    pub fn tier_changed(&mut self, key: &[u8], from: Tier, to: Tier) {
        if self.observed() {
            self.append(EventRef::TierChanged { key, from, to });
        }
    }

    /// The shard lost `count` blocks it cannot name (a region that could not be read back): subscribers
    /// must resync.
    pub fn lost(&mut self, count: u32) {
        if self.observed() && count > 0 {
            self.append(EventRef::Lagged { missed: count });
        }
    }

    /// Appends to `out` the events from `cursor` on whose keys start with `prefix` (all, for `None`), with
    /// the first `strip` bytes of each key taken off (a tenant's prefix), up to about `max_bytes`; returns
    /// the number appended and the next cursor. A cursor older than the oldest kept event first yields a
    /// `LAGGED` event.
    pub fn read(
        &self,
        cursor: u64,
        prefix: Option<&[u8]>,
        strip: usize,
        max_bytes: usize,
        out: &mut Vec<u8>,
    ) -> (u32, u64) {
        let mut count = 0u32;
        let mut cursor = cursor;
        if cursor < self.first_sequence {
            let missed = (self.first_sequence - cursor).min(u64::from(u32::MAX)) as u32;
            Event::Lagged { missed }.encode_into(self.first_sequence, out);
            count += 1;
            cursor = self.first_sequence;
        }
        let start_len = out.len();
        if prefix.is_none() && strip == 0 && cursor < self.next_sequence {
            // Every event, as logged: one copy of a contiguous run of the log.
            let first = (cursor - self.first_sequence) as usize;
            let from = self.starts[first];
            let limit = from.saturating_add(max_bytes);
            // Events whose start is within the byte budget (at least one).
            let last = (self.starts.partition_point(|&start| start < limit)).max(first + 1);
            let to = self.starts.get(last).copied().unwrap_or(self.bytes.len());
            out.extend_from_slice(&self.bytes[from..to]);
            let taken = (last - first) as u64;
            return (count + taken as u32, cursor + taken);
        }
        while cursor < self.next_sequence && out.len() - start_len < max_bytes {
            let index = (cursor - self.first_sequence) as usize;
            let start = self.starts[index];
            let end = self.starts.get(index + 1).copied().unwrap_or(self.bytes.len());
            let bytes = &self.bytes[start..end];
            // The log holds only what `append` encoded, so this decodes; were it not to, the event is
            // skipped rather than sent.
            let Ok((event, _, _)) = EventRef::decode(bytes) else {
                debug_assert!(false, "the event log holds an event it cannot decode");
                cursor += 1;
                continue;
            };
            // LAGGED has no key and goes to every subscriber.
            let key = event.key();
            if key.is_none_or(|key| prefix.is_none_or(|prefix| key.starts_with(prefix))) {
                if strip == 0 || key.is_none() {
                    out.extend_from_slice(bytes);
                } else {
                    event.stripped(strip).encode_into(cursor, out);
                }
                count += 1;
            }
            cursor += 1;
        }
        (count, cursor)
    }
}

/// A subscriber's registration: counted while it lives, so the log records only while observed.
pub struct Subscription {
    log: Rc<RefCell<EventLog>>,
    id: u64,
}

impl Subscription {
    /// Registers a subscriber of `log`; returns it and the cursor to read from.
    pub fn new(log: &Rc<RefCell<EventLog>>) -> (Self, u64) {
        let mut events = log.borrow_mut();
        events.subscribers += 1;
        let id = events.next_subscriber;
        events.next_subscriber += 1;
        let cursor = events.next_sequence();
        events.cursors.push((id, cursor));
        (Self { log: Rc::clone(log), id }, cursor)
    }

    /// This subscriber has sent every event before `cursor`: once all have, the log starts over.
    pub fn consumed(&self, cursor: u64) {
        let mut log = self.log.borrow_mut();
        if let Some(entry) = log.cursors.iter_mut().find(|(id, _)| *id == self.id) {
            entry.1 = cursor;
        }
        log.trim();
    }

    /// Resolves once an event after `cursor` exists.
    pub fn changed(&self, cursor: u64) -> impl Future<Output = ()> + '_ {
        Changed { log: &self.log, cursor }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut log = self.log.borrow_mut();
        log.subscribers -= 1;
        log.cursors.retain(|(id, _)| *id != self.id);
        log.trim();
    }
}

struct Changed<'a> {
    log: &'a Rc<RefCell<EventLog>>,
    cursor: u64,
}

impl Future for Changed<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        let mut log = self.log.borrow_mut();
        if log.next_sequence > self.cursor {
            return Poll::Ready(());
        }
        log.wakers.push(context.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(bytes: &[u8]) -> Vec<(Event, u64)> {
        let mut at = 0;
        let mut events = Vec::new();
        while at < bytes.len() {
            let (event, sequence, len) = Event::decode(&bytes[at..]).expect("decodes");
            events.push((event, sequence));
            at += len;
        }
        events
    }

    #[test]
    fn the_log_starts_over_once_every_subscriber_sent_everything() {
        let log = Rc::new(RefCell::new(EventLog::new(1 << 20)));
        let (fast, fast_cursor) = Subscription::new(&log);
        let (slow, slow_cursor) = Subscription::new(&log);
        for index in 0..10u32 {
            log.borrow_mut().stored(format!("key-{index}").as_bytes(), None, index, Tier::Dram);
        }
        let mut out = Vec::new();
        let (count, fast_cursor) = log.borrow().read(fast_cursor, None, 0, 1 << 20, &mut out);
        assert_eq!(count, 10);
        fast.consumed(fast_cursor);
        assert!(log.borrow().kept_bytes() > 0, "the slow subscriber has not sent them yet");
        out.clear();
        let (count, slow_cursor) = log.borrow().read(slow_cursor, None, 0, 1 << 20, &mut out);
        assert_eq!(count, 10);
        slow.consumed(slow_cursor);
        assert_eq!(log.borrow().kept_bytes(), 0, "everyone has them: the buffer starts over");
        // Numbering goes on where it was; nothing is reported missed.
        log.borrow_mut().stored(b"key-10", None, 10, Tier::Dram);
        out.clear();
        assert_eq!(log.borrow().read(fast_cursor, None, 0, 1 << 20, &mut out), (1, 11));
        assert_eq!(
            decode_all(&out),
            vec![(Event::BlockStored { key: b"key-10".to_vec(), parent: None, size: 10, tier: Tier::Dram }, 10)]
        );
        drop(slow);
        fast.consumed(11);
        assert_eq!(log.borrow().kept_bytes(), 0);
    }

    #[test]
    fn nothing_is_kept_unobserved_and_a_slow_reader_is_told_it_lagged() {
        let log = Rc::new(RefCell::new(EventLog::new(1000)));
        log.borrow_mut().stored(b"unseen", None, 1, Tier::Dram);
        let (subscription, cursor) = Subscription::new(&log);
        assert_eq!(cursor, 0, "the unobserved event was never recorded");
        for index in 0..200u32 {
            log.borrow_mut().stored(format!("key-{index}").as_bytes(), None, index, Tier::Dram);
        }
        let mut out = Vec::new();
        let (count, next) = log.borrow().read(cursor, None, 0, usize::MAX, &mut out);
        let events = decode_all(&out);
        assert_eq!(count as usize, events.len());
        let Event::Lagged { missed } = events[0].0 else { panic!("first event {:?}", events[0]) };
        assert!(missed > 0 && (missed as usize) < 200);
        assert_eq!(events.len() - 1 + missed as usize, 200, "missed + delivered = produced");
        assert_eq!(next, 200);
        let Event::BlockStored { key, .. } = &events.last().expect("events").0 else { panic!() };
        assert_eq!(key, b"key-199");
        // A prefix filter, and a reader that is caught up.
        log.borrow_mut().removed(b"chat/1", RemovalReason::Evicted);
        log.borrow_mut().tier_changed(b"sys/1", Tier::Dram, Tier::Nvme);
        let mut out = Vec::new();
        let (count, next) = log.borrow().read(next, Some(b"sys/"), 0, usize::MAX, &mut out);
        assert_eq!(count, 1);
        assert_eq!(
            decode_all(&out)[0].0,
            Event::TierChanged { key: b"sys/1".to_vec(), from: Tier::Dram, to: Tier::Nvme }
        );
        assert_eq!(log.borrow().read(next, None, 0, usize::MAX, &mut Vec::new()).0, 0);
        drop(subscription);
        assert!(!log.borrow().observed());
    }
}
