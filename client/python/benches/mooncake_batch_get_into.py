"""The client side of the Mooncake comparison: Mooncake's Python batch_get_into of 32 keys into a registered
buffer, timed like benches/batch_get_into.py times Strata's (batches drawn before the clock starts).

Run: python mooncake_batch_get_into.py VALUE_SIZE KEYS BATCH RUNTIME MASTER_PORT METADATA_PORT
"""

import json
import random
import sys
import time

import numpy as np
from mooncake.store import MooncakeDistributedStore


def main():
    size, keys, batch = (int(arg) for arg in sys.argv[1:4])
    runtime = float(sys.argv[4])
    master_port, metadata_port = int(sys.argv[5]), int(sys.argv[6])
    store = MooncakeDistributedStore()
    code = store.setup(
        "127.0.0.1", f"http://127.0.0.1:{metadata_port}/metadata", 0, 256 << 20, "tcp", "",
        f"127.0.0.1:{master_port}",
    )
    if code != 0:
        sys.exit(f"setup: {code}")
    pool = np.zeros(batch * size, dtype=np.uint8)
    if store.register_buffer(pool.ctypes.data, pool.nbytes) != 0:
        sys.exit("register_buffer failed")
    addresses = [pool.ctypes.data + slot * size for slot in range(batch)]
    rng = random.Random(1)
    batches = [[f"mc-bench/{rng.randrange(keys)}" for _ in range(batch)] for _ in range(256)]
    done = errors = calls = 0
    started = time.perf_counter()
    deadline = started + runtime
    # Bounded by time (and by count, for safety).
    for call in range(10**9):
        if time.perf_counter() >= deadline:
            break
        results = store.batch_get_into(batches[call % len(batches)], addresses, [size] * batch)
        calls += 1
        done += batch
        errors += sum(1 for result in results if result != size)
    elapsed = time.perf_counter() - started
    print(json.dumps({"client": "mooncake", "ops_per_sec": done / elapsed, "errors": errors, "calls": calls}))


if __name__ == "__main__":
    main()
