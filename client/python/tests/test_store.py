"""Every StrataStore method against a real node, including the error codes of each."""

import ctypes
import threading
import time
import uuid

import numpy as np
import pytest

import strata
from strata import ReplicateConfig, StrataStore


def unique(prefix="k"):
    return f"{prefix}-{uuid.uuid4().hex}"


def registered(store, size, fill=None):
    """A numpy buffer registered with the store; returns (array, address)."""
    array = np.zeros(size, dtype=np.uint8) if fill is None else np.frombuffer(fill, dtype=np.uint8).copy()
    address = array.ctypes.data
    assert store.register_buffer(address, array.nbytes) == 0
    return array, address


def pattern(seed, size):
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


# ---- setup and close --------------------------------------------------------------------------------


def test_setup_takes_an_address_or_a_list_and_reports_failures(node):
    store = StrataStore()
    assert store.setup("127.0.0.1:1", timeout_seconds=2) == strata.RPC_FAIL
    assert store.setup(["127.0.0.1:1", node.address], timeout_seconds=5) == 0
    assert store.put(unique(), b"x") == 0
    with pytest.raises(TypeError):
        store.setup(node.address, no_such_option=1)
    with pytest.raises(TypeError):
        store.setup(42)
    assert store.close() == 0


def test_calls_before_setup_or_after_close_fail_with_invalid_params(node):
    store = StrataStore()
    assert store.put("k", b"v") == strata.INVALID_PARAMS
    assert store.get("k") == b""
    assert store.is_exist("k") == strata.INVALID_PARAMS
    assert store.setup(node.address) == 0
    assert store.close() == 0
    assert store.get_size("k") == strata.INVALID_PARAMS
    assert store.batch_is_exist(["a", "b"]) == [strata.INVALID_PARAMS] * 2


def test_a_wrong_token_is_refused_as_an_illegal_client(tmp_path):
    from node_process import Node

    guarded = Node(tmp_path, cores=1, dram="16MiB", extra=["--token", "s3cret"])
    try:
        store = StrataStore()
        assert store.setup(guarded.address, token="wrong") == strata.ILLEGAL_CLIENT
        assert store.setup(guarded.address) == strata.ILLEGAL_CLIENT
        assert store.setup(guarded.address, token="s3cret") == 0
        assert store.put(unique(), b"v") == 0
        store.close()
    finally:
        guarded.stop()


# ---- put, upsert, get -------------------------------------------------------------------------------


def test_put_and_get_take_bytes_and_any_contiguous_buffer(store):
    key = unique()
    assert store.put(key, b"hello strata") == 0
    assert store.get(key) == b"hello strata"
    floats = np.arange(1000, dtype=np.float32)
    assert store.put(key + "-np", floats) == 0
    assert np.array_equal(np.frombuffer(store.get(key + "-np"), dtype=np.float32), floats)
    assert store.put(key + "-mv", memoryview(b"abcdef")[1:4]) == 0
    assert store.get(key + "-mv") == b"bcd"
    assert store.put(key.encode() + b"-bytes-key", b"v") == 0
    assert store.get(key.encode() + b"-bytes-key") == b"v"
    with pytest.raises(ValueError):
        store.put(unique(), np.arange(10)[::2])
    with pytest.raises(TypeError):
        store.put(12, b"v")


def test_a_put_keeps_a_stored_key_and_an_upsert_replaces_it(store):
    key = unique()
    assert store.put(key, b"first") == 0
    assert store.put(key, b"second") == strata.OBJECT_ALREADY_EXISTS
    assert strata.error_name(strata.OBJECT_ALREADY_EXISTS) == "OBJECT_ALREADY_EXISTS"
    assert store.get(key) == b"first"
    assert store.upsert(key, b"second") == 0
    assert store.get(key) == b"second"
    assert store.put(key, b"third", ReplicateConfig(upsert=True)) == 0
    assert store.get(key) == b"third"


def test_get_of_a_missing_key_is_empty_bytes(store):
    assert store.get(unique("missing")) == b""


def test_keys_over_the_bound_are_invalid_params(store):
    assert store.put("k" * 2000, b"v") == strata.INVALID_PARAMS
    assert store.put("", b"v") == strata.INVALID_PARAMS


# ---- registered buffers -----------------------------------------------------------------------------


def test_put_from_and_get_into_use_registered_buffers_only(store):
    key = unique()
    value = pattern(1, 64 << 10)
    source, source_address = registered(store, len(value), value)
    assert store.put_from(key, source_address, len(value)) == 0
    target, target_address = registered(store, 128 << 10)
    assert store.get_into(key, target_address, target.nbytes) == len(value)
    assert target[: len(value)].tobytes() == value
    # Too small a buffer, a missing key, an unregistered address.
    assert store.get_into(key, target_address, 100) == strata.INVALID_PARAMS
    assert store.get_into(unique("missing"), target_address, target.nbytes) == strata.OBJECT_NOT_FOUND
    loose = np.zeros(4096, dtype=np.uint8)
    assert store.get_into(key, loose.ctypes.data, loose.nbytes) == strata.INVALID_PARAMS
    assert store.put_from(unique(), loose.ctypes.data, loose.nbytes) == strata.INVALID_PARAMS
    assert store.put_from(unique(), target_address, target.nbytes + 1) == strata.INVALID_PARAMS
    # A range of the value, into the middle of a registered buffer.
    assert store.get_range_into(key, 1000, target_address + 10, 500) == 500
    assert target[10:510].tobytes() == value[1000:1500]
    assert store.get_range_into(key, len(value) - 10, target_address, 100) == strata.INVALID_PARAMS
    assert store.unregister_buffer(source_address) == 0
    assert store.unregister_buffer(target_address) == 0


def node_maps_shared_buffers(node):
    """Whether the node process maps a buffer of ``alloc_buffer`` (the shared-memory path was used)."""
    with open(f"/proc/{node.process.pid}/maps") as maps:
        return "memfd:strata-buffer" in maps.read()


def test_alloc_buffer_moves_values_through_shared_memory_or_tcp(node):
    values = [pattern(seed, size) for seed, size in enumerate([1, 4096, 100_000, 4 << 20])]
    for shared in (False, True):
        store = StrataStore()
        assert store.setup(node.address, shared_memory=shared) == 0
        buffer = store.alloc_buffer(sum(len(value) for value in values) + 4096)
        view = np.frombuffer(buffer, dtype=np.uint8)
        base = ctypes.addressof(buffer)
        offsets = np.cumsum([0] + [len(value) for value in values[:-1]]).tolist()
        for offset, value in zip(offsets, values):
            view[offset : offset + len(value)] = np.frombuffer(value, dtype=np.uint8)
        keys = [unique(f"alloc-{shared}") for _ in values]
        sizes = [len(value) for value in values]
        assert store.batch_put_from(keys, [base + offset for offset in offsets], sizes) == [0] * len(keys)
        view[:] = 0
        assert store.batch_get_into(keys, [base + offset for offset in offsets], sizes) == sizes
        for offset, value in zip(offsets, values):
            assert view[offset : offset + len(value)].tobytes() == value
        # The values read over the other path, and by a plain get.
        assert store.get(keys[2]) == values[2]
        assert store.get_into(keys[1], base + 8, 4096) == 4096
        assert view[8 : 8 + 4096].tobytes() == values[1]
        assert store.put_from(unique("one"), base, 4096) == 0
        # A range too small for its value, and one past the buffer.
        assert store.get_into(keys[3], base, 1 << 20) == strata.INVALID_PARAMS
        assert store.get_into(keys[0], base + len(buffer), 1) == strata.INVALID_PARAMS
        if shared:
            # While the store's connections are open: closing them unmaps the buffer.
            assert node_maps_shared_buffers(node), "the node maps the buffer: values moved through it"
        store.close()


def test_register_buffer_refuses_overlaps_and_unregister_unknown_addresses(store):
    array = np.zeros(8192, dtype=np.uint8)
    address = array.ctypes.data
    assert store.register_buffer(address, 8192) == 0
    assert store.register_buffer(address + 4096, 8192) == strata.INVALID_PARAMS
    assert store.register_buffer(address, 0) == strata.INVALID_PARAMS
    assert store.unregister_buffer(address + 1) == strata.INVALID_PARAMS
    assert store.unregister_buffer(address) == 0
    assert store.unregister_buffer(address) == strata.INVALID_PARAMS


def test_batch_put_from_and_batch_get_into_report_per_key(store):
    count, size = 32, 4096
    keys = [unique("batch") for _ in range(count)]
    values = b"".join(pattern(index, size) for index in range(count))
    source, source_address = registered(store, len(values), values)
    addresses = [source_address + index * size for index in range(count)]
    assert store.batch_put_from(keys, addresses, [size] * count) == [0] * count
    assert store.batch_put_from(keys[:2], addresses[:2], [size] * 2) == [strata.OBJECT_ALREADY_EXISTS] * 2
    target, target_address = registered(store, (count + 1) * size)
    asked = keys + [unique("missing")]
    slots = [target_address + index * size for index in range(count + 1)]
    results = store.batch_get_into(asked, slots, [size] * (count + 1))
    assert results == [size] * count + [strata.OBJECT_NOT_FOUND]
    assert target[: count * size].tobytes() == values
    # Mismatched lengths and overlapping destinations are refused before anything is sent.
    assert store.batch_get_into(keys[:2], slots[:1], [size]) == [strata.INVALID_PARAMS] * 2
    assert store.batch_get_into(keys[:2], [target_address, target_address + 1], [size, size]) == [strata.INVALID_PARAMS] * 2
    assert store.batch_put_from(keys[:1], [source_address], [size, size]) == [strata.INVALID_PARAMS]


def test_multi_buffer_forms_write_and_read_one_value_per_layer(store):
    layers, layer_size = 8, 2048
    keys = [unique("layered") for _ in range(3)]
    source_bytes = b"".join(pattern(100 + index, layers * layer_size) for index in range(3))
    source, base = registered(store, len(source_bytes), source_bytes)
    ptrs = [[base + (key * layers + layer) * layer_size for layer in range(layers)] for key in range(3)]
    sizes = [[layer_size] * layers for _ in range(3)]
    assert store.batch_put_from_multi_buffers(keys, ptrs, sizes) == [0, 0, 0]
    assert store.get(keys[1]) == source_bytes[layers * layer_size : 2 * layers * layer_size]
    target, target_base = registered(store, len(source_bytes))
    # Read each key's layers into a different layout: layer-major (all keys' layer 0 first, ...).
    out = [[target_base + (layer * 3 + key) * layer_size for layer in range(layers)] for key in range(3)]
    assert store.batch_get_into_multi_buffers(keys, out, sizes) == [layers * layer_size] * 3
    for key in range(3):
        for layer in range(layers):
            got = target[(layer * 3 + key) * layer_size : (layer * 3 + key + 1) * layer_size].tobytes()
            start = (key * layers + layer) * layer_size
            assert got == source_bytes[start : start + layer_size]
    short = [[target_base]] * 3
    assert store.batch_get_into_multi_buffers(keys, short, [[100]] * 3) == [strata.INVALID_PARAMS] * 3


# ---- exists, size, remove ---------------------------------------------------------------------------


def test_is_exist_get_size_and_remove(store):
    key, missing = unique(), unique("missing")
    assert store.put(key, b"x" * 321) == 0
    assert store.is_exist(key) == 1
    assert store.is_exist(missing) == 0
    assert store.batch_is_exist([key, missing, key]) == [1, 0, 1]
    assert store.get_size(key) == 321
    assert store.get_size(missing) == strata.OBJECT_NOT_FOUND
    assert store.remove(key) == 0
    assert store.remove(key) == strata.OBJECT_NOT_FOUND
    assert store.is_exist(key) == 0


# ---- Strata's own -----------------------------------------------------------------------------------


def test_prefix_match_counts_leading_stored_keys(store):
    chain = [unique("chain") for _ in range(100)]
    for key in chain[:60] + [chain[80]]:
        assert store.put(key, b"kv") == 0
    assert store.prefix_match(chain) == 60
    assert store.prefix_match(chain[60:]) == 0
    assert store.prefix_match([]) == 0
    assert store.batch_prefix_match([chain, chain[:10], [unique("none")]]) == [60, 10, 0]


def test_prefix_match_of_stems_builds_the_same_keys(store):
    prefix, suffix = unique("head/").encode() + b"/", b"/layer.0"
    stems = [f"{index:040x}".encode() for index in range(100)]
    for stem in stems[:45] + [stems[70]]:
        assert store.put(prefix + stem + suffix, b"kv") == 0
    assert store.prefix_match_stems(prefix, stems, suffix) == 45
    assert store.prefix_match_stems(prefix, stems, suffix) == store.prefix_match([prefix + s + suffix for s in stems])
    assert store.prefix_match_stems(prefix, [s.decode() for s in stems[:10]], suffix) == 10
    assert store.prefix_match_stems(prefix, stems, b"/layer.1") == 0
    assert store.prefix_match_stems(prefix, [], suffix) == 0


def test_gather_and_scatter_for_tensor_parallel_layouts(node, store):
    # Tp = 4 prefill ranks, each storing [K | V] of one KV head; a Td = 2 decode rank gathers two heads.
    slice_bytes = 1024
    keys = [unique(f"tp4-{rank}") for rank in range(4)]
    heads = [pattern(200 + rank, 2 * slice_bytes) for rank in range(4)]
    source, base = registered(store, 4 * 2 * slice_bytes, b"".join(heads))
    pieces = [(key, 2 * slice_bytes) for key in keys]
    assert store.scatter_put_from(base, source.nbytes, pieces) == [0] * 4
    target, target_base = registered(store, 4 * slice_bytes)
    ranges = [(keys[2], 0, slice_bytes), (keys[3], 0, slice_bytes), (keys[2], slice_bytes, slice_bytes), (keys[3], slice_bytes, slice_bytes)]
    assert store.gather_into(ranges, target_base, target.nbytes) == [slice_bytes] * 4
    expected = heads[2][:slice_bytes] + heads[3][:slice_bytes] + heads[2][slice_bytes:] + heads[3][slice_bytes:]
    assert target.tobytes() == expected
    ranges[1] = (unique("missing"), 0, slice_bytes)
    assert store.gather_into(ranges, target_base, target.nbytes)[1] == strata.OBJECT_NOT_FOUND
    assert store.gather_into(ranges, target_base, 10) == [strata.INVALID_PARAMS] * 4
    # With a wait, a range whose key is still to come is answered when it comes.
    late = unique("late-rank")
    ranges[1] = (late, 0, slice_bytes)
    other = StrataStore()
    assert other.setup(node.address) == 0
    writer = threading.Timer(0.2, lambda: other.put(late, heads[3]))
    writer.start()
    assert store.gather_into(ranges, target_base, target.nbytes, wait=5)[1] == slice_bytes
    writer.join()
    other.close()
    assert target.tobytes()[slice_bytes : 2 * slice_bytes] == heads[3][:slice_bytes]


def test_pins_are_accepted_and_bounded(store):
    assert store.put(unique("soft"), b"s" * 1000, ReplicateConfig(with_soft_pin=True)) == 0
    config = ReplicateConfig()
    config.with_soft_pin = True
    config.soft_pin_ttl_seconds = 5
    assert store.put(unique("soft-ttl"), b"s", config) == 0
    assert store.put(unique("hard"), b"h" * 1000, ReplicateConfig(with_hard_pin=True)) == 0
    # The node has 64 MiB over 2 shards; pins may take half of a shard's 32 MiB.
    huge = np.zeros(20 << 20, dtype=np.uint8)
    assert store.put(unique("too-much"), huge, ReplicateConfig(with_hard_pin=True)) == strata.QUOTA_EXCEEDED
    with pytest.raises(ValueError):
        store.put(unique(), b"v", ReplicateConfig(write_policy="sometimes"))
    assert store.put(unique(), b"v", ReplicateConfig(write_policy="durable")) == 0


# ---- the GIL ----------------------------------------------------------------------------------------


def test_calls_release_the_gil_while_they_wait(tmp_path):
    from node_process import Node

    paused = Node(tmp_path, cores=1, dram="16MiB")
    try:
        store = StrataStore()
        assert store.setup(paused.address, timeout_seconds=1.5) == 0
        paused.pause()
        outcome = []
        waiter = threading.Thread(target=lambda: outcome.append(store.is_exist("k")))
        started = time.monotonic()
        waiter.start()
        spins = 0
        while waiter.is_alive() and time.monotonic() - started < 10:
            spins += 1
        waiter.join()
        # The waiter was blocked on a stopped node for about its timeout; Python code ran meanwhile.
        assert outcome == [strata.RPC_FAIL]
        assert time.monotonic() - started >= 1.0
        assert spins > 10_000
        paused.resume()
        assert store.is_exist("k") == 0, "the connection is reopened after a timeout"
        store.close()
    finally:
        paused.resume()
        paused.stop()


def test_remove_by_regex_and_remove_all_count_what_they_removed(tmp_path):
    from node_process import Node

    own = Node(tmp_path, cores=2, dram="16MiB")
    try:
        store = StrataStore()
        assert store.setup(own.address) == 0
        for index in range(20):
            assert store.put(f"req-{index % 2}/block-{index}", b"kv" * 100) == 0
        assert store.remove_by_regex(r"^req-0/") == 10
        assert store.is_exist("req-0/block-0") == 0
        assert store.is_exist("req-1/block-1") == 1
        assert store.remove_by_regex("(") == strata.INVALID_PARAMS
        assert store.remove_all() == 10
        assert store.batch_is_exist([f"req-1/block-{index}" for index in range(1, 20, 2)]) == [0] * 10
        store.close()
    finally:
        own.stop()


def test_subscribers_see_stores_and_removals_with_a_prefix_filter(store):
    everything = store.subscribe_events()
    mine = store.subscribe_events(prefix="router-test/")
    key = "router-test/" + uuid.uuid4().hex
    assert store.put(key, b"x" * 77) == 0
    assert store.put(unique("other"), b"y") == 0
    assert store.remove(key) == 0
    seen = []
    deadline = time.monotonic() + 10
    while len(seen) < 2 and time.monotonic() < deadline:
        event = mine.next(timeout_seconds=0.2)
        if event is not None:
            seen.append(event)
    assert seen[0]["type"] == "BlockStored"
    assert seen[0]["keys"] == [key] and seen[0]["size"] == 77 and seen[0]["tier"] == "dram"
    assert seen[0]["parent"] is None and seen[0]["chained"] is False
    assert seen[1] == {**seen[1], "type": "BlockRemoved", "keys": [key], "reason": "removed"}
    assert mine.drain() == []
    types = []
    while len(types) < 3 and time.monotonic() < deadline:
        event = everything.next(timeout_seconds=0.2)
        if event is not None:
            types.append(event["type"])
    assert sorted(types) == ["BlockRemoved", "BlockStored", "BlockStored"]
    assert everything.close() == 0
    assert everything.next(timeout_seconds=0.01) is None
    mine.close()


def test_put_batch_and_get_batch_take_any_buffers(store):
    keys = [unique("pb") for _ in range(5)]
    values = [b"a" * 10, bytearray(b"b" * 20), memoryview(b"c" * 30), np.arange(4, dtype=np.int64), b""]
    assert store.put_batch(keys, values) == 0
    got = store.get_batch(keys + [unique("missing")])
    assert got[:3] == [b"a" * 10, b"b" * 20, b"c" * 30]
    assert np.array_equal(np.frombuffer(got[3], dtype=np.int64), np.arange(4))
    assert got[4] == b"" and got[5] == b""
    # One code for the call: the first failure (a stored key is kept, not replaced).
    assert store.put_batch([keys[0], unique("new")], [b"x", b"y"]) == strata.OBJECT_ALREADY_EXISTS
    assert store.put_batch(keys[:2], [b"x"]) == strata.INVALID_PARAMS
    assert store.put_batch(keys[:1], [b"replaced"], ReplicateConfig(upsert=True)) == 0
    assert store.get_batch(keys[:1]) == [b"replaced"]


def wait_until(condition, seconds=10):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_children_and_groups_leave_with_their_parent_or_a_member(store):
    chain = [unique("chain") for _ in range(6)]
    parents = [None] + chain[:-1]
    array, address = registered(store, 6 * 256, fill=pattern(9, 6 * 256))
    codes = store.batch_put_from(chain, [address + 256 * i for i in range(6)], [256] * 6, parents=parents)
    assert codes == [0] * 6
    assert store.put(unique("side"), b"s", parent=chain[1]) == 0
    subscription = store.subscribe_events(prefix="chain-")
    assert store.remove(chain[2]) == 0
    assert wait_until(lambda: store.batch_is_exist(chain[2:]) == [0] * 4), "the suffix left"
    assert store.batch_is_exist(chain[:2]) == [1, 1]
    reasons = {}
    deadline = time.monotonic() + 10
    while len(reasons) < 4 and time.monotonic() < deadline:
        event = subscription.next(timeout_seconds=0.2)
        if event is not None and event["type"] == "BlockRemoved":
            # One event may name several keys (a cascade is reported as it happens, in few events).
            reasons.update({removed: event["reason"] for removed in event["keys"]})
    assert reasons == {chain[2]: "removed", **{key: "cascaded" for key in chain[3:]}}
    subscription.close()

    # All layers of a block as one group: removing one member removes every member.
    layers = [unique("layer") for _ in range(4)]
    group = unique("group")
    assert store.put_batch(layers, [b"L" * 64] * 4, groups=[group] * 4) == 0
    assert store.put(unique("loner"), b"x", group=unique("other-group")) == 0
    assert store.remove(layers[0]) == 0
    assert wait_until(lambda: store.batch_is_exist(layers) == [0] * 4), "the group left together"

    # One name per key, or the call is refused.
    assert store.batch_put_from(chain[:2], [address, address + 256], [256, 256], parents=[None]) == [
        strata.INVALID_PARAMS
    ] * 2
    with pytest.raises(TypeError):
        store.put(unique(), b"v", parent=3)


def test_a_progressive_put_is_readable_layer_by_layer_before_it_completes(store):
    key, layer = unique("progressive"), 4096
    layers = [pattern(100 + i, layer) for i in range(4)]
    put = store.put_progressive(key, [layer] * 4)
    assert isinstance(put, strata.ProgressivePut)
    assert put.send(layers[0]) == 0
    array, address = registered(store, layer, fill=layers[1])
    assert put.send_from(address, layer) == 0
    assert put.parts_sent() == 2
    out, out_address = registered(store, layer)
    # The put's first bytes may still be on their way to the node: the read waits for them (up to 5 s).
    assert store.get_range_into(key, 0, out_address, layer, wait=5) == layer
    assert out.tobytes() == layers[0]
    assert store.get_range_into(key, layer, out_address, layer) == layer
    assert out.tobytes() == layers[1]
    assert store.is_exist(key) == 0, "not a stored block until finished"
    assert put.send(b"short") == strata.INVALID_PARAMS, "a part of the wrong size is refused"
    assert put.finish() == strata.INVALID_PARAMS, "two parts are missing"
    assert put.send(layers[2]) == 0 and put.send(np.frombuffer(layers[3], dtype=np.uint8)) == 0
    assert put.finish() == 0
    assert store.get(key) == b"".join(layers)
    assert put.finish() == strata.INVALID_PARAMS, "finished already"
    # A put of a stored key is refused when it finishes.
    again = store.put_progressive(key, [1])
    assert again.send(b"x") == 0 and again.finish() == strata.OBJECT_ALREADY_EXISTS
    # Before setup, or with an empty part, the put holds the error.
    assert store.put_progressive(unique(), [4, 0]).send(b"abcd") == strata.INVALID_PARAMS


def test_a_reader_can_wait_for_a_layer_that_is_not_sent_yet(node, store):
    key, layer = unique("later"), 4096
    layers = [pattern(200 + i, layer) for i in range(2)]
    reader = StrataStore()
    assert reader.setup(node.address) == 0
    out, out_address = registered(reader, layer)
    outcome = []
    asking = threading.Event()

    def read():
        asking.set()
        outcome.append(reader.get_range_into(key, 0, out_address, layer, wait=10))

    thread = threading.Thread(target=read)
    thread.start()
    assert asking.wait(5)
    time.sleep(0.2)
    put = store.put_progressive(key, [layer] * 2)
    assert put.send(layers[0]) == 0
    thread.join(10)
    assert outcome == [layer], "answered with the first layer before the second was sent"
    assert out.tobytes() == layers[0]
    assert put.send(layers[1]) == 0 and put.finish() == 0
    # A key that never comes: OBJECT_NOT_FOUND after the wait; a negative wait is a ValueError.
    started = time.monotonic()
    assert reader.get_into(unique("never"), out_address, layer, wait=0.3) == strata.OBJECT_NOT_FOUND
    assert time.monotonic() - started >= 0.29
    with pytest.raises(ValueError):
        reader.get_range_into(key, 0, out_address, layer, wait=-1)
    reader.close()
