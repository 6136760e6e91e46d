"""Keys/s of StrataStore.batch_get_into into registered buffers, as a serving engine calls it.

Run: python batch_get_into.py --server 127.0.0.1:7600 --value-size 4096 --batch 32 --keys 20000 --runtime 10

Reads the keys `strata-bench kv` preloads (its key names and values), so the two clients can be run on the
same node side by side; prints one JSON line with the same field names as `strata-bench kv`.
"""

import argparse
import json
import random
import sys
import time

import numpy as np

import strata


def key(seed, index):
    return f"strata-bench/{seed}/{index}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", default="127.0.0.1:7600")
    parser.add_argument("--value-size", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--keys", type=int, default=20000)
    parser.add_argument("--runtime", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--spin-microseconds", type=int, default=0)
    args = parser.parse_args()

    store = strata.StrataStore()
    code = store.setup(args.server, spin_microseconds=args.spin_microseconds)
    if code != 0:
        sys.exit(f"setup: {strata.error_name(code)}")
    pool = np.zeros(args.batch * args.value_size, dtype=np.uint8)
    base = pool.ctypes.data
    assert store.register_buffer(base, pool.nbytes) == 0
    addresses = [base + slot * args.value_size for slot in range(args.batch)]
    sizes = [args.value_size] * args.batch
    names = [key(args.seed, index) for index in range(args.keys)]
    rng = random.Random(args.seed)
    # The batches are drawn before the clock starts: an engine has its block keys at hand, and this
    # measures the client, not Python's random module.
    batches = [[names[rng.randrange(args.keys)] for _ in range(args.batch)] for _ in range(1024)]
    latencies = []
    keys_done = errors = 0
    started = time.perf_counter()
    deadline = started + args.runtime
    # Bounded by time (and by count, for safety).
    for call in range(10**9):
        now = time.perf_counter()
        if now >= deadline:
            break
        batch = batches[call % len(batches)]
        results = store.batch_get_into(batch, addresses, sizes)
        latencies.append(time.perf_counter() - now)
        keys_done += len(batch)
        errors += sum(1 for result in results if result != args.value_size)
    elapsed = time.perf_counter() - started
    latencies.sort()
    report = {
        "client": "python",
        "op": "get",
        "value_size": args.value_size,
        "batch": args.batch,
        "ops_per_sec": keys_done / elapsed,
        "bytes_per_sec": (keys_done - errors) * args.value_size / elapsed,
        "calls_per_sec": len(latencies) / elapsed,
        "lat_ns": {
            "p50": int(latencies[len(latencies) // 2] * 1e9),
            "p99": int(latencies[int(len(latencies) * 0.99)] * 1e9),
        },
        "errors": errors,
        "keys_done": keys_done,
        "runtime_s": elapsed,
    }
    print(json.dumps(report))
    store.close()


if __name__ == "__main__":
    main()
