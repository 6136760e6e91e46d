//! Shards over simulated namespaces for the engine's unit tests: one life at a time on an executor of its
//! own, a crash or a clean stop between lives, faults as each test sets them.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use glommio::{LocalExecutorBuilder, Placement};
use strata_nvme::{FaultConfig, VolatileDisk};
use strata_proto::{Links, Pin, PutOptions, Status, WritePolicy};

use super::Simulated;
use super::clock::SimClock;
use super::node::{Life, World};
use crate::config::EngineConfig;
use crate::record::FIRST_REGION_OFFSET;
use crate::shard::Shard;

/// Bytes per region of a test tier.
pub const REGION_BYTES: u64 = 128 << 10;

/// Regions of a test tier: 6 MiB, six times its DRAM.
const REGIONS: u64 = 48;

/// A one-shard node over one simulated namespace.
pub struct TestTier {
    /// The node's namespaces, clock and settings.
    pub world: World,
    lives: Cell<u64>,
}

impl TestTier {
    /// A node with 1 MiB of DRAM and 48 regions of 128 KiB, no read lease, `tune`d.
    pub fn new(tune: impl FnOnce(&mut EngineConfig)) -> Self {
        let mut config = EngineConfig {
            cpus: vec![0],
            dram_bytes: 1 << 20,
            hugepages: false,
            region_bytes: REGION_BYTES,
            read_lease: Duration::ZERO,
            metrics: None,
            stall_timeout: Duration::ZERO,
            ..EngineConfig::default()
        };
        tune(&mut config);
        let capacity = FIRST_REGION_OFFSET + REGIONS * REGION_BYTES;
        let world = World {
            config: Rc::new(config),
            disks: vec![VolatileDisk::new(capacity, 4096)],
            clock: SimClock::new(),
            faults: FaultConfig::default(),
            format_id: 0x5eed,
        };
        Self { world, lives: Cell::new(0) }
    }

    /// Starts the next life of the node on an executor of its own and runs `body` on its shard; the life
    /// ends with `body` (what it did not flush stays unflushed until [`TestTier::crash`]).
    pub fn life<T>(&self, body: impl AsyncFnOnce(Rc<Shard<Simulated>>, &Life) -> T) -> T {
        let life_number = self.lives.get();
        self.lives.set(life_number + 1);
        let executor = LocalExecutorBuilder::new(Placement::Unbound).io_memory(1 << 20).make().expect("an executor");
        executor.run(async {
            let life = self.world.start(life_number).await.expect("the node starts");
            let shard = Rc::clone(&life.shards[0]);
            body(shard, &life).await
        })
    }

    /// A power cut that loses every write since the last flush.
    pub fn crash(&self) {
        for disk in &self.world.disks {
            disk.crash_losing_unflushed();
        }
        self.world.clock.forget_timers();
    }

    /// The byte range of region `region` (the shard's numbering) on the namespace.
    pub fn region_range(&self, region: u32) -> std::ops::Range<u64> {
        let start = FIRST_REGION_OFFSET + u64::from(region) * REGION_BYTES;
        start..start + REGION_BYTES
    }

    /// Faults from now on.
    pub fn set_faults(&mut self, faults: FaultConfig) {
        self.world.faults = faults;
    }
}

/// `len` bytes derived from `seed`.
pub fn value(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|at| (at as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Upserts `key` = `value` with `policy` and `pin`; the status.
pub async fn put(
    shard: &Rc<Shard<Simulated>>,
    key: &[u8],
    value: &[u8],
    policy: WritePolicy,
    pin: Pin,
) -> Result<(), Status> {
    let options = PutOptions { upsert: true, policy: Some(policy), pin, ..PutOptions::default() };
    shard.put_value(key, value, strata_proto::crc32c(value), options, Links::NONE).await.map_err(|error| error.status())
}

/// Upserts `key` = `value`, a child of `parent`, durably.
pub async fn put_child(shard: &Rc<Shard<Simulated>>, key: &[u8], value: &[u8], parent: &[u8]) -> Result<(), Status> {
    let options = PutOptions { upsert: true, policy: Some(WritePolicy::Durable), ..PutOptions::default() };
    shard
        .put_value(key, value, strata_proto::crc32c(value), options, Links::parent(parent))
        .await
        .map_err(|error| error.status())
}

/// Reads `key` whole.
pub async fn read(shard: &Rc<Shard<Simulated>>, key: &[u8]) -> Result<Vec<u8>, Status> {
    shard.get(key, None, Duration::ZERO).await.map(|hit| hit.slices().concat()).map_err(|error| error.status())
}

/// Puts `count` durable filler objects of `len` bytes (keys `filler-N` from `from`): enough of them seal
/// regions and make the log reclaim.
pub async fn fill(shard: &Rc<Shard<Simulated>>, from: usize, count: usize, len: usize) {
    for index in from..from + count {
        let key = format!("filler-{index}");
        put(shard, key.as_bytes(), &value(index as u8, len), WritePolicy::Durable, Pin::None).await.expect("filler");
    }
}
