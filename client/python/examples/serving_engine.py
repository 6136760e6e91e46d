"""A serving engine's KV connector in miniature, over a Strata node.

Run: python serving_engine.py 127.0.0.1:7600

Blocks of 16 tokens are keyed by a chained hash (a block's key covers its tokens and its whole prefix, as
vLLM's prefix caching does). Before prefilling a request the engine asks how many leading blocks are
stored (prefix match), loads those into registered buffers (batch_get_into), computes only the rest, and
stores what it computed (batch_put_from), each block naming the one before it as its parent, so that a
block that leaves the node takes the rest of its chain with it (a suffix is useless without its prefix). A
second request that shares a prefix with the first loads it. A router subscribed to the node's events
learns which blocks the node holds without asking it. Finally a prefill sends one block layer by layer
(put_progressive) while a decode instance reads each layer as soon as it was sent.
"""

import hashlib
import sys
import time

import numpy as np

import strata

TOKENS_PER_BLOCK = 16
# A small model: 4 layers × K,V × 2 KV heads × head_dim 64 × bf16, per token.
LAYERS = 4
BYTES_PER_TOKEN = LAYERS * 2 * 2 * 64 * 2
BLOCK_BYTES = TOKENS_PER_BLOCK * BYTES_PER_TOKEN
LAYER_BYTES = BLOCK_BYTES // LAYERS


def block_keys(tokens, model="demo-model"):
    """Chained block hashes: key i depends on blocks 0..i (a suffix is useless without its prefix)."""
    keys, parent = [], model.encode()
    for start in range(0, len(tokens) - len(tokens) % TOKENS_PER_BLOCK, TOKENS_PER_BLOCK):
        block = np.asarray(tokens[start : start + TOKENS_PER_BLOCK], dtype=np.int32).tobytes()
        parent = hashlib.sha256(parent + block).digest()
        keys.append(parent.hex())
    return keys


def compute_kv(key):
    """Stands in for the attention layers: deterministic bytes per block."""
    seed = int(key[:16], 16)
    return np.random.default_rng(seed).integers(0, 256, BLOCK_BYTES, dtype=np.uint8)


class Engine:
    def __init__(self, address, max_blocks=64):
        self.store = strata.StrataStore()
        code = self.store.setup(address)
        if code != 0:
            raise SystemExit(f"setup failed: {strata.error_name(code)}")
        # The engine's KV buffer pool, registered once (as vLLM registers its paged KV cache).
        self.pool = np.zeros(max_blocks * BLOCK_BYTES, dtype=np.uint8)
        self.base = self.pool.ctypes.data
        assert self.store.register_buffer(self.base, self.pool.nbytes) == 0

    def slot(self, index):
        return self.base + index * BLOCK_BYTES

    def prefill(self, tokens):
        keys = block_keys(tokens)
        hit = self.store.prefix_match(keys)
        if hit < 0:
            raise RuntimeError(f"prefix_match: {strata.error_name(hit)}")
        loaded = self.store.batch_get_into(keys[:hit], [self.slot(i) for i in range(hit)], [BLOCK_BYTES] * hit)
        # A block that failed to load (evicted meanwhile, checksum, I/O) is recomputed, and so is
        # everything after it.
        usable = next((i for i, code in enumerate(loaded) if code != BLOCK_BYTES), hit)
        for index in range(usable):
            assert np.array_equal(self.pool[index * BLOCK_BYTES : (index + 1) * BLOCK_BYTES], compute_kv(keys[index]))
        for index in range(usable, len(keys)):
            self.pool[index * BLOCK_BYTES : (index + 1) * BLOCK_BYTES] = compute_kv(keys[index])
        new = list(range(usable, len(keys)))
        stored = self.store.batch_put_from(
            [keys[i] for i in new],
            [self.slot(i) for i in new],
            [BLOCK_BYTES] * len(new),
            parents=[keys[i - 1] if i > 0 else None for i in new],
        )
        # Another engine may have stored the same block meanwhile: that is as good as storing it.
        failed = [code for code in stored if code not in (0, strata.OBJECT_ALREADY_EXISTS)]
        if failed:
            raise RuntimeError(f"batch_put_from: {[strata.error_name(code) for code in failed]}")
        return usable, len(keys)

    def close(self):
        self.store.unregister_buffer(self.base)
        self.store.close()


class Router:
    """Tracks which blocks the node holds from its events (as a cache-aware router does)."""

    def __init__(self, address):
        self.store = strata.StrataStore()
        assert self.store.setup(address) == 0
        self.events = self.store.subscribe_events()
        self.held = set()

    def catch_up(self, done, timeout_seconds=10):
        """Reads events until `done(held)` (or the timeout); returns the blocks held."""
        import time

        deadline = time.monotonic() + timeout_seconds
        while not done(self.held) and time.monotonic() < deadline:
            event = self.events.next(timeout_seconds=0.1)
            if event is None:
                continue
            if event["type"] == "BlockStored":
                self.held.update(event["keys"])
            elif event["type"] == "BlockRemoved":
                self.held.difference_update(event["keys"])
            elif event["type"] == "Lagged":
                raise RuntimeError("router lagged: resync")
        return self.held


def main(address):
    router = Router(address)
    engine = Engine(address)
    rng = np.random.default_rng(7)
    system_prompt = rng.integers(0, 32000, 5 * TOKENS_PER_BLOCK).tolist()
    first = system_prompt + rng.integers(0, 32000, 3 * TOKENS_PER_BLOCK).tolist()
    second = system_prompt + rng.integers(0, 32000, 4 * TOKENS_PER_BLOCK).tolist()
    loaded, total = engine.prefill(first)
    print(f"request 1: {loaded} of {total} blocks loaded, {total - loaded} computed")
    loaded_again, total_again = engine.prefill(first)
    print(f"request 1 again: {loaded_again} of {total_again} blocks loaded")
    shared, total_second = engine.prefill(second)
    print(f"request 2: {shared} of {total_second} blocks loaded (the shared system prompt)")
    distinct = set(block_keys(first)) | set(block_keys(second))
    held = router.catch_up(lambda held: held == distinct)
    print(f"router: the node holds {len(held)} blocks (from its events)")
    assert held == distinct, (len(held), len(distinct))

    # Request 1's first own block leaves (evicted, or removed as here): the two after it go with it.
    first_keys = block_keys(first)
    assert engine.store.remove(first_keys[5]) == 0
    gone = set(first_keys[5:])
    held = router.catch_up(lambda held: not (held & gone))
    print(f"after removing block 5 of request 1: the node holds {len(held)} blocks")
    assert held == distinct - gone, (len(held), len(distinct - gone))
    reloaded, _ = engine.prefill(first)
    print(f"request 1 once more: {reloaded} of {total} blocks loaded")
    engine.close()
    router.events.close()
    assert (loaded, loaded_again, shared, reloaded) == (0, total, 5, 5), (loaded, loaded_again, shared, reloaded)

    layers_read = layerwise_transfer(address)
    print(f"layer-wise: decode read {layers_read} layers, each before the next one was sent")
    print("ok")


def layerwise_transfer(address):
    """A prefill instance sends a block layer by layer as it computes them; a decode instance reads each
    layer as soon as it was sent (its transfer overlaps the prefill's compute)."""
    prefill, decode = strata.StrataStore(), strata.StrataStore()
    assert prefill.setup(address) == 0 and decode.setup(address) == 0
    key = block_keys(list(range(TOKENS_PER_BLOCK)), model="layerwise-demo")[0]
    kv = compute_kv(key)
    layer_buffer = np.zeros(LAYER_BYTES, dtype=np.uint8)
    assert decode.register_buffer(layer_buffer.ctypes.data, layer_buffer.nbytes) == 0
    put = prefill.put_progressive(key, [LAYER_BYTES] * LAYERS)
    for layer in range(LAYERS):
        part = kv[layer * LAYER_BYTES : (layer + 1) * LAYER_BYTES]
        assert put.send(part) == 0
        # The put's first bytes may still be on their way to the node: wait (up to 5 s) rather than retry.
        read = decode.get_range_into(key, layer * LAYER_BYTES, layer_buffer.ctypes.data, LAYER_BYTES, wait=5)
        assert read == LAYER_BYTES, strata.error_name(read)
        assert np.array_equal(layer_buffer, part)
        if layer < LAYERS - 1:
            assert decode.is_exist(key) == 0, "the block as a whole is stored once every layer is in"
    assert put.finish() == 0
    assert decode.is_exist(key) == 1
    decode.unregister_buffer(layer_buffer.ctypes.data)
    prefill.close()
    decode.close()
    return LAYERS


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7600")
