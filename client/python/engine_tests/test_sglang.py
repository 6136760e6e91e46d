"""SGLang 0.5.23 on a real node: its own Mooncake store test through an import alias, and
``strata.sglang.StrataHiCacheStorage`` loaded by SGLang's ``StorageBackendFactory`` over real host KV pools
on CPU tensors."""

import os
import subprocess
import sys
import uuid

import pytest
import torch
from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, PoolHitPolicy, PoolName, PoolTransfer
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage import StorageBackendFactory

PAGE = 4
LAYERS = 3
HEAD_DIM = 8


def test_sglangs_own_mooncake_store_test_passes_through_an_import_alias(node, mooncake_alias):
    # SGLang's test file, run as SGLang runs it, with `mooncake.store` resolving to Strata and nothing else.
    environment = dict(os.environ, PYTHONPATH=str(mooncake_alias), MOONCAKE_MASTER=node.address)
    environment["MOONCAKE_PROTOCOL"] = "tcp"
    finished = subprocess.run(
        [sys.executable, "-m", "sglang.srt.mem_cache.storage.mooncake_store.test_mooncake_store"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = finished.stdout + finished.stderr
    assert finished.returncode == 0, output[-4000:]
    assert output.count("Batch operation passed") == 4, output[-4000:]
    assert "All tests passed" in output


def storage_config(node, *, tp_rank=0, tp_size=1, mla=False, split_heads_lcm=None, model="tiny"):
    return HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=mla,
        enable_storage_metrics=False,
        is_page_first_layout=True,
        model_name=model,
        tp_lcm_size=split_heads_lcm,
        should_split_heads=split_heads_lcm is not None,
        extra_config={
            "backend_name": "strata",
            "module_path": "strata.sglang",
            "class_name": "StrataHiCacheStorage",
            "interface_v1": 1,
            "address": node.address,
            "key_prefix": f"{uuid.uuid4().hex}/",
        },
    )


def mha_host_pool(layout, heads=2):
    device = MHATokenToKVPool(
        256, PAGE, torch.float16, heads, HEAD_DIM, LAYERS, "cpu", False, start_layer=0, end_layer=LAYERS
    )
    return MHATokenToKVPoolHost(
        device.get_device_pool_infos()[0].buffer_info,
        2.0,
        0,
        PAGE,
        layout,
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=device.size,
        start_layer=0,
        end_layer=LAYERS,
    )


def mla_host_pool():
    device = MLATokenToKVPool(256, PAGE, torch.float16, 16, 8, LAYERS, "cpu", False, start_layer=0, end_layer=LAYERS)
    return MLATokenToKVPoolHost(
        device.get_device_pool_infos()[0].buffer_info,
        2.0,
        0,
        PAGE,
        "page_first",
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=device.size,
        start_layer=0,
        end_layer=LAYERS,
        target_layer_num=LAYERS,
    )


def backend_over(config, pool):
    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    backend.register_mem_pool_host(pool)
    return backend


def filled_pages(pool, pages):
    """Host indices of `pages` fresh pages, filled with random bytes."""
    indices = pool.alloc(pages * PAGE)
    assert indices is not None
    pool.kv_buffer.view(torch.uint8).copy_(torch.randint(0, 256, pool.kv_buffer.view(torch.uint8).shape))
    return indices


def page_bytes(pool, indices):
    """Each page's bytes (compared as bytes: random bits make NaNs, which never equal themselves)."""
    return [
        pool.get_data_page(int(indices[at]), flat=True).clone().view(torch.uint8) for at in range(0, len(indices), PAGE)
    ]


@pytest.mark.parametrize("layout", ["page_first", "layer_first", "page_head"])
def test_pages_round_trip_byte_equal_through_the_factory(node, layout):
    pool = mha_host_pool(layout)
    backend = backend_over(storage_config(node), pool)
    assert type(backend).__name__ == "StrataHiCacheStorage"
    keys = [f"page-{at}" for at in range(5)]
    stored = filled_pages(pool, len(keys))
    written = page_bytes(pool, stored)

    assert backend.batch_exists(keys) == 0
    assert backend.batch_set_v1(keys, stored) == [True] * len(keys)
    assert backend.batch_exists(keys) == len(keys)
    # A page already stored counts as stored: its hash names its tokens.
    assert backend.batch_set_v1(keys[:2], stored[: 2 * PAGE]) == [True, True]

    loaded = pool.alloc(len(keys) * PAGE)
    assert backend.batch_get_v1(keys, loaded) == [True] * len(keys)
    for expected, actual in zip(written, page_bytes(pool, loaded)):
        assert torch.equal(expected, actual)
    backend.close()


def test_a_prefix_stops_at_the_first_missing_page(node):
    pool = mha_host_pool("page_first")
    backend = backend_over(storage_config(node), pool)
    keys = [f"chain-{at}" for at in range(6)]
    stored = filled_pages(pool, len(keys))
    assert all(backend.batch_set_v1(keys, stored))
    assert backend.batch_exists(keys) == 6
    assert backend.batch_exists(keys[:3] + ["never-stored"] + keys[3:]) == 3
    assert backend.batch_exists(["never-stored"] + keys) == 0

    # A page lost on the node: the match stops before it, and loading it reports that page alone.
    assert backend.store.remove(backend._object_keys([keys[4]])[0]) == 0
    assert backend.batch_exists(keys) == 4
    loaded = pool.alloc(len(keys) * PAGE)
    assert backend.batch_get_v1(keys, loaded) == [True, True, True, True, False, True]
    backend.close()


def test_another_layout_or_model_misses_instead_of_reading_foreign_bytes(node):
    config = storage_config(node)
    writer = backend_over(config, mha_host_pool("page_first"))
    keys = ["shared-0", "shared-1"]
    assert all(writer.batch_set_v1(keys, filled_pages(writer.mem_pool_host, 2)))
    other_layout = backend_over(config, mha_host_pool("layer_first"))
    assert other_layout.batch_exists(keys) == 0
    other_model = storage_config(node, model="another/model")
    other_model.extra_config["key_prefix"] = config.extra_config["key_prefix"]
    assert backend_over(other_model, mha_host_pool("page_first")).batch_exists(keys) == 0
    assert backend_over(config, mha_host_pool("page_first")).batch_exists(keys) == 2


def test_mla_pages_are_written_once_and_read_by_every_rank(node):
    writer_config = storage_config(node, tp_rank=0, tp_size=2, mla=True)
    reader_config = storage_config(node, tp_rank=1, tp_size=2, mla=True)
    reader_config.extra_config["key_prefix"] = writer_config.extra_config["key_prefix"]
    writer = backend_over(writer_config, mla_host_pool())
    reader = backend_over(reader_config, mla_host_pool())
    keys = ["mla-0", "mla-1", "mla-2"]

    # The second rank is not the storage writer: it stores nothing, and says so by storing nothing.
    assert reader.batch_set_v1(keys, filled_pages(reader.mem_pool_host, 3)) == [True] * 3
    assert writer.batch_exists(keys) == 0

    stored = filled_pages(writer.mem_pool_host, 3)
    assert writer.batch_set_v1(keys, stored) == [True] * 3
    loaded = reader.mem_pool_host.alloc(3 * PAGE)
    assert reader.batch_get_v1(keys, loaded) == [True] * 3
    for expected, actual in zip(page_bytes(writer.mem_pool_host, stored), page_bytes(reader.mem_pool_host, loaded)):
        assert torch.equal(expected, actual)


def test_a_tp2_reader_splits_heads_to_read_what_tp4_writers_stored(node):
    prefix = f"{uuid.uuid4().hex}/"
    keys = ["gqa-0", "gqa-1"]
    writers = []
    for rank in range(4):
        config = storage_config(node, tp_rank=rank, tp_size=4)
        config.extra_config["key_prefix"] = prefix
        writer = backend_over(config, mha_host_pool("page_head", heads=1))
        stored = filled_pages(writer.mem_pool_host, len(keys))
        assert writer.batch_set_v1(keys, stored) == [True, True]
        writers.append((writer.mem_pool_host, stored))

    for reader_rank in range(2):
        config = storage_config(node, tp_rank=reader_rank, tp_size=2, split_heads_lcm=4)
        config.extra_config["key_prefix"] = prefix
        reader = backend_over(config, mha_host_pool("page_head", heads=2))
        assert reader.batch_exists(keys) == 2
        loaded = reader.mem_pool_host.alloc(len(keys) * PAGE)
        assert reader.batch_get_v1(keys, loaded) == [True, True]
        # page_head keeps a page's heads apart: [k|v, page, head, token, layer, dim].
        for page in range(len(keys)):
            reader_page = int(loaded[page * PAGE]) // PAGE
            for head in range(2):
                writer_pool, stored = writers[reader_rank * 2 + head]
                writer_page = int(stored[page * PAGE]) // PAGE
                assert torch.equal(
                    reader.mem_pool_host.kv_buffer[:, reader_page, head].contiguous().view(torch.uint8),
                    writer_pool.kv_buffer[:, writer_page, 0].contiguous().view(torch.uint8),
                )


def test_the_legacy_interface_round_trips_values(node):
    pool = mha_host_pool("page_first")
    backend = backend_over(storage_config(node), pool)
    key = f"legacy-{uuid.uuid4().hex}"
    value = torch.arange(64, dtype=torch.float16)
    assert backend.set(key, value)
    assert backend.exists(key)
    assert torch.equal(backend.get(key).view(torch.float16), value)
    assert backend.get("legacy-missing") is None
    assert backend.batch_set([key + "-a", key + "-b"], [value, value + 1])
    fetched = backend.batch_get([key + "-a", key + "-b", "legacy-missing"])
    assert torch.equal(fetched[1].view(torch.float16), value + 1) and fetched[2] is None


def test_context_parallel_ranks_keep_their_own_shards_of_a_page(node):
    prefix = f"{uuid.uuid4().hex}/"
    keys = ["cp-0", "cp-1"]
    ranks = []
    for cp_rank in range(2):
        config = storage_config(node)
        config.attn_cp_size, config.attn_cp_rank = 2, cp_rank
        config.extra_config["key_prefix"] = prefix
        backend = backend_over(config, mha_host_pool("page_first"))
        stored = filled_pages(backend.mem_pool_host, len(keys))
        assert backend.batch_set_v1(keys, stored) == [True, True]
        ranks.append((backend, page_bytes(backend.mem_pool_host, stored)))
    for backend, written in ranks:
        loaded = backend.mem_pool_host.alloc(len(keys) * PAGE)
        assert backend.batch_get_v1(keys, loaded) == [True, True]
        for expected, actual in zip(written, page_bytes(backend.mem_pool_host, loaded)):
            assert torch.equal(expected, actual)  # its own shard, not the other rank's


# ---- hybrid pools (the v2 PoolTransfer interface) ----------------------------------------------------------


def mamba_host_pool():
    """A Mamba state pool: one temporal and one conv state per slot, two layers."""
    states = MambaStateBufferInfo(temporal=torch.zeros(2, 9, 4, 8), conv=(torch.zeros(2, 9, 3, 8),))
    return MambaPoolHost(states, 2.0, 0, device_capacity=8, pin_memory=False, device="cpu", layout="page_first")


def hybrid_backend(config, kv_pool):
    """A backend over a KV pool, a sliding-window pool (an MHA host pool of its own) and a Mamba pool, each
    registered as SGLang's hybrid pool group registers them."""
    swa, mamba = mha_host_pool("page_first", heads=1), mamba_host_pool()
    backend = backend_over(config, kv_pool)
    for name, pool in ((PoolName.KV, kv_pool), (PoolName.SWA, swa), (PoolName.MAMBA, mamba)):
        backend.register_mem_host_pool_v2(pool, name)
    return backend, swa, mamba


def mamba_states(pool, slots):
    """Each slot's states as bytes: temporal, then conv."""
    return [
        torch.cat([buffer[slot].reshape(-1).view(torch.uint8) for buffer in (pool.temporal_buffer, pool.conv_buffer[0])])
        for slot in slots.tolist()
    ]


def test_hybrid_pools_round_trip_and_each_bounds_the_restorable_prefix(node):
    kv = mha_host_pool("page_first")
    backend, swa, mamba = hybrid_backend(storage_config(node), kv)
    keys = [f"hybrid-{at}" for at in range(6)]
    assert all(backend.batch_set_v1(keys, filled_pages(kv, len(keys))))
    # The sliding window's last three pages, and Mamba checkpoints after pages 3 and 6.
    window = filled_pages(swa, 3)
    checkpoints = mamba.alloc(2)
    for buffer in (mamba.temporal_buffer, mamba.conv_buffer[0]):
        buffer.view(torch.uint8).copy_(torch.randint(0, 256, buffer.view(torch.uint8).shape))
    saves = [
        PoolTransfer(PoolName.SWA, host_indices=window, keys=keys[3:]),
        PoolTransfer(PoolName.MAMBA, host_indices=checkpoints, keys=[keys[2], keys[5]]),
    ]
    assert backend.batch_set_v2(saves) == {PoolName.SWA: [True] * 3, PoolName.MAMBA: [True, True]}

    by_window = PoolTransfer(PoolName.SWA, keys=keys[3:], hit_policy=PoolHitPolicy.TRAILING_PAGES)
    by_state = PoolTransfer(PoolName.MAMBA, keys=[keys[5]], hit_policy=PoolHitPolicy.TRAILING_PAGES)
    hit = backend.batch_exists_v2(keys, [by_state])
    assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (6, [3, 6])  # a state after pages 3 and 6 only
    hit = backend.batch_exists_v2(keys, [by_window, by_state])
    assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (6, [6])
    assert hit.extra_pool_hit_pages == {PoolName.KV: 6, PoolName.SWA: 6, PoolName.MAMBA: 6}
    every_page = PoolTransfer(PoolName.SWA, keys=keys, hit_policy=PoolHitPolicy.ALL_PAGES)
    assert backend.batch_exists_v2(keys, [every_page]).kv_hit_pages == 0  # pages 1-3 have no window rows

    loaded_window, loaded_states = swa.alloc(3 * PAGE), mamba.alloc(2)
    loads = [
        PoolTransfer(PoolName.SWA, host_indices=loaded_window, keys=keys[3:]),
        PoolTransfer(PoolName.MAMBA, host_indices=loaded_states, keys=[keys[2], keys[5]]),
    ]
    assert backend.batch_get_v2(loads) == {PoolName.SWA: [True] * 3, PoolName.MAMBA: [True, True]}
    for expected, actual in zip(page_bytes(swa, window), page_bytes(swa, loaded_window)):
        assert torch.equal(expected, actual)
    for expected, actual in zip(mamba_states(mamba, checkpoints), mamba_states(mamba, loaded_states)):
        assert torch.equal(expected, actual)

    # A window page lost on the node: the window no longer restores the prefix, and reading it reports it.
    assert backend.store.remove(backend._pool_keys(PoolName.SWA, [keys[4]])[0]) == 0
    assert backend.batch_exists_v2(keys, [by_window, by_state]).restorable_prefix_pages == []
    assert backend.batch_get_v2(loads[:1]) == {PoolName.SWA: [True, False, True]}
    with pytest.raises(ValueError, match="not supported"):
        backend.batch_exists_v2(keys, [PoolTransfer(PoolName.SWA, keys=keys, hit_policy=PoolHitPolicy.BLOCK_GROUPS)])
    backend.close()


def test_in_an_mla_model_shared_pools_are_written_once_and_mamba_state_by_every_rank(node):
    prefix = f"{uuid.uuid4().hex}/"
    ranks = []
    for rank in range(2):
        config = storage_config(node, tp_rank=rank, tp_size=2, mla=True)
        config.extra_config["key_prefix"] = prefix
        ranks.append(hybrid_backend(config, mla_host_pool()))
    (writer, _, _), (reader, reader_swa, reader_mamba) = ranks
    assert writer._pool_keys(PoolName.SWA, ["page"]) == reader._pool_keys(PoolName.SWA, ["page"])
    assert writer._pool_keys(PoolName.MAMBA, ["page"]) != reader._pool_keys(PoolName.MAMBA, ["page"])

    # The second rank is not the storage writer: it stores its Mamba shard, and no shared window page.
    saves = [
        PoolTransfer(PoolName.SWA, host_indices=filled_pages(reader_swa, 1), keys=["mla-page"]),
        PoolTransfer(PoolName.MAMBA, host_indices=reader_mamba.alloc(1), keys=["mla-page"]),
    ]
    assert reader.batch_set_v2(saves) == {PoolName.SWA: [True], PoolName.MAMBA: [True]}
    stored_keys = reader._pool_keys(PoolName.SWA, ["mla-page"]) + reader._pool_keys(PoolName.MAMBA, ["mla-page"])
    assert reader.store.batch_is_exist(stored_keys) == [0, 1]
    for backend, _, _ in ranks:
        backend.close()
