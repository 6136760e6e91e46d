//! The run of one seed: the node's shape, its lives (each on a fresh executor, ended by a crash, a clean
//! stop or the last step), the steps of each life, and the checks after each.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::rc::Rc;
use std::time::Duration;

use glommio::{LocalExecutorBuilder, Placement};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use strata_nvme::{FaultConfig, VolatileDisk};
use strata_proto::{Event, Pin, RemovalReason, Status, WritePolicy};

use super::clock::SimClock;
use super::model::{KeyState, VALUE_HEADER_BYTES, Version};
use super::node::{Life, World};
use super::ops::{Leniency, Op, Outcome, check_read, execute, key_name, key_number};
use crate::config::EngineConfig;
use crate::record::FIRST_REGION_OFFSET;

/// What a seed's run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimReport {
    /// The seed.
    pub seed: u64,
    /// Shards of the simulated node.
    pub shards: u32,
    /// Steps run.
    pub steps: usize,
    /// Lives of the node (starts).
    pub lives: u64,
    /// Crashes.
    pub crashes: u64,
    /// Clean stops.
    pub clean_stops: u64,
    /// Operations run.
    pub operations: u64,
    /// Puts acknowledged.
    pub puts_acknowledged: u64,
    /// Reads (gets and lookups) that found their key.
    pub found: u64,
    /// Keys the node reported gone (evictions, cascades), or lost to damage recovery counted.
    pub reported_gone: u64,
    /// Operations that failed with an error status (faults).
    pub errors: u64,
    /// A hash of every result in order: two runs of one seed have the same.
    pub fingerprint: u64,
}

/// A check that failed: the seed that replays it, the step, what was wrong, and the steps before it.
#[derive(Clone, Debug)]
pub struct SimFailure {
    /// The seed.
    pub seed: u64,
    /// The step at which the check failed.
    pub step: usize,
    /// What the node did wrong.
    pub message: String,
    /// The last steps, oldest first.
    pub trace: Vec<String>,
}

impl std::fmt::Display for SimFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "seed {} failed at step {}: {}", self.seed, self.step, self.message)?;
        writeln!(f, "last steps:")?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        write!(f, "replay: cargo run -p strata-engine --example simulate -- --seed {}", self.seed)
    }
}

/// How a life ended.
enum End {
    /// The node crashed: the writes not yet flushed keep all, none or some of their blocks.
    Crash,
    /// The node stopped cleanly.
    Clean,
    /// The last step ran.
    Done,
}

/// Lines of the trace kept for a failure's report, unless `STRATA_SIM_TRACE_LINES` says otherwise.
const TRACE_LINES: usize = 60;

/// Runs seed `seed` for `steps` steps; the report, or the first check that failed.
pub fn simulate(seed: u64, steps: usize) -> Result<SimReport, SimFailure> {
    let mut sim = Sim::new(seed, steps);
    loop {
        let executor = LocalExecutorBuilder::new(Placement::Unbound)
            .name("strata-sim")
            .io_memory(1 << 20)
            .make()
            .map_err(|error| sim.failure(format!("starting an executor: {error}")))?;
        let end = executor.run(sim.life());
        drop(executor);
        match end? {
            End::Done => return Ok(sim.finish()),
            End::Crash => sim.crash(),
            End::Clean => sim.clean_stop()?,
        }
    }
}

/// One seed's run.
struct Sim {
    rng: ChaCha8Rng,
    world: World,
    keys: Vec<KeyState>,
    /// The parents that each key's readable versions name.
    parents: Vec<Vec<u32>>,
    next_version: Vec<u32>,
    /// Keys reported gone since the batch began: the order of an event and an operation that finished in
    /// the same batch is not known, so a put acknowledged in it may have left already.
    gone: Vec<bool>,
    steps: usize,
    step: usize,
    faulty: bool,
    corrupting: bool,
    value_max: u32,
    report: SimReport,
    trace: VecDeque<String>,
    trace_lines: usize,
    fingerprint: std::collections::hash_map::DefaultHasher,
}

impl Sim {
    fn new(seed: u64, steps: usize) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let shards = rng.random_range(1..=3u32);
        let namespaces = rng.random_range(1..=2usize);
        let region_bytes: u64 = 128 << 10;
        let dram_per_shard = rng.random_range(1u64..=3) * (768 << 10);
        // A tier of 2 to 5 times DRAM, in regions dealt to the shards.
        let tier_per_shard = dram_per_shard * rng.random_range(2..=5u64);
        let regions_per_namespace = u64::from(shards) * (tier_per_shard / region_bytes) / namespaces as u64 + 2;
        let block_bytes = if rng.random_bool(0.5) { 4096 } else { 512 };
        let faulty = rng.random_bool(0.3);
        // Some faulty seeds also damage the medium at crashes: flipped bytes in the regions.
        let corrupting = faulty && rng.random_bool(0.5);
        let config = EngineConfig {
            cpus: (0..shards as usize).collect(),
            dram_bytes: u64::from(shards) * dram_per_shard,
            hugepages: false,
            region_bytes,
            region_buffers: rng.random_range(2..=3),
            write_policy: [WritePolicy::Durable, WritePolicy::WriteThrough, WritePolicy::WriteBack]
                [rng.random_range(0..3usize)],
            read_lease: Duration::from_millis(rng.random_range(0..=1000)),
            promote_window: Duration::from_millis(rng.random_range(0..=2000)),
            reinsert_window: Duration::from_millis(rng.random_range(0..=5000)),
            soft_pin_ttl: Duration::from_secs(rng.random_range(1..=10)),
            max_pinned_share: 0.3,
            event_log_bytes: 4 << 20,
            metrics: None,
            stall_timeout: Duration::ZERO,
            ..EngineConfig::default()
        };
        let capacity = FIRST_REGION_OFFSET + regions_per_namespace * region_bytes;
        let faults = FaultConfig {
            seed: rng.random(),
            error_probability: if faulty { rng.random_range(0.0002..0.002) } else { 0.0 },
            max_yields: rng.random_range(0..=3),
            ..FaultConfig::default()
        };
        let world = World {
            config: Rc::new(config),
            disks: (0..namespaces).map(|_| VolatileDisk::new(capacity, block_bytes)).collect(),
            clock: SimClock::new(),
            faults,
            format_id: rng.random(),
        };
        let key_count = rng.random_range(24..=96usize);
        let value_max = [256, 4 << 10, 40 << 10][rng.random_range(0..3usize)];
        Self {
            rng,
            world,
            keys: vec![KeyState::default(); key_count],
            parents: vec![Vec::new(); key_count],
            next_version: vec![1; key_count],
            gone: vec![false; key_count],
            steps,
            step: 0,
            faulty,
            corrupting,
            value_max,
            report: SimReport { seed, shards, ..SimReport::default() },
            trace: VecDeque::new(),
            trace_lines: std::env::var("STRATA_SIM_TRACE_LINES")
                .ok()
                .and_then(|lines| lines.parse().ok())
                .unwrap_or(TRACE_LINES),
            fingerprint: Default::default(),
        }
    }

    fn failure(&self, message: String) -> SimFailure {
        SimFailure { seed: self.report.seed, step: self.step, message, trace: self.trace.iter().cloned().collect() }
    }

    fn note(&mut self, line: String) {
        line.hash(&mut self.fingerprint);
        if self.trace.len() >= self.trace_lines {
            self.trace.pop_front();
        }
        self.trace.push_back(format!("{}: {line}", self.step));
    }

    fn finish(mut self) -> SimReport {
        self.report.steps = self.step;
        self.report.fingerprint = self.fingerprint.finish();
        self.report
    }

    fn shard_count(&self) -> u32 {
        self.world.config.cpus.len() as u32
    }

    fn shard_of(&self, key: u32) -> usize {
        strata_proto::shard_of(&key_name(key), self.shard_count()) as usize
    }

    /// One life of the node, on the executor this runs on.
    async fn life(&mut self) -> Result<End, SimFailure> {
        let life = match self.world.start(self.report.lives).await {
            Ok(life) => life,
            // A start may fail on an injected fault (a seal it must write at recovery): try another life.
            Err(error) if self.faulty => {
                self.note(format!("start failed: {error}"));
                self.report.lives += 1;
                self.crash_disks();
                return Ok(End::Crash);
            }
            Err(error) => return Err(self.failure(format!("the node did not start: {error}"))),
        };
        self.report.lives += 1;
        self.after_recovery(&life)?;
        self.drain_events(&life)?;
        self.verify_all(&life).await?;
        while self.step < self.steps {
            self.step += 1;
            match self.rng.random_range(0..100u32) {
                0..=74 => self.batch(&life).await?,
                75..=84 => {
                    let by = Duration::from_millis(self.rng.random_range(1..=3000));
                    self.note(format!("clock +{by:?}"));
                    self.world.clock.advance(by);
                }
                85..=94 => self.verify_all(&life).await?,
                95..=97 => {
                    self.crash_mid_batch(&life).await?;
                    return Ok(End::Crash);
                }
                _ => {
                    self.note("clean stop".into());
                    for shard in life.shards.iter() {
                        shard.flush_for_shutdown().await;
                    }
                    // Writing what was dirty may have reclaimed and evicted; and what the tier would not
                    // take leaves with the node, pinned or not.
                    for key in &mut self.keys {
                        key.hard_pinned = false;
                    }
                    self.drain_events(&life)?;
                    self.note_copies_taken(&life);
                    self.stop_cleanly()?;
                    return Ok(End::Clean);
                }
            }
        }
        self.verify_all(&life).await?;
        Ok(End::Done)
    }

    /// The power cut, at the crash point, inside the life: each namespace keeps what its unflushed writes
    /// left, and the handles of this life fail from now on (the tasks that still run before the executor
    /// stops change nothing on the namespaces). A durable key whose copy the shard no longer places on the
    /// tier (reclaim took it while it was in DRAM) may be gone.
    fn cut_power(&mut self, life: &Life) {
        self.note_copies_taken(life);
        self.crash_disks();
    }

    /// A durable key whose copy the shard no longer places on the tier (a reclaim took it while it was in
    /// DRAM, and it was not written again) is durable no more.
    fn note_copies_taken(&mut self, life: &Life) {
        for key in 0..self.keys.len() as u32 {
            let shard = &life.shards[self.shard_of(key)];
            let state = &mut self.keys[key as usize];
            if state.durable && state.acked.is_some() && !shard.has_tier_copy(&key_name(key)) {
                state.durable = false;
            }
        }
    }

    /// Each namespace keeps what its unflushed writes left; the handles opened so far fail from now on.
    /// A corrupting seed may also flip a few bytes of the regions.
    fn crash_disks(&mut self) {
        for index in 0..self.world.disks.len() {
            let report = self.world.disks[index].crash(self.rng.random());
            let line =
                format!("crash: {} unflushed writes kept, {} torn, {} lost", report.kept, report.torn, report.lost);
            self.note(line);
            if self.corrupting && self.rng.random_bool(0.5) {
                for _ in 0..self.rng.random_range(1..=3) {
                    let offset = self.rng.random_range(FIRST_REGION_OFFSET..self.world.disks[index].capacity_bytes());
                    let mask = self.rng.random_range(1..=255u8);
                    self.world.disks[index].corrupt(offset, mask);
                    self.note(format!("namespace {index}: byte {offset} flipped by {mask:#04x}"));
                }
            }
        }
    }

    /// After a crash: every key whose acknowledgement promised no durability may be gone.
    fn crash(&mut self) {
        self.world.clock.forget_timers();
        for key in &mut self.keys {
            key.crashed(false);
            key.hard_pinned = false;
        }
        self.report.crashes += 1;
    }

    /// The end of a clean stop, inside the life: nothing is left unflushed (unless a fault stopped a
    /// write), and the handles of this life fail from now on.
    fn stop_cleanly(&mut self) -> Result<(), SimFailure> {
        let unflushed: usize = self.world.disks.iter().map(VolatileDisk::unflushed_writes).sum();
        if unflushed > 0 && !self.faulty {
            return Err(self.failure(format!("a clean stop left {unflushed} writes unflushed")));
        }
        self.crash_disks();
        Ok(())
    }

    /// After a clean stop nothing acknowledged is lost, unless a fault stopped a write.
    fn clean_stop(&mut self) -> Result<(), SimFailure> {
        self.world.clock.forget_timers();
        for key in &mut self.keys {
            key.hard_pinned = false;
            if self.faulty {
                key.crashed(false);
            }
        }
        self.report.clean_stops += 1;
        Ok(())
    }

    /// Every key of a shard whose recovery counted damage may be gone; a clean stop without faults must
    /// leave nothing to lose.
    fn after_recovery(&mut self, life: &Life) -> Result<(), SimFailure> {
        for (shard, report) in life.reports.iter().enumerate() {
            self.note(format!("shard {shard} recovered: {report:?}"));
            if report.lost_records + report.lost_regions + report.dropped_keys == 0 {
                continue;
            }
            if !self.faulty && self.report.crashes == 0 {
                return Err(self.failure(format!("shard {shard}'s recovery lost data with no crash: {report:?}")));
            }
            for key in 0..self.keys.len() as u32 {
                if self.shard_of(key) == shard {
                    self.keys[key as usize].left();
                    self.report.reported_gone += 1;
                }
            }
        }
        Ok(())
    }

    /// Picks an operation on a key not in `taken`.
    fn pick_op(&mut self, taken: &mut Vec<u32>) -> Option<Op> {
        let key_count = self.keys.len() as u32;
        let key = (0..8).map(|_| self.rng.random_range(0..key_count)).find(|key| !taken.contains(key))?;
        let op = match self.rng.random_range(0..100u32) {
            0..=29 => self.pick_put(key, false),
            30..=44 => self.pick_put(key, true),
            45..=54 => Op::Remove { key },
            55..=79 => {
                let range = self.pick_range(key);
                Op::Get { key, range }
            }
            80..=89 => Op::Exists { key },
            _ => {
                let len = self.rng.random_range(2..=6u32);
                let keys: Vec<u32> = (key..(key + len).min(key_count)).filter(|key| !taken.contains(key)).collect();
                Op::Chain { keys }
            }
        };
        taken.extend(op.keys());
        Some(op)
    }

    fn pick_put(&mut self, key: u32, upsert: bool) -> Op {
        let number = self.next_version[key as usize];
        self.next_version[key as usize] += 1;
        let len = self.rng.random_range(VALUE_HEADER_BYTES as u32..=self.value_max.max(VALUE_HEADER_BYTES as u32));
        let policy = match self.rng.random_range(0..4u32) {
            0 => None,
            1 => Some(WritePolicy::Durable),
            2 => Some(WritePolicy::WriteThrough),
            _ => Some(WritePolicy::WriteBack),
        };
        let pin = match self.rng.random_range(0..20u32) {
            0 => Pin::Hard,
            1 => Pin::Soft { ttl_seconds: self.rng.random_range(0..=5) },
            _ => Pin::None,
        };
        let parent = (key > 0 && self.rng.random_bool(0.15)).then(|| key - 1);
        Op::Put { key, version: Version { number, len }, upsert, policy, pin, parent }
    }

    /// A range within every version a read of `key` may return, or the whole value.
    fn pick_range(&mut self, key: u32) -> Option<(u32, u32)> {
        let shortest = self.keys[key as usize].readable().map(|version| version.len).min()?;
        if !self.rng.random_bool(0.3) {
            return None;
        }
        let offset = self.rng.random_range(0..shortest);
        Some((offset, self.rng.random_range(0..=shortest - offset)))
    }

    fn pick_batch(&mut self) -> Vec<Op> {
        let mut taken = Vec::new();
        let count = self.rng.random_range(1..=4);
        (0..count).filter_map(|_| self.pick_op(&mut taken)).collect()
    }

    /// Runs a few operations on distinct keys at once, to completion, and checks them.
    async fn batch(&mut self, life: &Life) -> Result<(), SimFailure> {
        let ops = self.pick_batch();
        let tasks: Vec<_> =
            ops.iter().map(|op| glommio::spawn_local(execute(Rc::clone(&life.shards), op.clone()))).collect();
        let mut outcomes = Vec::with_capacity(tasks.len());
        for task in tasks {
            outcomes.push(task.await);
        }
        self.gone.fill(false);
        self.drain_events(life)?;
        for (op, outcome) in ops.iter().zip(&outcomes) {
            self.apply(op, outcome)?;
        }
        Ok(())
    }

    /// Starts a batch and crashes after a random number of turns of the executor: what finished is
    /// checked, what did not is in doubt.
    async fn crash_mid_batch(&mut self, life: &Life) -> Result<(), SimFailure> {
        let ops = self.pick_batch();
        let done: Rc<RefCell<Vec<Option<Outcome>>>> = Rc::new(RefCell::new(ops.iter().map(|_| None).collect()));
        for (index, op) in ops.iter().enumerate() {
            let (shards, done, op) = (Rc::clone(&life.shards), Rc::clone(&done), op.clone());
            glommio::spawn_local(async move {
                let outcome = execute(shards, op).await;
                // After the crash point the slots are gone: what finishes then is in doubt, as it was.
                if let Some(slot) = done.borrow_mut().get_mut(index) {
                    *slot = Some(outcome);
                }
            })
            .detach();
        }
        for _ in 0..self.rng.random_range(0..40) {
            futures_lite::future::yield_now().await;
        }
        let done = std::mem::take(&mut *done.borrow_mut());
        self.gone.fill(false);
        self.drain_events(life)?;
        self.cut_power(life);
        for (op, outcome) in ops.iter().zip(done) {
            match outcome {
                Some(outcome) => self.apply(op, &outcome)?,
                None => {
                    self.note(format!("{op:?} cut off by the crash"));
                    match op {
                        Op::Put { key, version, parent, .. } => {
                            self.keys[*key as usize].put_in_doubt(*version);
                            self.parents[*key as usize].extend(parent);
                        }
                        Op::Remove { key } => self.remove_in_doubt(*key),
                        _ => {}
                    }
                }
            }
        }
        Ok(())
    }

    /// Checks an operation's outcome and records what it changed.
    fn apply(&mut self, op: &Op, outcome: &Outcome) -> Result<(), SimFailure> {
        self.report.operations += 1;
        self.note(format!("{op:?} -> {}", describe(outcome)));
        let keys = &self.keys;
        let leniency = Leniency { faults: self.faulty };
        check_read(op, outcome, &|key| keys[key as usize].clone(), leniency)
            .map_err(|message| self.failure(message))?;
        self.count(outcome);
        match (op, outcome) {
            (Op::Put { key, version, upsert, policy, pin, parent }, Outcome::Put(result)) => {
                let state = &self.keys[*key as usize];
                match result {
                    Ok(()) if !upsert && !state.allows_miss() => {
                        return Err(self.failure(format!("key {key}: a put succeeded over a stored key ({state:?})")));
                    }
                    Ok(()) => {
                        let durable = policy.unwrap_or(self.world.config.write_policy) == WritePolicy::Durable;
                        self.keys[*key as usize].put_acked(*version, durable, *pin == Pin::Hard);
                        self.parents[*key as usize] = parent.iter().copied().collect();
                        self.report.puts_acknowledged += 1;
                        if self.gone[*key as usize] {
                            self.keys[*key as usize].left();
                        }
                    }
                    Err(Status::Exists) if !upsert && state.may_exist() => {}
                    Err(Status::Exists) => {
                        return Err(self.failure(format!("key {key}: EXISTS for a key that is not stored ({state:?})")));
                    }
                    Err(_) => {
                        self.keys[*key as usize].put_in_doubt(*version);
                        self.parents[*key as usize].extend(parent);
                    }
                }
            }
            (Op::Remove { key }, Outcome::Remove(result)) => {
                let state = &self.keys[*key as usize];
                match result {
                    Ok(()) if !state.may_exist() => {
                        return Err(self.failure(format!("key {key}: removed a key that is not stored ({state:?})")));
                    }
                    Ok(()) => {
                        self.keys[*key as usize].remove_acked();
                        self.children_leave(*key);
                    }
                    Err(Status::NotFound) if state.allows_miss() => {}
                    Err(Status::NotFound) => {
                        return Err(self.failure(format!("key {key}: a removal found no stored key ({state:?})")));
                    }
                    Err(_) => self.remove_in_doubt(*key),
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn count(&mut self, outcome: &Outcome) {
        let statuses: Vec<Status> = match outcome {
            Outcome::Put(result) | Outcome::Remove(result) => vec![result.err().unwrap_or(Status::Ok)],
            Outcome::Get(result) => vec![result.as_ref().err().copied().unwrap_or(Status::Ok)],
            Outcome::Exists(result) => vec![result.err().unwrap_or(Status::Ok)],
            Outcome::Chain(results) => results.iter().map(|result| result.err().unwrap_or(Status::Ok)).collect(),
        };
        for status in statuses {
            match status {
                Status::Ok if !matches!(outcome, Outcome::Put(_) | Outcome::Remove(_)) => self.report.found += 1,
                Status::Io | Status::Checksum => self.report.errors += 1,
                _ => {}
            }
        }
    }

    fn remove_in_doubt(&mut self, key: u32) {
        self.keys[key as usize].remove_in_doubt();
        self.children_leave(key);
    }

    /// `key` left or may have: the keys that name it as their parent (and theirs, and so on) may leave
    /// too, by a cascade that runs when it runs.
    fn children_leave(&mut self, key: u32) {
        let mut leaving = vec![key];
        let mut visited = vec![false; self.keys.len()];
        visited[key as usize] = true;
        while let Some(parent) = leaving.pop() {
            for child in 0..self.keys.len() as u32 {
                if self.parents[child as usize].contains(&parent) && !visited[child as usize] {
                    visited[child as usize] = true;
                    self.keys[child as usize].left();
                    self.gone[child as usize] = true;
                    leaving.push(child);
                }
            }
        }
    }

    /// Reads every shard's new events: a key reported gone may be missed from now on.
    fn drain_events(&mut self, life: &Life) -> Result<(), SimFailure> {
        for (shard, (subscription, cursor)) in life.shards.iter().zip(life.subscriptions.iter()) {
            let mut frame = Vec::new();
            loop {
                frame.clear();
                let (count, next) = shard.events().borrow_mut().read(cursor.get(), None, 0, 1 << 20, &mut frame);
                cursor.set(next);
                subscription.consumed(next);
                if count == 0 {
                    break;
                }
                let mut bytes = &frame[..];
                while !bytes.is_empty() {
                    let (event, _, used) = Event::decode(bytes).map_err(|error| {
                        self.failure(format!("shard {}: an event that does not decode: {error}", shard.id))
                    })?;
                    bytes = &bytes[used..];
                    self.on_event(shard.id, event)?;
                }
            }
        }
        Ok(())
    }

    fn on_event(&mut self, shard: u32, event: Event) -> Result<(), SimFailure> {
        match event {
            Event::BlockRemoved { keys, reason } if reason != RemovalReason::Removed => {
                for key in keys.iter().filter_map(|name| key_number(name)) {
                    if reason == RemovalReason::Evicted && self.keys[key as usize].hard_pinned {
                        let state = self.keys[key as usize].clone();
                        return Err(self.failure(format!("key {key}: hard-pinned, yet evicted ({state:?})")));
                    }
                    self.note(format!("key {key} left: {reason:?}"));
                    self.keys[key as usize].left();
                    self.gone[key as usize] = true;
                    self.children_leave(key);
                    self.report.reported_gone += 1;
                }
            }
            Event::Lagged { .. } => {
                self.note(format!("shard {shard}: events lagged or records lost"));
                for key in 0..self.keys.len() as u32 {
                    if self.shard_of(key) == shard as usize {
                        self.keys[key as usize].left();
                        self.gone[key as usize] = true;
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Reads every key whole and checks it; then that the shards count the objects the reads found.
    async fn verify_all(&mut self, life: &Life) -> Result<(), SimFailure> {
        for shard in life.shards.iter() {
            shard.cascades_settled().await;
        }
        self.drain_events(life)?;
        let gone_before = self.report.reported_gone;
        let mut found = 0u64;
        for key in 0..self.keys.len() as u32 {
            let op = Op::Get { key, range: None };
            let outcome = execute(Rc::clone(&life.shards), op.clone()).await;
            if matches!(outcome, Outcome::Get(Ok(_))) {
                found += 1;
            }
            // A read may promote, and a promotion evict: what left before this read is known before it is
            // checked.
            self.drain_events(life)?;
            self.apply(&op, &outcome)?;
        }
        self.drain_events(life)?;
        let indexed: u64 = life.shards.iter().map(|shard| shard.object_count() as u64).sum();
        let gauged: u64 = life
            .shards
            .iter()
            .map(|shard| shard.metrics.index_objects.load(std::sync::atomic::Ordering::Relaxed))
            .sum();
        // A cascade may still run while the keys are read (a peer's departures arrive when they arrive): the
        // counts are compared when nothing left meanwhile.
        let quiet = self.report.reported_gone == gone_before;
        if !self.faulty && quiet && (indexed != found || gauged != found) {
            return Err(self.failure(format!(
                "the shards index {indexed} objects (gauge: {gauged}) but reads of every key found {found}"
            )));
        }
        Ok(())
    }
}

/// An outcome for the trace (a read's bytes by their length and the version they name).
fn describe(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Get(Ok((bytes, _, len))) => {
            format!("{} bytes of a {len}-byte value ({:?})", bytes.len(), super::model::identify(bytes))
        }
        other => format!("{other:?}"),
    }
}
