//! `EventSubscription`: the node's cache events as Python dicts, in the vocabulary of vLLM's KV events.

use std::sync::Mutex;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};
use strata_client::{Event, EventStream, RemovalReason, ShardEvent, Tier};

use crate::codes;

/// A live subscription (from `StrataStore.subscribe_events`).
#[pyclass(module = "strata._strata")]
pub struct EventSubscription {
    stream: Mutex<Option<EventStream>>,
}

impl EventSubscription {
    pub fn new(stream: EventStream) -> Self {
        Self { stream: Mutex::new(Some(stream)) }
    }
}

fn tier_name(tier: Tier) -> &'static str {
    match tier {
        Tier::None => "none",
        Tier::Dram => "dram",
        Tier::Nvme => "nvme",
    }
}

fn reason_name(reason: RemovalReason) -> &'static str {
    match reason {
        RemovalReason::Removed => "removed",
        RemovalReason::Evicted => "evicted",
        RemovalReason::Checksum => "checksum",
        RemovalReason::StorageError => "storage_error",
        RemovalReason::Cascaded => "cascaded",
    }
}

/// A key as Python sees keys: `str` when it is UTF-8 (Mooncake's keys are), else `bytes`.
fn key_object<'py>(py: Python<'py>, key: &[u8]) -> Bound<'py, PyAny> {
    match std::str::from_utf8(key) {
        Ok(text) => PyString::new(py, text).into_any(),
        Err(_) => PyBytes::new(py, key).into_any(),
    }
}

fn event_dict<'py>(py: Python<'py>, event: &ShardEvent) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("node", &*event.node)?;
    dict.set_item("shard", event.shard)?;
    dict.set_item("sequence", event.sequence)?;
    match &event.event {
        Event::BlockStored { keys, parent, chained, size, tier } => {
            dict.set_item("type", "BlockStored")?;
            dict.set_item("keys", PyList::new(py, keys.iter().map(|key| key_object(py, key)))?)?;
            dict.set_item("parent", parent.as_deref().map(|parent| key_object(py, parent)))?;
            dict.set_item("chained", *chained)?;
            dict.set_item("size", *size)?;
            dict.set_item("tier", tier_name(*tier))?;
        }
        Event::BlockRemoved { keys, reason } => {
            dict.set_item("type", "BlockRemoved")?;
            dict.set_item("keys", PyList::new(py, keys.iter().map(|key| key_object(py, key)))?)?;
            dict.set_item("reason", reason_name(*reason))?;
        }
        Event::TierChanged { key, from, to } => {
            dict.set_item("type", "TierChanged")?;
            dict.set_item("key", key_object(py, key))?;
            dict.set_item("from", tier_name(*from))?;
            dict.set_item("to", tier_name(*to))?;
        }
        Event::Lagged { missed } => {
            dict.set_item("type", "Lagged")?;
            dict.set_item("missed", *missed)?;
        }
    }
    Ok(dict)
}

fn error_dict<'py>(py: Python<'py>, code: i64) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("type", "Error")?;
    dict.set_item("code", code)?;
    Ok(dict)
}

#[pymethods]
impl EventSubscription {
    /// The next event as a dict, waiting at most `timeout_seconds`; None if none came (or closed). Types:
    /// `BlockStored` {keys, parent, chained, size, tier} (chained: each key after the first names the one
    /// before it as its parent, as vLLM's `block_hashes`; else every key names `parent`), `BlockRemoved`
    /// {keys, reason}, `TierChanged` {key, from, to}, `Lagged` {missed} (events were lost: resync), `Error`
    /// {code} (a shard's stream ended).
    #[pyo3(signature = (timeout_seconds = 1.0))]
    fn next<'py>(&self, py: Python<'py>, timeout_seconds: f64) -> PyResult<Option<Bound<'py, PyDict>>> {
        let timeout = Duration::from_secs_f64(timeout_seconds.clamp(0.0, 3600.0));
        let received = py.detach(|| {
            let stream = self.stream.lock().unwrap_or_else(|poison| poison.into_inner());
            stream.as_ref().and_then(|stream| stream.next_timeout(timeout))
        });
        match received {
            None => Ok(None),
            Some(Ok(event)) => event_dict(py, &event).map(Some),
            Some(Err(error)) => error_dict(py, codes::of(&error)).map(Some),
        }
    }

    /// Every event queued now, without waiting.
    fn drain<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let events = {
            let stream = self.stream.lock().unwrap_or_else(|poison| poison.into_inner());
            stream.as_ref().map(EventStream::drain).unwrap_or_default()
        };
        events
            .iter()
            .map(|event| match event {
                Ok(event) => event_dict(py, event),
                Err(error) => error_dict(py, codes::of(error)),
            })
            .collect()
    }

    /// Ends the subscription (closes its connections); returns 0.
    fn close(&self, py: Python<'_>) -> i64 {
        py.detach(|| self.stream.lock().unwrap_or_else(|poison| poison.into_inner()).take());
        codes::OK
    }
}
