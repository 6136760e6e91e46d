"""Fixtures of the serving-engine tests: the Python suite's real node, and a ``mooncake`` package that is
nothing but an import alias of Strata, for running the engines' own Mooncake code unmodified.

These tests run in the engines' virtual environment (scripts/engines-venv.sh installs vLLM, SGLang and
LMCache at the versions pinned in client/python/engines.txt)."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

from node_process import Node  # noqa: E402  (the Python suite's node process)

MOONCAKE_ALIAS = "from strata import StrataStore as MooncakeDistributedStore, ReplicateConfig  # noqa: F401\n"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    started = Node(tmp_path_factory.mktemp("node"), dram="256MiB")
    yield started
    started.stop()


@pytest.fixture(scope="session")
def mooncake_alias(tmp_path_factory):
    """A directory holding ``mooncake/store.py`` = the import alias, to put first on PYTHONPATH."""
    root = tmp_path_factory.mktemp("alias")
    (root / "mooncake").mkdir()
    (root / "mooncake" / "__init__.py").write_text("")
    (root / "mooncake" / "store.py").write_text(MOONCAKE_ALIAS)
    return root
