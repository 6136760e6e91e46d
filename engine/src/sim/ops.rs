//! The operations a simulation runs on a shard, what each returned, and the check of each result against
//! the model.

use std::rc::Rc;
use std::time::Duration;

use strata_proto::{Links, Pin, PutOptions, Status, WritePolicy};

use super::Simulated;
use super::model::{KeyState, Version, identify, value_of};
use crate::error::EngineError;
use crate::shard::Shard;

/// The key of key number `key`.
pub fn key_name(key: u32) -> Vec<u8> {
    format!("key-{key:05}").into_bytes()
}

/// The key number of a key the simulation wrote.
pub fn key_number(name: &[u8]) -> Option<u32> {
    std::str::from_utf8(name.strip_prefix(b"key-")?).ok()?.parse().ok()
}

/// One operation on one key (or, for a chain, on several keys in order).
#[derive(Clone, Debug)]
pub enum Op {
    /// Stores `version` of `key` (an upsert replaces a stored version; a put refuses to).
    Put {
        /// The key.
        key: u32,
        /// The version written.
        version: Version,
        /// Replace a stored version.
        upsert: bool,
        /// Its write policy (none: the node's).
        policy: Option<WritePolicy>,
        /// Its pin.
        pin: Pin,
        /// The key it names as its parent, if any.
        parent: Option<u32>,
    },
    /// Removes `key`.
    Remove {
        /// The key.
        key: u32,
    },
    /// Reads `key`, whole or a range of it.
    Get {
        /// The key.
        key: u32,
        /// `(offset, length)` of the value, or the whole value.
        range: Option<(u32, u32)>,
    },
    /// Looks `key` up (the index alone).
    Exists {
        /// The key.
        key: u32,
    },
    /// Looks keys up in order with a read lease, stopping at the first miss (a prefix match).
    Chain {
        /// The keys.
        keys: Vec<u32>,
    },
}

impl Op {
    /// The keys it touches.
    pub fn keys(&self) -> Vec<u32> {
        match self {
            Op::Put { key, .. } | Op::Remove { key } | Op::Get { key, .. } | Op::Exists { key } => vec![*key],
            Op::Chain { keys } => keys.clone(),
        }
    }
}

/// What an operation returned.
#[derive(Debug)]
pub enum Outcome {
    /// A put's status.
    Put(Result<(), Status>),
    /// A removal's status.
    Remove(Result<(), Status>),
    /// A read's bytes, their crc as the shard reported it and the whole value's length; or its status.
    Get(Result<(Vec<u8>, u32, u32), Status>),
    /// A lookup's value length, or its status.
    Exists(Result<u32, Status>),
    /// Each looked-up key's value length or status, up to and with the first miss.
    Chain(Vec<Result<u32, Status>>),
}

/// What a client is told of `error`: the model compares statuses.
fn status(error: EngineError) -> Status {
    error.status()
}

/// Runs `op` on the shards of its keys (`shards`, by id), as a client that routes by the shard map does.
pub async fn execute(shards: Rc<Vec<Rc<Shard<Simulated>>>>, op: Op) -> Outcome {
    let shard_of = |key: u32| Rc::clone(&shards[strata_proto::shard_of(&key_name(key), shards.len() as u32) as usize]);
    let shard = shard_of(op.keys().first().copied().unwrap_or(0));
    match op {
        Op::Put { key, version, upsert, policy, pin, parent } => {
            let value = value_of(key, version.number, version.len as usize);
            let options = PutOptions { upsert, policy, pin, ..PutOptions::default() };
            let parent = parent.map(key_name);
            let links = Links { parent: parent.as_deref(), group: None };
            let crc = strata_proto::crc32c(&value);
            Outcome::Put(shard.put_value(&key_name(key), &value, crc, options, links).await.map_err(status))
        }
        Op::Remove { key } => Outcome::Remove(shard.remove(&key_name(key)).await.map_err(status)),
        Op::Get { key, range } => Outcome::Get(
            shard
                .get(&key_name(key), range, Duration::ZERO)
                .await
                .map(|hit| (hit.slices().concat(), hit.data_crc, hit.object_len))
                .map_err(status),
        ),
        Op::Exists { key } => Outcome::Exists(shard.exists(&key_name(key)).map_err(status)),
        Op::Chain { keys } => {
            let mut found = Vec::new();
            for key in keys {
                let result = shard_of(key).exists_leased(&key_name(key)).map_err(status);
                let miss = result.is_err();
                found.push(result);
                if miss {
                    break;
                }
            }
            Outcome::Chain(found)
        }
    }
}

/// Whether the node is allowed a typed error (an I/O error, a checksum failure) on this read: only when
/// faults are injected.
#[derive(Clone, Copy, Debug)]
pub struct Leniency {
    /// Faults are injected: reads may fail with an error status.
    pub faults: bool,
}

/// Checks a read-side outcome of `op` against the model's state of its key(s); writes are applied by the
/// caller. `Err` says what the node did wrong.
pub fn check_read(
    op: &Op,
    outcome: &Outcome,
    state: &dyn Fn(u32) -> KeyState,
    leniency: Leniency,
) -> Result<(), String> {
    match (op, outcome) {
        (Op::Get { key, range }, Outcome::Get(result)) => check_get(*key, *range, result, &state(*key), leniency),
        (Op::Exists { key }, Outcome::Exists(result)) => check_lookup(*key, result, &state(*key), leniency),
        (Op::Chain { keys }, Outcome::Chain(results)) => {
            for (key, result) in keys.iter().zip(results) {
                check_lookup(*key, result, &state(*key), leniency)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn check_get(
    key: u32,
    range: Option<(u32, u32)>,
    result: &Result<(Vec<u8>, u32, u32), Status>,
    state: &KeyState,
    leniency: Leniency,
) -> Result<(), String> {
    let (bytes, crc, object_len) = match result {
        Ok(hit) => hit,
        Err(status) => return check_status(key, *status, state, leniency),
    };
    if strata_proto::crc32c(bytes) != *crc {
        return Err(format!("key {key}: the bytes read do not match the crc the shard gave them"));
    }
    match range {
        None => {
            let Some((owner, version)) = identify(bytes) else {
                return Err(format!("key {key}: read {} bytes that are no value the simulation wrote", bytes.len()));
            };
            if owner != key {
                return Err(format!("key {key}: read key {owner}'s bytes"));
            }
            if !state.allows(version) {
                return Err(format!("key {key}: read version {version}, which is superseded or removed ({state:?})"));
            }
            if *object_len as usize != bytes.len() {
                return Err(format!("key {key}: object length {object_len} for {} bytes", bytes.len()));
            }
            Ok(())
        }
        Some((offset, len)) => {
            let matches = state.readable().any(|version| {
                let value = value_of(key, version.number, version.len as usize);
                version.len == *object_len
                    && value.get(offset as usize..(offset + len) as usize).is_some_and(|part| part == bytes.as_slice())
            });
            if matches {
                Ok(())
            } else {
                Err(format!("key {key}: range {offset}+{len} matches no version a read may return ({state:?})"))
            }
        }
    }
}

fn check_lookup(key: u32, result: &Result<u32, Status>, state: &KeyState, leniency: Leniency) -> Result<(), String> {
    match result {
        Ok(len) if state.readable().any(|version| version.len == *len) => Ok(()),
        Ok(len) => Err(format!("key {key}: a lookup found a {len}-byte value no read may return ({state:?})")),
        Err(status) => check_status(key, *status, state, leniency),
    }
}

fn check_status(key: u32, status: Status, state: &KeyState, leniency: Leniency) -> Result<(), String> {
    match status {
        Status::NotFound if state.allows_miss() => Ok(()),
        Status::NotFound => Err(format!("key {key}: missing, yet acknowledged and never reported gone ({state:?})")),
        Status::Io | Status::Checksum if leniency.faults => Ok(()),
        other => Err(format!("key {key}: status {} ({state:?})", other.name())),
    }
}
