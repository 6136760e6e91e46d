//! A seeded simulation of a node, in the spirit of TigerBeetle's VOPR and foyer's fuzzy storage tests.
//!
//! The shards run the node's own code over [`Simulated`]: memory namespaces behind a volatile write cache
//! ([`strata_nvme::VolatileDisk`]) wrapped in [`strata_nvme::FaultDevice`] (I/O errors, and completions
//! reordered by seeded yields), and a clock that moves only when the simulation says ([`clock::SimClock`]).
//! One seed decides everything: the node's shape (shards, namespaces, DRAM, regions, write policy), the
//! faults, and a run of puts, upserts, removes, gets, ranged gets, lookups and prefix matches, pins, links
//! and clock moves, several at once on distinct keys, across shards, with crashes at random points (the
//! writes not yet flushed keep all, none or some of their blocks) and clean restarts.
//!
//! Every result is checked against a model of what must remain ([`model`]): acknowledged durable data
//! survives; no read returns another key's bytes, a superseded version, or a removed key; what left was
//! reported (events) or lost to damage that recovery counted; the shards' object counts agree with what
//! the reads find. A failure names its seed and the steps before it, and the seed replays exactly:
//! `scripts/simulate.sh SEEDS` runs any number, `cargo run -p strata-engine --example simulate -- --seed N`
//! replays one.

pub mod clock;
mod driver;
pub mod model;
mod node;
mod ops;
#[cfg(test)]
pub(crate) mod testing;

use strata_nvme::{FaultDevice, VolatileDevice};

use crate::backend::Backend;
pub use driver::{SimFailure, SimReport, simulate};

/// The simulation's backend: fault-injecting handles on memory namespaces, and the simulated clock.
pub struct Simulated;

impl Backend for Simulated {
    type Device = FaultDevice<VolatileDevice>;
    type Clock = clock::SimClock;
}
