#!/usr/bin/env python3
"""The KV events publisher's row: block events delivered to vLLM's own decoder, and the puts/s it costs.

A release node on one shard (CPU 1, DRAM only, as the serving rows) takes 64-byte puts in batches of 128 over two connections from
`strata-bench kv` (CPU 0) for RUNTIME seconds, alternately
  - with `--kv-events`, a pyzmq SUB socket decoding every batch with vLLM's `KVEventBatch` decoder and
    counting the block hashes (CPU 0), and
  - without a publisher,
ROUNDS times each, on fresh nodes. Prints one JSON object: events/s delivered, and puts/s with the
publisher over puts/s without, per round and their medians; and, as the row's ceiling, the events/s the
decoder alone gets through on CPU 0 over batches the publisher sent.

    cargo build --release --bin strata-node --bin strata-bench && scripts/engines-venv.sh
    [CONSUMER_NICE=19] target/engines/bin/python scripts/bench-kv-events.py [ROUNDS] [RUNTIME]
"""

import gc
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "client" / "python" / "tests"))

import msgspec  # noqa: E402
import zmq  # noqa: E402
from node_process import Node, free_port_pair  # noqa: E402
from vllm.distributed.kv_events import KVEventBatch  # noqa: E402

BENCH = str(REPO / "target" / "release" / "strata-bench")


def puts_per_second(address, runtime):
    command = ["taskset", "-c", "0", BENCH, "kv", "--server", address, "--op", "put", "--value-size", "64",
               "--batch", "128", "--connections", "2", "--keys", "2000000", "--runtime", str(runtime),
               "--output-format=json"]
    report = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    return report["ops_per_sec"]


def decoder_alone(payloads, seconds=2.0):
    """Block events/s vLLM's decoder gets through on this process's core with nothing else to do, over
    batches the publisher sent: the ceiling of the row's decoding side."""
    os.sched_setaffinity(0, {0})
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    blocks, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for payload in payloads:
            blocks += sum(len(getattr(event, "block_hashes", ())) for event in decoder.decode(payload).events)
    return blocks / (time.perf_counter() - started)


def count_events(endpoint, stop, counted):
    # CONSUMER_NICE=19 leaves CPU 0 to the put load first: the consumer (a router, elsewhere in a
    # deployment) then takes only what the load leaves, and the row shows what the publisher costs.
    os.nice(int(os.environ.get("CONSUMER_NICE", "0")))
    socket = zmq.Context.instance().socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.setsockopt(zmq.RCVHWM, 0)
    socket.connect(endpoint)
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    while not stop.is_set():
        if socket.poll(50):
            _, _, payload = socket.recv_multipart()
            counted["blocks"] += sum(len(getattr(event, "block_hashes", ())) for event in decoder.decode(payload).events)
            if len(counted["payloads"]) < 256:
                counted["payloads"].append(payload)
    socket.close(linger=0)


def one_run(scratch, runtime, publish):
    extra = ["--cpus", "1", "--busy-poll"]
    endpoint = None
    if publish:
        endpoint = f"tcp://127.0.0.1:{free_port_pair()}"
        extra += ["--kv-events", endpoint]
    node = Node(pathlib.Path(tempfile.mkdtemp(dir=scratch)), cores=1, dram="4GiB", extra=extra, nvme=False)
    stop, counted, counter = threading.Event(), {"blocks": 0, "payloads": []}, None
    try:
        if publish:
            counter = threading.Thread(target=count_events, args=(endpoint, stop, counted))
            counter.start()
            time.sleep(0.5)
        started = time.monotonic()
        puts = puts_per_second(node.address, runtime)
        elapsed = time.monotonic() - started
        time.sleep(0.5)  # the events of the last puts still in flight
    finally:
        stop.set()
        if counter:
            counter.join()
        node.stop()
    return puts, counted["blocks"] / elapsed, counted["payloads"]


def main():
    # As a vLLM process does once it has started (`freeze_gc_heap`): the objects of the imports (torch,
    # vLLM) leave the collector's generations, or each collection that decoding's allocations set off scans
    # them all, and the decoder gets through a tenth of the events.
    gc.freeze()
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    runtime = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    with tempfile.TemporaryDirectory() as scratch:
        rows, payloads = [], []
        for _ in range(rounds):
            with_publisher, events, payloads = one_run(scratch, runtime, publish=True)
            without, _, _ = one_run(scratch, runtime, publish=False)
            rows.append({"puts_with": with_publisher, "puts_without": without, "events_per_s": events})
    print(json.dumps({
        "events_per_s": statistics.median(row["events_per_s"] for row in rows),
        "puts_ratio": statistics.median(row["puts_with"] / row["puts_without"] for row in rows),
        "decoder_alone_events_per_s": decoder_alone(payloads),
        "rounds": rows,
    }, indent=1))


if __name__ == "__main__":
    main()
