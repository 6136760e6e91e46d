//! What an observed put costs the node in its event log, alone: a `BlockStored` key appended per put, and,
//! every 1,536 keys (about one 2 ms frame at the events row's put rate), the frame copied out for the
//! subscriber and marked sent, and the subscriber waiting again, as `server.rs` does. Keys shaped like
//! strata-bench's (`strata-bench/3/N`).
//! Run: `cargo bench -p strata-engine --bench event_log`.

use std::cell::RefCell;
use std::future::Future;
use std::hint::black_box;
use std::rc::Rc;
use std::task::{Context, Waker};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use strata_engine::events::{EventLog, Subscription};
use strata_proto::Tier;

const KEYS_PER_FRAME: usize = 1536;

fn observed_puts(criterion: &mut Criterion) {
    let keys: Vec<Vec<u8>> =
        (0..KEYS_PER_FRAME).map(|index| format!("strata-bench/3/{}", 100_000 + index).into_bytes()).collect();
    let log = Rc::new(RefCell::new(EventLog::new(8 << 20)));
    let (subscription, mut cursor) = Subscription::new(&log);
    let mut frame = Vec::with_capacity(256 << 10);
    let mut group = criterion.benchmark_group("event_log");
    group.throughput(Throughput::Elements(KEYS_PER_FRAME as u64));
    group.bench_function("stored_then_one_frame_sent", |bench| {
        bench.iter(|| {
            for key in &keys {
                log.borrow_mut().stored(black_box(key), None, 64, Tier::Dram);
            }
            frame.clear();
            let (count, next) = log.borrow_mut().read(cursor, None, 0, 256 << 10, &mut frame);
            black_box((count, &frame));
            cursor = next;
            subscription.consumed(cursor);
            // Caught up, the subscriber waits for the next event (registers its waker), as server.rs's does.
            let mut waiting = std::pin::pin!(subscription.changed(cursor));
            let pending = waiting.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            assert!(pending.is_pending());
        });
    });
    group.finish();
}

criterion_group!(benches, observed_puts);
criterion_main!(benches);
