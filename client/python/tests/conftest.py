"""Fixtures: a real strata-node process on loopback (``node_process.Node``), one per test module."""

import pytest
from node_process import Node


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    started = Node(tmp_path_factory.mktemp("node"))
    yield started
    started.stop()


@pytest.fixture
def store(node):
    from strata import StrataStore

    opened = StrataStore()
    assert opened.setup(node.address) == 0
    yield opened
    opened.close()
