"""``StrataConnector``: an LMCache (0.5.6) remote storage plugin whose chunks live on a Strata node.

LMCache loads it from its config::

    remote_storage_plugins: ["strata"]
    extra_config:
      remote_storage_plugin.strata.module_path: strata.lmcache
      remote_storage_plugin.strata.class_name: StrataConnector
      remote_storage_plugin.strata.address: 127.0.0.1:7600    # the node: host:port, a list, or comma-separated
      remote_storage_plugin.strata.token: ...                 # optional: the tenant's token

**Objects.** A chunk is one object under ``key.to_string()`` (LMCache's key: model, world size, worker,
chunk hash, dtype, tags). With ``save_chunk_meta`` (LMCache's default) the object is LMCache's own
``RemoteMetadata`` header followed by the chunk's bytes, so a partial chunk reads back with its own shape;
without it, the object is the bytes alone and a partial chunk is reshaped from its length. The header and
the chunk are sent as two parts of one put, never joined into a copy.

**Round trips.** Contains checks are one prefix match of the chunk keys (one round trip per shard), and
batched gets and puts are one batch each. Every blocking call runs in a worker thread, so LMCache's event
loop never waits on the network.

``list()`` walks the node's keys (SCAN, a page per round trip per shard) and returns them as LMCache's key
strings: every chunk the node holds for this plugin's tenant, whichever engine stored it.
"""

from __future__ import annotations

import asyncio
import logging

from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from . import OK
from .store import connect, stored

logger = logging.getLogger(__name__)


def plugin_settings(config) -> dict:
    """The ``remote_storage_plugin.<name>.*`` settings of the plugin that names this module."""
    extra = dict(getattr(config, "extra_config", None) or {})
    for name in getattr(config, "remote_storage_plugins", None) or []:
        prefix = f"remote_storage_plugin.{name}."
        if extra.get(prefix + "module_path") == __name__:
            return {key[len(prefix) :]: value for key, value in extra.items() if key.startswith(prefix)}
    return {}


class StrataConnector(RemoteConnector):
    """LMCache's ``RemoteConnector`` on a Strata node (see the module's docs)."""

    def __init__(self, loop, local_cpu_backend, config=None):
        super().__init__(local_cpu_backend.config, local_cpu_backend.metadata)
        settings = plugin_settings(config or local_cpu_backend.config)
        options = {"token": settings["token"]} if settings.get("token") else {}
        self.store = connect(settings.get("address"), "set remote_storage_plugin.<name>.address", **options)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend

    # ---- contains -------------------------------------------------------------------------------------

    async def exists(self, key) -> bool:
        return await asyncio.to_thread(self.exists_sync, key)

    def exists_sync(self, key) -> bool:
        return self.store.is_exist(key.to_string()) == 1

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys) -> int:
        """How many leading chunks are stored: one prefix match."""
        if not keys:
            return 0
        return max(self.store.prefix_match([key.to_string() for key in keys]), 0)

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id, keys, pin=False) -> int:
        del lookup_id, pin  # a node keeps a chunk until evicted; there is nothing to pin
        return await asyncio.to_thread(self.batched_contains, keys)

    # ---- puts -----------------------------------------------------------------------------------------

    async def put(self, key, memory_obj) -> None:
        await self.batched_put([key], [memory_obj])

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys, memory_objs) -> None:
        if not keys:
            return
        names = [key.to_string() for key in keys]
        parts = [self._parts_of(memory_obj) for memory_obj in memory_objs]
        codes = await asyncio.to_thread(self.store.batch_put_parts, names, parts)
        for name, code in zip(names, codes):
            if not stored(code):
                logger.warning("strata: put of %s failed (code %d)", name, code)

    def _parts_of(self, memory_obj):
        data = memory_obj.byte_array
        if not self.save_chunk_meta:
            return [data]
        header = RemoteMetadata(
            len(data), memory_obj.get_shapes(), memory_obj.get_dtypes(), memory_obj.get_memory_format()
        ).serialize()
        return [header, data]

    # ---- gets -----------------------------------------------------------------------------------------

    async def get(self, key):
        return (await self.batched_get([key]))[0]

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys):
        """A ``MemoryObj`` per key, or None for a chunk not stored (or not readable as a chunk)."""
        if not keys:
            return []
        values = await asyncio.to_thread(self.store.get_batch, [key.to_string() for key in keys])
        return [self._chunk_of(value) if value else None for value in values]

    async def batched_get_non_blocking(self, lookup_id, keys):
        """The leading chunks that were read, up to the first one that was not; later ones are released."""
        del lookup_id
        chunks = await self.batched_get(keys)
        leading = []
        for chunk in chunks:
            if chunk is None:
                break
            leading.append(chunk)
        for chunk in chunks[len(leading) :]:
            if chunk is not None:
                chunk.ref_count_down()
        return leading

    def _chunk_of(self, value: bytes):
        """The memory object holding one stored chunk; None when the value is not a chunk of this model."""
        try:
            if self.save_chunk_meta:
                return self._chunk_with_header(value)
            return self._chunk_without_header(value)
        except (ValueError, KeyError, AssertionError) as error:
            logger.warning("strata: a stored value is not a chunk of this model: %s", error)
            return None

    def _chunk_with_header(self, value: bytes):
        header_bytes = self.remote_metadata_bytes
        if len(value) < header_bytes:
            raise ValueError(f"{len(value)} bytes, shorter than the {header_bytes}-byte header")
        metadata = RemoteMetadata.deserialize(value[:header_bytes])
        if metadata.length != len(value) - header_bytes:
            raise ValueError(f"the header says {metadata.length} bytes, the value holds {len(value) - header_bytes}")
        memory_obj = self.local_cpu_backend.allocate(metadata.shapes, metadata.dtypes, metadata.fmt)
        if memory_obj is None:
            logger.warning("strata: LMCache's CPU backend had no room for a fetched chunk")
            return None
        _bytes_of(memory_obj)[: metadata.length] = memoryview(value)[header_bytes:]
        return memory_obj

    def _chunk_without_header(self, value: bytes):
        memory_obj = self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)
        if memory_obj is None:
            logger.warning("strata: LMCache's CPU backend had no room for a fetched chunk")
            return None
        if len(value) > self.full_chunk_size_bytes:
            memory_obj.ref_count_down()
            raise ValueError(f"{len(value)} bytes, more than a full chunk ({self.full_chunk_size_bytes})")
        _bytes_of(memory_obj)[: len(value)] = value
        return self.reshape_partial_chunk(memory_obj, len(value))

    # ---- the rest -------------------------------------------------------------------------------------

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        """0 when the node answers, else Strata's negative code."""
        return await asyncio.to_thread(self.store.health_check)

    def remove_sync(self, key) -> bool:
        return self.store.remove(key.to_string()) == OK

    async def list(self) -> list[str]:
        keys = await asyncio.to_thread(self.store.list_keys)
        return [key.decode("utf-8", errors="replace") for key in keys]

    async def close(self) -> None:
        await asyncio.to_thread(self.store.close)


def _bytes_of(memory_obj) -> memoryview:
    """A memory object's bytes as a plain byte view (LMCache's ``byte_array`` has ctypes' ``<B`` format,
    which a slice assignment from bytes refuses)."""
    return memoryview(memory_obj.byte_array).cast("B")
