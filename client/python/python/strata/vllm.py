"""``StrataConnector``: a vLLM (0.33) KV connector whose blocks live on a Strata node.

vLLM loads it with::

    --kv-transfer-config '{"kv_connector":"StrataConnector","kv_connector_module_path":"strata.vllm",
                           "kv_role":"kv_both","kv_connector_extra_config":{"address":"127.0.0.1:7600"}}'

Extra-config keys: ``address`` (the node: ``host:port``, a list, or comma-separated), ``token`` (the
tenant's token), ``key_prefix`` (a namespace of the operator's own).

**Objects.** One object per (block, layer): the block's rows of that layer's KV cache tensor (its K and V
rows as two parts of one put, or one part for MLA), written from and read into the registered KV cache
tensors with no staging copy. A block's layers share a group, so the node evicts them together. Keys are
``{key_prefix}{model}/tp{size}.{rank}/{block hash}/{layer name}`` in bytes, the block hash as vLLM computed
it: ranks and models never share a key, and a layer name is unique across pipeline stages.

**Scheduler side.** ``get_num_new_matched_tokens`` is one prefix match of the request's block-hash chain
(one round trip per shard), over the keys of TP rank 0's last layer: layers are saved in order, so a block
whose last layer is stored is stored whole on that rank. A hit stops one token short of the prompt, as
vLLM needs a token to compute. ``build_connector_meta`` carries the blocks to load (the hit) and to save
(every block that became full in the step). Saves finish inside the step (``wait_for_save``), so
``request_finished`` never delays freeing a request's blocks.

**Worker side.** ``save_kv_layer`` queues the layer's put (one batch for every block of the step) to a
saver thread, so the forward pass goes on while the layer is sent; ``wait_for_save`` waits for the queue.
Each layer's object is readable once its put returned: a reader can start before the last layer lands.
``start_load_kv`` hands the step's loads to a loader thread that reads layer after layer (one batch per
layer);
``wait_for_layer_load`` waits for its layer only, so layer i is used while later layers are in flight.
A block whose read fails (evicted, removed, or short) is reported by ``get_block_ids_with_load_errors``
from the node's per-key statuses, so vLLM recomputes those blocks and only those.

**What is tested where.** The scheduler side and the worker side over CPU KV cache tensors are tested on
a real node with vLLM's own ``Scheduler`` (``client/python/engine_tests/test_vllm.py``). KV caches on a GPU
need a device transfer path that no machine here can test: ``register_kv_caches`` refuses them with a clear
error rather than reading device pointers as host memory. Not yet built: vLLM's KV events from Strata's
event stream (``take_events`` returns none), TP-asymmetric (GQA) loads, and hybrid (HMA) groups.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from . import OBJECT_ALREADY_EXISTS, OK
from .store import StrataStore

logger = logging.getLogger(__name__)


@dataclass
class BlockTransfer:
    """Blocks of one request to move: their hashes (vLLM's, bytes) and their block ids in vLLM's KV cache."""

    request_id: str
    hashes: list
    block_ids: list


@dataclass
class StrataConnectorMetadata(KVConnectorMetadata):
    """What the workers do in a step: blocks to load before the forward pass, blocks to save during it."""

    loads: list = field(default_factory=list)
    saves: list = field(default_factory=list)


@dataclass
class _Tracked:
    """The scheduler's view of a request: its block ids, the blocks already saved, and a pending load."""

    request: Any
    block_ids: list = field(default_factory=list)
    saved_blocks: int = 0
    load_from: int = 0
    load_to: int = 0


def _connect(extra: dict) -> StrataStore:
    address = extra.get("address")
    if not address:
        raise ValueError("strata: kv_connector_extra_config needs 'address' (the Strata node, host:port)")
    store = StrataStore()
    options = {"token": extra["token"]} if extra.get("token") else {}
    code = store.setup(address, **options)
    if code != OK:
        raise ConnectionError(f"strata: no node answered at {address!r} (code {code})")
    return store


class StrataConnector(KVConnectorBase_V1):
    """vLLM's ``KVConnectorBase_V1`` on a Strata node (see the module's docs)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self.store = _connect(extra)
        self.block_size = vllm_config.cache_config.block_size
        parallel = vllm_config.parallel_config
        model = str(vllm_config.model_config.model).strip("/").replace("/", "-")
        self._namespace = f"{extra.get('key_prefix', '')}{model}/tp{parallel.tensor_parallel_size}.".encode()
        self.tp_rank = 0
        if role == KVConnectorRole.WORKER:
            self.tp_rank = _tensor_parallel_rank()
        self._layer_names = list(kv_cache_config.kv_cache_groups[0].layer_names) if kv_cache_config else []
        self.scheduler = _SchedulerSide(self) if role == KVConnectorRole.SCHEDULER else None
        self.worker = _WorkerSide(self) if role == KVConnectorRole.WORKER else None

    def keys(self, block_hashes, layer_name: str, rank: int | None = None) -> list:
        """The node's keys of these blocks' objects in one layer (``layer_name`` empty: the blocks' groups).
        Keys are bytes, with vLLM's block hashes as they are: no hex encoding on the lookup path."""
        head = self._namespace + str(self.tp_rank if rank is None else rank).encode() + b"/"
        tail = b"/" + layer_name.encode()
        return [head + block_hash + tail for block_hash in block_hashes]

    def key(self, block_hash: bytes, layer_name: str, rank: int | None = None) -> bytes:
        return self.keys([block_hash], layer_name, rank)[0]

    # ---- scheduler side -------------------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self.scheduler.matched_tokens(request, num_computed_tokens), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.scheduler.after_alloc(request, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        return self.scheduler.step_metadata(scheduler_output)

    def request_finished(self, request, block_ids):
        self.scheduler.finished(request.request_id)
        return False, None

    # ---- worker side ----------------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict):
        self.worker.register(kv_caches)

    def start_load_kv(self, forward_context, **kwargs):
        self.worker.start_loads(self._get_connector_metadata())

    def wait_for_layer_load(self, layer_name: str) -> None:
        self.worker.wait_for_layer(layer_name)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        self.worker.save_layer(self._get_connector_metadata(), layer_name)

    def wait_for_save(self):
        self.worker.wait_for_saves()

    def get_block_ids_with_load_errors(self) -> set:
        return self.worker.take_load_errors() if self.worker else set()

    def shutdown(self):
        if self.worker:
            self.worker.close()
        self.store.close()


def _block_layout(name: str, tensor, num_blocks) -> tuple:
    """Where a layer's blocks are: (part bases, block stride, part size) in bytes. vLLM's CPU and flash
    layouts are ``[2, num_blocks, ...]`` (a block's K and V rows) or ``[num_blocks, ...]`` (one row: MLA)."""
    item = tensor.element_size()
    if tensor.dim() >= 2 and tensor.shape[0] == 2 and tensor.shape[1] == num_blocks and tensor[0, 0].is_contiguous():
        return [tensor[0].data_ptr(), tensor[1].data_ptr()], tensor.stride(1) * item, tensor[0, 0].numel() * item
    if tensor.shape[0] == num_blocks and tensor[0].is_contiguous():
        return [tensor.data_ptr()], tensor.stride(0) * item, tensor[0].numel() * item
    raise ValueError(f"strata: layer {name}'s KV cache has shape {tuple(tensor.shape)}, not {num_blocks} blocks of contiguous rows")


def _tensor_parallel_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank()
    except (AssertionError, AttributeError):
        return 0  # no tensor-parallel group: one rank


class _SchedulerSide:
    """The scheduler's half: lookups, and the load and save specs of each step."""

    def __init__(self, connector: StrataConnector):
        self.connector = connector
        self.block_size = connector.block_size
        self.marker_layer = connector._layer_names[-1] if connector._layer_names else None
        self.tracked: dict = {}

    def matched_tokens(self, request, num_computed_tokens: int) -> int:
        tracked = self.tracked.setdefault(request.request_id, _Tracked(request))
        if not request.block_hashes or self.marker_layer is None:
            return 0
        blocks = self.connector.store.prefix_match(self.connector.keys(request.block_hashes, self.marker_layer, 0))
        if blocks <= 0:
            return 0
        # vLLM computes at least one token: a hit covering the whole prompt stops a block short.
        usable = min(blocks * self.block_size, (request.num_tokens - 1) // self.block_size * self.block_size)
        tracked.load_from, tracked.load_to = num_computed_tokens // self.block_size, usable // self.block_size
        return max(usable - num_computed_tokens, 0)

    def after_alloc(self, request, num_external_tokens: int) -> None:
        tracked = self.tracked.setdefault(request.request_id, _Tracked(request))
        if num_external_tokens == 0:
            tracked.load_from = tracked.load_to = 0

    def step_metadata(self, scheduler_output) -> StrataConnectorMetadata:
        metadata = StrataConnectorMetadata()
        for new in scheduler_output.scheduled_new_reqs:
            tracked = self.tracked.get(new.req_id)
            if tracked is None:
                continue
            tracked.block_ids = list(new.block_ids[0])
            if tracked.load_to > tracked.load_from:
                metadata.loads.append(self._transfer(tracked, tracked.load_from, tracked.load_to))
            tracked.saved_blocks = max(tracked.load_to, new.num_computed_tokens // self.block_size)
            tracked.load_from = tracked.load_to = 0
            self._add_saves(metadata, tracked, new.num_computed_tokens, scheduler_output)
        cached = scheduler_output.scheduled_cached_reqs
        for at, request_id in enumerate(cached.req_ids):
            tracked = self.tracked.get(request_id)
            if tracked is None:
                continue
            new_ids = cached.new_block_ids[at]
            if new_ids is not None:
                resumed = request_id in cached.resumed_req_ids
                tracked.block_ids = list(new_ids[0]) if resumed else tracked.block_ids + list(new_ids[0])
            self._add_saves(metadata, tracked, cached.num_computed_tokens[at], scheduler_output)
        return metadata

    def _add_saves(self, metadata, tracked: _Tracked, computed: int, scheduler_output) -> None:
        """Saves the blocks that become full in this step and have a hash."""
        scheduled = scheduler_output.num_scheduled_tokens.get(tracked.request.request_id, 0)
        full = min((computed + scheduled) // self.block_size, len(tracked.request.block_hashes), len(tracked.block_ids))
        if full > tracked.saved_blocks:
            metadata.saves.append(self._transfer(tracked, tracked.saved_blocks, full))
            tracked.saved_blocks = full

    @staticmethod
    def _transfer(tracked: _Tracked, start: int, end: int) -> BlockTransfer:
        hashes = list(tracked.request.block_hashes[start:end])
        return BlockTransfer(tracked.request.request_id, hashes, tracked.block_ids[start:end])

    def finished(self, request_id: str) -> None:
        self.tracked.pop(request_id, None)


class _WorkerSide:
    """The worker's half: registered KV caches, a saver thread and a loader thread."""

    def __init__(self, connector: StrataConnector):
        self.connector = connector
        self.store = connector.store
        self.num_blocks = connector._kv_cache_config.num_blocks if connector._kv_cache_config else None
        self.layouts: dict = {}
        self.registered: list = []
        self.saves: queue.Queue = queue.Queue()
        self.save_failures = 0
        self.saver = threading.Thread(target=self._save_loop, name="strata-vllm-saver", daemon=True)
        self.saver.start()
        self.loaded: dict = {}
        self.load_errors: set = set()
        self.errors_lock = threading.Lock()
        self.loads: queue.Queue = queue.Queue()
        self.loader = threading.Thread(target=self._load_loop, name="strata-vllm-loader", daemon=True)
        self.loader.start()

    def register(self, kv_caches: dict) -> None:
        for name, tensor in kv_caches.items():
            if tensor.device.type != "cpu":
                raise NotImplementedError(
                    f"strata: layer {name}'s KV cache is on {tensor.device}; Strata's vLLM connector moves "
                    "CPU KV caches only (the GPU path is not built: no machine here can test it)"
                )
            self.layouts[name] = _block_layout(name, tensor, self.num_blocks)
            pointer, size = tensor.data_ptr(), tensor.numel() * tensor.element_size()
            if self.store.register_buffer(pointer, size) != OK:
                raise ValueError(f"strata: could not register layer {name}'s KV cache at {pointer:#x}")
            self.registered.append(pointer)

    def _block_parts(self, layer_name: str, block_ids) -> tuple:
        """Each block's (pointers, sizes) in a layer: its K and V rows, or its one row (MLA)."""
        bases, stride, size = self.layouts[layer_name]
        pointers = [[base + block * stride for base in bases] for block in block_ids]
        return pointers, [[size] * len(bases) for _ in block_ids]

    # ---- saves ----------------------------------------------------------------------------------------

    def save_layer(self, metadata: StrataConnectorMetadata, layer_name: str) -> None:
        if layer_name not in self.layouts or not metadata.saves:
            return
        keys, groups, pointers, sizes = [], [], [], []
        for transfer in metadata.saves:
            block_pointers, block_sizes = self._block_parts(layer_name, transfer.block_ids)
            keys += self.connector.keys(transfer.hashes, layer_name)
            groups += self.connector.keys(transfer.hashes, "")
            pointers += block_pointers
            sizes += block_sizes
        self.saves.put((keys, pointers, sizes, groups))

    def _save_loop(self) -> None:
        while True:
            job = self.saves.get()
            if job is None:
                self.saves.task_done()
                return
            keys, pointers, sizes, groups = job
            try:
                codes = self.store.batch_put_from_multi_buffers(keys, pointers, sizes, groups=groups)
                failed = [key for key, code in zip(keys, codes) if code not in (OK, OBJECT_ALREADY_EXISTS)]
                if failed:
                    self.save_failures += len(failed)
                    logger.warning("strata: %d block layers were not saved (first: %s)", len(failed), failed[0])
            finally:
                self.saves.task_done()

    def wait_for_saves(self) -> None:
        self.saves.join()

    # ---- loads ----------------------------------------------------------------------------------------

    def start_loads(self, metadata: StrataConnectorMetadata) -> None:
        self.loaded = {name: threading.Event() for name in self.layouts}
        if not metadata.loads:
            for event in self.loaded.values():
                event.set()
            return
        self.loads.put((metadata.loads, self.loaded))

    def _load_loop(self) -> None:
        """Reads a step's layers in order, each as one batch, and marks each layer loaded when it lands."""
        while True:
            job = self.loads.get()
            if job is None:
                return
            loads, loaded = job
            block_ids = [block for transfer in loads for block in transfer.block_ids]
            stems = [stem for transfer in loads for stem in self.connector.keys(transfer.hashes, "")]
            for layer_name, done in loaded.items():
                try:
                    self._load_layer(layer_name, stems, block_ids)
                finally:
                    done.set()

    def _load_layer(self, layer_name: str, stems: list, block_ids: list) -> None:
        """One batch: every block's object of this layer (its key: the block's stem and the layer's name)."""
        suffix = layer_name.encode()
        keys = [stem + suffix for stem in stems]
        pointers, sizes = self._block_parts(layer_name, block_ids)
        codes = self.store.batch_get_into_multi_buffers(keys, pointers, sizes)
        failed = {block for block, code, parts in zip(block_ids, codes, sizes) if code != sum(parts)}
        if failed:
            with self.errors_lock:
                self.load_errors |= failed

    def wait_for_layer(self, layer_name: str) -> None:
        done = self.loaded.get(layer_name)
        if done is not None:
            done.wait()

    def take_load_errors(self) -> set:
        with self.errors_lock:
            errors, self.load_errors = self.load_errors, set()
        return errors

    def close(self) -> None:
        self.saves.put(None)
        self.loads.put(None)
        self.saver.join(timeout=30)
        self.loader.join(timeout=30)
        for pointer in self.registered:
            self.store.unregister_buffer(pointer)
        self.registered.clear()
