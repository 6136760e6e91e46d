"""The storage side of the Mooncake comparison: a MooncakeDistributedStore that mounts a 2 GiB segment and
stores the keys the client then reads (Mooncake's "two processes": this one holds the memory).

Run (after mooncake_master): python mooncake_holder.py VALUE_SIZE KEYS MASTER_PORT METADATA_PORT
"""

import sys
import time

import numpy as np
from mooncake.store import MooncakeDistributedStore


def main():
    size, keys, master_port, metadata_port = (int(arg) for arg in sys.argv[1:5])
    store = MooncakeDistributedStore()
    code = store.setup(
        "127.0.0.1", f"http://127.0.0.1:{metadata_port}/metadata", 2 << 30, 256 << 20, "tcp", "",
        f"127.0.0.1:{master_port}",
    )
    if code != 0:
        sys.exit(f"setup: {code}")
    value = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8).tobytes()
    for index in range(keys):
        code = store.put(f"mc-bench/{index}", value)
        if code != 0:
            sys.exit(f"put {index}: {code}")
    print("ready", flush=True)
    time.sleep(24 * 3600)


if __name__ == "__main__":
    main()
