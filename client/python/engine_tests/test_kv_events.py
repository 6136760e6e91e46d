"""`strata-node --kv-events`: the node's blocks as vLLM's KV events, read as a router reads a vLLM instance:
a ZeroMQ SUB socket (pyzmq, as vLLM's subscribers) and vLLM's own `KVEventBatch` decoder, plus the replay
socket."""

import time
import uuid

import msgspec
import pytest
import zmq
from node_process import Node, free_port_pair
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch

TOKEN = "tenant-a"
OTHER_TOKEN = "tenant-b"
END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)


@pytest.fixture(scope="module")
def publishing_node(tmp_path_factory):
    """A node with two tenants, publishing tenant A's blocks (the `[kv-events]` table of its file)."""
    directory = tmp_path_factory.mktemp("kv-events")
    publish, replay = free_port_pair(), free_port_pair()
    config = directory / "node.toml"
    config.write_text(
        f'''
[[tenants]]
name = "a"
token = "{TOKEN}"

[[tenants]]
name = "b"
token = "{OTHER_TOKEN}"

[kv-events]
endpoint = "tcp://127.0.0.1:{publish}"
replay-endpoint = "tcp://127.0.0.1:{replay}"
topic = "strata"
token = "{TOKEN}"
block-size = 16
'''
    )
    started = Node(directory, extra=["--config", str(config)])
    started.publish, started.replay = f"tcp://127.0.0.1:{publish}", f"tcp://127.0.0.1:{replay}"
    yield started
    started.stop()


@pytest.fixture
def subscriber(publishing_node):
    context = zmq.Context.instance()
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.connect(publishing_node.publish)
    yield socket
    socket.close(linger=0)


@pytest.fixture
def store(publishing_node):
    from strata import StrataStore

    opened = StrataStore()
    assert opened.setup(publishing_node.address, token=TOKEN) == 0
    yield opened
    opened.close()


DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)


def receive(socket, until, seconds=10):
    """Messages (topic, sequence, batch) until `until(events so far)` holds, bounded in time."""
    messages, deadline = [], time.monotonic() + seconds
    while not until([event for _, _, batch in messages for event in batch.events]):
        assert time.monotonic() < deadline, f"no such events in {seconds} s: {messages}"
        if socket.poll(100):
            topic, sequence, payload = socket.recv_multipart()
            messages.append((topic, int.from_bytes(sequence, "big"), DECODER.decode(payload)))
    return messages


def joined(subscriber, store):
    """Puts warm-up blocks until the subscriber sees one: a SUB socket misses what is sent before it joined."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert store.put(f"warm-up-{uuid.uuid4().hex}", b"x") == 0
        if subscriber.poll(200):
            subscriber.recv_multipart()
            return
    raise AssertionError("the subscriber never joined")


def test_stored_and_removed_blocks_arrive_in_vllms_format(publishing_node, subscriber, store):
    joined(subscriber, store)
    keys = [f"chain-{uuid.uuid4().hex}-{at}" for at in range(3)]
    assert store.put(keys[0], b"a" * 64) == 0
    assert store.put(keys[1], b"b" * 64, parent=keys[0]) == 0
    assert store.put(keys[2], b"c" * 64, parent=keys[1]) == 0
    wanted = {key.encode() for key in keys}

    def stored(events):
        return {block for event in events if isinstance(event, BlockStored) for block in event.block_hashes}

    messages = receive(subscriber, lambda events: wanted <= stored(events))
    assert {topic for topic, _, _ in messages} == {b"strata"}
    sequences = [sequence for _, sequence, _ in messages]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)
    # A BlockStored's hashes are a chain (the node may fold consecutive puts into one event): each block's
    # parent is the hash before it, the first one's is parent_block_hash.
    parents, events = {}, {}
    for _, _, batch in messages:
        for event in batch.events:
            if isinstance(event, BlockStored):
                for at, block in enumerate(event.block_hashes):
                    parents[block] = event.block_hashes[at - 1] if at else event.parent_block_hash
                    events[block] = event
    assert [parents[key.encode()] for key in keys] == [None, keys[0].encode(), keys[1].encode()]
    assert all(events[key.encode()].medium == "CPU" and events[key.encode()].block_size == 16 for key in keys)

    assert store.remove(keys[2]) == 0
    removed = receive(
        subscriber,
        lambda events: any(isinstance(event, BlockRemoved) and keys[2].encode() in event.block_hashes for event in events),
    )
    assert removed


def test_another_tenants_blocks_are_not_published(publishing_node, subscriber, store):
    from strata import StrataStore

    joined(subscriber, store)
    other = StrataStore()
    assert other.setup(publishing_node.address, token=OTHER_TOKEN) == 0
    theirs, mine = f"theirs-{uuid.uuid4().hex}", f"mine-{uuid.uuid4().hex}"
    assert other.put(theirs, b"x") == 0
    assert store.put(mine, b"x") == 0  # after theirs: once mine arrives, theirs would have too
    messages = receive(subscriber, lambda events: any(
        isinstance(event, BlockStored) and mine.encode() in event.block_hashes for event in events))
    published = {block for _, _, batch in messages for event in batch.events for block in getattr(event, "block_hashes", [])}
    assert theirs.encode() not in published
    other.close()


def test_a_subscriber_replays_what_it_missed(publishing_node, subscriber, store):
    joined(subscriber, store)
    missed = f"missed-{uuid.uuid4().hex}"
    assert store.put(missed, b"y") == 0
    messages = receive(subscriber, lambda events: any(
        isinstance(event, BlockStored) and missed.encode() in event.block_hashes for event in events))
    first_sequence = messages[-1][1]

    replay = zmq.Context.instance().socket(zmq.DEALER)
    replay.connect(publishing_node.replay)
    replay.send_multipart([b"", first_sequence.to_bytes(8, "big")])
    replayed, deadline = [], time.monotonic() + 10
    while True:
        assert time.monotonic() < deadline, replayed
        if not replay.poll(100):
            continue
        _, topic, sequence, payload = replay.recv_multipart()
        if sequence == END_OF_REPLAY:
            break
        replayed.append((topic, int.from_bytes(sequence, "big"), DECODER.decode(payload)))
    assert replayed[0][1] == first_sequence
    assert any(missed.encode() in event.block_hashes for event in replayed[0][2].events if isinstance(event, BlockStored))
    # A malformed request is ignored, and the socket keeps serving.
    replay.send_multipart([b"", b"short"])
    replay.send_multipart([b"", (2**62).to_bytes(8, "big")])
    while not replay.poll(100):
        assert time.monotonic() < deadline
    assert replay.recv_multipart()[2] == END_OF_REPLAY
    replay.close(linger=0)
