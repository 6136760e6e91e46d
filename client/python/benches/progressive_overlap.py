"""How much of a block's transfer a progressive put hides behind the prefill's compute.

Run: python progressive_overlap.py --server 127.0.0.1:7600 --layers 32 --layer-size 65536 --compute-us 500

A prefill thread computes a block layer by layer (a sleep of --compute-us per layer stands in for the
attention layers) and a decode thread loads it into a registered buffer. Two ways, alternating, --blocks
times each:
- whole: the prefill stores the block once every layer is computed (`put`), then the decode reads it
  (`get_into`);
- progressive: the prefill sends each layer as it is computed (`put_progressive`), and the decode reads each
  layer (`get_range_into`) as soon as it is there.
Reported per way: the exposed latency, from the end of the last layer's compute to the decode holding the
whole block (medians and p90, microseconds), and the same from the start of the prefill. One JSON line.
"""

import argparse
import json
import threading
import time
import uuid

import numpy as np

import strata


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def compute(layer_us):
    # A sleep overshoots by the timer slack; spinning the last stretch keeps each layer's "compute" close to
    # its nominal time, the same for both ways.
    deadline = time.perf_counter() + layer_us / 1e6
    if layer_us > 200:
        time.sleep((layer_us - 150) / 1e6)
    while time.perf_counter() < deadline:
        pass


def one_block(prefill, decode, layers, layer_size, layer_us, progressive, pool_address):
    key = f"overlap/{uuid.uuid4().hex}"
    kv = np.random.default_rng(len(key)).integers(0, 256, layers * layer_size, dtype=np.uint8)
    computed = {}
    stored = threading.Event()
    failures = []

    def prefill_side():
        computed["start"] = time.perf_counter()
        if progressive:
            put = prefill.put_progressive(key, [layer_size] * layers)
            for layer in range(layers):
                compute(layer_us)
                if put.send(kv[layer * layer_size : (layer + 1) * layer_size]) != 0:
                    failures.append("send")
            computed["end"] = time.perf_counter()
            if put.finish() != 0:
                failures.append("finish")
        else:
            for _ in range(layers):
                compute(layer_us)
            computed["end"] = time.perf_counter()
            if prefill.put(key, kv) != 0:
                failures.append("put")
            stored.set()

    def decode_side():
        if progressive:
            for layer in range(layers):
                # The put's item header may not have reached the node yet: the node waits for it (5 s).
                at = pool_address + layer * layer_size
                read = decode.get_range_into(key, layer * layer_size, at, layer_size, wait=5)
                if read != layer_size:
                    failures.append(f"layer {layer}: {strata.error_name(read)}")
        else:
            stored.wait()
            if decode.get_into(key, pool_address, layers * layer_size) != layers * layer_size:
                failures.append("get_into")
        computed["loaded"] = time.perf_counter()

    threads = [threading.Thread(target=prefill_side), threading.Thread(target=decode_side)]
    if progressive:
        # The decode asks for layer 0 once the put is under way (it learns of the block from the scheduler).
        threads[0].start()
        while "start" not in computed:
            time.sleep(0)
        time.sleep(layer_us / 2e6)
        threads[1].start()
    else:
        for thread in threads:
            thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise SystemExit(f"{'progressive' if progressive else 'whole'}: {failures}")
    return (computed["loaded"] - computed["end"]) * 1e6, (computed["loaded"] - computed["start"]) * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", default="127.0.0.1:7600")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--layer-size", type=int, default=64 << 10)
    parser.add_argument("--compute-us", type=float, default=500.0)
    parser.add_argument("--blocks", type=int, default=20)
    args = parser.parse_args()
    prefill, decode = strata.StrataStore(), strata.StrataStore()
    assert prefill.setup(args.server) == 0 and decode.setup(args.server) == 0
    pool = np.zeros(args.layers * args.layer_size, dtype=np.uint8)
    assert decode.register_buffer(pool.ctypes.data, pool.nbytes) == 0
    results = {"whole": [], "progressive": []}
    for _ in range(args.blocks):
        for way in ("whole", "progressive"):
            results[way].append(
                one_block(
                    prefill, decode, args.layers, args.layer_size, args.compute_us, way == "progressive", pool.ctypes.data
                )
            )
    report = {"layers": args.layers, "layer_size": args.layer_size, "compute_us": args.compute_us}
    for way, samples in results.items():
        exposed = [sample[0] for sample in samples]
        total = [sample[1] for sample in samples]
        report[way] = {
            "exposed_us_p50": percentile(exposed, 0.5),
            "exposed_us_p90": percentile(exposed, 0.9),
            "total_us_p50": percentile(total, 0.5),
        }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
