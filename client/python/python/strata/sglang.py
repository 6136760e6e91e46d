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

The v2 ``PoolTransfer`` interface (hybrid pools: Mamba, SWA, DSA) is not implemented: SGLang only uses it
for backends that declare it, and falls back to v1 for the KV pool.
"""

from __future__ import annotations

import logging
import re

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

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
        self._registered = []
        self._namespaces = None

    # ---- registration ---------------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        buffers = getattr(mem_pool_host, "get_hybrid_pool_buffer", lambda: [mem_pool_host.kv_buffer])()
        for buffer in buffers:
            if buffer is None:
                continue
            pointer, size = buffer.data_ptr(), buffer.numel() * buffer.element_size()
            if self.store.register_buffer(pointer, size) != OK:
                raise ValueError(f"strata: could not register the host pool's buffer at {pointer:#x}")
            self._registered.append(pointer)
        self._namespaces = self._namespaces_of(mem_pool_host)

    def _namespaces_of(self, pool) -> list:
        """The key namespace of each object of a page: one, or ``split_factor`` in split-heads mode."""
        config = self.config
        model = (config.model_name or "default").replace("/", "-")
        layout = _LAYOUT_FAMILIES.get(pool.layout, pool.layout)
        tail = f"pp{config.pp_rank}/"
        if config.attn_cp_size > 1 or config.dcp_size > 1:
            # Context-parallel ranks hold different shards of a page: their objects must never meet.
            tail = f"cp{config.attn_cp_size}.{config.attn_cp_rank}/dcp{config.dcp_size}.{config.dcp_rank}/{tail}"
        if config.is_mla_model:
            return [f"{self.key_prefix}{model}/mla/{layout}/tp*/{tail}"]
        unit, first = config.tp_size * self.split_factor, config.tp_rank * self.split_factor
        return [f"{self.key_prefix}{model}/mha/{layout}/tp{unit}.{first + i}/{tail}" for i in range(self.split_factor)]

    def _object_keys(self, page_keys):
        """The node's keys of the pages' objects, page by page (and unit by unit within a page)."""
        if self._namespaces is None:
            raise RuntimeError("strata: register_mem_pool_host() must come before page transfers")
        return [namespace + key for key in page_keys for namespace in self._namespaces]

    def _page_parts(self, object_count, host_indices):
        """The host pool's (pointers, sizes) grouped per object, in the pool's own part order."""
        pool = self.mem_pool_host
        if self.split_factor == 1:
            pointers, sizes = pool.get_page_buffer_meta(host_indices)
        else:
            pointers, sizes = pool.get_split_heads_page_buffer_meta(host_indices, self.split_factor)
        if object_count == 0 or len(pointers) % object_count:
            raise ValueError(f"strata: {len(pointers)} buffer parts do not split into {object_count} pages")
        per_object = len(pointers) // object_count
        grouped_pointers = [pointers[i : i + per_object] for i in range(0, len(pointers), per_object)]
        grouped_sizes = [sizes[i : i + per_object] for i in range(0, len(sizes), per_object)]
        return grouped_pointers, grouped_sizes

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
        """Removes this rank's pages (its key namespace); other models and ranks keep theirs."""
        namespaces = self._namespaces or ([self.key_prefix] if self.key_prefix else [])
        for namespace in namespaces:
            self.store.remove_by_regex("^" + re.escape(namespace))
        if not namespaces:
            self.store.remove_all()

    def close(self) -> None:
        for pointer in self._registered:
            self.store.unregister_buffer(pointer)
        self._registered.clear()
        self.store.close()


def _bytes_of(value) -> bytes:
    if isinstance(value, torch.Tensor):
        return value.contiguous().view(torch.uint8).numpy().tobytes()
    return bytes(value)

