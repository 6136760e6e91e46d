"""LMCache 0.5.6 on a real node: two LMCache engines on their CPU backend, one storing chunks and the other
retrieving them, through ``strata.lmcache.StrataConnector`` and through LMCache's own Mooncake connector
(its default mode, ``save_chunk_meta``) with ``mooncake.store`` aliased to Strata.

LMCache moves KV between the serving engine and its memory objects through a ``GPUConnectorInterface``;
on this CPU machine the tests give it one over a CPU tensor (``CpuKVCache``). Everything between the
memory objects and the node is LMCache's own code and the plugin's."""

import asyncio
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
import torch
from lmcache.v1.cache_engine import LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface
from lmcache.v1.metadata import LMCacheMetadata

LAYERS, HEADS, HEAD_DIM, CHUNK = 2, 2, 8, 16
TOKENS = 40  # two full chunks and a partial one


class CpuKVCache(GPUConnectorInterface):
    """A serving engine's KV cache on CPU, ``[k|v, layer, token, hidden]``: LMCache's ``KV_2LTD`` chunks are
    its token slices."""

    def __init__(self, tokens):
        self.kv = torch.zeros(2, LAYERS, tokens, HEADS * HEAD_DIM, dtype=torch.float16)

    def from_gpu(self, memory_obj, start, end, **kwargs):
        memory_obj.tensor.copy_(self.kv[:, :, start:end])

    def to_gpu(self, memory_obj, start, end, **kwargs):
        self.kv[:, :, start:end].copy_(memory_obj.tensor)

    def batched_from_gpu(self, memory_objs, starts, ends, **kwargs):
        for memory_obj, start, end in zip(memory_objs, starts, ends):
            self.from_gpu(memory_obj, start, end)

    def batched_to_gpu(self, memory_objs, starts, ends, **kwargs):
        for memory_obj, start, end in zip(memory_objs, starts, ends):
            self.to_gpu(memory_obj, start, end)

    def get_shape(self, num_tokens):
        return torch.Size([2, LAYERS, num_tokens, HEADS * HEAD_DIM])

    def token_bytes(self, end):
        return self.kv[:, :, :end].contiguous().view(torch.uint8)


def strata_plugin(address):
    return ["strata"], {
        "remote_storage_plugin.strata.module_path": "strata.lmcache",
        "remote_storage_plugin.strata.class_name": "StrataConnector",
        "remote_storage_plugin.strata.address": address,
    }


def start_engine(model, plugins, extra):
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK,
        local_cpu=False,
        max_local_cpu_size=0.05,
        save_unfull_chunk=True,
        remote_storage_plugins=plugins,
        extra_config=extra,
    )
    metadata = LMCacheMetadata(
        model_name=model,
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=torch.float16,
        kv_shape=(LAYERS, 2, CHUNK, HEADS, HEAD_DIM),
        chunk_size=CHUNK,
    )
    kv_cache = CpuKVCache(TOKENS)
    name = f"engine-{uuid.uuid4().hex}"
    engine = LMCacheEngineBuilder.get_or_create(
        name, config, metadata, kv_cache, lambda tensor, rank: None, lambda value, rank: value
    )
    engine.post_init()
    _started.append(name)
    return name, engine, kv_cache


_started = []


@pytest.fixture(autouse=True)
def destroy_engines():
    """Every engine a test started is destroyed, even when the test fails: its threads must not outlive
    the test (at interpreter exit they would still be calling into the store)."""
    yield
    while _started:
        LMCacheEngineBuilder.destroy(_started.pop())


def chunk_keys(engine, tokens):
    return [key.to_string() for _start, _end, key in engine.token_database.process_tokens(tokens=tokens)]


def wait_until_stored(address, keys, seconds=20):
    """LMCache puts to remote storage in the background: wait (bounded) until the node holds every key."""
    from strata import StrataStore

    store = StrataStore()
    assert store.setup(address) == 0
    deadline = time.monotonic() + seconds
    while store.batch_is_exist(keys) != [1] * len(keys):
        assert time.monotonic() < deadline, f"the node did not receive {keys} in {seconds} s"
        time.sleep(0.05)
    store.close()


def test_a_second_engine_retrieves_byte_equal_what_the_first_stored(node):
    model = f"tiny-{uuid.uuid4().hex}"
    tokens = torch.randint(0, 30000, (TOKENS,))
    first_name, first, stored = start_engine(model, *strata_plugin(node.address))
    stored.kv.view(torch.int16).copy_(torch.randint(-(2**15), 2**15, stored.kv.shape, dtype=torch.int16))
    first.store(tokens)
    wait_until_stored(node.address, chunk_keys(first, tokens))
    LMCacheEngineBuilder.destroy(first_name)  # nothing is left but the node's copy

    second_name, second, loaded = start_engine(model, *strata_plugin(node.address))
    assert second.lookup(tokens) == TOKENS
    retrieved = second.retrieve(tokens)
    assert int(retrieved.sum()) == TOKENS
    assert torch.equal(loaded.token_bytes(TOKENS), stored.token_bytes(TOKENS))

    # Another model's engine shares nothing with this one.
    other_name, other, _ = start_engine(f"other-{uuid.uuid4().hex}", *strata_plugin(node.address))
    assert other.lookup(tokens) == 0
    LMCacheEngineBuilder.destroy(second_name)
    LMCacheEngineBuilder.destroy(other_name)


def store_three_chunks(node):
    """A fresh model's engine that stored 40 tokens (three chunks) on the node: (model, tokens, name, engine,
    the chunks' keys)."""
    model = f"tiny-{uuid.uuid4().hex}"
    tokens = torch.randint(0, 30000, (TOKENS,))
    name, engine, kv_cache = start_engine(model, *strata_plugin(node.address))
    kv_cache.kv.normal_()
    engine.store(tokens)
    keys = chunk_keys(engine, tokens)
    assert len(keys) == 3
    wait_until_stored(node.address, keys)
    return model, tokens, name, engine, keys


def remove_from_node(address, key):
    from strata import StrataStore

    store = StrataStore()
    assert store.setup(address) == 0
    assert store.remove(key) == 0
    store.close()


def test_a_prefix_lookup_stops_at_the_first_chunk_the_node_lost(node):
    model, tokens, name, _, keys = store_three_chunks(node)
    LMCacheEngineBuilder.destroy(name)
    remove_from_node(node.address, keys[1])

    name, engine, _ = start_engine(model, *strata_plugin(node.address))
    assert engine.lookup(tokens) == CHUNK
    LMCacheEngineBuilder.destroy(name)


def test_list_names_the_chunks_the_node_holds(node):
    _, _, name, engine, keys = store_three_chunks(node)
    # LMCache's own remote backend holds the plugin's connector (wrapped or not, `list` reaches it).
    connector = engine.storage_manager.storage_backends["RemoteBackend-strata"].connection
    assert set(keys) <= set(asyncio.run(connector.list()))
    remove_from_node(node.address, keys[1])
    listed = set(asyncio.run(connector.list()))
    assert keys[1] not in listed and {keys[0], keys[2]} <= listed
    LMCacheEngineBuilder.destroy(name)


def test_lmcaches_own_mooncake_connector_runs_on_strata_through_an_import_alias(node, mooncake_alias):
    # A fresh interpreter, so that `mooncake.store` resolves to the alias for LMCache's own connector.
    script = textwrap.dedent(
        f"""
        import sys, uuid, torch
        sys.path.insert(0, {str(mooncake_alias)!r})
        sys.path.insert(0, {str(__file__.rsplit("/", 1)[0])!r})
        from lmcache.v1.cache_engine import LMCacheEngineBuilder
        from test_lmcache import chunk_keys, start_engine, wait_until_stored, TOKENS

        extra = {{"master_server_address": {node.address!r}, "local_hostname": "localhost", "protocol": "tcp"}}
        model = "mooncake-" + uuid.uuid4().hex
        tokens = torch.randint(0, 30000, (TOKENS,))
        name, first, stored = start_engine(model, ["mooncakestore"], extra)
        stored.kv.normal_()
        first.store(tokens)
        wait_until_stored({node.address!r}, chunk_keys(first, tokens))
        LMCacheEngineBuilder.destroy(name)
        name, second, loaded = start_engine(model, ["mooncakestore"], extra)
        assert second.lookup(tokens) == TOKENS, second.lookup(tokens)
        assert int(second.retrieve(tokens).sum()) == TOKENS
        assert torch.equal(loaded.token_bytes(TOKENS), stored.token_bytes(TOKENS))
        LMCacheEngineBuilder.destroy(name)
        print("round trip through the Mooncake connector: ok")
        """
    )
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    output = finished.stdout + finished.stderr
    assert finished.returncode == 0, output[-4000:]
    assert "round trip through the Mooncake connector: ok" in output
    assert "MooncakestoreConnector initialized successfully" in output or "Mooncake store setup" in output
