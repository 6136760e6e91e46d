"""vLLM 0.33 on a real node: ``strata.vllm.StrataConnector`` loaded by vLLM's own ``Scheduler`` from a
``kv_transfer_config`` (a tiny model's ``config.json``, no weights), its worker side over CPU KV caches.

Instance 1 computes a prompt and saves its blocks; instance 2 hits them, schedules only the remaining
tokens, and loads bytes equal to the saved ones; a block removed between lookup and load is reported for
recompute, and only that block."""

import json
import os
import uuid

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"

from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
)
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

BLOCK = 16
BLOCKS = 64
LAYERS = [f"model.layers.{at}.self_attn.attn" for at in range(2)]
KV_HEADS, HEAD_DIM = 2, 16
PROMPT = 3 * BLOCK + 2  # three full blocks and two tokens

init_none_hash(sha256)


def write_model(directory, kv_heads):
    """A tiny Llama's ``config.json`` (no weights: vLLM's scheduler and config need nothing more)."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 32 * kv_heads,
        "intermediate_size": 128,
        "num_attention_heads": 2 * kv_heads,
        "num_key_value_heads": kv_heads,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": len(LAYERS),
        "vocab_size": 1000,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "float16",
    }
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("tiny-model"), KV_HEADS)


@pytest.fixture(scope="module")
def gqa_model(tmp_path_factory):
    """4 KV heads: one a rank at TP 4, two a rank at TP 2."""
    return write_model(tmp_path_factory.mktemp("gqa-model"), 4)


def vllm_config(model, address, prefix):
    transfer = KVTransferConfig(
        kv_connector="StrataConnector",
        kv_connector_module_path="strata.vllm",
        kv_role="kv_both",
        kv_connector_extra_config={"address": address, "key_prefix": prefix},
    )
    return engine_config(model, transfer)


def engine_config(model, transfer):
    """A CPU vLLM config of the tiny model, ``BLOCKS`` blocks of ``BLOCK`` tokens, with connector ``transfer``."""
    cache = CacheConfig(block_size=BLOCK, gpu_memory_utilization=0.5, cache_dtype="auto")
    cache.num_gpu_blocks = BLOCKS
    return VllmConfig(
        model_config=ModelConfig(model=model, skip_tokenizer_init=True, dtype="float16", max_model_len=512),
        cache_config=cache,
        scheduler_config=SchedulerConfig(
            max_num_seqs=8, max_num_batched_tokens=512, max_model_len=512, is_encoder_decoder=False
        ),
        kv_transfer_config=transfer,
        device_config=DeviceConfig("cpu"),
    )


def kv_cache_config(kv_heads=None):
    spec = FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=kv_heads or KV_HEADS, head_size=HEAD_DIM, dtype=torch.float16
    )
    tensors = [
        KVCacheTensor(size=BLOCKS * spec.page_size_bytes, layers=[name], layer_stride=0, block_stride=spec.page_size_bytes)
        for name in LAYERS
    ]
    return KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=tensors, kv_cache_groups=[KVCacheGroupSpec(LAYERS, spec)])


def schedule_request(scheduler, request_id, tokens, hash_block_size=None):
    """Adds a one-token request for ``tokens`` (blocks hashed as vLLM hashes them) and schedules it."""
    request = Request(
        request_id,
        prompt_token_ids=tokens,
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        block_hasher=get_request_block_hasher(hash_block_size or BLOCK, sha256),
    )
    scheduler.add_request(request)
    return scheduler.schedule()


class Instance:
    """One vLLM instance: its real scheduler (which loads the connector's scheduler side) and a worker-side
    connector over CPU KV caches ``[k|v, block, token, head, dim]``."""

    def __init__(self, model, address, prefix):
        config = vllm_config(model, address, prefix)
        self.scheduler = Scheduler(config, kv_cache_config(), StructuredOutputManager(config), block_size=BLOCK)
        assert type(self.scheduler.connector).__name__ == "StrataConnector"
        from strata.vllm import StrataConnector

        self.worker = StrataConnector(config, KVConnectorRole.WORKER, kv_cache_config())
        self.kv = {name: torch.zeros(2, BLOCKS, BLOCK, KV_HEADS, HEAD_DIM, dtype=torch.float16) for name in LAYERS}
        self.worker.register_kv_caches(self.kv)

    def schedule(self, request_id, tokens):
        return schedule_request(self.scheduler, request_id, tokens)

    def run_forward(self, output, compute=None, before_load=None):
        """The worker's part of a step: loads layer by layer, then 'computes' and saves each layer."""
        self.worker.bind_connector_metadata(output.kv_connector_metadata)
        if before_load:
            before_load()
        self.worker.start_load_kv(None)
        for name in self.kv:  # the layers in forward order
            self.worker.wait_for_layer_load(name)
            if compute:
                compute(name)
            self.worker.save_kv_layer(name, self.kv[name], None)
        self.worker.wait_for_save()
        self.worker.clear_connector_metadata()
        return self.worker.get_block_ids_with_load_errors()

    def close(self):
        self.worker.shutdown()
        self.scheduler.connector.shutdown()


def block_bytes(instance, name, block):
    return instance.kv[name][:, block].contiguous().view(torch.uint8)


def test_a_second_instance_hits_the_saved_blocks_and_loads_them_byte_equal(node, tiny_model):
    prefix = f"{uuid.uuid4().hex}/"
    tokens = torch.randint(0, 1000, (PROMPT,)).tolist()

    first = Instance(tiny_model, node.address, prefix)
    output = first.schedule("first", tokens)
    assert output.num_scheduled_tokens["first"] == PROMPT  # nothing stored yet
    saved_blocks = output.scheduled_new_reqs[0].block_ids[0][:3]

    def compute(name):
        first.kv[name].view(torch.int16).copy_(torch.randint(-(2**15), 2**15, first.kv[name].shape, dtype=torch.int16))

    assert first.run_forward(output, compute=compute) == set()

    second = Instance(tiny_model, node.address, prefix)
    output = second.schedule("second", tokens)
    assert output.num_scheduled_tokens["second"] == PROMPT - 3 * BLOCK  # only the remaining tokens
    loads = output.kv_connector_metadata.loads
    assert [len(load.block_ids[0]) for load in loads] == [3]
    assert second.run_forward(output) == set()
    for name in LAYERS:
        for saved, loaded in zip(saved_blocks, loads[0].block_ids[0]):
            assert torch.equal(block_bytes(second, name, loaded), block_bytes(first, name, saved))
    first.close()
    second.close()


def test_a_block_removed_between_lookup_and_load_is_reported_for_recompute(node, tiny_model):
    from strata import StrataStore

    prefix = f"{uuid.uuid4().hex}/"
    tokens = torch.randint(0, 1000, (PROMPT,)).tolist()
    first = Instance(tiny_model, node.address, prefix)
    first.run_forward(first.schedule("first", tokens), compute=lambda name: first.kv[name].normal_())

    second = Instance(tiny_model, node.address, prefix)
    output = second.schedule("second", tokens)
    load = output.kv_connector_metadata.loads[0]
    assert len(load.block_ids[0]) == 3

    store = StrataStore()
    assert store.setup(node.address) == 0

    def remove_the_middle_block():
        assert store.remove(second.worker.key(load.hashes[1], LAYERS[0])) == 0

    assert second.run_forward(output, before_load=remove_the_middle_block) == {load.block_ids[0][1]}
    store.close()
    first.close()
    second.close()


def test_gpu_kv_caches_are_refused_with_a_clear_error(node, tiny_model):
    from strata.vllm import StrataConnector

    config = vllm_config(tiny_model, node.address, "refused/")
    worker = StrataConnector(config, KVConnectorRole.WORKER, kv_cache_config())
    meta = torch.zeros(2, BLOCKS, BLOCK, KV_HEADS, HEAD_DIM, dtype=torch.float16, device="meta")
    with pytest.raises(NotImplementedError, match="CPU KV caches only"):
        worker.register_kv_caches({LAYERS[0]: meta})
    worker.shutdown()


def test_block_events_come_from_the_nodes_stream_in_vllms_own_format(node, tiny_model):
    import time

    import msgspec
    from strata import StrataStore
    from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch

    prefix = f"{uuid.uuid4().hex}/"
    tokens = torch.randint(0, 1000, (PROMPT,)).tolist()
    first = Instance(tiny_model, node.address, prefix)
    output = first.schedule("first", tokens)
    request = first.scheduler.requests["first"]
    first.run_forward(output, compute=lambda name: first.kv[name].normal_())

    def events_until(count, kind):
        taken, deadline = [], time.monotonic() + 10
        while sum(isinstance(event, kind) for event in taken) < count:
            assert time.monotonic() < deadline, taken
            taken += first.scheduler.connector.take_events()
            time.sleep(0.02)
        return taken

    stored = [event for event in events_until(3, BlockStored) if isinstance(event, BlockStored)]
    # Each shard streams its own events: blocks on different shards arrive in any order.
    by_hash = {event.block_hashes[0]: event for event in stored}
    assert sorted(by_hash) == sorted(request.block_hashes[:3]) and len(stored) == 3
    for at, block in enumerate(request.block_hashes[:3]):
        assert by_hash[block].token_ids == tokens[at * BLOCK : (at + 1) * BLOCK]
        assert by_hash[block].parent_block_hash == (request.block_hashes[at - 1] if at else None)
        assert by_hash[block].block_size == BLOCK and by_hash[block].medium == "CPU"  # in the node's DRAM
        assert (by_hash[block].group_idx, by_hash[block].kv_cache_spec_kind) == (0, "full_attention")

    store = StrataStore()
    assert store.setup(node.address) == 0
    assert store.remove(first.worker.key(request.block_hashes[2], LAYERS[-1], unit=0)) == 0
    store.close()
    removed = [event for event in events_until(1, BlockRemoved) if isinstance(event, BlockRemoved)]
    assert removed[0].block_hashes == [request.block_hashes[2]] and removed[0].group_idx == 0

    # The batch a vLLM publisher would send decodes with vLLM's own types.
    wire = msgspec.msgpack.Encoder().encode(KVEventBatch(ts=time.time(), events=stored + removed))
    decoded = msgspec.msgpack.Decoder(type=KVEventBatch).decode(wire)
    assert decoded.events == stored + removed
    first.close()


def tensor_parallel_config(model, address, prefix, tp_size, head_units):
    from vllm.config import ParallelConfig

    base = vllm_config(model, address, prefix)
    base.kv_transfer_config.kv_connector_extra_config["kv_head_units"] = head_units
    return VllmConfig(
        model_config=base.model_config,
        cache_config=base.cache_config,
        scheduler_config=base.scheduler_config,
        kv_transfer_config=base.kv_transfer_config,
        device_config=base.device_config,
        parallel_config=ParallelConfig(tensor_parallel_size=tp_size),
    )


def tp_worker(model, address, prefix, tp_size, rank, monkeypatch):
    """A worker-side connector of one rank at `tp_size`, its KV caches holding 4 / tp_size heads."""
    import strata.vllm

    config = tensor_parallel_config(model, address, prefix, tp_size, head_units=4)
    heads = 4 // tp_size
    cache_config = kv_cache_config(heads)
    monkeypatch.setattr(strata.vllm, "_tensor_parallel_rank", lambda: rank)
    worker = strata.vllm.StrataConnector(config, KVConnectorRole.WORKER, cache_config)
    kv = {name: torch.zeros(2, BLOCKS, BLOCK, heads, HEAD_DIM, dtype=torch.float16) for name in LAYERS}
    kv_random = {name: tensor.view(torch.int16) for name, tensor in kv.items()}
    for tensor in kv_random.values():
        tensor.copy_(torch.randint(-(2**15), 2**15, tensor.shape, dtype=torch.int16))
    worker.register_kv_caches(kv)
    return worker, kv


def save_blocks(worker, kv, hashes, block_ids):
    from strata.vllm import BlockTransfer, StrataConnectorMetadata

    worker.bind_connector_metadata(StrataConnectorMetadata(saves=[BlockTransfer("save", hashes, (block_ids,))]))
    for name in LAYERS:
        worker.save_kv_layer(name, kv[name], None)
    worker.wait_for_save()
    worker.clear_connector_metadata()


def load_blocks(worker, hashes, block_ids):
    from strata.vllm import BlockTransfer, StrataConnectorMetadata

    worker.bind_connector_metadata(StrataConnectorMetadata(loads=[BlockTransfer("load", hashes, (block_ids,))]))
    worker.start_load_kv(None)
    for name in LAYERS:
        worker.wait_for_layer_load(name)
    worker.clear_connector_metadata()
    return worker.get_block_ids_with_load_errors()


def heads_bytes(kv, name, block, head):
    return kv[name][:, block, :, head].contiguous().view(torch.uint8)


def test_tp4_prefill_blocks_load_at_tp2_and_tp2_decode_blocks_load_at_tp4(node, gqa_model, monkeypatch):
    prefix = f"{uuid.uuid4().hex}/"
    prefill = [os.urandom(32) for _ in range(3)]
    writers = [tp_worker(gqa_model, node.address, prefix, 4, rank, monkeypatch) for rank in range(4)]
    for worker, kv in writers:
        save_blocks(worker, kv, prefill, [1, 2, 3])

    readers = [tp_worker(gqa_model, node.address, prefix, 2, rank, monkeypatch) for rank in range(2)]
    for rank, (reader, kv) in enumerate(readers):
        assert load_blocks(reader, prefill, [10, 11, 12]) == set()
        for name in LAYERS:
            for written, loaded in zip([1, 2, 3], [10, 11, 12]):
                for head in range(2):  # a TP 2 rank's heads are two TP 4 ranks' heads, in order
                    _, writer_kv = writers[rank * 2 + head]
                    assert torch.equal(heads_bytes(kv, name, loaded, head), heads_bytes(writer_kv, name, written, 0))

    # The decode side (TP 2) writes its own blocks in the same units: a TP 4 rank reads its one head.
    decode = [os.urandom(32) for _ in range(2)]
    for reader, kv in readers:
        save_blocks(reader, kv, decode, [20, 21])
    for rank, (writer, kv) in enumerate(writers):
        assert load_blocks(writer, decode, [30, 31]) == set()
        _, decode_kv = readers[rank // 2]
        for name in LAYERS:
            for written, loaded in zip([20, 21], [30, 31]):
                assert torch.equal(heads_bytes(kv, name, loaded, 0), heads_bytes(decode_kv, name, written, rank % 2))
    for worker, _ in writers + readers:
        worker.shutdown()


def test_head_units_that_a_tp_size_cannot_hold_whole_are_refused(node, gqa_model):
    config = tensor_parallel_config(gqa_model, node.address, "units/", 2, head_units=3)
    from strata.vllm import StrataConnector

    with pytest.raises(ValueError, match="multiple of the TP size"):
        StrataConnector(config, KVConnectorRole.WORKER, kv_cache_config())


def test_mla_latent_rows_are_stored_once_by_rank_0_and_read_by_every_rank(node, gqa_model, monkeypatch):
    import strata.vllm
    from strata import StrataStore
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    latent = 64
    spec = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=latent, dtype=torch.float16)
    tensors = [
        KVCacheTensor(size=BLOCKS * spec.page_size_bytes, layers=[name], layer_stride=0, block_stride=spec.page_size_bytes)
        for name in LAYERS
    ]
    cache_config = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=tensors, kv_cache_groups=[KVCacheGroupSpec(LAYERS, spec)])
    prefix = f"{uuid.uuid4().hex}/"
    ranks = []
    for rank in range(2):
        monkeypatch.setattr(strata.vllm, "_tensor_parallel_rank", lambda rank=rank: rank)
        worker = strata.vllm.StrataConnector(tensor_parallel_config(gqa_model, node.address, prefix, 2, 2), KVConnectorRole.WORKER, cache_config)
        kv = {name: torch.randn(BLOCKS, BLOCK, latent).to(torch.float16) for name in LAYERS}
        worker.register_kv_caches(kv)
        ranks.append((worker, kv))
    blocks = [os.urandom(32) for _ in range(2)]

    store = StrataStore()
    assert store.setup(node.address) == 0
    save_blocks(*ranks[1], blocks, [4, 5])  # not rank 0: stores nothing
    assert store.batch_is_exist(ranks[0][0].keys(blocks, LAYERS[0])) == [0, 0]
    save_blocks(*ranks[0], blocks, [4, 5])
    assert store.batch_is_exist(ranks[0][0].keys(blocks, LAYERS[0])) == [1, 1]
    store.close()

    worker, kv = ranks[1]
    assert load_blocks(worker, blocks, [8, 9]) == set()
    for name in LAYERS:
        assert torch.equal(kv[name][8:10].view(torch.uint8), ranks[0][1][name][4:6].view(torch.uint8))
    for worker, _ in ranks:
        worker.shutdown()


# ---- hybrid models (HMA): a full-attention group of 32-token blocks and a sliding-window group of 16 --------

HYBRID_FULL, HYBRID_WINDOW = 32, 16  # each group's tokens per block; the scheduler's block is 32, hashes 16
WINDOW = 32  # the sliding window, in tokens
HYBRID_LAYERS = [f"model.layers.{at}.self_attn.attn" for at in range(4)]  # even: full, odd: sliding window
HYBRID_PROMPT = 4 * HYBRID_FULL + 2


def hybrid_kv_cache_config():
    """vLLM's hybrid layout: one group per kind of attention, each with its own block size and the same page
    size, every KV cache tensor shared by one layer of each group."""
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    full = FullAttentionSpec(block_size=HYBRID_FULL, num_kv_heads=2, head_size=HEAD_DIM, dtype=torch.float16)
    window = SlidingWindowSpec(
        block_size=HYBRID_WINDOW, num_kv_heads=4, head_size=HEAD_DIM, dtype=torch.float16, sliding_window=WINDOW
    )
    assert full.page_size_bytes == window.page_size_bytes
    page = full.page_size_bytes
    tensors = [
        KVCacheTensor(size=BLOCKS * page, layers=HYBRID_LAYERS[at : at + 2], layer_stride=0, block_stride=page)
        for at in (0, 2)
    ]
    groups = [KVCacheGroupSpec(HYBRID_LAYERS[0::2], full), KVCacheGroupSpec(HYBRID_LAYERS[1::2], window)]
    return KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=tensors, kv_cache_groups=groups)


class HybridInstance(Instance):
    """A vLLM instance of a hybrid model: its real scheduler over the two groups, and a worker-side connector
    whose layers view shared KV cache tensors as vLLM lays them out."""

    def __init__(self, model, address, prefix, chunk=None):
        from strata.vllm import StrataConnector

        config = vllm_config(model, address, prefix)
        if chunk:  # tokens a step: a longer prompt is prefilled in chunks
            config.scheduler_config.max_num_batched_tokens = chunk
        kv_config = hybrid_kv_cache_config()
        self.scheduler = Scheduler(
            config, kv_config, StructuredOutputManager(config), block_size=HYBRID_FULL, hash_block_size=HYBRID_WINDOW
        )
        self.worker = StrataConnector(config, KVConnectorRole.WORKER, kv_config)
        page = kv_config.kv_cache_tensors[0].size // BLOCKS
        self.raw = [torch.zeros(BLOCKS * page, dtype=torch.uint8) for _ in kv_config.kv_cache_tensors]
        self.kv = {}
        for at, name in enumerate(HYBRID_LAYERS):
            tokens, heads = (HYBRID_FULL, 2) if at % 2 == 0 else (HYBRID_WINDOW, 4)
            self.kv[name] = self.raw[at // 2].view(torch.float16).view(2, BLOCKS, tokens, heads, HEAD_DIM)
        self.worker.register_kv_caches(self.kv)

    def schedule(self, request_id, tokens):
        return schedule_request(self.scheduler, request_id, tokens, hash_block_size=HYBRID_WINDOW)


@pytest.mark.parametrize("chunk", [None, 2 * HYBRID_FULL], ids=["one-step", "chunked-prefill"])
def test_a_hybrid_models_groups_of_two_block_sizes_are_saved_and_loaded_byte_equal(node, tiny_model, chunk):
    import time

    from vllm.distributed.kv_events import BlockStored
    from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma
    from vllm.v1.request import RequestStatus

    prefix = f"{uuid.uuid4().hex}/"
    tokens = torch.randint(0, 1000, (HYBRID_PROMPT,)).tolist()
    first = HybridInstance(tiny_model, node.address, prefix, chunk)
    assert supports_hma(first.scheduler.connector)
    output = first.schedule("first", tokens)
    full_saved, window_saved = (list(ids) for ids in output.scheduled_new_reqs[0].block_ids)
    for raw in first.raw:
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8))
    steps = [output.num_scheduled_tokens["first"]]
    assert first.run_forward(output) == set()
    while sum(steps) < HYBRID_PROMPT:  # each step saves the blocks it filled, each group's as it grew
        output = first.scheduler.schedule()
        new_ids = output.scheduled_cached_reqs.new_block_ids[0]
        full_saved, window_saved = full_saved + list(new_ids[0]), window_saved + list(new_ids[1])
        steps.append(output.num_scheduled_tokens["first"])
        assert first.run_forward(output) == set()
    assert steps == ([HYBRID_PROMPT] if chunk is None else [chunk, chunk, HYBRID_PROMPT - 2 * chunk])
    first.scheduler.finish_requests("first", RequestStatus.FINISHED_ABORTED)  # request_finished_all_groups
    assert "first" not in first.scheduler.connector.scheduler.tracked
    # Events name the lookup layer's blocks: the sliding-window group's (the model's last layer).
    stored, deadline = [], time.monotonic() + 10
    while len(stored) < 4 * HYBRID_FULL // HYBRID_WINDOW:
        assert time.monotonic() < deadline, stored
        stored += [event for event in first.scheduler.connector.take_events() if isinstance(event, BlockStored)]
        time.sleep(0.02)
    assert {(event.group_idx, event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window) for event in stored} == {
        (1, "sliding_window", WINDOW)
    }
    assert all(event.block_size == HYBRID_WINDOW and len(event.token_ids) == HYBRID_WINDOW for event in stored)

    second = HybridInstance(tiny_model, node.address, prefix)
    output = second.schedule("second", tokens)
    hit = 4 * HYBRID_FULL  # every full scheduler block; the last two tokens are computed
    assert output.num_scheduled_tokens["second"] == HYBRID_PROMPT - hit
    full_loaded, window_loaded = output.kv_connector_metadata.loads[0].block_ids
    assert len(full_loaded) == hit // HYBRID_FULL and len(window_loaded) == hit // HYBRID_WINDOW
    # vLLM holds only the window's blocks of the sliding-window group: the others are its null block.
    in_window = -(-(WINDOW - 1) // HYBRID_WINDOW)
    assert window_loaded[:-in_window] == [0] * (len(window_loaded) - in_window) and 0 not in window_loaded[-in_window:]
    assert second.run_forward(output) == set()

    for name in HYBRID_LAYERS[0::2]:
        for saved, loaded in zip(full_saved, full_loaded):
            assert torch.equal(block_bytes(second, name, loaded), block_bytes(first, name, saved))
    for name in HYBRID_LAYERS[1::2]:
        for saved, loaded in list(zip(window_saved, window_loaded))[-in_window:]:
            assert torch.equal(block_bytes(second, name, loaded), block_bytes(first, name, saved))
    for name in HYBRID_LAYERS:  # the null block is never written
        assert not block_bytes(second, name, 0).any()
    first.close()
    second.close()


def test_mamba_groups_are_refused_with_a_clear_error(node, tiny_model):
    from strata.vllm import StrataConnector
    from vllm.v1.kv_cache_interface import MambaSpec

    config = vllm_config(tiny_model, node.address, "mamba/")
    mamba = MambaSpec(block_size=BLOCK, shapes=((16,),), dtypes=(torch.float16,), mamba_cache_mode="align")
    attention = kv_cache_config().kv_cache_groups[0].kv_cache_spec
    groups = [KVCacheGroupSpec(LAYERS[:1], attention), KVCacheGroupSpec(LAYERS[1:], mamba)]
    kv_config = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[], kv_cache_groups=groups)
    with pytest.raises(ValueError, match="not recurrent state"):
        StrataConnector(config, KVConnectorRole.WORKER, kv_config)
