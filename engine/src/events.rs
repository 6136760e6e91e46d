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
//!
//! The newest event stays open while no subscriber has read it: a put of the same size and tier whose
//! parent relation fits (the same parent as every key in it, or the event's last key: a chain) adds its
//! key to it instead of starting an event, and so does a removal for the same reason. A run of batched
//! puts costs each key its bytes, not an event's head, a log entry and a sequence number. Any read closes
//! it (an event a subscriber has sent never changes), and so does any other event.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use strata_proto::{Event, EventRef, Keys, OpenEvent, RemovalReason, Tier};

/// Bytes an open event grows to at most: a few frames' worth of keys per event, and a log of many events, so
/// that halving it drops about half (a quarter of the log's capacity, for small logs).
const MAX_OPEN_EVENT_BYTES: usize = 16 << 10;

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
    /// The newest event, while keys may still join it.
    open: Option<Open>,
}

/// The newest event of the log, not yet read by any subscriber.
struct Open {
    event: OpenEvent,
    kind: OpenKind,
    /// Where its last key is in the log (a chained put names it as its parent).
    last_key: Range<usize>,
}

enum OpenKind {
    Stored {
        size: u32,
        tier: Tier,
        /// Where the parent every key names is in the log (when not chained).
        parent: Option<Range<usize>>,
        /// Whether it is a chain: decided by its second key.
        chained: Option<bool>,
    },
    Removed(RemovalReason),
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
            open: None,
        }
    }

    /// Drops every kept event if every subscriber has sent them all (a cheap check: a few subscribers).
    fn trim(&mut self) {
        if self.cursors.iter().all(|&(_, cursor)| cursor >= self.next_sequence) {
            self.open = None;
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

    /// Starts an event at the end of the log: closes the open one, takes a sequence number (the event's
    /// is `next_sequence - 1` after this), wakes waiting subscribers.
    fn start_event(&mut self) {
        self.open = None;
        if self.bytes.len() >= self.capacity {
            self.compact();
        }
        self.starts.push_back(self.bytes.len());
        self.next_sequence += 1;
        // Usually empty: a subscriber waits only when it has sent everything, so the first event after
        // that wakes it and the rest of a gather interval's events find no one to wake.
        if !self.wakers.is_empty() {
            for waker in self.wakers.drain(..) {
                waker.wake();
            }
        }
    }

    fn append(&mut self, event: EventRef<'_>) {
        self.start_event();
        event.encode_into(self.next_sequence - 1, &mut self.bytes);
    }

    /// Adds `key` to the open event if `fits` says its kind and parent relation match; returns whether it
    /// did.
    fn join_open(&mut self, key: &[u8], fits: impl FnOnce(&OpenKind, &[u8], &[u8]) -> Option<bool>) -> bool {
        let Some(open) = &mut self.open else {
            return false;
        };
        if self.bytes.len() - open.event.start() + key.len() + 3 > MAX_OPEN_EVENT_BYTES.min(self.capacity / 4) {
            return false;
        }
        let Some(chained) = fits(&open.kind, &self.bytes, &self.bytes[open.last_key.clone()]) else {
            return false;
        };
        if !open.event.push_key(&mut self.bytes, key) {
            return false;
        }
        if let OpenKind::Stored { chained: decided @ None, .. } = &mut open.kind {
            *decided = Some(chained);
            if chained {
                open.event.set_chained(&mut self.bytes);
            }
        }
        open.last_key = self.bytes.len() - key.len()..self.bytes.len();
        true
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
        // Offsets move: nothing may stay open (`start_event`, the caller, closed it already).
        self.open = None;
        self.bytes.drain(..cut);
        self.starts.drain(..drop_events);
        for start in &mut self.starts {
            *start -= cut;
        }
        self.first_sequence += drop_events as u64;
    }

    /// A block was stored in `tier`.
    pub fn stored(&mut self, key: &[u8], parent: Option<&[u8]>, size: u32, tier: Tier) {
        if !self.observed() {
            return;
        }
        let parent = parent.filter(|parent| !parent.is_empty());
        let joined = self.join_open(key, |kind, log, last_key| {
            let OpenKind::Stored { size: open_size, tier: open_tier, parent: open_parent, chained } = kind else {
                return None;
            };
            if (*open_size, *open_tier) != (size, tier) {
                return None;
            }
            if *chained != Some(false) && parent == Some(last_key) {
                Some(true)
            } else if *chained != Some(true) && parent == open_parent.clone().map(|range| &log[range]) {
                Some(false)
            } else {
                None
            }
        });
        if joined {
            return;
        }
        self.start_event();
        let event = OpenEvent::block_stored(&mut self.bytes, self.next_sequence - 1, parent, size, tier);
        let parent = parent.map(|parent| self.bytes.len() - parent.len()..self.bytes.len());
        event.push_key(&mut self.bytes, key);
        let last_key = self.bytes.len() - key.len()..self.bytes.len();
        self.open = Some(Open { event, kind: OpenKind::Stored { size, tier, parent, chained: None }, last_key });
    }

    /// A block left the node.
    pub fn removed(&mut self, key: &[u8], reason: RemovalReason) {
        if !self.observed() {
            return;
        }
        let joined = self
            .join_open(key, |kind, _, _| matches!(kind, OpenKind::Removed(open) if *open == reason).then_some(false));
        if joined {
            return;
        }
        self.start_event();
        let event = OpenEvent::block_removed(&mut self.bytes, self.next_sequence - 1, reason);
        event.push_key(&mut self.bytes, key);
        let last_key = self.bytes.len() - key.len()..self.bytes.len();
        self.open = Some(Open { event, kind: OpenKind::Removed(reason), last_key });
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
    /// `LAGGED` event. An event some of whose keys match is sent with those keys only; a chain that loses
    /// keys is sent as its runs of matching keys, each naming the key before it as its parent, all with the
    /// event's sequence number. Closes the open event: what a subscriber has read never changes.
    pub fn read(
        &mut self,
        cursor: u64,
        prefix: Option<&[u8]>,
        strip: usize,
        max_bytes: usize,
        out: &mut Vec<u8>,
    ) -> (u32, u64) {
        self.open = None;
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
        let matches = |key: &[u8]| prefix.is_none_or(|prefix| key.starts_with(prefix));
        let cut = |key| cut(key, strip);
        while cursor < self.next_sequence && out.len() - start_len < max_bytes {
            let index = (cursor - self.first_sequence) as usize;
            let start = self.starts[index];
            let end = self.starts.get(index + 1).copied().unwrap_or(self.bytes.len());
            let bytes = &self.bytes[start..end];
            // The log holds only what it encoded, so this decodes; were it not to, the event is skipped
            // rather than sent.
            let Ok((event, _, _)) = EventRef::decode(bytes) else {
                debug_assert!(false, "the event log holds an event it cannot decode");
                cursor += 1;
                continue;
            };
            let whole = |keys: Keys<'_>| strip == 0 && keys.iter().all(matches);
            count += match event {
                // LAGGED has no key and goes to every subscriber.
                EventRef::Lagged { .. } => {
                    out.extend_from_slice(bytes);
                    1
                }
                EventRef::TierChanged { key, from, to } if matches(key) => {
                    EventRef::TierChanged { key: cut(key), from, to }.encode_into(cursor, out);
                    1
                }
                EventRef::TierChanged { .. } => 0,
                EventRef::BlockRemoved { keys, .. } | EventRef::BlockStored { keys, .. } if whole(keys) => {
                    out.extend_from_slice(bytes);
                    1
                }
                EventRef::BlockRemoved { keys, reason } => {
                    let event = OpenEvent::block_removed(out, cursor, reason);
                    push_matching(out, event, keys, matches, strip)
                }
                EventRef::BlockStored { keys, parent, chained: false, size, tier } => {
                    let event = OpenEvent::block_stored(out, cursor, parent.map(cut), size, tier);
                    push_matching(out, event, keys, matches, strip)
                }
                EventRef::BlockStored { keys, parent, chained: true, size, tier } => {
                    // Runs of matching keys; each run's parent is the key before it in the chain.
                    let mut sent = 0;
                    let mut before = parent;
                    let mut run: Option<OpenEvent> = None;
                    for key in keys {
                        if matches(key) {
                            match run {
                                Some(event) => {
                                    event.push_key(out, cut(key));
                                    event.set_chained(out);
                                }
                                None => {
                                    let event = OpenEvent::block_stored(out, cursor, before.map(cut), size, tier);
                                    event.push_key(out, cut(key));
                                    run = Some(event);
                                    sent += 1;
                                }
                            }
                        } else {
                            run = None;
                        }
                        before = Some(key);
                    }
                    sent
                }
            };
            cursor += 1;
        }
        (count, cursor)
    }
}

/// `key` without its first `strip` bytes (a tenant's prefix).
fn cut(key: &[u8], strip: usize) -> &[u8] {
    &key[strip.min(key.len())..]
}

/// Adds to `event` (the last in `out`) the keys that match, cut; an event left with none is taken back.
/// Returns the events written (0 or 1).
fn push_matching(
    out: &mut Vec<u8>,
    event: OpenEvent,
    keys: Keys<'_>,
    matches: impl Fn(&[u8]) -> bool,
    strip: usize,
) -> u32 {
    for key in keys.iter().filter(|key| matches(key)) {
        event.push_key(out, cut(key, strip));
    }
    if event.keys(out) == 0 {
        out.truncate(event.start());
        return 0;
    }
    1
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
        // It starts after the newest event, which must not grow behind its back.
        events.open = None;
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
        let (count, fast_cursor) = log.borrow_mut().read(fast_cursor, None, 0, 1 << 20, &mut out);
        assert_eq!(count, 10);
        fast.consumed(fast_cursor);
        assert!(log.borrow().kept_bytes() > 0, "the slow subscriber has not sent them yet");
        out.clear();
        let (count, slow_cursor) = log.borrow_mut().read(slow_cursor, None, 0, 1 << 20, &mut out);
        assert_eq!(count, 10);
        slow.consumed(slow_cursor);
        assert_eq!(log.borrow().kept_bytes(), 0, "everyone has them: the buffer starts over");
        // Numbering goes on where it was; nothing is reported missed.
        log.borrow_mut().stored(b"key-10", None, 10, Tier::Dram);
        out.clear();
        assert_eq!(log.borrow_mut().read(fast_cursor, None, 0, 1 << 20, &mut out), (1, 11));
        assert_eq!(
            decode_all(&out),
            vec![(
                Event::BlockStored {
                    keys: vec![b"key-10".to_vec()],
                    parent: None,
                    chained: false,
                    size: 10,
                    tier: Tier::Dram
                },
                10
            )]
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
        let (count, next) = log.borrow_mut().read(cursor, None, 0, usize::MAX, &mut out);
        let events = decode_all(&out);
        assert_eq!(count as usize, events.len());
        let Event::Lagged { missed } = events[0].0 else { panic!("first event {:?}", events[0]) };
        assert!(missed > 0 && (missed as usize) < 200);
        assert_eq!(events.len() - 1 + missed as usize, 200, "missed + delivered = produced");
        assert_eq!(next, 200);
        // Each put a size of its own: an event each.
        let Event::BlockStored { keys, .. } = &events.last().expect("events").0 else { panic!() };
        assert_eq!(keys, &[b"key-199".to_vec()]);
        // A prefix filter, and a reader that is caught up.
        log.borrow_mut().removed(b"chat/1", RemovalReason::Evicted);
        log.borrow_mut().tier_changed(b"sys/1", Tier::Dram, Tier::Nvme);
        let mut out = Vec::new();
        let (count, next) = log.borrow_mut().read(next, Some(b"sys/"), 0, usize::MAX, &mut out);
        assert_eq!(count, 1);
        assert_eq!(
            decode_all(&out)[0].0,
            Event::TierChanged { key: b"sys/1".to_vec(), from: Tier::Dram, to: Tier::Nvme }
        );
        assert_eq!(log.borrow_mut().read(next, None, 0, usize::MAX, &mut Vec::new()).0, 0);
        drop(subscription);
        assert!(!log.borrow().observed());
    }

    fn stored(keys: &[&str], parent: Option<&str>, chained: bool) -> Event {
        Event::BlockStored {
            keys: keys.iter().map(|key| key.as_bytes().to_vec()).collect(),
            parent: parent.map(|parent| parent.as_bytes().to_vec()),
            chained,
            size: 64,
            tier: Tier::Dram,
        }
    }

    #[test]
    fn keys_join_the_newest_event_until_it_is_read_or_stops_fitting() {
        let log = Rc::new(RefCell::new(EventLog::new(1 << 20)));
        let (subscription, cursor) = Subscription::new(&log);
        {
            let mut log = log.borrow_mut();
            // Siblings (no parent), then a chain under "t/p", then a put that fits neither.
            log.stored(b"t/a", None, 64, Tier::Dram);
            log.stored(b"t/b", None, 64, Tier::Dram);
            log.stored(b"t/c1", Some(b"t/p"), 64, Tier::Dram);
            log.stored(b"u/c2", Some(b"t/c1"), 64, Tier::Dram);
            log.stored(b"t/c3", Some(b"u/c2"), 64, Tier::Dram);
            log.stored(b"t/x", Some(b"t/p"), 64, Tier::Dram);
            // Another size, then siblings under one parent.
            log.stored(b"t/big", None, 65, Tier::Dram);
            log.stored(b"t/s1", Some(b"t/q"), 64, Tier::Dram);
            log.stored(b"t/s2", Some(b"t/q"), 64, Tier::Dram);
            log.removed(b"t/a", RemovalReason::Evicted);
            log.removed(b"u/b", RemovalReason::Evicted);
            log.removed(b"t/c", RemovalReason::Removed);
            log.tier_changed(b"t/s1", Tier::Dram, Tier::Nvme);
            log.stored(b"t/d", None, 64, Tier::Dram);
        }
        let mut out = Vec::new();
        let (count, next) = log.borrow_mut().read(cursor, None, 0, usize::MAX, &mut out);
        let expected = vec![
            (stored(&["t/a", "t/b"], None, false), 0),
            (stored(&["t/c1", "u/c2", "t/c3"], Some("t/p"), true), 1),
            (stored(&["t/x"], Some("t/p"), false), 2),
            (
                Event::BlockStored {
                    keys: vec![b"t/big".to_vec()],
                    parent: None,
                    chained: false,
                    size: 65,
                    tier: Tier::Dram,
                },
                3,
            ),
            (stored(&["t/s1", "t/s2"], Some("t/q"), false), 4),
            (Event::BlockRemoved { keys: vec![b"t/a".to_vec(), b"u/b".to_vec()], reason: RemovalReason::Evicted }, 5),
            (Event::BlockRemoved { keys: vec![b"t/c".to_vec()], reason: RemovalReason::Removed }, 6),
            (Event::TierChanged { key: b"t/s1".to_vec(), from: Tier::Dram, to: Tier::Nvme }, 7),
            (stored(&["t/d"], None, false), 8),
        ];
        assert_eq!(decode_all(&out), expected);
        assert_eq!((count, next), (9, 9));
        // Read, the newest event is closed: the next key starts an event of its own.
        log.borrow_mut().stored(b"t/e", None, 64, Tier::Dram);
        out.clear();
        assert_eq!(log.borrow_mut().read(next, None, 0, usize::MAX, &mut out), (1, 10));
        assert_eq!(decode_all(&out), vec![(stored(&["t/e"], None, false), 9)]);
        // A tenant's view ("t/", cut): only its keys; the chain split into its runs, each naming the key
        // before it (the other tenant's key is named, cut like the rest, as the parent of "c3").
        out.clear();
        let (count, _) = log.borrow_mut().read(0, Some(b"t/"), 2, usize::MAX, &mut out);
        let filtered = decode_all(&out);
        assert_eq!(count as usize, filtered.len());
        assert_eq!(
            filtered[..4],
            [
                (stored(&["a", "b"], None, false), 0),
                (stored(&["c1"], Some("p"), false), 1),
                (stored(&["c3"], Some("c2"), false), 1),
                (stored(&["x"], Some("p"), false), 2),
            ]
        );
        assert_eq!(filtered[6], (Event::BlockRemoved { keys: vec![b"a".to_vec()], reason: RemovalReason::Evicted }, 5));
        assert_eq!(filtered.len(), 11);
        // A prefix nothing of an event matches leaves nothing of it.
        out.clear();
        assert_eq!(log.borrow_mut().read(0, Some(b"u/"), 0, usize::MAX, &mut out).0, 2);
        assert_eq!(
            decode_all(&out),
            vec![
                (stored(&["u/c2"], Some("t/c1"), false), 1),
                (Event::BlockRemoved { keys: vec![b"u/b".to_vec()], reason: RemovalReason::Evicted }, 5),
            ]
        );
        // A subscriber that joins now sees every key stored after it joined: the open event closes.
        log.borrow_mut().stored(b"t/f", None, 64, Tier::Dram);
        let (late, late_cursor) = Subscription::new(&log);
        log.borrow_mut().stored(b"t/g", None, 64, Tier::Dram);
        out.clear();
        assert_eq!(log.borrow_mut().read(late_cursor, None, 0, usize::MAX, &mut out), (1, 12));
        assert_eq!(decode_all(&out), vec![(stored(&["t/g"], None, false), 11)]);
        drop((subscription, late));
    }

    #[test]
    fn an_event_stops_growing_at_its_byte_bound() {
        let log = Rc::new(RefCell::new(EventLog::new(8 << 20)));
        let (_subscription, cursor) = Subscription::new(&log);
        let key = [b'k'; 100];
        let keys = 2 * MAX_OPEN_EVENT_BYTES / key.len();
        for _ in 0..keys {
            log.borrow_mut().stored(&key, None, 64, Tier::Dram);
        }
        let mut out = Vec::new();
        let (count, _) = log.borrow_mut().read(cursor, None, 0, usize::MAX, &mut out);
        let events = decode_all(&out);
        assert_eq!(count as usize, events.len());
        assert!((2..=3).contains(&events.len()), "{} events", events.len());
        let mut total = 0;
        let mut at = 0;
        for (event, _) in &events {
            let (_, _, len) = Event::decode(&out[at..]).expect("decodes");
            assert!(len <= MAX_OPEN_EVENT_BYTES, "an event of {len} bytes");
            at += len;
            let Event::BlockStored { keys, .. } = event else { panic!("{event:?}") };
            total += keys.len();
        }
        assert_eq!(total, keys);
    }

    /// What a router learns about one key, in the order it learns it.
    #[derive(Clone, Debug, PartialEq, Eq)]
    enum Fact {
        Stored { key: u8, parent: Option<u8>, size: u32 },
        Removed { key: u8, reason: RemovalReason },
        Moved { key: u8 },
    }

    impl Fact {
        fn key(&self) -> u8 {
            match *self {
                Fact::Stored { key, .. } | Fact::Removed { key, .. } | Fact::Moved { key } => key,
            }
        }
    }

    fn name(key: u8) -> Vec<u8> {
        format!("key-{key}").into_bytes()
    }

    fn number(name: &[u8]) -> u8 {
        std::str::from_utf8(&name[4..]).expect("utf-8").parse().expect("a number")
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 512, ..Default::default() })]

        /// Events grouped any way the log likes still tell each key's story in order, and every fact once.
        #[test]
        fn grouping_never_reorders_a_keys_own_events(
            ops in proptest::collection::vec((0u8..5, 0u8..6, 0u8..7, 1u32..3), 1..200),
        ) {
            let log = Rc::new(RefCell::new(EventLog::new(1 << 20)));
            let (_subscription, mut cursor) = Subscription::new(&log);
            let mut facts = Vec::new();
            let mut out = Vec::new();
            for (op, key, parent, size) in ops {
                let mut log = log.borrow_mut();
                match op {
                    0 | 1 => {
                        let parent = (parent < 6).then_some(parent);
                        log.stored(&name(key), parent.map(name).as_deref(), size, Tier::Dram);
                        facts.push(Fact::Stored { key, parent, size });
                    }
                    2 => {
                        let reason = if size == 1 { RemovalReason::Evicted } else { RemovalReason::Cascaded };
                        log.removed(&name(key), reason);
                        facts.push(Fact::Removed { key, reason });
                    }
                    3 => {
                        log.tier_changed(&name(key), Tier::Dram, Tier::Nvme);
                        facts.push(Fact::Moved { key });
                    }
                    _ => cursor = log.read(cursor, None, 0, usize::MAX, &mut out).1,
                }
            }
            cursor = log.borrow_mut().read(cursor, None, 0, usize::MAX, &mut out).1;
            proptest::prop_assert_eq!(cursor, log.borrow().next_sequence());
            let mut told = Vec::new();
            for (expected_sequence, (event, sequence)) in (0u64..).zip(decode_all(&out)) {
                proptest::prop_assert_eq!(sequence, expected_sequence, "numbered in order, no gap");
                match &event {
                    Event::BlockStored { size, .. } => told.extend(
                        event.stored_blocks().map(|(key, parent)| Fact::Stored {
                            key: number(key),
                            parent: parent.map(number),
                            size: *size,
                        }),
                    ),
                    Event::BlockRemoved { keys, reason } => {
                        told.extend(keys.iter().map(|key| Fact::Removed { key: number(key), reason: *reason }))
                    }
                    Event::TierChanged { key, .. } => told.push(Fact::Moved { key: number(key) }),
                    Event::Lagged { .. } => proptest::prop_assert!(false, "lagged"),
                }
            }
            proptest::prop_assert_eq!(told.len(), facts.len());
            for key in 0..6 {
                let of = |facts: &[Fact]| facts.iter().filter(|fact| fact.key() == key).cloned().collect::<Vec<_>>();
                proptest::prop_assert_eq!(of(&told), of(&facts), "key {}", key);
            }
        }
    }
}
