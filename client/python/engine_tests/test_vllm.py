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


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-model")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": len(LAYERS),
        "vocab_size": 1000,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "float16",
    }
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


def vllm_config(model, address, prefix):
    cache = CacheConfig(block_size=BLOCK, gpu_memory_utilization=0.5, cache_dtype="auto")
    cache.num_gpu_blocks = BLOCKS
    transfer = KVTransferConfig(
        kv_connector="StrataConnector",
        kv_connector_module_path="strata.vllm",
        kv_role="kv_both",
        kv_connector_extra_config={"address": address, "key_prefix": prefix},
    )
    return VllmConfig(
        model_config=ModelConfig(model=model, skip_tokenizer_init=True, dtype="float16", max_model_len=512),
        cache_config=cache,
        scheduler_config=SchedulerConfig(
            max_num_seqs=8, max_num_batched_tokens=512, max_model_len=512, is_encoder_decoder=False
        ),
        kv_transfer_config=transfer,
        device_config=DeviceConfig("cpu"),
    )


def kv_cache_config():
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=HEAD_DIM, dtype=torch.float16)
    tensors = [
        KVCacheTensor(size=BLOCKS * spec.page_size_bytes, layers=[name], layer_stride=0, block_stride=spec.page_size_bytes)
        for name in LAYERS
    ]
    return KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=tensors, kv_cache_groups=[KVCacheGroupSpec(LAYERS, spec)])


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
        request = Request(
            request_id,
            prompt_token_ids=tokens,
            sampling_params=SamplingParams(max_tokens=1),
            pooling_params=None,
            block_hasher=get_request_block_hasher(BLOCK, sha256),
        )
        self.scheduler.add_request(request)
        return self.scheduler.schedule()

    def run_forward(self, output, compute=None, before_load=None):
        """The worker's part of a step: loads layer by layer, then 'computes' and saves each layer."""
        self.worker.bind_connector_metadata(output.kv_connector_metadata)
        if before_load:
            before_load()
        self.worker.start_load_kv(None)
        for name in LAYERS:
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
    assert [len(load.block_ids) for load in loads] == [3]
    assert second.run_forward(output) == set()
    for name in LAYERS:
        for saved, loaded in zip(saved_blocks, loads[0].block_ids):
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
    assert len(load.block_ids) == 3

    store = StrataStore()
    assert store.setup(node.address) == 0

    def remove_the_middle_block():
        assert store.remove(second.worker.key(load.hashes[1], LAYERS[0])) == 0

    assert second.run_forward(output, before_load=remove_the_middle_block) == {load.block_ids[1]}
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
