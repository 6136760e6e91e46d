//! Raw addresses from Python (`register_buffer(ptr, size)`, then `get_into(key, ptr, size)`): the path
//! vLLM and SGLang use for pinned host and GPU-mapped memory. An address is only turned into a slice when
//! the whole range lies inside a buffer the caller registered, so a stray integer is an `INVALID_PARAMS`,
//! not a write to random memory. This is the crate's only `unsafe` module.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::Mutex;

/// The registered buffers: start address → length.
#[derive(Default)]
pub struct Registry {
    buffers: Mutex<BTreeMap<usize, usize>>,
}

impl Registry {
    /// Registers `[start, start + len)`; `false` if it is empty, wraps, or overlaps a registered buffer.
    pub fn register(&self, start: usize, len: usize) -> bool {
        let Some(end) = start.checked_add(len) else { return false };
        if start == 0 || len == 0 {
            return false;
        }
        let mut buffers = self.buffers.lock().unwrap_or_else(|poison| poison.into_inner());
        let before = buffers.range(..end).next_back().map(|(&other, &other_len)| other + other_len > start);
        if before == Some(true) {
            return false;
        }
        buffers.insert(start, len);
        true
    }

    /// Unregisters the buffer that starts at `start`; `false` if none does.
    pub fn unregister(&self, start: usize) -> bool {
        self.buffers.lock().unwrap_or_else(|poison| poison.into_inner()).remove(&start).is_some()
    }

    fn covers(&self, start: usize, len: usize) -> bool {
        covered(&self.buffers.lock().unwrap_or_else(|poison| poison.into_inner()), start, len)
    }

    /// `[start, start + len)` as a slice to read, if a registered buffer covers it.
    pub fn read(&self, start: usize, len: usize) -> Option<&'static [u8]> {
        if len == 0 {
            return Some(&[]);
        }
        // SAFETY: the range lies inside memory the caller registered as a buffer of its own and promised
        // (the contract of `register_buffer`, as in Mooncake) to keep valid until it unregisters it, and not
        // to free while an operation on it runs. The slice does not outlive the call that uses it.
        self.covers(start, len).then(|| unsafe { std::slice::from_raw_parts(start as *const u8, len) })
    }

    /// Each `(start, len)` as a slice to fill, if registered buffers cover them all (one lock for the
    /// whole batch).
    pub fn write_all(&self, ranges: &[(usize, usize)]) -> Option<Vec<&'static mut [u8]>> {
        {
            let buffers = self.buffers.lock().unwrap_or_else(|poison| poison.into_inner());
            if !ranges.iter().all(|&(start, len)| len == 0 || covered(&buffers, start, len)) {
                return None;
            }
        }
        // SAFETY: as in `write`: every range lies in memory the caller registered and hands to this call;
        // the caller checked that the ranges do not overlap (`disjoint`).
        Some(
            ranges
                .iter()
                .map(|&(start, len)| {
                    if len == 0 {
                        &mut [][..]
                    } else {
                        unsafe { std::slice::from_raw_parts_mut(start as *mut u8, len) }
                    }
                })
                .collect(),
        )
    }

    /// `[start, start + len)` as a slice to fill, if a registered buffer covers it.
    pub fn write(&self, start: usize, len: usize) -> Option<&'static mut [u8]> {
        if len == 0 {
            return Some(&mut []);
        }
        // SAFETY: as in `read`; the caller hands the range to this call to be written, and ranges of one
        // batch must not overlap (checked by `disjoint` before a batch uses them).
        self.covers(start, len).then(|| unsafe { std::slice::from_raw_parts_mut(start as *mut u8, len) })
    }
}

/// Whether one buffer of `buffers` holds all of `[start, start + len)`.
fn covered(buffers: &BTreeMap<usize, usize>, start: usize, len: usize) -> bool {
    let Some(end) = start.checked_add(len) else { return false };
    buffers.range(..=start).next_back().is_some_and(|(&base, &base_len)| end <= base + base_len)
}

/// Whether the ranges `(start, len)` are pairwise disjoint (two keys of one batch may not be read into the
/// same bytes: that would alias two mutable slices).
pub fn disjoint(ranges: &mut [(usize, usize)]) -> bool {
    ranges.sort_unstable();
    ranges.windows(2).all(|pair| pair[0].0.saturating_add(pair[0].1) <= pair[1].0)
}

/// The bytes of a Python buffer-protocol object (bytes, bytearray, memoryview, numpy), if C-contiguous.
pub fn object_bytes(buffer: &pyo3::buffer::PyUntypedBuffer) -> Option<&[u8]> {
    if !buffer.is_c_contiguous() {
        return None;
    }
    let len = buffer.len_bytes();
    if len == 0 {
        return Some(&[]);
    }
    // SAFETY: a C-contiguous buffer's memory is `len_bytes` bytes from `buf_ptr`, kept alive (and its
    // exporter kept from resizing it) until the `PyUntypedBuffer` the slice borrows from is released.
    Some(unsafe { std::slice::from_raw_parts(buffer.buf_ptr() as *const u8, len) })
}

/// A shared buffer and spans (offset, length) of it.
pub type Held = (std::sync::Arc<strata_client::SharedBuffer>, Vec<(usize, usize)>);

/// Buffers of shared memory the store allocated (`alloc_buffer`): a node on this host copies values into
/// and out of them directly. They live as long as the store (a node that mapped one keeps its mapping
/// until the connection closes, so freeing one early would gain nothing there).
#[derive(Default)]
pub struct SharedBuffers {
    buffers: Mutex<Vec<std::sync::Arc<strata_client::SharedBuffer>>>,
}

impl SharedBuffers {
    /// Allocates `len` bytes and registers them in `registry` (so every `*_into` / `*_from` call takes
    /// addresses in them); their address.
    pub fn alloc(&self, len: usize, registry: &Registry) -> Result<usize, strata_client::ClientError> {
        let buffer = std::sync::Arc::new(strata_client::SharedBuffer::new(len)?);
        let address = buffer.as_ptr() as usize;
        if !registry.register(address, len) {
            return Err(strata_client::ClientError::Protocol("a new mapping overlaps a registered buffer".into()));
        }
        self.buffers.lock().unwrap_or_else(|poison| poison.into_inner()).push(buffer);
        Ok(address)
    }

    /// The shared buffer that holds every range `(start, len)`, and each range as a span (offset, len)
    /// of it; `None` if no one buffer holds them all.
    pub fn holding(&self, ranges: &[(usize, usize)]) -> Option<Held> {
        let (first, _) = *ranges.first()?;
        let buffers = self.buffers.lock().unwrap_or_else(|poison| poison.into_inner());
        let buffer = buffers.iter().find(|buffer| {
            let base = buffer.as_ptr() as usize;
            (base..base + buffer.len()).contains(&first)
        })?;
        let base = buffer.as_ptr() as usize;
        let spans: Option<Vec<(usize, usize)>> = ranges
            .iter()
            .map(|&(start, len)| {
                let end = start.checked_add(len)?;
                (start >= base && end <= base + buffer.len()).then_some((start - base, len))
            })
            .collect();
        Some((std::sync::Arc::clone(buffer), spans?))
    }
}

/// Reads `keys` into the spans of a shared buffer (`batch_get_into_shared_unchecked`).
pub fn get_into_shared(
    client: &mut strata_client::Client,
    keys: &[&[u8]],
    buffer: &strata_client::SharedBuffer,
    spans: &[(usize, usize)],
) -> Vec<Result<usize, strata_client::ClientError>> {
    // SAFETY: the spans are memory the caller registered (its own allocation) and handed to this call, as
    // for every `*_into` call (`register_buffer`'s contract); the client checks that they do not overlap.
    unsafe { client.batch_get_into_shared_unchecked(keys, buffer, spans) }
}
