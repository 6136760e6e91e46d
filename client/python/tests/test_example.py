"""The serving-engine example runs against a real node and checks its own results."""

import pathlib
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "serving_engine.py"


def test_the_serving_engine_example_loads_what_it_stored(tmp_path):
    from node_process import Node

    fresh = Node(tmp_path, cores=2, dram="32MiB")
    try:
        run = subprocess.run([sys.executable, str(EXAMPLE), fresh.address], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "request 2: 5 of 9 blocks loaded" in run.stdout
        assert "request 1 once more: 5 of 8 blocks loaded" in run.stdout
        assert "layer-wise: decode read 4 layers" in run.stdout
        assert run.stdout.strip().endswith("ok")
    finally:
        fresh.stop()
