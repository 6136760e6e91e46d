#!/usr/bin/env python3
"""The vLLM connector's two benchmark rows, side by side with their references in the same run.

1. Worker-side load: 64 blocks of 64 KiB per layer across 8 layers, through ``strata.vllm.StrataConnector``
   (``start_load_kv`` then ``wait_for_layer_load`` per layer) into registered CPU KV caches, against the same
   bytes fetched with raw ``StrataStore.batch_get_into_multi_buffers``, one layer batch after another.
   Rounds alternate between the two; each round's figure is its median over REPS loads.
2. Scheduler lookup: ``get_num_new_matched_tokens`` on a request of a 1,000-block chain that is stored,
   p50 and p99 over LOOKUPS requests, each timed at its first lookup; then the same with the connector's
   ``spin_microseconds`` at 0 (``lookup_no_spin_*``).

Run in the engines' venv, against a release node it starts on loopback, as the serving rows run: the node
on one shard busy-polling on CPU 1, this process on CPU 0:
    cargo build --release --bin strata-node && scripts/engines-venv.sh
    STRATA_NODE=target/release/strata-node target/engines/bin/python scripts/bench-vllm.py [ROUNDS] [REPS] [LOOKUPS]
Prints one JSON object.
"""

import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
import uuid

os.environ["HF_HUB_OFFLINE"] = "1"
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "client" / "python" / "tests"))
sys.path.insert(0, str(REPO / "client" / "python" / "engine_tests"))

import torch  # noqa: E402
from node_process import Node  # noqa: E402
from strata import StrataStore  # noqa: E402
from strata.vllm import StrataConnector, StrataConnectorMetadata  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402

import test_vllm  # noqa: E402  (its tiny-model vLLM config)

LAYERS, BLOCKS_LOADED = 8, 64
POOL_BLOCKS = 2 * BLOCKS_LOADED + 1  # block 0 is vLLM's null block, never a request's
TOKENS, KV_HEADS, HEAD_DIM = 16, 8, 128  # K and V rows of 32 KiB each: 64 KiB per block and layer


def configure_for_the_benchmark():
    test_vllm.LAYERS[:] = [f"model.layers.{at}.self_attn.attn" for at in range(LAYERS)]
    test_vllm.BLOCK, test_vllm.BLOCKS = TOKENS, POOL_BLOCKS
    test_vllm.KV_HEADS, test_vllm.HEAD_DIM = KV_HEADS, HEAD_DIM


def worker(config):
    connector = StrataConnector(config, KVConnectorRole.WORKER, test_vllm.kv_cache_config())
    kv = {
        name: torch.randn(2, POOL_BLOCKS, TOKENS, KV_HEADS, HEAD_DIM, dtype=torch.float16)
        for name in test_vllm.LAYERS
    }
    connector.register_kv_caches(kv)
    return connector, kv


def stored_blocks(config):
    """Saves BLOCKS_LOADED blocks of every layer through a first worker; the transfer a second one loads."""
    from strata.vllm import BlockTransfer

    saver, kv = worker(config)
    saved = list(range(1, BLOCKS_LOADED + 1))
    transfer = BlockTransfer("bench", [os.urandom(32) for _ in range(BLOCKS_LOADED)], (saved,))
    saver.bind_connector_metadata(StrataConnectorMetadata(saves=[transfer]))
    for name in test_vllm.LAYERS:
        saver.save_kv_layer(name, kv[name], None)
    saver.wait_for_save()
    saver.shutdown()
    return BlockTransfer("bench", transfer.hashes, (list(range(BLOCKS_LOADED + 1, POOL_BLOCKS)),))


def connector_load(loader, metadata):
    started = time.perf_counter()
    loader.bind_connector_metadata(metadata)
    loader.start_load_kv(None)
    for name in test_vllm.LAYERS:
        loader.wait_for_layer_load(name)
    loader.clear_connector_metadata()
    elapsed = time.perf_counter() - started
    assert not loader.get_block_ids_with_load_errors()
    return elapsed


def raw_load(store, loader, transfer):
    per_layer = []
    for name in test_vllm.LAYERS:
        pointers, sizes = loader.worker._block_parts(name, transfer.block_ids[0])
        keys = loader.keys(transfer.hashes, name)
        per_layer.append((keys, pointers, sizes))
    started = time.perf_counter()
    for keys, pointers, sizes in per_layer:
        codes = store.batch_get_into_multi_buffers(keys, pointers, sizes)
        assert all(code == sum(parts) for code, parts in zip(codes, sizes))
    return time.perf_counter() - started


def load_rows(config, rounds, reps):
    transfer = stored_blocks(config)
    loader, kv = worker(config)
    metadata = StrataConnectorMetadata(loads=[transfer])
    store = StrataStore()
    assert store.setup(config.kv_transfer_config.kv_connector_extra_config["address"]) == 0
    # The raw reads go into the loader's KV caches, registered with this second store too.
    store_registered = [
        store.register_buffer(tensor.data_ptr(), tensor.numel() * tensor.element_size()) for tensor in kv.values()
    ]
    assert all(code == 0 for code in store_registered)
    gib = LAYERS * BLOCKS_LOADED * 64 * 1024 / 2**30
    connector_rounds, raw_rounds = [], []
    for _ in range(rounds):
        connector_rounds.append(gib / statistics.median(connector_load(loader, metadata) for _ in range(reps)))
        raw_rounds.append(gib / statistics.median(raw_load(store, loader, transfer) for _ in range(reps)))
    loader.shutdown()
    store.close()
    return {
        "load_connector_gib_s": statistics.median(connector_rounds),
        "load_raw_gib_s": statistics.median(raw_rounds),
        "load_ratio": statistics.median(c / r for c, r in zip(connector_rounds, raw_rounds)),
        "load_rounds": [[round(c, 3), round(r, 3)] for c, r in zip(connector_rounds, raw_rounds)],
    }


def lookup_rows(config, lookups):
    """The lookup row with the connector's default (its scheduler-side store busy-polls each reply) and,
    in the same run, with ``spin_microseconds: 0`` (each reply waits in a sleeping thread)."""
    extra = config.kv_transfer_config.kv_connector_extra_config
    spinning = lookup_row(config, lookups)
    extra["spin_microseconds"] = 0
    try:
        sleeping = lookup_row(config, lookups)
    finally:
        del extra["spin_microseconds"]
    return {**spinning, **{key.replace("lookup_", "lookup_no_spin_"): value for key, value in sleeping.items()}}


def lookup_row(config, lookups):
    """Each timed call is a request's first lookup: LOOKUPS requests of distinct 1,000-block prompts, all
    stored (marker keys only: the lookup reads nothing else)."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    chain = 1000
    hasher = get_request_block_hasher(TOKENS, sha256)
    scheduler = StrataConnector(config, KVConnectorRole.SCHEDULER, test_vllm.kv_cache_config())
    requests, chains = [], []
    for at in range(lookups):
        prompt = torch.randint(0, 1000, (chain * TOKENS + 1,)).tolist()
        request = Request(f"lookup-{at}", prompt, SamplingParams(max_tokens=1), None, block_hasher=hasher)
        keys = scheduler.keys(request.block_hashes, test_vllm.LAYERS[-1], unit=0)
        assert len(keys) == chain
        assert all(code == 0 for code in scheduler.store.batch_put_parts(keys, [[b"x"]] * chain))
        requests.append(request)
        chains.append(keys)
    raw = []
    for keys in chains:  # the reference: the same prefix match, its keys already built
        started = time.perf_counter()
        assert scheduler.store.prefix_match(keys) == chain
        raw.append(time.perf_counter() - started)
    timings = []
    for request in requests:
        started = time.perf_counter()
        matched, _ = scheduler.get_num_new_matched_tokens(request, 0)
        timings.append(time.perf_counter() - started)
        assert matched == chain * TOKENS
    timings.sort()
    raw.sort()
    scheduler.shutdown()
    return {
        "lookup_raw_prefix_match_p50_us": raw[len(raw) // 2] * 1e6,
        "lookup_1000_blocks_p50_us": timings[len(timings) // 2] * 1e6,
        "lookup_1000_blocks_p99_us": timings[int(len(timings) * 0.99)] * 1e6,
    }


def main():
    defaults = [5, 20, 500]
    given = [int(arg) for arg in sys.argv[1:4]]
    rounds, reps, lookups = given + defaults[len(given) :]
    configure_for_the_benchmark()
    with tempfile.TemporaryDirectory() as scratch:
        os.sched_setaffinity(0, {0})
        node = Node(pathlib.Path(scratch), cores=1, dram="2GiB", extra=["--cpus", "1", "--busy-poll"])
        try:
            model = test_vllm.write_model(pathlib.Path(tempfile.mkdtemp(dir=scratch)), KV_HEADS)
            config = test_vllm.vllm_config(model, node.address, f"bench-{uuid.uuid4().hex}/")
            result = {**load_rows(config, rounds, reps), **lookup_rows(config, lookups)}
        finally:
            node.stop()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
