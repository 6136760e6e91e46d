//! A router subscribed to a node's events sees every block stored, moved between tiers and removed, can
//! filter by key prefix, and is told when it fell behind (LAGGED) instead of the node buffering without
//! bound.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{Scratch, client, config, key_of, start, value_of, with_file};
use strata_client::{Event, EventStream, RemovalReason, ShardEvent, Tier};
use strata_engine::config::EventCpus;

/// The blocks `events` report on (an event names one key or many).
fn blocks(events: &[ShardEvent]) -> usize {
    events.iter().map(|event| event.event.blocks()).sum()
}

/// Collects events until `done` says so or 10 s pass.
fn collect(stream: &EventStream, mut done: impl FnMut(&[ShardEvent]) -> bool) -> Vec<ShardEvent> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut events = Vec::new();
    while !done(&events) && Instant::now() < deadline {
        if let Some(event) = stream.next_timeout(Duration::from_millis(50)) {
            events.push(event.expect("event"));
        }
    }
    events
}

#[test]
fn stores_tier_changes_and_removals_are_reported_in_order() {
    reports_in_order(EventCpus::Inline);
}

#[test]
fn sender_threads_report_the_same_in_the_same_order() {
    reports_in_order(EventCpus::These(vec![0]));
}

fn reports_in_order(event_cpus: EventCpus) {
    let scratch = Scratch::new("events");
    let mut node_config = with_file(config(&[0, 1], 8 << 20), &scratch.file("ns0.img"), 64 << 20);
    node_config.event_cpus = event_cpus;
    let node = start(node_config);
    let mut client = client(&node);
    let everything = client.subscribe_events(None).expect("subscribe");
    let system_only = client.subscribe_events(Some(b"sys/")).expect("subscribe with a prefix");
    client.put(b"sys/prompt", &value_of(1, 1000)).expect("put");
    for index in 0..10u64 {
        client.put(&key_of(index), &value_of(index, 4096)).expect("put");
    }
    client.remove(&key_of(3)).expect("remove");
    // Eleven blocks stored and one removed, in however many events the shards grouped them.
    let events = collect(&everything, |events| blocks(events) >= 12);
    let stored: Vec<_> = events
        .iter()
        .flat_map(|event| {
            let (size, tier) = match event.event {
                Event::BlockStored { size, tier, .. } => (size, tier),
                _ => (0, Tier::None),
            };
            event.event.stored_blocks().map(move |(key, parent)| (key.to_vec(), size, tier, parent.map(<[u8]>::to_vec)))
        })
        .collect();
    assert_eq!(stored.len(), 11, "{events:?}");
    assert!(stored.contains(&(b"sys/prompt".to_vec(), 1000, Tier::Dram, None)));
    assert!(stored.contains(&(key_of(9), 4096, Tier::Dram, None)));
    let removed = events.iter().find(|event| matches!(event.event, Event::BlockRemoved { .. })).expect("removal");
    assert_eq!(removed.event, Event::BlockRemoved { keys: vec![key_of(3)], reason: RemovalReason::Removed });
    // Per shard, sequence numbers are consecutive.
    let mut last: HashMap<u32, u64> = HashMap::new();
    for event in &events {
        if let Some(previous) = last.insert(event.shard, event.sequence) {
            assert_eq!(event.sequence, previous + 1, "shard {}", event.shard);
        }
    }

    // 16 MiB of 64 KiB blocks over 8 MiB of DRAM: evictions to the NVMe tier (written through already).
    for index in 100..356u64 {
        client.put(&key_of(index), &value_of(index, 64 << 10)).expect("put");
    }
    let demoted = collect(&everything, |events| {
        events.iter().any(|event| matches!(&event.event, Event::TierChanged { key, .. } if *key == key_of(100)))
    });
    let moved = demoted
        .iter()
        .find(|event| matches!(&event.event, Event::TierChanged { key, .. } if *key == key_of(100)))
        .expect("the oldest block left DRAM");
    assert_eq!(moved.event, Event::TierChanged { key: key_of(100), from: Tier::Dram, to: Tier::Nvme });
    // Two hits within the promotion window bring it back.
    client.get(&key_of(100)).expect("get");
    client.get(&key_of(100)).expect("get");
    let promoted = collect(&everything, |events| {
        events.iter().any(|event| matches!(&event.event, Event::TierChanged { to: Tier::Dram, .. }))
    });
    assert!(
        promoted
            .iter()
            .any(|event| event.event == Event::TierChanged { key: key_of(100), from: Tier::Nvme, to: Tier::Dram }),
        "{promoted:?}"
    );

    // The prefix subscription saw only its key: stored, then (maybe) moved to NVMe and back.
    let mut filtered = collect(&system_only, |events| !events.is_empty());
    filtered.extend(system_only.drain().into_iter().map(|event| event.expect("event")));
    assert!(matches!(&filtered[0].event, Event::BlockStored { keys, .. } if keys == &[b"sys/prompt".to_vec()]));
    for event in &filtered {
        let keys = match &event.event {
            Event::BlockStored { keys, .. } | Event::BlockRemoved { keys, .. } => keys.clone(),
            Event::TierChanged { key, .. } => vec![key.clone()],
            Event::Lagged { .. } => panic!("lagged"),
        };
        assert!(keys.iter().all(|key| key.starts_with(b"sys/")), "{event:?}");
    }
    drop(everything);
    drop(system_only);
    node.shutdown().expect("shutdown");
}

#[test]
fn a_subscriber_that_falls_behind_is_told_how_much_it_missed() {
    falls_behind(EventCpus::Inline);
}

#[test]
fn a_subscriber_with_a_sender_thread_that_falls_behind_is_told_too() {
    falls_behind(EventCpus::These(vec![1]));
}

fn falls_behind(event_cpus: EventCpus) {
    let mut small_log = config(&[0], 64 << 20);
    small_log.event_log_bytes = 16 << 10;
    small_log.event_cpus = event_cpus;
    let node = start(small_log);
    let mut client = client(&node);
    let stream = client.subscribe_events(None).expect("subscribe");
    // 400,000 puts (about 26 MB of events) while the subscriber reads nothing: far more than its queue,
    // the sockets' buffers and the node's 16 KiB log hold together.
    const PUTS: u64 = 400_000;
    let keys: Vec<Vec<u8>> = (0..PUTS).map(|index| format!("event-block-{index:020}").into_bytes()).collect();
    for batch in keys.chunks(1000) {
        let items: Vec<(&[u8], &[u8])> = batch.iter().map(|key| (&key[..], &b"v"[..])).collect();
        assert!(client.batch_put(&items).iter().all(Result::is_ok));
    }
    // A last put of another size starts an event of its own: the stream has been read to its end when
    // that event arrives. Events are numbered from 0 (a node records nothing before its first subscriber).
    client.put(b"the-last-put", b"vv").expect("put");
    let (mut delivered, mut missed, mut blocks) = (0u64, 0u64, 0u64);
    let mut last_sequence = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    while last_sequence.is_none() && Instant::now() < deadline {
        match stream.next_timeout(Duration::from_millis(200)) {
            Some(Ok(ShardEvent { event: Event::Lagged { missed: count }, .. })) => missed += u64::from(count),
            Some(Ok(ShardEvent { event, sequence, .. })) => {
                assert!(matches!(event, Event::BlockStored { .. } | Event::BlockRemoved { .. }), "{event:?}");
                delivered += 1;
                blocks += event.blocks() as u64;
                if matches!(&event, Event::BlockStored { keys, .. } if keys == &[b"the-last-put".to_vec()]) {
                    last_sequence = Some(sequence);
                }
            }
            Some(Err(error)) => panic!("{error}"),
            None => {}
        }
    }
    let last_sequence = last_sequence.expect("the last put's event arrived");
    assert!(missed > 0, "the subscriber was told it lagged");
    assert!(delivered > 0);
    assert_eq!(delivered + missed, last_sequence + 1, "every event is delivered or counted as missed");
    // Blocks: one per put and one per block evicted to make room (a DRAM-only node drops them), the ones in
    // the events delivered fewer.
    let produced = PUTS + 1 + common::total(&node, |shard| &shard.dram_evictions);
    assert!(blocks < produced, "{blocks} of {produced} blocks");
    drop(stream);
    node.shutdown().expect("shutdown");
}

#[test]
fn batches_borrow_their_keys_and_say_what_owned_events_say() {
    let node = start(config(&[0], 32 << 20));
    let mut client = client(&node);
    let owned = client.subscribe_events(None).expect("subscribe");
    let borrowed = client.subscribe_events(None).expect("subscribe");
    client.put_linked(b"child", b"v", strata_client::Links::parent(b"root"), Default::default()).expect("put");
    for index in 0..20u64 {
        client.put(&key_of(index), &value_of(index, 100)).expect("put");
    }
    client.remove(&key_of(5)).expect("remove");
    let expected = collect(&owned, |events| blocks(events) >= 22);
    assert_eq!(blocks(&expected), 22);

    // The same events through batches: one owned event first, then the rest of its batch and the ones after.
    let mut seen: Vec<ShardEvent> =
        vec![borrowed.next_timeout(Duration::from_secs(5)).expect("an event").expect("event")];
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.len() < expected.len() && Instant::now() < deadline {
        let Some(batch) = borrowed.next_batch_timeout(Duration::from_millis(50)) else { continue };
        let batch = batch.expect("batch");
        assert!(!batch.is_empty() && batch.shard() == 0);
        let before = seen.len();
        for (sequence, event) in batch.iter() {
            if let strata_client::EventRef::BlockStored { keys, parent, .. } = event
                && keys.first() == Some(b"child")
            {
                assert_eq!(parent, Some(&b"root"[..]), "the parent borrowed from the frame");
            }
            seen.push(ShardEvent {
                node: batch.node().into(),
                shard: batch.shard(),
                sequence,
                event: event.to_event(),
            });
        }
        assert_eq!(seen.len() - before, batch.len());
    }
    assert_eq!(seen, expected, "batches and owned events tell the same story, in the same order");
    assert!(borrowed.next_batch_timeout(Duration::from_millis(100)).is_none(), "nothing more");
    node.shutdown().expect("shutdown");
}

#[test]
fn a_node_that_stops_ends_its_subscribers_streams() {
    for (event_cpus, threads) in [(EventCpus::Inline, 0), (EventCpus::These(vec![1]), 1)] {
        let mut node_config = config(&[0], 32 << 20);
        node_config.event_cpus = event_cpus.clone();
        let node = start(node_config);
        let mut client = client(&node);
        let stream = client.subscribe_events(None).expect("subscribe");
        client.put(b"before-stop", b"v").expect("put");
        let events = collect(&stream, |events| !events.is_empty());
        assert!(matches!(&events[..], [ShardEvent { event: Event::BlockStored { .. }, .. }]), "{events:?}");
        assert_eq!(node.event_sender_threads(), threads, "{event_cpus:?}");
        node.stop();
        // The stream reports its connection closed (rather than staying silent on a socket nobody serves),
        // and no sender thread outlives the node.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut ended = false;
        while !(ended && node.event_sender_threads() == 0) && Instant::now() < deadline {
            ended |= matches!(stream.next_timeout(Duration::from_millis(100)), Some(Err(_)));
        }
        assert!(ended, "the stream ended when the node stopped ({event_cpus:?})");
        assert_eq!(node.event_sender_threads(), 0, "{event_cpus:?}");
        node.shutdown().expect("shutdown");
    }
}

#[test]
fn a_chain_put_in_one_batch_arrives_as_chained_events() {
    let node = start(config(&[0], 32 << 20));
    let mut client = client(&node);
    let stream = client.subscribe_events(None).expect("subscribe");
    let chain: Vec<Vec<u8>> = (0..16).map(|index| format!("chain-block-{index}").into_bytes()).collect();
    let value: &[&[u8]] = &[b"kv"];
    let puts: Vec<strata_client::BlockPut<'_>> = chain
        .iter()
        .enumerate()
        .map(|(index, key)| strata_client::BlockPut {
            key,
            parts: value,
            links: strata_client::Links::parent(if index == 0 { b"prompt-root" } else { &chain[index - 1] }),
        })
        .collect();
    assert!(client.batch_put_blocks(&puts, Default::default()).iter().all(Result::is_ok));
    let events = collect(&stream, |events| blocks(events) >= chain.len());
    // Each block with the parent it named, in order, however the shard grouped them.
    let seen: Vec<(Vec<u8>, Option<Vec<u8>>)> = events
        .iter()
        .flat_map(|event| event.event.stored_blocks())
        .map(|(key, parent)| (key.to_vec(), parent.map(<[u8]>::to_vec)))
        .collect();
    let expected: Vec<(Vec<u8>, Option<Vec<u8>>)> = chain
        .iter()
        .enumerate()
        .map(|(index, key)| {
            (key.clone(), Some(if index == 0 { b"prompt-root".to_vec() } else { chain[index - 1].clone() }))
        })
        .collect();
    assert_eq!(seen, expected);
    // One batch, read by the subscriber at most a few times meanwhile: the chain came as chained events.
    assert!(
        events
            .iter()
            .any(|event| matches!(&event.event, Event::BlockStored { keys, chained: true, .. } if keys.len() > 1)),
        "{events:?}"
    );
    assert!(events.len() < chain.len(), "{} events for {} blocks", events.len(), chain.len());
    drop(stream);
    node.shutdown().expect("shutdown");
}
