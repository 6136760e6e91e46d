//! `ProgressivePut`: a put whose value is sent part by part as a prefill computes its layers (Strata's own;
//! Mooncake has no such call). Each part is readable on the node (`get_range_into`) once it arrived.

use std::sync::{Arc, Mutex};

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use strata_client::ClientError;

use crate::buffers::{Registry, object_bytes};
use crate::codes;

/// Where a progressive put stands.
pub enum State {
    /// Parts still to send or the answer to read.
    Open(strata_client::ProgressivePut),
    /// It failed with this code (every later call returns it).
    Failed(i64),
    /// Finished.
    Done,
}

/// A put in progress, from `StrataStore.put_progressive(key, sizes, ...)`: `send(part)` or
/// `send_from(buffer_ptr, size)` for each part in order, then `finish()`. Each returns 0 or a negative code;
/// after a failure every call returns that code. Dropped unfinished, the node discards the partial value.
#[pyclass(module = "strata._strata")]
pub struct ProgressivePut {
    state: Mutex<State>,
    registry: Arc<Registry>,
}

impl ProgressivePut {
    /// A put in `state`, reading registered buffers from `registry`.
    pub fn new(state: State, registry: Arc<Registry>) -> Self {
        Self { state: Mutex::new(state), registry }
    }

    fn send_bytes(&self, py: Python<'_>, part: &[u8]) -> i64 {
        py.detach(|| {
            let mut state = self.state.lock().unwrap_or_else(|poison| poison.into_inner());
            match &mut *state {
                State::Open(put) => match put.send_part(part) {
                    Ok(()) => codes::OK,
                    // A part of the wrong length is refused before anything is sent: the put goes on.
                    Err(error @ ClientError::Invalid(_)) => codes::of(&error),
                    Err(error) => {
                        let code = codes::of(&error);
                        *state = State::Failed(code);
                        code
                    }
                },
                State::Failed(code) => *code,
                State::Done => codes::INVALID_PARAMS,
            }
        })
    }
}

#[pymethods]
impl ProgressivePut {
    /// Sends the next part (bytes or any C-contiguous buffer of the announced size).
    fn send(&self, py: Python<'_>, part: &Bound<'_, PyAny>) -> PyResult<i64> {
        let buffer = PyUntypedBuffer::get(part)?;
        let Some(bytes) = object_bytes(&buffer) else {
            return Err(PyValueError::new_err("a part must be a C-contiguous buffer"));
        };
        Ok(self.send_bytes(py, bytes))
    }

    /// Sends the next part from the registered buffer at `buffer_ptr` (`size` bytes).
    fn send_from(&self, py: Python<'_>, buffer_ptr: usize, size: usize) -> i64 {
        match self.registry.read(buffer_ptr, size) {
            Some(bytes) => self.send_bytes(py, bytes),
            None => codes::INVALID_PARAMS,
        }
    }

    /// Waits for the node's answer once every part is sent: 0 when stored, else a negative code.
    fn finish(&self, py: Python<'_>) -> i64 {
        py.detach(|| {
            let mut state = self.state.lock().unwrap_or_else(|poison| poison.into_inner());
            match std::mem::replace(&mut *state, State::Done) {
                State::Open(put) if put.parts_sent() < put.part_count() => {
                    *state = State::Open(put);
                    codes::INVALID_PARAMS
                }
                State::Open(put) => codes::of_unit(&put.finish()),
                State::Failed(code) => {
                    *state = State::Failed(code);
                    code
                }
                State::Done => codes::INVALID_PARAMS,
            }
        })
    }

    /// Parts sent so far.
    fn parts_sent(&self) -> usize {
        match &*self.state.lock().unwrap_or_else(|poison| poison.into_inner()) {
            State::Open(put) => put.parts_sent(),
            _ => 0,
        }
    }
}
