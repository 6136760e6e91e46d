"""Mooncake's call forms on StrataStore against a real node: every setup form the engines use, the removal
forms with ``force``, the upsert and parts methods, buffers, ranged reads, and calls from several threads
running at once."""

import ctypes
import threading
import time
import uuid

import numpy as np
import pytest

import strata
from strata import ReplicateConfig
from strata import StrataStore as MooncakeDistributedStore


def unique(prefix="k"):
    return f"{prefix}-{uuid.uuid4().hex}"


def registered(store, size, fill=None):
    array = np.zeros(size, dtype=np.uint8) if fill is None else np.frombuffer(fill, dtype=np.uint8).copy()
    assert store.register_buffer(array.ctypes.data, array.nbytes) == 0
    return array, array.ctypes.data


def works(store):
    key = unique("works")
    assert store.put(key, b"value") == 0
    assert store.get(key) == b"value"


def test_every_setup_form_the_engines_use_connects(node):
    forms = [
        # vLLM and SGLang: Mooncake's positional form.
        (("localhost", "http://127.0.0.1:8080/metadata", 512 << 20, 128 << 20, "tcp", "", node.address), {}),
        # SGLang's: an eighth, the transfer engine to share (None).
        (("localhost", "P2PHANDSHAKE", 1 << 30, 0, "tcp", "", node.address, None), {}),
        # The same by keyword, with Mooncake's other spellings and a tenant id.
        (
            (),
            dict(
                local_hostname="localhost",
                metadata_server="P2PHANDSHAKE",
                global_segment_size=1 << 30,
                local_buffer_size=1 << 28,
                protocol="rdma",
                rdma_devices="mlx5_0",
                master_server_addr=node.address,
                tenant_id="",
            ),
        ),
        # LMCache: one dict.
        (({"local_hostname": "localhost", "protocol": "tcp", "master_server_address": node.address},), {}),
        # A list of nodes, first one down; and a comma-separated string.
        (("localhost", "", 0, 0, "tcp", "", ["127.0.0.1:1", node.address]), {}),
        (("localhost", "", 0, 0, "tcp", "", f"127.0.0.1:1, {node.address}"), {}),
        # Strata's own form.
        ((node.address,), {"timeout_seconds": 5}),
    ]
    for args, kwargs in forms:
        store = MooncakeDistributedStore()
        assert store.setup(*args, **kwargs) == 0, (args, kwargs)
        works(store)
        store.close()
    dummy = MooncakeDistributedStore()
    assert dummy.setup_dummy(256 << 20, 64 << 20, node.address) == 0
    works(dummy)
    dummy.close()


def test_a_setup_that_names_no_node_is_invalid_params():
    store = MooncakeDistributedStore()
    assert store.setup("localhost", "http://127.0.0.1:8080/metadata", 1, 1, "tcp", "", "") == strata.INVALID_PARAMS
    assert store.setup({"local_hostname": "localhost"}) == strata.INVALID_PARAMS
    assert store.get_hostname() == "localhost"
    try:
        store.setup("a", "b", 1, 2, "tcp", "", "127.0.0.1:1", None, "one too many")
    except TypeError:
        pass
    else:
        raise AssertionError("nine positional arguments are refused (Mooncake's eighth is the engine)")


def test_removal_forms_take_force(store):
    keys = [unique("rm") for _ in range(4)]
    for key in keys:
        assert store.put(key, b"x") == 0
    assert store.remove(keys[0], force=True) == 0
    assert store.batch_remove(keys[1:3], force=True) == [0, 0]
    assert store.batch_remove([keys[1]]) == [strata.OBJECT_NOT_FOUND]
    assert store.remove_by_regex(f"^{keys[3]}$", force=True) == 1
    assert store.remove_all(force=True) >= 0
    assert store.is_exist(keys[3]) == 0


def test_batch_put_parts_stores_each_key_from_its_parts_with_a_code_per_key(store):
    keys = [unique("batch-parts") for _ in range(3)]
    layer = np.arange(16, dtype=np.uint8)
    parts = [[b"head:", memoryview(b"body")], [layer, layer[::-1].copy()], [bytearray(b"one part")]]
    assert store.batch_put_parts(keys, parts) == [0, 0, 0]
    assert store.get_batch(keys) == [b"head:body", layer.tobytes() + layer[::-1].tobytes(), b"one part"]
    assert store.batch_put_parts(keys[:1], [[b"again"]]) == [strata.OBJECT_ALREADY_EXISTS]
    assert store.batch_put_parts(keys[:1], [[b"replaced"]], ReplicateConfig(upsert=True)) == [0]
    assert store.get(keys[0]) == b"replaced"
    assert store.batch_put_parts(keys, [[b"too few values"]]) == [strata.INVALID_PARAMS] * 3
    with pytest.raises(ValueError):
        store.batch_put_parts(keys[:1], [[layer[::2]]])  # not contiguous: refused, never sent


def test_parts_and_upserts_replace_as_mooncake_says(store):
    key = unique("parts")
    assert store.put_parts(key, b"Hello, ", memoryview(b"World"), bytearray(b"!")) == 0
    assert store.get(key) == b"Hello, World!"
    assert store.put_parts(key, b"again") == strata.OBJECT_ALREADY_EXISTS
    assert store.upsert_parts(key, b"new ", b"value", config=ReplicateConfig(replica_num=2)) == 0
    assert store.get(key) == b"new value"
    keys = [unique("upsert") for _ in range(2)]
    assert store.upsert_batch(keys, [b"a", b"b"]) == 0
    assert store.upsert_batch(keys, [b"c", b"d"]) == 0
    assert store.get_batch(keys) == [b"c", b"d"]
    value = b"from a registered buffer"
    _, address = registered(store, len(value), value)
    assert store.upsert_from(keys[0], address, len(value)) == 0
    assert store.batch_upsert_from(keys, [address, address], [4, 8]) == [0, 0]
    assert store.get_batch(keys) == [value[:4], value[:8]]
    config = ReplicateConfig()
    config.preferred_segments = ["node-a"]
    config.prefer_alloc_in_same_node = True
    assert store.put(unique("config"), b"v", config) == 0
    assert store.unregister_buffer(address) == 0


def test_buffers_expose_the_value_and_its_address(store):
    key, value = unique("buffer"), bytes(range(256)) * 64
    assert store.put(key, value) == 0
    handle = store.get_buffer(key)
    assert handle is not None and handle.size() == len(value) == len(handle)
    assert bytes(memoryview(handle)) == value
    assert ctypes.string_at(handle.ptr(), handle.size()) == value
    assert np.array(handle, copy=False).tobytes() == value
    assert store.get_buffer(unique("missing")) is None
    handles = store.batch_get_buffer([key, unique("missing")])
    assert bytes(handles[0]) == value and handles[1] is None


def test_get_into_ranges_places_each_fragment(store):
    first, second = unique("r1"), unique("r2")
    one, two = bytes(range(40)), bytes(range(100, 140))
    assert store.put(first, one) == 0 and store.put(second, two) == 0
    buffer, address = registered(store, 32)
    results = store.get_into_ranges([address], [[first, second]], [[[0, 20], [8]]], [[[1, 30], [2]]], [[[4, 3], [5]]])
    assert results == [[[4, 3], [5]]]
    assert buffer[0:4].tobytes() == one[1:5]
    assert buffer[20:23].tobytes() == one[30:33]
    assert buffer[8:13].tobytes() == two[2:7]
    missing = store.get_into_ranges([address], [[unique("missing")]], [[[0]]], [[[0]]], [[[4]]])
    assert missing == [[[strata.OBJECT_NOT_FOUND]]]
    assert store.get_into_ranges([address], [[first]], [[[0]]], [[[0], [1]]], [[[4]]])[0][0][0] < 0
    assert store.unregister_buffer(address) == 0


def test_hostname_and_health(node, store):
    assert store.health_check() == 0
    assert isinstance(store.get_hostname(), str) and store.get_hostname()
    named = MooncakeDistributedStore()
    assert named.setup("worker-7:1234", "", 0, 0, "tcp", "", node.address) == 0
    assert named.get_hostname() == "worker-7:1234"
    named.close()
    assert named.health_check() == strata.INVALID_PARAMS, "closed"


def test_a_waiting_read_in_one_thread_does_not_hold_a_put_in_another(store):
    layer = 4096
    buffer, address = registered(store, layer)
    outcome = []
    asking = threading.Event()

    def wait_for_a_key_that_never_comes():
        asking.set()
        outcome.append(store.get_into(unique("never"), address, layer, wait=2.0))

    waiter = threading.Thread(target=wait_for_a_key_that_never_comes)
    waiter.start()
    assert asking.wait(5)
    time.sleep(0.1)
    started = time.monotonic()
    assert store.put(unique("meanwhile"), b"x" * 1024) == 0
    put_took = time.monotonic() - started
    waiter.join(10)
    assert outcome == [strata.OBJECT_NOT_FOUND]
    assert put_took < 1.0, f"the put waited {put_took:.2f} s behind the other thread's read"
    assert store.unregister_buffer(address) == 0
    del buffer


def test_replica_descriptors_say_where_each_key_is(tmp_path):
    from node_process import Node

    small = Node(tmp_path, cores=1, dram="4MiB")
    try:
        store = MooncakeDistributedStore()
        assert store.setup("localhost", "", 0, 0, "tcp", "", ["127.0.0.1:1", small.address]) == 0
        assert store.node_address() == small.address
        config = ReplicateConfig(write_policy="write-through")
        first = unique("first")
        assert store.put(first, b"a" * 65536, config) == 0
        replicas = store.get_replica_desc(first)
        tiers = sorted(replica.tier for replica in replicas)
        assert tiers == ["dram", "nvme"], replicas
        memory = next(replica for replica in replicas if replica.is_memory_replica())
        assert memory.get_memory_descriptor().buffer_descriptor.size == 65536
        assert memory.get_memory_descriptor().buffer_descriptors[0].transport_endpoint_ == small.address
        assert memory.node == small.address and memory.status == "COMPLETE"
        # Enough later puts push the first out of 4 MiB of DRAM: only its tier record is left.
        for _ in range(128):
            assert store.put(unique("filler"), b"f" * 65536, config) == 0
        described = store.batch_get_replica_desc([first, unique("missing")])
        assert [replica.tier for replica in described[first]] == ["nvme"]
        assert described[first][0].get_disk_descriptor().object_size == 65536
        assert list(described.values())[1] == []
        store.close()
    finally:
        small.stop()


def test_every_connection_of_a_store_reaches_the_node_that_answered_setup(tmp_path):
    """A store set up with a list of nodes uses the one that answered. A connection it opens later, for a
    second call in flight, must not go to an earlier node of the list that has come up since: that node
    holds other data."""
    from node_process import Node

    for name in ("first", "second", "late"):
        (tmp_path / name).mkdir()
    first = Node(tmp_path / "first", cores=1, dram="16MiB")
    first_port = int(first.address.rsplit(":", 1)[1])
    first.stop()
    second = Node(tmp_path / "second", cores=1, dram="16MiB")
    late = None
    try:
        store = MooncakeDistributedStore()
        assert store.setup("localhost", "", 0, 0, "tcp", "", [first.address, second.address]) == 0
        assert store.node_address() == second.address
        # A node comes up where the first was.
        late = Node(tmp_path / "late", cores=1, dram="16MiB", port=first_port)
        # One call holds the store's connection while another opens a second one.
        buffer, address = registered(store, 4096)
        waiting = threading.Thread(target=lambda: store.get_into(unique("never"), address, 4096, wait=1.0))
        waiting.start()
        time.sleep(0.2)
        key = unique("where")
        assert store.put(key, b"on the node that answered") == 0
        waiting.join(10)
        on_second = MooncakeDistributedStore()
        assert on_second.setup(second.address) == 0
        assert on_second.get(key) == b"on the node that answered"
        on_second.close()
        store.close()
        del buffer
    finally:
        if late is not None:
            late.stop()
        second.stop()


def test_list_keys_walks_every_shard_and_follows_removals(store):
    keys = [unique("listed") for _ in range(40)]  # more keys than shards: every shard holds some
    assert store.put_batch(keys, [b"v"] * len(keys)) == 0
    listed = set(store.list_keys())
    assert {key.encode() for key in keys} <= listed
    assert store.remove(keys[0]) == 0
    listed = set(store.list_keys())
    assert keys[0].encode() not in listed
    assert {key.encode() for key in keys[1:]} <= listed
