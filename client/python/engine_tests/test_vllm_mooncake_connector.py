"""vLLM 0.33's own ``MooncakeStoreConnector``, unmodified, on a real Strata node: ``mooncake.store`` is an
import alias of ``strata`` (conftest's ``mooncake_alias``) and the node is named by the Mooncake config
file's ``master_server_address``, as a Mooncake user would write it.

vLLM's scheduler loads the connector by its registered name; its scheduler side asks the worker's lookup
server (ZeroMQ, worker rank 0) which calls ``batch_is_exist``; its worker side registers the KV caches with
``register_buffer`` and moves blocks with ``batch_put_from_multi_buffers`` (send thread) and
``batch_get_into_multi_buffers`` (receive threads).

One step is not run as vLLM runs it: ``wait_for_save`` records a CUDA event before it queues the save, and
this machine has no GPU. The test queues the save on the worker's own send thread, as ``wait_for_save``
does, without the event (the send thread skips the wait when there is none)."""

import json
import os
import sys
import time
import uuid

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"

from test_vllm import (  # noqa: E402
    BLOCK,
    BLOCKS,
    HEAD_DIM,
    KV_HEADS,
    LAYERS,
    PROMPT,
    engine_config,
    kv_cache_config,
    schedule_request,
    write_model,
)
from vllm.config import KVTransferConfig, set_current_vllm_config  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402


@pytest.fixture(scope="module")
def mooncake(node, mooncake_alias, tmp_path_factory):
    """The alias first on sys.path, a Mooncake config file naming the node, and a one-rank gloo world."""
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    config_path = tmp_path_factory.mktemp("mooncake") / "mooncake.json"
    config_path.write_text(
        json.dumps(
            {
                "local_hostname": "127.0.0.1",
                "metadata_server": "P2PHANDSHAKE",
                "master_server_address": node.address,
                "protocol": "tcp",
                "device_name": "",
                "global_segment_size": "256MB",
                "local_buffer_size": "64MB",
            }
        )
    )
    patch = pytest.MonkeyPatch()
    patch.setenv("MOONCAKE_CONFIG_PATH", str(config_path))
    patch.syspath_prepend(str(mooncake_alias))
    sys.modules.pop("mooncake", None)
    sys.modules.pop("mooncake.store", None)
    model = write_model(tmp_path_factory.mktemp("mooncake-model"), KV_HEADS)
    from node_process import free_port_pair

    with set_current_vllm_config(mooncake_vllm_config(model, "init/", 0)):
        init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{free_port_pair()}",
            local_rank=0,
            backend="gloo",
        )
        ensure_model_parallel_initialized(1, 1)
    yield model
    destroy_model_parallel()
    destroy_distributed_environment()
    patch.undo()
    sys.modules.pop("mooncake", None)
    sys.modules.pop("mooncake.store", None)


def mooncake_vllm_config(model, prefix, lookup_port):
    transfer = KVTransferConfig(
        kv_connector="MooncakeStoreConnector",
        kv_role="kv_both",
        # Each instance's lookup server has its own IPC path; the prefix keeps the tests' keys apart.
        kv_connector_extra_config={"cache_prefix": prefix, "lookup_rpc_port": lookup_port},
    )
    return engine_config(model, transfer)


class MooncakeInstance:
    """One vLLM instance on the Mooncake connector: vLLM's scheduler and a worker-side connector over CPU KV
    caches laid out blocks first, ``[block, k|v, token, head, dim]``, as that connector requires."""

    def __init__(self, model, prefix, lookup_port):
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.connector import MooncakeStoreConnector

        config = mooncake_vllm_config(model, prefix, lookup_port)
        with set_current_vllm_config(config):
            # The worker first: its rank 0 binds the lookup server that the scheduler side asks.
            self.worker = MooncakeStoreConnector(config, KVConnectorRole.WORKER, kv_cache_config())
            self.scheduler = Scheduler(config, kv_cache_config(), StructuredOutputManager(config), block_size=BLOCK)
        assert type(self.scheduler.connector).__name__ == "MooncakeStoreConnector"
        store = self.worker.connector_worker.store
        assert type(store).__module__.startswith("strata"), "the alias did not take"
        self.kv = {name: torch.zeros(BLOCKS, 2, BLOCK, KV_HEADS, HEAD_DIM, dtype=torch.float16) for name in LAYERS}
        self.worker.register_kv_caches(self.kv)

    def schedule(self, request_id, tokens):
        return schedule_request(self.scheduler, request_id, tokens)

    def save(self, output):
        """The save half of a step: ``wait_for_save`` without its CUDA event, then until the send thread has
        put every queued request."""
        sender = self.worker.connector_worker.kv_send_thread
        saving = [request for request in output.kv_connector_metadata.requests if request.can_save]
        assert saving, "the scheduler asked for no save"
        for request in saving:
            sender.add_request(request)
        sender.request_queue.join()

    def load(self, output, request_id, timeout=20):
        """The load half: ``start_load_kv`` queues the loads; ``get_finished`` reports them done."""
        metadata = output.kv_connector_metadata
        self.worker.bind_connector_metadata(metadata)
        self.worker.start_load_kv(None)
        deadline = time.monotonic() + timeout
        while True:
            _, received = self.worker.get_finished(set())
            if request_id in received:
                break
            assert time.monotonic() < deadline, "the load never finished"
            time.sleep(0.01)
        self.worker.clear_connector_metadata()
        return self.worker.get_block_ids_with_load_errors()

    def close(self):
        self.worker.shutdown()
        self.scheduler.connector.shutdown()


@pytest.fixture
def instances(mooncake):
    """Makes instances and closes them all, also when a test fails: a worker's threads left running would keep
    the interpreter from exiting."""
    made = []

    def make(prefix, lookup_port):
        made.append(MooncakeInstance(mooncake, prefix, lookup_port))
        return made[-1]

    yield make
    for instance in made:
        instance.close()
    CLOSED.extend(made)


# vLLM's lookup server closes its ZeroMQ socket from another thread while its own thread still blocks in
# recv, so collecting its context would block for ever in term(). Closed instances stay referenced until the
# interpreter exits, where pyzmq skips term().
CLOSED = []


def block_bytes(instance, name, block):
    return instance.kv[name][block].contiguous().view(torch.uint8)


def test_vllms_mooncake_store_connector_saves_and_loads_through_strata(instances):
    prefix = f"{uuid.uuid4().hex}/"
    tokens = torch.randint(0, 1000, (PROMPT,)).tolist()

    first = instances(prefix, 1)
    output = first.schedule("first", tokens)
    assert output.num_scheduled_tokens["first"] == PROMPT  # nothing stored yet
    saved_blocks = output.scheduled_new_reqs[0].block_ids[0][:3]
    for name in LAYERS:
        first.kv[name].view(torch.int16).copy_(torch.randint(-(2**15), 2**15, first.kv[name].shape, dtype=torch.int16))
    first.save(output)

    second = instances(prefix, 2)
    output = second.schedule("second", tokens)
    # Three full blocks hit: the load is asynchronous, so the request waits for it and computes nothing yet.
    assert "second" not in output.num_scheduled_tokens
    (request,) = [request for request in output.kv_connector_metadata.requests if request.load_spec]
    assert request.load_spec.kvpool_cached_tokens == 3 * BLOCK
    loaded_blocks = request.block_ids[0][:3]
    assert second.load(output, "second") == set()
    for name in LAYERS:
        for saved, loaded in zip(saved_blocks, loaded_blocks):
            assert torch.equal(block_bytes(second, name, loaded), block_bytes(first, name, saved))


def test_the_lookup_stops_at_a_block_the_node_no_longer_holds(node, instances):
    from strata import StrataStore

    prefix = f"{uuid.uuid4().hex}/"
    tokens = torch.randint(0, 1000, (PROMPT,)).tolist()
    first = instances(prefix, 3)
    output = first.schedule("first", tokens)
    for name in LAYERS:
        first.kv[name].normal_()
    first.save(output)

    # The key vLLM's own store layout gives the middle block.
    request = first.scheduler.requests["first"]
    layout = first.worker.connector_worker.token_dbs[0].store_layout
    store = StrataStore()
    assert store.setup(node.address) == 0
    keys = [layout.key_for(0, block_hash) for block_hash in request.block_hashes[:3]]
    assert store.batch_is_exist(keys) == [1, 1, 1]
    assert store.remove(keys[1]) == 0
    store.close()

    second = instances(prefix, 4)
    output = second.schedule("second", tokens)
    (request,) = [request for request in output.kv_connector_metadata.requests if request.load_spec]
    assert request.load_spec.kvpool_cached_tokens == BLOCK  # the first block only

