//! `StrataStore`: Mooncake's `MooncakeDistributedStore` surface over one [`strata_client::Client`].
//!
//! Conventions (Mooncake's): puts return `0` or a negative code; reads into buffers return the bytes read
//! or a negative code; `get` returns the value, or empty bytes on any failure; `is_exist` returns 1, 0 or
//! a negative code; batch forms return one such integer per key. A Python exception is raised only for a
//! call Python itself could not make (a key that is neither `str` nor `bytes`, a non-contiguous buffer).
//!
//! Calls from several Python threads run at once, each with the GIL released, each on a connection of its
//! own from the store's pool (`pool.rs`): no lock is held across a round trip.

use std::sync::Arc;
use std::time::Duration;

use pyo3::IntoPyObjectExt;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyConnectionError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};
use strata_client::{
    BlockPut, Client, ClientError, ClientOptions, ClusterOptions, Links, Pin, PutOptions, WritePolicy,
};

use crate::buffers::{Registry, SharedBuffers, disjoint, get_into_shared, object_bytes};
use crate::codes;
use crate::events::EventSubscription;
use crate::pool::ClientPool;
use crate::progressive::{ProgressivePut, State};

/// A connection to a Strata node with Mooncake's store methods.
#[pyclass(module = "strata._strata", subclass)]
pub struct StrataStore {
    clients: ClientPool,
    registry: Arc<Registry>,
    /// Buffers of shared memory (`alloc_buffer`), registered in `registry` too.
    shared: SharedBuffers,
}

/// A read's `wait=` in seconds, as a duration: finite and not negative.
fn wait_of(seconds: f64) -> PyResult<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(seconds)
        .map_err(|_| PyValueError::new_err(format!("wait={seconds}: a number of seconds, 0 or more")))
}

fn key_of(key: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    key_slice(key).map(<[u8]>::to_vec)
}

/// A key's bytes, borrowed from the Python object (str and bytes are immutable, and the caller holds a
/// reference to the object for as long as it uses the slice, GIL released or not).
fn key_slice<'a>(key: &'a Bound<'_, PyAny>) -> PyResult<&'a [u8]> {
    if let Ok(text) = key.cast::<PyString>() {
        return Ok(text.to_str()?.as_bytes());
    }
    if let Ok(bytes) = key.cast::<PyBytes>() {
        return Ok(bytes.as_bytes());
    }
    Err(PyTypeError::new_err("a key is a str or bytes"))
}

/// The key objects of an iterable, held for [`key_slice`].
fn key_objects<'py>(keys: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    keys.try_iter()?.collect()
}

/// The bytes of each key object (see [`key_slice`]).
fn key_slices<'a>(objects: &'a [Bound<'_, PyAny>]) -> PyResult<Vec<&'a [u8]>> {
    objects.iter().map(key_slice).collect()
}

fn attribute<'py, T: for<'a> FromPyObject<'a, 'py>>(config: &Bound<'py, PyAny>, name: &str) -> PyResult<Option<T>> {
    match config.getattr(name) {
        Ok(value) if value.is_none() => Ok(None),
        Ok(value) => value.extract::<T>().map(Some).map_err(|_| PyTypeError::new_err(format!("config.{name}"))),
        Err(_) => Ok(None),
    }
}

/// The put options of a `ReplicateConfig` (Mooncake's `with_soft_pin`; Strata's `with_hard_pin`,
/// `soft_pin_ttl_seconds`, `upsert`, `write_policy`), and `replica_num`: the nodes that store it in a
/// cluster (one node keeps one copy). `preferred_segment` is accepted and unused: placement decides.
fn put_options(config: Option<&Bound<'_, PyAny>>, upsert: bool) -> PyResult<PutOptions> {
    let mut options = PutOptions { upsert, ..PutOptions::default() };
    let Some(config) = config.filter(|config| !config.is_none()) else { return Ok(options) };
    let ttl_seconds = attribute::<u32>(config, "soft_pin_ttl_seconds")?.unwrap_or(0);
    if attribute::<bool>(config, "with_hard_pin")?.unwrap_or(false) {
        options.pin = Pin::Hard;
    } else if attribute::<bool>(config, "with_soft_pin")?.unwrap_or(false) {
        options.pin = Pin::Soft { ttl_seconds };
    }
    options.upsert |= attribute::<bool>(config, "upsert")?.unwrap_or(false);
    if let Some(replicas) = attribute::<i64>(config, "replica_num")? {
        options.replicas = u8::try_from(replicas.max(0))
            .map_err(|_| PyValueError::new_err(format!("replica_num {replicas}: at most 255")))?;
    }
    if let Some(policy) = attribute::<String>(config, "write_policy")? {
        options.policy = Some(WritePolicy::parse(&policy).ok_or_else(|| {
            PyValueError::new_err(format!("write_policy {policy:?}: write-through, write-back or durable"))
        })?);
    }
    Ok(options)
}

/// A name for a link (`parent=` / `group=`): None, str or bytes.
fn link_name(name: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<u8>>> {
    name.filter(|name| !name.is_none()).map(key_of).transpose()
}

/// Per-key link names (`parents=` / `groups=`): None for none at all, else one entry (None, str or bytes)
/// per key; `None` when the count is wrong.
fn link_names(names: Option<&Bound<'_, PyAny>>, count: usize) -> PyResult<Option<Vec<Option<Vec<u8>>>>> {
    let Some(names) = names.filter(|names| !names.is_none()) else { return Ok(Some(vec![None; count])) };
    let names: Vec<Option<Vec<u8>>> = names.try_iter()?.map(|name| link_name(Some(&name?))).collect::<PyResult<_>>()?;
    Ok((names.len() == count).then_some(names))
}

/// Puts every key from its parts with its links; a result per key.
fn put_blocks(
    client: &mut Client,
    keys: &[&[u8]],
    parts: &[Vec<&[u8]>],
    parents: &[Option<Vec<u8>>],
    groups: &[Option<Vec<u8>>],
    options: PutOptions,
) -> Vec<Result<(), ClientError>> {
    let blocks: Vec<BlockPut<'_>> = (0..keys.len())
        .map(|at| BlockPut {
            key: keys[at],
            parts: &parts[at],
            links: Links { parent: parents[at].as_deref(), group: groups[at].as_deref() },
        })
        .collect();
    client.batch_put_blocks(&blocks, options)
}

impl StrataStore {
    /// Runs `work` on the client with the GIL released; `None` before `setup` or after `close`.
    fn with_client<T: Send>(&self, py: Python<'_>, work: impl FnOnce(&mut Client) -> T + Send) -> Option<T> {
        py.detach(|| self.clients.run(work))
    }

    /// Per-key ranges to fill, or `None` if one is not registered or two overlap.
    fn writable(&self, ranges: &[(usize, usize)]) -> Option<Vec<&'static mut [u8]>> {
        if !disjoint(&mut ranges.to_vec()) {
            return None;
        }
        self.registry.write_all(ranges)
    }
}

/// Pages a walk of one shard reads at most: a shard's index holds far fewer entries than this many pages
/// of `MAX_SCAN_KEYS` could name, so the bound only stops a walk that would never end.
const MAX_SCAN_PAGES: usize = 1 << 20;

/// Every key of every shard the client reaches, each once (a cluster's replicas name a key more than once).
fn list_every_key(client: &mut Client) -> Result<std::collections::BTreeSet<Vec<u8>>, ClientError> {
    let mut keys = std::collections::BTreeSet::new();
    for shard in 0..client.shard_count() as usize {
        let mut cursor = 0;
        for _ in 0..MAX_SCAN_PAGES {
            let page = client.scan_shard(shard, cursor, strata_proto::MAX_SCAN_KEYS)?;
            keys.extend(page.entries.into_iter().map(|entry| entry.key));
            match page.next {
                Some(next) => cursor = next,
                None => break,
            }
        }
    }
    Ok(keys)
}

fn failed(count: usize, code: i64) -> Vec<i64> {
    vec![code; count]
}

/// A code per key from a batch's results (`len`s: bytes read), or `INVALID_PARAMS` for every key when there
/// was no client to run it.
fn per_key_lens(results: Option<Vec<Result<usize, ClientError>>>, count: usize) -> Vec<i64> {
    results.map_or_else(|| failed(count, codes::INVALID_PARAMS), |results| results.iter().map(codes::of_len).collect())
}

/// A count (keys removed), or a negative code.
fn count_code(removed: Option<Result<u64, ClientError>>) -> i64 {
    removed
        .map_or(codes::INVALID_PARAMS, |removed| removed.map_or_else(|error| codes::of(&error), |count| count as i64))
}

/// The same for results without a value (puts): 0 or a negative code per key.
fn per_key_units(results: Option<Vec<Result<(), ClientError>>>, count: usize) -> Vec<i64> {
    results.map_or_else(|| failed(count, codes::INVALID_PARAMS), |results| results.iter().map(codes::of_unit).collect())
}

#[pymethods]
impl StrataStore {
    #[new]
    fn new() -> Self {
        Self {
            clients: ClientPool::default(),
            registry: Arc::new(Registry::default()),
            shared: SharedBuffers::default(),
        }
    }

    /// Connects to a node: `address` is `"host:port"` (any shard's port) or a list of them, tried in
    /// order; or to a cluster: `"etcd://host:port[,host:port…]"`. Options by keyword: `token` (str or
    /// bytes), `timeout_seconds` (30), `verify_checksums` (True), `shared_memory` (True: buffers of
    /// `alloc_buffer` move through shared memory with a node on this host), `spin_microseconds` (busy-poll replies
    /// before sleeping; 0); for a cluster, `cluster_name` ("strata"), `replicas` (per put, 1) and
    /// `min_replicas` (1). A node of a cluster makes this a client of its cluster (members learnt from
    /// it), unless `single_node=True`. Returns 0 or a negative code.
    #[pyo3(signature = (address, **options))]
    fn setup(&self, py: Python<'_>, address: &Bound<'_, PyAny>, options: Option<&Bound<'_, PyDict>>) -> PyResult<i64> {
        let addresses: Vec<String> = if let Ok(one) = address.extract::<String>() {
            vec![one]
        } else {
            address.extract::<Vec<String>>().map_err(|_| PyTypeError::new_err("address is a str or a list of str"))?
        };
        let mut client_options = ClientOptions::default();
        let in_cluster = addresses.len() == 1 && addresses[0].starts_with("etcd://");
        let mut cluster = ClusterOptions::new(if in_cluster { &addresses[0] } else { "" });
        let mut single_node = false;
        if let Some(options) = options {
            for (name, value) in options.iter() {
                let name: String = name.extract()?;
                match name.as_str() {
                    "cluster_name" => cluster.cluster = value.extract()?,
                    "single_node" => single_node = value.extract()?,
                    "replicas" => cluster.replicas = value.extract()?,
                    "min_replicas" => cluster.min_replicas = value.extract()?,
                    "token" => client_options.token = Some(key_of(&value)?),
                    "timeout_seconds" => {
                        let seconds: f64 = value.extract()?;
                        if !(seconds > 0.0 && seconds.is_finite()) {
                            return Err(PyValueError::new_err("timeout_seconds must be positive"));
                        }
                        client_options.timeout = Duration::from_secs_f64(seconds);
                    }
                    "verify_checksums" => client_options.verify_checksums = value.extract()?,
                    "shared_memory" => client_options.shared_memory = value.extract()?,
                    "spin_microseconds" => {
                        let micros: u64 = value.extract()?;
                        client_options.spin_before_block = (micros > 0).then(|| Duration::from_micros(micros));
                    }
                    other => return Err(PyTypeError::new_err(format!("setup() got an unexpected option {other:?}"))),
                }
            }
        }
        let connected = py.detach(|| {
            let options = ClusterOptions { client: client_options, ..cluster };
            if in_cluster {
                self.clients.setup_cluster(options)
            } else {
                self.clients.setup(addresses, options, single_node)
            }
        });
        Ok(match connected {
            Ok(()) => codes::OK,
            Err(error) => codes::of(&error),
        })
    }

    /// Closes the connections; returns 0.
    fn close(&self, py: Python<'_>) -> i64 {
        py.detach(|| self.clients.close());
        codes::OK
    }

    /// Stores `value` (bytes or any C-contiguous buffer) under `key`; a stored key answers
    /// `OBJECT_ALREADY_EXISTS` and is kept, unless `config.upsert`. `parent`: the key of the block this one
    /// continues (when it leaves the node, so does this block); `group`: a name shared by blocks that leave
    /// together. Returns 0 or a negative code.
    #[pyo3(signature = (key, value, config = None, parent = None, group = None))]
    fn put(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        config: Option<&Bound<'_, PyAny>>,
        parent: Option<&Bound<'_, PyAny>>,
        group: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<i64> {
        let options = put_options(config, false)?;
        self.put_object(py, key, value, options, (link_name(parent)?, link_name(group)?))
    }

    /// Stores `value` under `key`, replacing a stored version (links as for `put`). Returns 0 or a
    /// negative code.
    #[pyo3(signature = (key, value, config = None, parent = None, group = None))]
    fn upsert(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        config: Option<&Bound<'_, PyAny>>,
        parent: Option<&Bound<'_, PyAny>>,
        group: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<i64> {
        let options = put_options(config, true)?;
        self.put_object(py, key, value, options, (link_name(parent)?, link_name(group)?))
    }

    /// The value of `key`, or empty bytes if it cannot be read (Mooncake's convention).
    fn get<'py>(&self, py: Python<'py>, key: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
        let key = key_of(key)?;
        let value = self.with_client(py, |client| client.get(&key)).and_then(Result::ok).unwrap_or_default();
        Ok(PyBytes::new(py, &value))
    }

    /// The values of `keys`, in one round trip per shard; empty bytes for a key that cannot be read.
    fn get_batch<'py>(&self, py: Python<'py>, keys: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let objects = key_objects(keys)?;
        let key_refs = key_slices(&objects)?;
        let keys = &key_refs;
        let values = self.with_client(py, |client| client.batch_get(keys));
        let values = values.unwrap_or_else(|| keys.iter().map(|_| Err(ClientError::NotFound)).collect());
        Ok(values.into_iter().map(|value| PyBytes::new(py, &value.unwrap_or_default())).collect())
    }

    /// Stores every `(keys[i], values[i])` (bytes or any C-contiguous buffer) in one round trip per shard.
    /// Returns 0 when every key was stored, else the first key's negative code (Mooncake's `put_batch`
    /// returns one code for the call); `batch_put_from` gives a code per key. `parents` / `groups`: one
    /// name (or None) per key, as for `put`.
    #[pyo3(signature = (keys, values, config = None, parents = None, groups = None))]
    fn put_batch(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        values: &Bound<'_, PyAny>,
        config: Option<&Bound<'_, PyAny>>,
        parents: Option<&Bound<'_, PyAny>>,
        groups: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<i64> {
        let options = put_options(config, false)?;
        let objects = key_objects(keys)?;
        let key_refs = key_slices(&objects)?;
        let (Some(parents), Some(groups)) = (link_names(parents, key_refs.len())?, link_names(groups, key_refs.len())?)
        else {
            return Ok(codes::INVALID_PARAMS);
        };
        let buffers: Vec<PyUntypedBuffer> =
            values.try_iter()?.map(|value| PyUntypedBuffer::get(&value?)).collect::<PyResult<_>>()?;
        if buffers.len() != key_refs.len() {
            return Ok(codes::INVALID_PARAMS);
        }
        let Some(bytes) = buffers.iter().map(object_bytes).collect::<Option<Vec<&[u8]>>>() else {
            return Err(PyValueError::new_err("every value must be a C-contiguous buffer"));
        };
        let parts: Vec<Vec<&[u8]>> = bytes.into_iter().map(|value| vec![value]).collect();
        let keys = &key_refs;
        let results = self.with_client(py, |client| put_blocks(client, keys, &parts, &parents, &groups, options));
        Ok(results.map_or(codes::INVALID_PARAMS, |results| {
            results.iter().map(codes::of_unit).find(|&code| code != codes::OK).unwrap_or(codes::OK)
        }))
    }

    /// Stores each key's value as the concatenation of its parts (bytes or any C-contiguous buffers, sent
    /// as they are, never joined into a copy) in one round trip per shard: a code per key. With
    /// `config.upsert`, a stored version is replaced.
    #[pyo3(signature = (keys, all_parts, config = None))]
    fn batch_put_parts(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        all_parts: &Bound<'_, PyAny>,
        config: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<i64>> {
        let options = put_options(config, false)?;
        let objects = key_objects(keys)?;
        let key_refs = key_slices(&objects)?;
        let buffers: Vec<Vec<PyUntypedBuffer>> = all_parts
            .try_iter()?
            .map(|parts| parts?.try_iter()?.map(|part| PyUntypedBuffer::get(&part?)).collect())
            .collect::<PyResult<_>>()?;
        if buffers.len() != key_refs.len() {
            return Ok(failed(key_refs.len(), codes::INVALID_PARAMS));
        }
        let Some(parts) = buffers
            .iter()
            .map(|parts| parts.iter().map(object_bytes).collect::<Option<Vec<&[u8]>>>())
            .collect::<Option<Vec<_>>>()
        else {
            return Err(PyValueError::new_err("every part must be a C-contiguous buffer"));
        };
        let unlinked = vec![None; key_refs.len()];
        let keys = &key_refs;
        let results = self.with_client(py, |client| put_blocks(client, keys, &parts, &unlinked, &unlinked, options));
        Ok(per_key_units(results, keys.len()))
    }

    /// Reads `key`'s value into the registered buffer at `buffer_ptr` (`size` bytes); returns the bytes
    /// read or a negative code. `wait` (seconds): a key not stored yet is waited for that long (a put of
    /// it committing), then OBJECT_NOT_FOUND.
    #[pyo3(signature = (key, buffer_ptr, size, wait = 0.0))]
    fn get_into(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        buffer_ptr: usize,
        size: usize,
        wait: f64,
    ) -> PyResult<i64> {
        let key = key_of(key)?;
        let wait = wait_of(wait)?;
        if let Some((shared, spans)) = self.shared.holding(&[(buffer_ptr, size)]).filter(|_| wait.is_zero()) {
            let read = self.with_client(py, |client| get_into_shared(client, &[&key], &shared, &spans));
            return Ok(per_key_lens(read, 1)[0]);
        }
        let Some(buffer) = self.registry.write(buffer_ptr, size) else { return Ok(codes::INVALID_PARAMS) };
        Ok(self
            .with_client(py, |client| codes::of_len(&client.get_into_waiting(&key, buffer, wait)))
            .unwrap_or(codes::INVALID_PARAMS))
    }

    /// Reads `size` bytes at `offset` of `key`'s value (one layer, say) into the registered buffer at
    /// `buffer_ptr`; returns the bytes read or a negative code. `wait` (seconds): a key not stored yet is
    /// waited for that long (a put of it committing, or a progressive put of it starting and this range
    /// arriving), so a decode instance can ask for a layer a prefill instance has not sent yet.
    #[pyo3(signature = (key, offset, buffer_ptr, size, wait = 0.0))]
    fn get_range_into(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        offset: u32,
        buffer_ptr: usize,
        size: usize,
        wait: f64,
    ) -> PyResult<i64> {
        let key = key_of(key)?;
        let wait = wait_of(wait)?;
        let Some(buffer) = self.registry.write(buffer_ptr, size) else { return Ok(codes::INVALID_PARAMS) };
        let read =
            self.with_client(py, |client| codes::of_len(&client.get_range_into_waiting(&key, offset, buffer, wait)));
        Ok(read.unwrap_or(codes::INVALID_PARAMS))
    }

    /// Starts a put of `key` whose value is sent part by part (`sizes` bytes each, in order) as a prefill
    /// computes its layers; each part is readable (`get_range_into`) once it arrived, and the key as a whole
    /// once `finish()` returned 0. Returns a `ProgressivePut` (whose calls return a negative code if this one
    /// failed). Links as for `put`.
    #[pyo3(signature = (key, sizes, config = None, parent = None, group = None))]
    fn put_progressive(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        sizes: Vec<u32>,
        config: Option<&Bound<'_, PyAny>>,
        parent: Option<&Bound<'_, PyAny>>,
        group: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<ProgressivePut> {
        let key = key_of(key)?;
        let options = put_options(config, false)?;
        let (parent, group) = (link_name(parent)?, link_name(group)?);
        let links = Links { parent: parent.as_deref(), group: group.as_deref() };
        let started = self.with_client(py, |client| client.put_progressive(&key, &sizes, links, options));
        let state = match started {
            Some(Ok(put)) => State::Open(put),
            Some(Err(error)) => State::Failed(codes::of(&error)),
            None => State::Failed(codes::INVALID_PARAMS),
        };
        Ok(ProgressivePut::new(state, Arc::clone(&self.registry)))
    }

    /// Stores `size` bytes of the registered buffer at `buffer_ptr` under `key` (links as for `put`).
    /// Returns 0 or a negative code.
    #[pyo3(signature = (key, buffer_ptr, size, config = None, parent = None, group = None))]
    #[allow(clippy::too_many_arguments)]
    fn put_from(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        buffer_ptr: usize,
        size: usize,
        config: Option<&Bound<'_, PyAny>>,
        parent: Option<&Bound<'_, PyAny>>,
        group: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<i64> {
        let key = key_of(key)?;
        let options = put_options(config, false)?;
        let (parent, group) = (link_name(parent)?, link_name(group)?);
        let unlinked = parent.is_none() && group.is_none();
        if let Some((shared, spans)) = self.shared.holding(&[(buffer_ptr, size)]).filter(|_| unlinked) {
            let stored = self.with_client(py, |client| client.batch_put_from_shared(&[&key], &shared, &spans, options));
            return Ok(per_key_units(stored, 1)[0]);
        }
        let Some(value) = self.registry.read(buffer_ptr, size) else { return Ok(codes::INVALID_PARAMS) };
        let links = Links { parent: parent.as_deref(), group: group.as_deref() };
        Ok(self
            .with_client(py, |client| codes::of_unit(&client.put_linked(&key, value, links, options)))
            .unwrap_or(codes::INVALID_PARAMS))
    }

    /// `put_from` for many keys (`parents` / `groups`: one name, or None, per key); a code per key.
    #[pyo3(signature = (keys, buffer_ptrs, sizes, config = None, parents = None, groups = None))]
    #[allow(clippy::too_many_arguments)]
    fn batch_put_from(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        buffer_ptrs: Vec<usize>,
        sizes: Vec<usize>,
        config: Option<&Bound<'_, PyAny>>,
        parents: Option<&Bound<'_, PyAny>>,
        groups: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<i64>> {
        let objects = key_objects(keys)?;
        let keys = key_slices(&objects)?;
        let options = put_options(config, false)?;
        let (Some(parents), Some(groups)) = (link_names(parents, keys.len())?, link_names(groups, keys.len())?) else {
            return Ok(failed(keys.len(), codes::INVALID_PARAMS));
        };
        if buffer_ptrs.len() != keys.len() || sizes.len() != keys.len() {
            return Ok(failed(keys.len(), codes::INVALID_PARAMS));
        }
        let ranges: Vec<(usize, usize)> = buffer_ptrs.iter().copied().zip(sizes.iter().copied()).collect();
        let unlinked = parents.iter().chain(&groups).all(Option::is_none);
        // From a buffer of `alloc_buffer`: the node copies out of it (shared memory), or TCP sends it.
        if let Some((buffer, spans)) = self.shared.holding(&ranges).filter(|_| unlinked) {
            let keys = &keys;
            let results = self.with_client(py, |client| client.batch_put_from_shared(keys, &buffer, &spans, options));
            return Ok(per_key_units(results, keys.len()));
        }
        let values: Option<Vec<Vec<&[u8]>>> = buffer_ptrs
            .iter()
            .zip(&sizes)
            .map(|(&start, &len)| self.registry.read(start, len).map(|value| vec![value]))
            .collect();
        let Some(parts) = values else { return Ok(failed(keys.len(), codes::INVALID_PARAMS)) };
        let keys = &keys;
        let results = self.with_client(py, |client| put_blocks(client, keys, &parts, &parents, &groups, options));
        Ok(per_key_units(results, keys.len()))
    }

    /// `get_into` for many keys, all in flight together; a code (bytes read, or negative) per key.
    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        buffer_ptrs: Vec<usize>,
        sizes: Vec<usize>,
    ) -> PyResult<Vec<i64>> {
        // The hot path of a serving engine's loads: keys are borrowed from their Python objects, not copied.
        let objects = key_objects(keys)?;
        let key_refs = key_slices(&objects)?;
        if buffer_ptrs.len() != key_refs.len() || sizes.len() != key_refs.len() {
            return Ok(failed(key_refs.len(), codes::INVALID_PARAMS));
        }
        let ranges: Vec<(usize, usize)> = buffer_ptrs.into_iter().zip(sizes).collect();
        let keys = &key_refs;
        // Into a buffer of `alloc_buffer`: the node copies into it (shared memory), or TCP fills it.
        if let Some((buffer, spans)) = self.shared.holding(&ranges) {
            let results = self.with_client(py, |client| get_into_shared(client, keys, &buffer, &spans));
            return Ok(per_key_lens(results, keys.len()));
        }
        let Some(mut buffers) = self.writable(&ranges) else {
            return Ok(failed(key_refs.len(), codes::INVALID_PARAMS));
        };
        let results = self.with_client(py, |client| client.batch_get_into(keys, &mut buffers));
        Ok(per_key_lens(results, keys.len()))
    }

    /// Stores each key's value from several registered buffers in order (one per layer, say; links as for
    /// `batch_put_from`); a code per key.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, config = None, parents = None, groups = None))]
    #[allow(clippy::too_many_arguments)]
    fn batch_put_from_multi_buffers(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        all_buffer_ptrs: Vec<Vec<usize>>,
        all_sizes: Vec<Vec<usize>>,
        config: Option<&Bound<'_, PyAny>>,
        parents: Option<&Bound<'_, PyAny>>,
        groups: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<i64>> {
        let objects = key_objects(keys)?;
        let keys = key_slices(&objects)?;
        let options = put_options(config, false)?;
        let (Some(parents), Some(groups)) = (link_names(parents, keys.len())?, link_names(groups, keys.len())?) else {
            return Ok(failed(keys.len(), codes::INVALID_PARAMS));
        };
        if all_buffer_ptrs.len() != keys.len() || all_sizes.len() != keys.len() {
            return Ok(failed(keys.len(), codes::INVALID_PARAMS));
        }
        let mut parts: Vec<Vec<&[u8]>> = Vec::with_capacity(keys.len());
        for (ptrs, sizes) in all_buffer_ptrs.iter().zip(&all_sizes) {
            let key_parts: Option<Vec<&[u8]>> = (ptrs.len() == sizes.len())
                .then(|| ptrs.iter().zip(sizes).map(|(&start, &len)| self.registry.read(start, len)).collect())
                .flatten();
            let Some(key_parts) = key_parts else { return Ok(failed(keys.len(), codes::INVALID_PARAMS)) };
            parts.push(key_parts);
        }
        let keys = &keys;
        let results = self.with_client(py, |client| put_blocks(client, keys, &parts, &parents, &groups, options));
        Ok(per_key_units(results, keys.len()))
    }

    /// Reads each key's value into several registered buffers in order; a code (bytes read, or negative)
    /// per key. `prefer_alloc_in_same_node` is Mooncake's placement hint, without meaning for one node.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, prefer_alloc_in_same_node = false))]
    fn batch_get_into_multi_buffers(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        all_buffer_ptrs: Vec<Vec<usize>>,
        all_sizes: Vec<Vec<usize>>,
        prefer_alloc_in_same_node: bool,
    ) -> PyResult<Vec<i64>> {
        let _ = prefer_alloc_in_same_node;
        let objects = key_objects(keys)?;
        let keys = key_slices(&objects)?;
        if all_buffer_ptrs.len() != keys.len() || all_sizes.len() != keys.len() {
            return Ok(failed(keys.len(), codes::INVALID_PARAMS));
        }
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for (ptrs, sizes) in all_buffer_ptrs.iter().zip(&all_sizes) {
            if ptrs.len() != sizes.len() {
                return Ok(failed(keys.len(), codes::INVALID_PARAMS));
            }
            ranges.extend(ptrs.iter().copied().zip(sizes.iter().copied()));
        }
        let Some(mut flat) = self.writable(&ranges) else { return Ok(failed(keys.len(), codes::INVALID_PARAMS)) };
        let mut per_key: Vec<Vec<&mut [u8]>> = Vec::with_capacity(keys.len());
        let mut rest = flat.drain(..);
        for sizes in &all_sizes {
            per_key.push(rest.by_ref().take(sizes.len()).collect());
        }
        drop(rest);
        let mut lists: Vec<&mut [&mut [u8]]> = per_key.iter_mut().map(Vec::as_mut_slice).collect();
        let key_refs = &keys;
        let results = self.with_client(py, |client| client.batch_get_into_parts(key_refs, &mut lists));
        Ok(per_key_lens(results, keys.len()))
    }

    /// 1 if `key` is stored, 0 if not, or a negative code.
    fn is_exist(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<i64> {
        let key = key_of(key)?;
        Ok(self.with_client(py, |client| exist_code(client.exists(&key))).unwrap_or(codes::INVALID_PARAMS))
    }

    /// `is_exist` for many keys, in one round trip per shard.
    fn batch_is_exist(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
        let objects = key_objects(keys)?;
        let keys = key_slices(&objects)?;
        let key_refs = &keys;
        let results = self.with_client(py, |client| client.batch_exists(key_refs));
        Ok(results.map_or_else(
            || failed(keys.len(), codes::INVALID_PARAMS),
            |results| results.into_iter().map(exist_code).collect(),
        ))
    }

    /// The length of `key`'s value, or a negative code.
    fn get_size(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<i64> {
        let key = key_of(key)?;
        let size = self.with_client(py, |client| client.get_size(&key).map(|size| size as usize));
        Ok(size.map_or(codes::INVALID_PARAMS, |size| codes::of_len(&size)))
    }

    /// Where each of `keys` is stored, in one round trip per shard: `(size, in_dram, on_nvme)` per key, or
    /// a negative code.
    fn batch_locate<'py>(&self, py: Python<'py>, keys: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let objects = key_objects(keys)?;
        let keys = key_slices(&objects)?;
        let key_refs = &keys;
        let located = self.with_client(py, |client| client.batch_locate(key_refs));
        let Some(located) = located else {
            return failed(keys.len(), codes::INVALID_PARAMS)
                .into_iter()
                .map(|code| code.into_bound_py_any(py))
                .collect();
        };
        located
            .into_iter()
            .map(|result| match result {
                Ok(location) => (location.len, location.in_dram, location.on_nvme).into_bound_py_any(py),
                Err(error) => codes::of(&error).into_bound_py_any(py),
            })
            .collect()
    }

    /// The node address that answered `setup` (`"host:port"`), or None before it.
    fn node_address(&self) -> Option<String> {
        self.clients.node_address()
    }

    /// Removes each of `keys`, in one round trip per shard; a code per key (0 or negative).
    fn batch_remove(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
        let objects = key_objects(keys)?;
        let keys = key_slices(&objects)?;
        let key_refs = &keys;
        Ok(per_key_units(self.with_client(py, |client| client.batch_remove(key_refs)), keys.len()))
    }

    /// Removes `key`; returns 0 or a negative code.
    fn remove(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<i64> {
        let key = key_of(key)?;
        Ok(self.with_client(py, |client| codes::of_unit(&client.remove(&key))).unwrap_or(codes::INVALID_PARAMS))
    }

    /// Removes every key that `regex_pattern` matches anywhere (Rust `regex` syntax); returns how many, or
    /// a negative code (`INVALID_PARAMS` for a pattern that does not compile).
    fn remove_by_regex(&self, py: Python<'_>, regex_pattern: &str) -> i64 {
        count_code(self.with_client(py, |client| client.remove_matching(regex_pattern)))
    }

    /// Removes every key; returns how many, or a negative code.
    fn remove_all(&self, py: Python<'_>) -> i64 {
        count_code(self.with_client(py, |client| client.remove_all()))
    }

    /// Every key the node holds for this store's tenant (each once, in no particular order), its shards
    /// walked a page at a time (SCAN). A key put or removed during the walk may or may not be listed.
    /// Raises `ConnectionError` (with Strata's code) when a page cannot be read.
    fn list_keys<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let listed = self.with_client(py, list_every_key);
        match listed {
            Some(Ok(keys)) => Ok(keys.iter().map(|key| PyBytes::new(py, key)).collect()),
            Some(Err(error)) => Err(PyConnectionError::new_err(format!("list_keys: {error} ({})", codes::of(&error)))),
            None => Err(PyConnectionError::new_err("list_keys: setup() first")),
        }
    }

    /// Registers `[buffer_ptr, buffer_ptr + size)` for the `*_into` / `*_from` calls. The memory must stay
    /// valid until `unregister_buffer`, and not be freed while a call uses it. Returns 0, or
    /// `INVALID_PARAMS` for an empty range or one that overlaps a registered buffer.
    fn register_buffer(&self, buffer_ptr: usize, size: usize) -> i64 {
        if self.registry.register(buffer_ptr, size) { codes::OK } else { codes::INVALID_PARAMS }
    }

    /// Allocates `size` bytes of shared memory (a sealed memfd) and registers them as a buffer; returns
    /// their address. A node on this host copies values into and out of such a buffer directly (one copy,
    /// no socket); elsewhere the same calls use TCP. The memory lives as long as the store. Raises
    /// `MemoryError` if it cannot be allocated.
    fn alloc_buffer(&self, size: usize) -> PyResult<usize> {
        self.shared
            .alloc(size, &self.registry)
            .map_err(|error| pyo3::exceptions::PyMemoryError::new_err(format!("alloc_buffer({size}): {error}")))
    }

    /// Unregisters the buffer registered at `buffer_ptr`; 0, or `INVALID_PARAMS` if none was.
    fn unregister_buffer(&self, buffer_ptr: usize) -> i64 {
        if self.registry.unregister(buffer_ptr) { codes::OK } else { codes::INVALID_PARAMS }
    }

    // ---- Strata's own ---------------------------------------------------------------------------------

    /// Subscribes to the node's cache events for keys that start with `prefix` (all keys for None):
    /// returns an `EventSubscription`. Raises `ConnectionError` (with the code's name) if the node
    /// cannot be reached.
    #[pyo3(signature = (prefix = None))]
    fn subscribe_events(&self, py: Python<'_>, prefix: Option<&Bound<'_, PyAny>>) -> PyResult<EventSubscription> {
        let prefix = prefix.map(key_of).transpose()?;
        let stream = self.with_client(py, |client| client.subscribe_events(prefix.as_deref()));
        match stream {
            Some(Ok(stream)) => Ok(EventSubscription::new(stream)),
            Some(Err(error)) => {
                Err(PyConnectionError::new_err(format!("subscribe_events: {error} ({})", codes::of(&error))))
            }
            None => Err(PyConnectionError::new_err("subscribe_events: setup() first")),
        }
    }

    /// How many leading keys of the chain `keys` are stored (one round trip per shard), or a negative code.
    fn prefix_match(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<i64> {
        let objects = key_objects(keys)?;
        let key_refs = key_slices(&objects)?;
        Ok(self
            .with_client(py, |client| codes::of_len(&client.prefix_match(&key_refs)))
            .unwrap_or(codes::INVALID_PARAMS))
    }

    /// `prefix_match` of the chain of keys `prefix + stem + suffix`, one per stem (str or bytes), the keys
    /// built here: a serving engine's scheduler names a block by its hash between fixed parts, and building
    /// a 1,000-block chain as Python bytes objects cost it ~65 µs per lookup.
    fn prefix_match_stems(
        &self,
        py: Python<'_>,
        prefix: &[u8],
        stems: &Bound<'_, PyAny>,
        suffix: &[u8],
    ) -> PyResult<i64> {
        let objects = key_objects(stems)?;
        let stem_refs = key_slices(&objects)?;
        let affix_bytes = prefix.len() + suffix.len();
        let mut arena = Vec::with_capacity(stem_refs.iter().map(|stem| stem.len() + affix_bytes).sum());
        let mut ends = Vec::with_capacity(stem_refs.len());
        for stem in &stem_refs {
            arena.extend_from_slice(prefix);
            arena.extend_from_slice(stem);
            arena.extend_from_slice(suffix);
            ends.push(arena.len());
        }
        let key_refs: Vec<&[u8]> =
            ends.iter().scan(0, |start, &end| Some(&arena[std::mem::replace(start, end)..end])).collect();
        Ok(self
            .with_client(py, |client| codes::of_len(&client.prefix_match(&key_refs)))
            .unwrap_or(codes::INVALID_PARAMS))
    }

    /// `prefix_match` for many chains in one round trip per shard; a count (or negative code) per chain.
    fn batch_prefix_match(&self, py: Python<'_>, chains: &Bound<'_, PyList>) -> PyResult<Vec<i64>> {
        let chains: Vec<Vec<Bound<'_, PyAny>>> =
            chains.iter().map(|chain| key_objects(&chain)).collect::<PyResult<_>>()?;
        let chain_refs: Vec<Vec<&[u8]>> = chains.iter().map(|chain| key_slices(chain)).collect::<PyResult<_>>()?;
        let lists: Vec<&[&[u8]]> = chain_refs.iter().map(Vec::as_slice).collect();
        let results = self.with_client(py, |client| client.batch_prefix_match(&lists));
        Ok(per_key_lens(results, chains.len()))
    }

    /// Gathers `(key, offset, length)` ranges back to back into the registered buffer at `buffer_ptr`
    /// (`size` bytes), in the order given: the TP-asymmetric read. A code (bytes, or negative) per range.
    /// `wait` (seconds): keys not stored yet are waited for that long, all together.
    #[pyo3(signature = (ranges, buffer_ptr, size, wait = 0.0))]
    fn gather_into(
        &self,
        py: Python<'_>,
        ranges: &Bound<'_, PyList>,
        buffer_ptr: usize,
        size: usize,
        wait: f64,
    ) -> PyResult<Vec<i64>> {
        let wait = wait_of(wait)?;
        let parsed: Vec<(Vec<u8>, u32, u32)> = ranges
            .iter()
            .map(|range| {
                let (key, offset, len): (Bound<'_, PyAny>, u32, u32) = range.extract()?;
                Ok((key_of(&key)?, offset, len))
            })
            .collect::<PyResult<_>>()?;
        let Some(destination) = self.registry.write(buffer_ptr, size) else {
            return Ok(failed(parsed.len(), codes::INVALID_PARAMS));
        };
        let key_ranges: Vec<(&[u8], u32, u32)> =
            parsed.iter().map(|(key, offset, len)| (&key[..], *offset, *len)).collect();
        let results = self.with_client(py, |client| client.gather_into_waiting(&key_ranges, destination, wait));
        Ok(per_key_lens(results, parsed.len()))
    }

    /// Stores consecutive pieces of the registered buffer at `buffer_ptr` (`size` bytes) as the values of
    /// `(key, length)` pieces, in order; a code per piece.
    #[pyo3(signature = (buffer_ptr, size, pieces, config = None))]
    fn scatter_put_from(
        &self,
        py: Python<'_>,
        buffer_ptr: usize,
        size: usize,
        pieces: &Bound<'_, PyList>,
        config: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<i64>> {
        let options = put_options(config, false)?;
        let parsed: Vec<(Vec<u8>, usize)> = pieces
            .iter()
            .map(|piece| {
                let (key, len): (Bound<'_, PyAny>, usize) = piece.extract()?;
                Ok((key_of(&key)?, len))
            })
            .collect::<PyResult<_>>()?;
        let Some(source) = self.registry.read(buffer_ptr, size) else {
            return Ok(failed(parsed.len(), codes::INVALID_PARAMS));
        };
        let piece_refs: Vec<(&[u8], usize)> = parsed.iter().map(|(key, len)| (&key[..], *len)).collect();
        let results = self.with_client(py, |client| client.scatter_put(source, &piece_refs, options));
        Ok(per_key_units(results, parsed.len()))
    }
}

impl StrataStore {
    fn put_object(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        options: PutOptions,
        (parent, group): (Option<Vec<u8>>, Option<Vec<u8>>),
    ) -> PyResult<i64> {
        let key = key_of(key)?;
        let buffer = PyUntypedBuffer::get(value)?;
        let Some(bytes) = object_bytes(&buffer) else {
            return Err(PyValueError::new_err("the value must be a C-contiguous buffer"));
        };
        let links = Links { parent: parent.as_deref(), group: group.as_deref() };
        Ok(self
            .with_client(py, |client| codes::of_unit(&client.put_linked(&key, bytes, links, options)))
            .unwrap_or(codes::INVALID_PARAMS))
    }
}

fn exist_code(result: Result<bool, ClientError>) -> i64 {
    match result {
        Ok(true) => 1,
        Ok(false) => 0,
        Err(error) => codes::of(&error),
    }
}
