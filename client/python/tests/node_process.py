"""A real strata-node process on loopback (the binary built by cargo), for the Python and engine tests."""

import os
import pathlib
import signal
import socket
import subprocess
import threading
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]


def node_binary():
    """The strata-node binary: $STRATA_NODE, else the newest of target/{release,debug}/strata-node."""
    explicit = os.environ.get("STRATA_NODE")
    if explicit:
        return explicit
    candidates = [REPO / "target" / profile / "strata-node" for profile in ("release", "debug")]
    built = [path for path in candidates if path.exists()]
    if not built:
        pytest.fail("no strata-node binary: run `cargo build --bin strata-node` or set STRATA_NODE")
    return str(max(built, key=lambda path: path.stat().st_mtime))


def free_port_pair():
    """A port p with p + 1 free too (a node with two shards listens on both)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port >= 65535:
            continue
        try:
            with socket.socket() as second:
                second.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    pytest.fail("no two consecutive free ports on loopback")


class Node:
    """A running strata-node: its address, its process and its data directory."""

    def __init__(self, tmp_path, cores=2, dram="64MiB", extra=(), port=None, nvme=True):
        """``port``: listen there (one attempt) instead of on a free pair of ports; ``nvme=False``: DRAM only."""
        self.data = tmp_path
        self.cores = cores
        self.dram = dram
        self.extra = list(extra)
        self.port = port
        self.tier = ["--nvme", f"file:{tmp_path}/ns0.img,size=256MiB", "--region-size", "1MiB"] if nvme else ["--dram-only"]
        self.process = None
        self.address = None
        self.start()

    def start(self):
        for _attempt in range(1 if self.port else 5):
            port = self.port or free_port_pair()
            command = [
                node_binary(),
                "--listen", f"127.0.0.1:{port}",
                "--cores", str(self.cores),
                "--dram", self.dram,
                *self.tier,
                "--metrics", "off",
                "--hugepages=false",
                *self.extra,
            ]
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            output = []
            deadline = time.monotonic() + 60
            for line in self.process.stdout:
                output.append(line)
                if "ready" in line or time.monotonic() > deadline:
                    break
            if any("ready" in line for line in output):
                self.address = f"127.0.0.1:{port}"
                # Keep draining what the node prints, so a full pipe can never stall it.
                threading.Thread(target=self.process.stdout.read, daemon=True).start()
                return
            self.process.kill()
            self.process.wait()
        pytest.fail("strata-node did not start:\n" + "".join(output))

    def pause(self):
        self.process.send_signal(signal.SIGSTOP)

    def resume(self):
        self.process.send_signal(signal.SIGCONT)

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
