"""``StrataConnector``: a vLLM (0.33) KV connector whose blocks live on a Strata node.

vLLM loads it with::

    --kv-transfer-config '{"kv_connector":"StrataConnector","kv_connector_module_path":"strata.vllm",
                           "kv_role":"kv_both","kv_connector_extra_config":{"address":"127.0.0.1:7600"}}'

Extra-config keys: ``address`` (the node: ``host:port``, a list, or comma-separated), ``token`` (the
tenant's token), ``key_prefix`` (a namespace of the operator's own), ``kv_head_units`` (below),
``spin_microseconds`` (how long the connector's store busy-polls a reply before its thread sleeps: by default
1,000 on the scheduler side, whose lookup is on the engine's critical path and answered well within it, so
that it never pays a sleeping thread's wake-up, 50–100 µs on a virtual machine; 0 on the worker side, whose
loads and saves run on threads of their own).

**Objects.** One object per (block, layer, head unit): the block's rows of that layer's KV cache tensor
(K and V rows, or one row for MLA), written from and read into the registered KV cache tensors with no
staging copy. The objects of one scheduler block (every layer, every head unit) share a group, so the node
evicts them together. Keys are ``{key_prefix}{model}/b{tokens}/u{units}.{unit}/{block hash}/{layer name}``
in bytes: the block's tokens, and its block hash as vLLM computed it (the hash of the block's last
``hash_block_size`` tokens, which chains over its whole prefix). Models never share a key, a layer name is
unique across pipeline stages, and a block's size is in its key because its hash names where it ends, not
where it starts.

**Hybrid models** (``SupportsHMA``). vLLM's hybrid KV cache manager gives each kind of attention its own
group, with its own block table and block size (full attention, sliding window, chunked local attention,
MLA): the connector moves every group that vLLM lets connectors transfer and prefix-cache. A hit is counted
in scheduler blocks (the least common multiple of the groups' block sizes), and the blocks of every group
that become full are saved, so a prefix stored whole for the lookup's layer is stored for all. On a load, a
group's blocks that vLLM left out (the null block: a sliding window's blocks below the window) are neither
read nor written. Mamba groups and decode-context parallelism are refused with a clear error: their state
is not a list of token blocks.

**Head units (TP asymmetry).** A layer's KV heads are stored as ``kv_head_units`` objects per block (by
default the TP size: one per rank). A rank of TP size T holds ``units / T`` of them; when it holds more than
one, each unit's object is the slices of that unit's heads in every token of the block, K rows then V rows,
gathered on a put and scattered on a get straight between the KV cache and the socket (a multi-buffer list,
no staging copy). So a prefill at TP 4 (units 4) and a decode at TP 2 (``"kv_head_units": 4``) read and
write the same objects, whichever side computed a block. ``kv_head_units`` must be a multiple of the TP size.

**Scheduler side.** ``get_num_new_matched_tokens`` is one prefix match of the request's block-hash chain
(one round trip per shard), over the keys of head unit 0's last layer in forward order: layers are saved in
order, so a block whose last layer is stored is stored whole for that unit. A hit stops one token short of
the prompt, as
vLLM needs a token to compute. ``build_connector_meta`` carries the blocks to load (the hit) and to save
(every block that became full in the step). Saves finish inside the step (``wait_for_save``), so
``request_finished`` never delays freeing a request's blocks.

**Worker side.** ``save_kv_layer`` queues the layer's put (one batch for every block of the step) to a
saver thread, so the forward pass goes on while the layer is sent; ``wait_for_save`` waits for the queue.
Each layer's object is readable once its put returned: a reader can start before the last layer lands.
``start_load_kv`` hands the step's loads to a loader thread that reads layer after layer (one batch per
layer); ``wait_for_layer_load`` waits for its layer only, so layer i is used while later layers are in
flight.
A block whose read fails (evicted, removed, or short) is reported by ``get_block_ids_with_load_errors``
from the node's per-key statuses, so vLLM recomputes those blocks and only those.

**What is tested where.** The scheduler side and the worker side over CPU KV cache tensors are tested on
a real node with vLLM's own ``Scheduler`` (``client/python/engine_tests/test_vllm.py``). KV caches on a GPU
need a device transfer path that no machine here can test: ``register_kv_caches`` refuses them with a clear
error rather than reading device pointers as host memory. Hybrid groups (a full-attention group and a
sliding-window group of another block size, their layers sharing KV cache tensors as vLLM lays them out)
are tested the same way.

**MLA.** The latent rows are the same on every TP rank: rank 0 stores one copy (unit 0 of 1), and every
rank, at any TP size, reads it.

**Events.** ``take_events`` returns vLLM's own ``BlockStored`` and ``BlockRemoved``, translated from the
node's event stream of the blocks' last-layer objects (see ``_BlockEvents``).
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

from . import OK
from .store import connect, stored

logger = logging.getLogger(__name__)

# How long the scheduler side's store busy-polls a reply before sleeping (see the module's docs).
SCHEDULER_SPIN_MICROSECONDS = 1000

# vLLM's BlockPool reserves block 0 as its null block: the entry of a block a group does not hold (a sliding
# window's blocks below the window). It holds no request's KV: the connector never saves or loads it.
NULL_BLOCK_ID = 0


@dataclass
class BlockTransfer:
    """Blocks of one request to move, over a range of its tokens that starts and ends on scheduler blocks:
    the range's block hashes as vLLM computed them (bytes, one per ``hash_block_size`` tokens) and, for
    each KV cache group the connector moves (``StrataConnector.groups``, in order), that group's block ids
    over the range in vLLM's KV cache (``NULL_BLOCK_ID`` where the group holds no block)."""

    request_id: str
    hashes: list
    block_ids: tuple


@dataclass
class StrataConnectorMetadata(KVConnectorMetadata):
    """What the workers do in a step: blocks to load before the forward pass, blocks to save during it."""

    loads: list = field(default_factory=list)
    saves: list = field(default_factory=list)


@dataclass(frozen=True)
class KvGroup:
    """A KV cache group the connector moves: where its block ids sit in vLLM's per-group tuples, its tokens
    per block, how many block hashes make one of its blocks, its layers, and its kind of attention as
    vLLM's events name it (``full_attention``, ``sliding_window``, ..., and the window in tokens)."""

    position: int
    block_size: int
    hashes_per_block: int
    layers: tuple
    kind: str | None = None
    sliding_window: int | None = None

    def block_hashes(self, hashes):
        """One hash per block of this group: the last of the block's hashes, which chains over its prefix."""
        step = self.hashes_per_block
        return hashes if step == 1 else hashes[step - 1 :: step]


@dataclass
class _Tracked:
    """The scheduler's view of a request: its block ids (one list per group), the tokens already saved,
    and a pending load (a range of tokens)."""

    request: Any
    block_ids: tuple = ()
    saved_tokens: int = 0
    load_from: int = 0
    load_to: int = 0


class StrataConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM's ``KVConnectorBase_V1`` on a Strata node (see the module's docs)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self.groups, self.block_size, self.hash_block_size = _kv_groups(vllm_config, kv_cache_config)
        options = {"token": extra["token"]} if extra.get("token") else {}
        default_spin = SCHEDULER_SPIN_MICROSECONDS if role == KVConnectorRole.SCHEDULER else 0
        options["spin_microseconds"] = int(extra.get("spin_microseconds", default_spin))
        self.store = connect(extra.get("address"), "kv_connector_extra_config needs 'address'", **options)
        tp_size = vllm_config.parallel_config.tensor_parallel_size
        rank = _tensor_parallel_rank() if role == KVConnectorRole.WORKER else 0
        # MLA's latent rows are the same on every rank: one copy, written by rank 0, read by all.
        self.latent = _is_latent(kv_cache_config)
        self.writes = rank == 0 or not self.latent
        self.head_units = 1 if self.latent else int(extra.get("kv_head_units", tp_size))
        if self.head_units % tp_size and not self.latent:
            raise ValueError(
                f"strata: kv_head_units ({self.head_units}) must be a multiple of the TP size ({tp_size}): "
                "each rank stores and loads whole units of KV heads"
            )
        model = str(vllm_config.model_config.model).strip("/").replace("/", "-")
        self._namespace = f"{extra.get('key_prefix', '')}{model}/".encode()
        per_rank = 1 if self.latent else self.head_units // tp_size
        first = 0 if self.latent else rank * per_rank
        self.units = list(range(first, first + per_rank))
        self._group_of_layer = {layer: group for group in self.groups for layer in group.layers}
        self.marker_layer = _last_layer(self.groups)
        self.scheduler = _SchedulerSide(self) if role == KVConnectorRole.SCHEDULER else None
        self.worker = _WorkerSide(self) if role == KVConnectorRole.WORKER else None

    def keys(self, block_hashes, layer_name: str, unit: int | None = None) -> list:
        """The node's keys of these blocks' objects of one head unit (this rank's first unit by default) in
        one layer; each hash is the block's, at the block size of the layer's group. Keys are bytes, with
        vLLM's block hashes as they are: no hex encoding on the lookup path."""
        head, tail = self.key_affixes(layer_name, unit)
        return [head + block_hash + tail for block_hash in block_hashes]

    def key_affixes(self, layer_name: str, unit: int | None = None) -> tuple:
        """What comes before and after a block hash in its key (see ``keys``)."""
        return self.key_head(self._group_of_layer[layer_name], unit), b"/" + layer_name.encode()

    def key_head(self, group: KvGroup, unit: int | None = None) -> bytes:
        """What comes before a block hash in the keys of a group's blocks, for one head unit."""
        unit = self.units[0] if unit is None else unit
        return self._namespace + f"b{group.block_size}/u{self.head_units}.{unit}/".encode()

    def key(self, block_hash: bytes, layer_name: str, unit: int | None = None) -> bytes:
        return self.keys([block_hash], layer_name, unit)[0]

    def eviction_group(self, scheduler_block_hash: bytes) -> bytes:
        """The group of every object of a scheduler block (all KV groups, layers and head units), named by
        the block's hash: they leave the node together."""
        return self._namespace + b"*/" + scheduler_block_hash

    # ---- scheduler side -------------------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self.scheduler.matched_tokens(request, num_computed_tokens), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.scheduler.after_alloc(request, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        return self.scheduler.step_metadata(scheduler_output)

    def request_finished(self, request, block_ids):
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(self, request, block_ids):
        # Saves finish inside their step (wait_for_save): a finished request's blocks are free at once.
        self.scheduler.finished(request.request_id)
        return False, None

    def take_events(self):
        return self.scheduler.events.take() if self.scheduler else ()

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
        if self.scheduler:
            self.scheduler.events.close()
        self.store.close()


def _kv_groups(vllm_config, kv_cache_config) -> tuple:
    """(the KV cache groups the connector moves, the scheduler's block size, the block hashes' size), as
    vLLM's engine core resolves them. Groups vLLM does not transfer or prefix-cache are left to vLLM; a
    group whose state is not a list of token blocks (Mamba) is refused."""
    block_size = vllm_config.cache_config.block_size
    if kv_cache_config is None or not kv_cache_config.kv_cache_groups:
        return (), block_size, block_size
    if vllm_config.parallel_config.decode_context_parallel_size > 1:
        raise ValueError("strata: decode-context parallelism (DCP > 1) is not supported by Strata's vLLM connector")
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
    from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind, get_kv_cache_spec_sliding_window

    scheduler_block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    groups = []
    for position, group in enumerate(kv_cache_config.kv_cache_groups):
        spec = group.kv_cache_spec
        if not group.enable_kv_transfer or not spec.prefix_cacheable:
            continue  # rebuilt by vLLM from another group, or a request's scratch: never shared
        if not _is_token_blocks(spec):
            raise ValueError(
                f"strata: KV cache group {position} is {type(spec).__name__}: Strata's vLLM connector moves "
                "attention KV blocks (full, sliding-window, chunked local, MLA), not recurrent state"
            )
        kind, window = get_kv_cache_spec_kind(spec).value, get_kv_cache_spec_sliding_window(spec)
        hashes_per_block = spec.block_size // hash_block_size
        groups.append(KvGroup(position, spec.block_size, hashes_per_block, tuple(group.layer_names), kind, window))
    return tuple(groups), scheduler_block_size, hash_block_size


def _is_token_blocks(spec) -> bool:
    """Whether a group's spec is attention KV held as token blocks (not Mamba state, not cross-attention)."""
    from vllm.v1.kv_cache_interface import AttentionSpec, CrossAttentionSpec, UniformTypeKVCacheSpecs

    specs = spec.kv_cache_specs.values() if isinstance(spec, UniformTypeKVCacheSpecs) else (spec,)
    return all(isinstance(one, AttentionSpec) and not isinstance(one, CrossAttentionSpec) for one in specs)


def _last_layer(groups) -> str | None:
    """The layer computed last in a forward pass (by its index in the model, as vLLM names layers:
    ``model.layers.{index}....``), of all the groups': the layer a lookup matches."""
    layers = [layer for group in groups for layer in group.layers]
    if not layers:
        return None

    def index(layer: str) -> int:
        numbers = [int(part) for part in layer.split(".") if part.isdigit()]
        return numbers[0] if numbers else -1

    return max(enumerate(layers), key=lambda item: (index(item[1]), item[0]))[1]


@dataclass(frozen=True)
class _LayerLayout:
    """Where a layer's blocks are, in bytes: the bases of its rows (K and V, or one for MLA), the block
    stride and a row's size; and, to split a row by head units, the token stride and a unit's bytes in a
    token (``unit_bytes`` 0: this rank holds one unit, a block's rows go whole)."""

    bases: tuple
    block_stride: int
    row_bytes: int
    tokens: int = 0
    token_stride: int = 0
    unit_bytes: int = 0

    def parts(self, block: int, unit: int) -> tuple:
        """(pointers, sizes) of one unit's object of one block: its rows whole, or, split by heads, every
        token's slice of the unit's heads, K rows then V rows (the layout of a rank that holds that unit
        alone, so any TP size that stores whole units reads and writes the same bytes)."""
        start = block * self.block_stride
        if not self.unit_bytes:
            return [base + start for base in self.bases], [self.row_bytes] * len(self.bases)
        offset = start + unit * self.unit_bytes
        pointers = [base + offset + token * self.token_stride for base in self.bases for token in range(self.tokens)]
        return pointers, [self.unit_bytes] * len(pointers)


def _block_layout(name: str, tensor, num_blocks, units: int) -> _LayerLayout:
    """A layer's layout: vLLM's CPU and flash layouts are ``[2, num_blocks, block_size, heads, head_size]``
    (a block's K and V rows) or ``[num_blocks, ...]`` (one row: MLA, which has no heads to split)."""
    item = tensor.element_size()
    if tensor.dim() >= 2 and tensor.shape[0] == 2 and tensor.shape[1] == num_blocks and tensor[0, 0].is_contiguous():
        bases = (tensor[0].data_ptr(), tensor[1].data_ptr())
        whole = _LayerLayout(bases, tensor.stride(1) * item, tensor[0, 0].numel() * item)
        if units == 1:
            return whole
        if tensor.dim() != 5 or tensor.shape[3] % units:
            raise ValueError(f"strata: layer {name}'s KV heads {tuple(tensor.shape)} do not split into {units} units")
        unit_bytes = tensor.shape[3] // units * tensor.shape[4] * item
        return _LayerLayout(bases, whole.block_stride, whole.row_bytes, tensor.shape[2], tensor.stride(2) * item, unit_bytes)
    if tensor.shape[0] == num_blocks and tensor[0].is_contiguous() and units == 1:
        return _LayerLayout((tensor.data_ptr(),), tensor.stride(0) * item, tensor[0].numel() * item)
    raise ValueError(
        f"strata: layer {name}'s KV cache has shape {tuple(tensor.shape)}: not {num_blocks} blocks of contiguous "
        f"rows that split into {units} head units"
    )


def _is_latent(kv_cache_config) -> bool:
    """Whether the KV cache is MLA's latent rows (the same on every TP rank)."""
    if kv_cache_config is None or not kv_cache_config.kv_cache_groups:
        return False
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    return isinstance(kv_cache_config.kv_cache_groups[0].kv_cache_spec, MLAAttentionSpec)


def _tensor_parallel_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank()
    except (AssertionError, AttributeError):
        return 0  # no tensor-parallel group: one rank


class _SchedulerSide:
    """The scheduler's half: lookups, and the load and save specs of each step. Token counts here are in
    whole scheduler blocks (``connector.block_size`` tokens), which every group's blocks divide."""

    def __init__(self, connector: StrataConnector):
        self.connector = connector
        self.block_size = connector.block_size
        self.hash_block_size = connector.hash_block_size
        marker = connector.marker_layer
        self.marker = connector._group_of_layer[marker] if marker is not None else None
        # What comes before and after a block hash in the keys a lookup matches (unit 0 of the lookup layer).
        self.marker_affixes = connector.key_affixes(marker, unit=0) if marker is not None else None
        self.tracked: dict = {}
        self.events = _BlockEvents(connector, self.marker, self.marker_affixes)

    def matched_tokens(self, request, num_computed_tokens: int) -> int:
        tracked = self.tracked.setdefault(request.request_id, _Tracked(request))
        if not request.block_hashes or self.marker is None:
            return 0
        # The keys are built in the store's native code: as Python bytes a 1,000-block chain's keys cost ~65 µs.
        head, tail = self.marker_affixes
        hashes = self.marker.block_hashes(request.block_hashes)
        blocks = self.connector.store.prefix_match_stems(head, hashes, tail)
        if blocks <= 0:
            return 0
        # vLLM computes at least one token: a hit covering the whole prompt stops a block short.
        usable = min(blocks * self.marker.block_size, request.num_tokens - 1) // self.block_size * self.block_size
        tracked.load_from, tracked.load_to = num_computed_tokens, usable
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
            tracked.block_ids = self._moved(new.block_ids)
            if tracked.load_to > tracked.load_from:
                metadata.loads.append(self._transfer(tracked, tracked.load_from, tracked.load_to))
            computed = new.num_computed_tokens // self.block_size * self.block_size
            tracked.saved_tokens = max(tracked.load_to, computed)
            tracked.load_from = tracked.load_to = 0
            self._add_saves(metadata, tracked, new.num_computed_tokens, scheduler_output)
        cached = scheduler_output.scheduled_cached_reqs
        for at, request_id in enumerate(cached.req_ids):
            tracked = self.tracked.get(request_id)
            if tracked is None:
                continue
            new_ids = cached.new_block_ids[at]
            if new_ids is not None:
                moved = self._moved(new_ids)
                if request_id in cached.resumed_req_ids:
                    tracked.block_ids = moved
                else:
                    tracked.block_ids = tuple(old + new for old, new in zip(tracked.block_ids, moved))
            self._add_saves(metadata, tracked, cached.num_computed_tokens[at], scheduler_output)
        return metadata

    def _moved(self, block_ids) -> tuple:
        """The block ids of the groups the connector moves, from vLLM's tuple of every group's."""
        return tuple(list(block_ids[group.position]) for group in self.connector.groups)

    def _add_saves(self, metadata, tracked: _Tracked, computed: int, scheduler_output) -> None:
        """Saves the scheduler blocks that become full in this step, have hashes, and have blocks in every
        group."""
        scheduled = scheduler_output.num_scheduled_tokens.get(tracked.request.request_id, 0)
        full = min(computed + scheduled, len(tracked.request.block_hashes) * self.hash_block_size)
        for group, block_ids in zip(self.connector.groups, tracked.block_ids):
            full = min(full, len(block_ids) * group.block_size)
        full = full // self.block_size * self.block_size
        if full > tracked.saved_tokens:
            metadata.saves.append(self._transfer(tracked, tracked.saved_tokens, full))
            self.events.expect(tracked.request, tracked.saved_tokens, full)
            tracked.saved_tokens = full

    def _transfer(self, tracked: _Tracked, start: int, end: int) -> BlockTransfer:
        """The blocks of tokens [start, end) (both on scheduler blocks)."""
        hashes = list(tracked.request.block_hashes[start // self.hash_block_size : end // self.hash_block_size])
        block_ids = tuple(
            ids[start // group.block_size : end // group.block_size]
            for group, ids in zip(self.connector.groups, tracked.block_ids)
        )
        return BlockTransfer(tracked.request.request_id, hashes, block_ids)

    def finished(self, request_id: str) -> None:
        self.tracked.pop(request_id, None)


class _BlockEvents:
    """vLLM's ``BlockStored`` / ``BlockRemoved`` events, taken from the node's event stream of head unit 0's
    objects of the lookup's layer (a block is stored once that layer is), at that layer's block size and
    with its group's index and kind, as vLLM's own events carry them.
    Token ids and parents are known for blocks this scheduler asked to save (remembered up to
    ``REMEMBERED`` blocks); for blocks another instance stored, an event carries the hash alone. When the
    node reports lost events (``Lagged``), the next batch starts with ``AllBlocksCleared``: a router drops
    what it knew of this pool and relearns it."""

    REMEMBERED = 1 << 16

    def __init__(self, connector: StrataConnector, marker: KvGroup | None, affixes: tuple | None):
        self.marker = marker
        self.block_size = marker.block_size if marker else connector.block_size
        self.subscription = None
        if marker is not None:
            self.head, self.tail = affixes
            self.subscription = connector.store.subscribe_events(self.head)
        self.known: dict = {}

    def expect(self, request, start: int, end: int) -> None:
        """Remembers the tokens and parent of blocks about to be saved (tokens [start, end)), for their
        BlockStored events."""
        if self.marker is None:
            return
        block_size, tokens = self.block_size, request.all_token_ids
        hashes = self.marker.block_hashes(request.block_hashes)
        for at in range(start // block_size, end // block_size):
            if len(self.known) >= self.REMEMBERED:
                self.known.pop(next(iter(self.known)))
            parent = hashes[at - 1] if at else None
            self.known[hashes[at]] = (list(tokens[at * block_size : (at + 1) * block_size]), parent)

    def take(self) -> list:
        if self.subscription is None:
            return []
        events = []
        for event in self.subscription.drain():
            kind = event["type"]
            if kind == "Lagged":
                events.append(AllBlocksCleared())
                continue
            hashes = [block for block in map(self._block_hash, event.get("keys", ())) if block is not None]
            if not hashes:
                continue
            if kind == "BlockStored":
                medium = "CPU" if event["tier"] == "dram" else "STORAGE"
                events += [self._stored(block, medium) for block in hashes]
            elif kind == "BlockRemoved":
                events.append(BlockRemoved(block_hashes=hashes, medium=None, group_idx=self.marker.position))
        return events

    def _stored(self, block: bytes, medium: str) -> BlockStored:
        tokens, parent = self.known.pop(block, ([], None))
        return BlockStored(
            block_hashes=[block],
            parent_block_hash=parent,
            token_ids=tokens,
            block_size=self.block_size,
            lora_id=None,
            medium=medium,
            lora_name=None,
            group_idx=self.marker.position,
            kv_cache_spec_kind=self.marker.kind,
            kv_cache_spec_sliding_window=self.marker.sliding_window,
        )

    def _block_hash(self, key):
        """The vLLM block hash in a key of unit 0's lookup layer, else None."""
        key = key.encode() if isinstance(key, str) else key
        if key.startswith(self.head) and key.endswith(self.tail) and len(key) > len(self.head) + len(self.tail):
            return key[len(self.head) : -len(self.tail)]
        return None

    def close(self) -> None:
        if self.subscription is not None:
            self.subscription.close()


@dataclass(frozen=True)
class _GroupPlan:
    """One KV cache group's objects in a step's transfers, block by block and unit by unit: their key
    stems (a layer name ends each key), their eviction groups, and the block ids they are read into or
    written from (one per block; null blocks left out)."""

    stems: list
    evictions: list
    block_ids: list


class _WorkerSide:
    """The worker's half: registered KV caches, a saver thread and a loader thread."""

    def __init__(self, connector: StrataConnector):
        self.connector = connector
        self.store = connector.store
        self.num_blocks = connector._kv_cache_config.num_blocks if connector._kv_cache_config else None
        self.layouts: dict = {}
        self.registered: dict = {}
        self.saves: queue.Queue = queue.Queue()
        self.planned = (None, {})  # (the step's metadata, its save plans by group): see _save_plan
        self.saver = threading.Thread(target=self._save_loop, name="strata-vllm-saver", daemon=True)
        self.saver.start()
        self.loaded: dict = {}
        self.load_errors: set = set()
        self.errors_lock = threading.Lock()
        self.loads: queue.Queue = queue.Queue()
        self.loader = threading.Thread(target=self._load_loop, name="strata-vllm-loader", daemon=True)
        self.loader.start()

    def register(self, kv_caches: dict) -> None:
        """Registers the KV caches of the layers the connector moves. Layers of different groups may share
        one tensor (vLLM's hybrid layout): its memory is registered once."""
        for name, tensor in kv_caches.items():
            if name not in self.connector._group_of_layer:
                continue
            if tensor.device.type != "cpu":
                raise NotImplementedError(
                    f"strata: layer {name}'s KV cache is on {tensor.device}; Strata's vLLM connector moves "
                    "CPU KV caches only (the GPU path is not built: no machine here can test it)"
                )
            self.layouts[name] = _block_layout(name, tensor, self.num_blocks, len(self.connector.units))
            pointer, size = tensor.data_ptr(), tensor.numel() * tensor.element_size()
            if self.registered.get(pointer) == size:
                continue
            if pointer in self.registered or self.store.register_buffer(pointer, size) != OK:
                raise ValueError(f"strata: could not register layer {name}'s KV cache ({size} bytes at {pointer:#x})")
            self.registered[pointer] = size

    def _block_parts(self, layer_name: str, block_ids) -> tuple:
        """(pointers, sizes) of every block's objects in a layer, block by block and unit by unit."""
        layout = self.layouts[layer_name]
        if not layout.unit_bytes:  # one unit a rank: a block's rows whole (the common case, kept cheap)
            row_sizes = [layout.row_bytes] * len(layout.bases)
            pointers = [[base + block * layout.block_stride for base in layout.bases] for block in block_ids]
            return pointers, [row_sizes] * len(block_ids)
        pointers, sizes = [], []
        for block in block_ids:
            for unit in range(len(self.connector.units)):
                unit_pointers, unit_sizes = layout.parts(block, unit)
                pointers.append(unit_pointers)
                sizes.append(unit_sizes)
        return pointers, sizes

    def _plan(self, transfers, group: KvGroup) -> _GroupPlan:
        """One group's objects in these transfers (see ``_GroupPlan``)."""
        connector = self.connector
        at = connector.groups.index(group)
        heads = [connector.key_head(group, unit) for unit in connector.units]
        per_block, per_scheduler_block = group.hashes_per_block, connector.block_size // connector.hash_block_size
        stems, evictions, block_ids = [], [], []
        for transfer in transfers:
            hashes = transfer.hashes
            for index, block in enumerate(transfer.block_ids[at]):
                if block == NULL_BLOCK_ID:
                    continue
                last = (index + 1) * per_block - 1
                scheduler_block_end = (last // per_scheduler_block + 1) * per_scheduler_block - 1
                eviction = connector.eviction_group(hashes[scheduler_block_end])
                stem = hashes[last] + b"/"
                stems += [head + stem for head in heads]
                evictions += [eviction] * len(heads)
                block_ids.append(block)
        return _GroupPlan(stems, evictions, block_ids)

    # ---- saves ----------------------------------------------------------------------------------------

    def save_layer(self, metadata: StrataConnectorMetadata, layer_name: str) -> None:
        if layer_name not in self.layouts or not metadata.saves or not self.connector.writes:
            return
        plan = self._save_plan(metadata, self.connector._group_of_layer[layer_name])
        if not plan.block_ids:
            return
        suffix = layer_name.encode()
        pointers, sizes = self._block_parts(layer_name, plan.block_ids)
        self.saves.put(([stem + suffix for stem in plan.stems], pointers, sizes, plan.evictions))

    def _save_plan(self, metadata: StrataConnectorMetadata, group: KvGroup) -> _GroupPlan:
        """A group's plan of the step's saves, built at its first layer and kept for the others."""
        if self.planned[0] is not metadata:
            self.planned = (metadata, {})
        plans = self.planned[1]
        if group.position not in plans:
            plans[group.position] = self._plan(metadata.saves, group)
        return plans[group.position]

    def _save_loop(self) -> None:
        while True:
            job = self.saves.get()
            if job is None:
                self.saves.task_done()
                return
            keys, pointers, sizes, groups = job
            try:
                codes = self.store.batch_put_from_multi_buffers(keys, pointers, sizes, groups=groups)
                failed = [key for key, code in zip(keys, codes) if not stored(code)]
                if failed:
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
            plans: dict = {}
            for layer_name, done in loaded.items():
                try:
                    group = self.connector._group_of_layer[layer_name]
                    if group.position not in plans:
                        plans[group.position] = self._plan(loads, group)
                    self._load_layer(layer_name, plans[group.position])
                finally:
                    done.set()

    def _load_layer(self, layer_name: str, plan: _GroupPlan) -> None:
        """One batch: every block's object of this layer (its key: the block's stem and the layer's name)."""
        if not plan.block_ids:
            return
        suffix = layer_name.encode()
        keys = [stem + suffix for stem in plan.stems]
        pointers, sizes = self._block_parts(layer_name, plan.block_ids)
        codes = self.store.batch_get_into_multi_buffers(keys, pointers, sizes)
        units = len(self.connector.units)
        failed = {plan.block_ids[at // units] for at, (code, parts) in enumerate(zip(codes, sizes)) if code != sum(parts)}
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
