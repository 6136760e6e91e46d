"""``StrataHiCacheStorage``: SGLang's HiCache L3 storage backend on a Strata node.

SGLang (0.5.23) loads it through its ``dynamic`` storage backend::

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
    '{"backend_name":"strata","module_path":"strata.sglang","class_name":"StrataHiCacheStorage",
      "interface_v1":1,"address":"127.0.0.1:7600"}'

Extra-config keys: ``address`` (the node, ``host:port``, a list, or comma-separated; ``master_server_address``
is accepted too), ``token`` (the tenant's token), ``timeout_seconds``, and ``key_prefix`` (a namespace of the
operator's own, put before every key).

**Objects.** A page is one object, whatever the host pool's layout: its K and V rows (or, in ``layer_first``,
each layer's K and V rows) are written from, and read back into, the host pool's own buffers as the parts of
one put or get (``batch_put_from_multi_buffers`` / ``batch_get_into_multi_buffers``), with no staging copy.
One object per page halves the keys Mooncake's backend stores (``_k`` and ``_v`` objects), so a prefix check
is one ``prefix_match`` of the page hashes: one round trip per shard, and a page is never half present.

**Keys.** ``{key_prefix}{model}/{mha|mla}/{layout}/tp{unit}.{rank}/pp{pp_rank}/{page hash}``. A page's bytes
depend on the model, the attention kind, the host layout's byte order, and (for MHA) which heads the rank
holds, so each is in the key: a reader with another layout or head split misses instead of reading bytes
laid out for someone else. MLA pages are the same on every TP rank, so their keys carry no rank, and only
the storage writer (``HiCacheStorageConfig.is_storage_writer``) stores them. Under context parallelism
(``attn_cp_size`` or ``dcp_size`` above 1) the keys carry the CP and DCP ranks, whose shards differ. Under SGLang's split-heads mode
(``should_split_heads``, TP sizes that differ between writer and reader, ``page_head`` layout) the unit is
``tp_lcm_size``: a rank holding ``split_factor`` units reads and writes one object per unit, so a TP 4 writer
and a TP 2 reader name the same objects.

**Results.** ``batch_set_v1`` counts a page already stored as stored (pages are immutable: the hash names
its tokens), without the existence round trip Mooncake's backend makes first. ``batch_get_v1`` counts a
page as read only when every byte of every part arrived, checked end to end by the node's crc32c.

**Hybrid pools** (SGLang's v2 ``PoolTransfer`` interface, which its ``HybridCacheController`` calls for
hybrid models: sliding-window, Mamba and sparse-attention pools beside the KV pool). Each pool registered
with ``register_mem_host_pool_v2`` has its buffers registered with the store, and each page of it is one
object, named like the KV page of the same hash with the pool's name in its namespace:
``{key_prefix}{model}/{mha|mla}/{layout}/{pool}/tp{size}.{rank}/pp{pp_rank}/{page hash}``. A pool's pages
carry the rank, as SGLang's ranks all store them, except in an MLA model, where only the storage writer
stores them (``tp*``), Mamba state aside: it is TP-sharded even there. ``batch_exists_v2`` is one prefix
match of the KV pages and one existence batch for every pool's pages of that prefix; each pool then removes
the stops it cannot restore: an ``all_pages`` pool needs every page before a stop, a ``trailing_pages`` pool
(a sliding window, a Mamba checkpoint) its last ``len(keys)`` pages, so the restorable stops can have holes
(SGLang intersects them across ranks). ``batch_get_v2`` and ``batch_set_v2`` move every pool's pages in
one batch and answer one bool per page of each pool. The ``block_groups`` policy (DeepSeek V4's compressed
pools) is refused with a clear error.
"""

from __future__ import annotations

import logging
import re

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    PoolHitPolicy,
    PoolName,
    PoolTransferResult,
)

from . import OK
from .store import connect, stored

logger = logging.getLogger(__name__)

_LAYOUT_FAMILIES = {
    # Layouts whose pages have the same byte order share a family.
    "page_first": "pf",
    "page_first_direct": "pf",
    "layer_first": "lf",
    "page_head": "ph",
    "page_first_kv_split": "pfs",
}


class StrataHiCacheStorage(HiCacheStorage):
    """A ``HiCacheStorage`` whose pages live on a Strata node (see the module's docs)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs=None):
        extra = dict(storage_config.extra_config or {})
        address = extra.get("address") or extra.get("master_server_address")
        options = {name: extra[name] for name in ("token", "timeout_seconds") if name in extra}
        self.store = connect(address, "the extra config needs 'address'", **options)
        self.config = storage_config
        self.key_prefix = str(extra.get("key_prefix", ""))
        self.split_factor = 1
        if storage_config.should_split_heads and not storage_config.is_mla_model:
            self.split_factor = storage_config.tp_lcm_size // storage_config.tp_size
        self.mem_pool_host = None
        self.registered_pools = {}
        self._registered = {}
        self._namespaces = None
        self._pool_namespaces = {}

    # ---- registration ---------------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        self._register_buffers(mem_pool_host, "KV")
        self._namespaces = self._namespaces_of(mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        if host_pool_name == PoolName.KV:
            return  # the KV pool: registered by register_mem_pool_host, its pages are the v1 objects
        self._register_buffers(host_pool, host_pool_name)
        self._pool_namespaces[host_pool_name] = self._pool_namespace(host_pool, host_pool_name)

    def _register_buffers(self, pool, name) -> None:
        """Registers a host pool's buffers with the store, each once."""
        buffers = getattr(pool, "get_hybrid_pool_buffer", lambda: [getattr(pool, "kv_buffer", None)])()
        for buffer in buffers:
            if buffer is None:
                continue
            pointer, size = buffer.data_ptr(), buffer.numel() * buffer.element_size()
            if self._registered.get(pointer) == size:
                continue
            if pointer in self._registered or self.store.register_buffer(pointer, size) != OK:
                raise ValueError(f"strata: could not register the {name} pool's buffer ({size} bytes at {pointer:#x})")
            self._registered[pointer] = size

    def _namespace_root(self, pool) -> tuple:
        """(what every key of a pool's pages starts with: prefix, model, attention kind and layout; what
        ends it: the pipeline stage, and the context-parallel shard where there is one)."""
        config = self.config
        model = (config.model_name or "default").replace("/", "-")
        layout = _LAYOUT_FAMILIES.get(pool.layout, pool.layout)
        kind = "mla" if config.is_mla_model else "mha"
        tail = f"pp{config.pp_rank}/"
        if config.attn_cp_size > 1 or config.dcp_size > 1:
            # Context-parallel ranks hold different shards of a page: their objects must never meet.
            tail = f"cp{config.attn_cp_size}.{config.attn_cp_rank}/dcp{config.dcp_size}.{config.dcp_rank}/{tail}"
        return f"{self.key_prefix}{model}/{kind}/{layout}/", tail

    def _namespaces_of(self, pool) -> list:
        """The key namespace of each object of a KV page: one, or ``split_factor`` in split-heads mode."""
        config = self.config
        root, tail = self._namespace_root(pool)
        if config.is_mla_model:
            return [f"{root}tp*/{tail}"]
        unit, first = config.tp_size * self.split_factor, config.tp_rank * self.split_factor
        return [f"{root}tp{unit}.{first + i}/{tail}" for i in range(self.split_factor)]

    def _pool_namespace(self, pool, name) -> str:
        """The key namespace of a hybrid pool's pages (see the module's docs)."""
        config = self.config
        root, tail = self._namespace_root(pool)
        ranks = "tp*" if self._pool_is_shared(name) else f"tp{config.tp_size}.{config.tp_rank}"
        return f"{root}{getattr(name, 'value', name)}/{ranks}/{tail}"

    def _object_keys(self, page_keys):
        """The node's keys of the pages' objects, page by page (and unit by unit within a page)."""
        if self._namespaces is None:
            raise RuntimeError("strata: register_mem_pool_host() must come before page transfers")
        return [namespace + key for key in page_keys for namespace in self._namespaces]

    def _page_parts(self, object_count, host_indices):
        """The KV host pool's (pointers, sizes) grouped per object, in the pool's own part order."""
        pool = self.mem_pool_host
        if self.split_factor == 1:
            pointers, sizes = pool.get_page_buffer_meta(host_indices)
        else:
            pointers, sizes = pool.get_split_heads_page_buffer_meta(host_indices, self.split_factor)
        return _grouped(pointers, sizes, object_count)

    def _per_page(self, per_object):
        """One bool per page from one bool per object (a page holds ``split_factor`` objects)."""
        step = self.split_factor
        return [all(per_object[i : i + step]) for i in range(0, len(per_object), step)]

    # ---- the zero-copy (v1) interface -------------------------------------------------------------------

    def batch_exists(self, keys, extra_info=None) -> int:
        """How many leading pages are stored: one prefix match over the pages' objects."""
        if not keys:
            return 0
        matched = self.store.prefix_match(self._object_keys(keys))
        if matched < 0:
            logger.warning("strata: prefix match failed (code %d); treating as no hit", matched)
            return 0
        return matched // self.split_factor

    def batch_get_v1(self, keys, host_indices: torch.Tensor, extra_info=None):
        if not keys:
            return []
        object_keys = self._object_keys(keys)
        pointers, sizes = self._page_parts(len(object_keys), host_indices)
        results = self.store.batch_get_into_multi_buffers(object_keys, pointers, sizes)
        read = [code == sum(part_sizes) for code, part_sizes in zip(results, sizes)]
        return self._per_page(read)

    def batch_set_v1(self, keys, host_indices: torch.Tensor, extra_info=None):
        if not keys:
            return []
        if not self.config.is_storage_writer:
            # MLA replicas: the writer rank stores the shared page; the others have nothing to add.
            return [True] * len(keys)
        object_keys = self._object_keys(keys)
        pointers, sizes = self._page_parts(len(object_keys), host_indices)
        results = self.store.batch_put_from_multi_buffers(object_keys, pointers, sizes)
        return self._per_page([stored(code) for code in results])

    # ---- the hybrid-pool (v2) interface --------------------------------------------------------------

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None) -> PoolTransferResult:
        """The longest prefix of ``keys`` every pool can restore (see the module's docs)."""
        anchored = getattr(self.mem_pool_host, "kv_buffer", None) is not None
        kv_pages = self.batch_exists(keys, extra_info) if anchored else len(keys)
        hits = {PoolName.KV: kv_pages} if kv_pages else {}
        restorable = set(range(1, kv_pages + 1))
        checked = [transfer for transfer in pool_transfers or () if transfer.name != PoolName.KV and kv_pages]
        for transfer in checked:
            if transfer.hit_policy not in (PoolHitPolicy.ALL_PAGES, PoolHitPolicy.TRAILING_PAGES):
                raise ValueError(f"strata: pool hit policy {transfer.hit_policy} is not supported")
        object_keys = [self._pool_keys(transfer.name, keys[:kv_pages]) for transfer in checked]
        found = self.store.batch_is_exist([key for pool_keys in object_keys for key in pool_keys]) if checked else []
        for at, transfer in enumerate(checked):
            present = [code == 1 for code in found[at * kv_pages : (at + 1) * kv_pages]]
            window = kv_pages if transfer.hit_policy == PoolHitPolicy.ALL_PAGES else max(1, len(transfer.keys or ()))
            stops = _restorable_stops(present, window)
            if stops:
                hits[transfer.name] = stops[-1]
            restorable &= set(stops)
        stops = sorted(restorable)
        return PoolTransferResult(stops[-1] if stops else 0, hits, stops)

    def batch_get_v2(self, transfers, extra_info=None) -> dict:
        """Reads each pool's pages into its host indices: one bool per page of each pool."""
        return self._pool_io(transfers, writing=False)

    def batch_set_v2(self, transfers, extra_info=None) -> dict:
        """Writes each pool's pages from its host indices: one bool per page of each pool."""
        return self._pool_io(transfers, writing=True)

    def _pool_io(self, transfers, writing: bool) -> dict:
        """Every pool's pages in one batch (the KV pool's, if asked for, through the v1 path)."""
        results, plans = {}, []
        for transfer in transfers:
            if not transfer.keys:
                results[transfer.name] = []
            elif transfer.name == PoolName.KV:
                move = self.batch_set_v1 if writing else self.batch_get_v1
                results[transfer.name] = move(transfer.keys, transfer.host_indices)
            elif writing and self._pool_is_shared(transfer.name) and not self.config.is_storage_writer:
                results[transfer.name] = [True] * len(transfer.keys)  # the writer rank stores shared pages
            else:
                plans.append((transfer.name, self._pool_keys(transfer.name, transfer.keys), *self._pool_parts(transfer)))
        if not plans:
            return results
        keys = [key for plan in plans for key in plan[1]]
        pointers = [parts for plan in plans for parts in plan[2]]
        sizes = [parts for plan in plans for parts in plan[3]]
        if writing:
            done = [stored(code) for code in self.store.batch_put_from_multi_buffers(keys, pointers, sizes)]
        else:
            codes = self.store.batch_get_into_multi_buffers(keys, pointers, sizes)
            done = [code == sum(parts) for code, parts in zip(codes, sizes)]
        start = 0
        for name, pool_keys, _, _ in plans:
            results[name] = done[start : start + len(pool_keys)]
            start += len(pool_keys)
        return results

    def _pool_keys(self, name, page_keys) -> list:
        namespace = self._pool_namespaces.get(name)
        if namespace is None:
            raise ValueError(f"strata: host pool {name} was not registered (register_mem_host_pool_v2)")
        return [namespace + key for key in page_keys]

    def _pool_is_shared(self, name) -> bool:
        """Whether a pool's pages are the same on every TP rank: an MLA model's, Mamba state aside (it is
        TP-sharded even there)."""
        return self.config.is_mla_model and name != PoolName.MAMBA

    def _pool_parts(self, transfer) -> tuple:
        """A transfer's (pointers, sizes), one list of parts per page, from its pool's own buffer layout."""
        pool = self.registered_pools[transfer.name]
        page_size = getattr(pool, "page_size", 1) or 1
        if len(transfer.host_indices) != len(transfer.keys) * page_size:
            raise ValueError(
                f"strata: {transfer.name} transfer of {len(transfer.keys)} pages has "
                f"{len(transfer.host_indices)} host indices, not {len(transfer.keys) * page_size}"
            )
        pointers, sizes = pool.get_page_buffer_meta(transfer.host_indices)
        return _grouped(pointers, sizes, len(transfer.keys))

    # ---- the legacy interface: a key and a pointer (or a tensor) per value ------------------------------

    def get(self, key, target_location=None, target_sizes=None):
        """Reads into ``target_location`` (a registered pointer; True if every byte arrived), or returns the
        value as a uint8 tensor (None if missing) when no location is given."""
        if target_location is None:
            value = self.store.get(key)
            return torch.frombuffer(bytearray(value), dtype=torch.uint8) if value else None
        return self.store.get_into(key, target_location, target_sizes) == target_sizes

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """With locations: how many leading values arrived whole. Without: a tensor or None per key."""
        if target_locations is None:
            return [self.get(key) for key in keys]
        results = self.store.batch_get_into(keys, list(target_locations), list(target_sizes))
        for count, (code, size) in enumerate(zip(results, target_sizes)):
            if code != size:
                return count
        return len(keys)

    def set(self, key, value=None, target_location=None, target_sizes=None) -> bool:
        if target_location is not None:
            code = self.store.put_from(key, target_location, target_sizes)
        elif value is not None:
            code = self.store.put(key, _bytes_of(value))
        else:
            return False
        return stored(code)

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None) -> bool:
        if not keys:
            return False
        if target_locations is not None:
            codes = self.store.batch_put_from(keys, list(target_locations), list(target_sizes))
        elif values is not None:
            codes = self.store.batch_put_parts(keys, [[_bytes_of(value)] for value in values])
        else:
            return False
        return all(stored(code) for code in codes)

    def exists(self, key) -> bool:
        return self.store.is_exist(key) == 1

    def clear(self) -> None:
        """Removes this rank's pages (its key namespaces); other models and ranks keep theirs."""
        namespaces = (self._namespaces or []) + list(self._pool_namespaces.values())
        namespaces = namespaces or ([self.key_prefix] if self.key_prefix else [])
        for namespace in namespaces:
            self.store.remove_by_regex("^" + re.escape(namespace))
        if not namespaces:
            self.store.remove_all()

    def close(self) -> None:
        for pointer in self._registered:
            self.store.unregister_buffer(pointer)
        self._registered.clear()
        self.store.close()


def _grouped(pointers, sizes, object_count) -> tuple:
    """(pointers, sizes) as one list of parts per object, in order."""
    if object_count == 0 or len(pointers) % object_count:
        raise ValueError(f"strata: {len(pointers)} buffer parts do not split into {object_count} pages")
    per_object = len(pointers) // object_count
    grouped_pointers = [pointers[i : i + per_object] for i in range(0, len(pointers), per_object)]
    grouped_sizes = [sizes[i : i + per_object] for i in range(0, len(sizes), per_object)]
    return grouped_pointers, grouped_sizes


def _restorable_stops(present: list, window: int) -> list:
    """The prefix lengths (1..len(present)) whose last ``window`` pages (fewer at the start) are present."""
    stops, run = [], 0
    for length, here in enumerate(present, start=1):
        run = run + 1 if here else 0
        if run >= min(window, length):
            stops.append(length)
    return stops


def _bytes_of(value) -> bytes:
    if isinstance(value, torch.Tensor):
        return value.contiguous().view(torch.uint8).numpy().tobytes()
    return bytes(value)

