"""Cluster mode from Python: Mooncake's positional ``setup`` with ``metadata_server`` naming etcd reaches two
nodes registered in a real etcd (Debian's etcd-server on loopback); ``ReplicateConfig.replica_num`` puts
on both, and a get survives one node's kill -9."""

import base64
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest
from node_process import Node

from strata import ReplicateConfig, StrataStore

ETCD = "/usr/bin/etcd"


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def etcd(tmp_path):
    if not os.path.exists(ETCD):
        pytest.fail(f"{ETCD} is missing: install Debian's etcd-server (scripts/test.sh does)")
    client, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [ETCD, "--name", "default", "--data-dir", str(tmp_path / "etcd"),
         "--listen-client-urls", client, "--advertise-client-urls", client,
         "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
         "--initial-cluster", f"default={peer}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    port = int(client.rsplit(":", 1)[1])
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    yield f"etcd://127.0.0.1:{port}"
    process.kill()
    process.wait()
    shutil.rmtree(tmp_path / "etcd", ignore_errors=True)


def wait_for_members(etcd_url, count):
    """Waits (10 s at most) until ``count`` nodes of cluster ``py`` are registered, through etcd's JSON
    gateway."""
    prefix = b"/strata/py/nodes/"
    body = json.dumps({
        "key": base64.b64encode(prefix).decode(),
        "range_end": base64.b64encode(prefix[:-1] + b"0").decode(),
        "count_only": True,
    }).encode()
    url = etcd_url.replace("etcd://", "http://") + "/v3/kv/range"
    deadline = time.monotonic() + 10
    while True:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=5) as answer:
            registered = int(json.load(answer).get("count", 0))
        if registered == count:
            return
        assert time.monotonic() < deadline, f"{registered} nodes registered, waited for {count}"
        time.sleep(0.05)


def cluster_node(tmp_path, etcd_url, node_id):
    return Node(tmp_path / node_id, cores=1, nvme=False, extra=[
        "--cluster", etcd_url, "--cluster-name", "py", "--node-id", node_id, "--lease-ttl", "2s"])


def test_mooncake_setup_with_etcd_replicates_and_fails_over(tmp_path, etcd):
    for node_id in ("a", "b"):
        (tmp_path / node_id).mkdir()
    nodes = [cluster_node(tmp_path, etcd, node_id) for node_id in ("a", "b")]
    try:
        wait_for_members(etcd, 2)
        store = StrataStore()
        # Mooncake's positional form; master_server_address empty: the members come from etcd.
        assert store.setup("localhost", etcd, 0, 0, "tcp", "", "", cluster_name="py") == 0
        values = {f"key-{index}": os.urandom(1000 + index) for index in range(50)}
        config = ReplicateConfig(replica_num=2)
        for key, value in values.items():
            assert store.put(key, value, config) == 0

        # Both nodes hold every key (a node's own store sees only its keys).
        direct = []
        for node in nodes:
            one = StrataStore()
            assert one.setup(node.address, single_node=True) == 0
            direct.append(one)
        for one in direct:
            assert one.batch_is_exist(list(values)) == [1] * len(values)

        # One replica by default (no config): exactly one node holds it.
        assert store.put("single", b"x" * 100) == 0
        assert sum(one.is_exist("single") for one in direct) == 1

        # Strata's form with one node's address: the store learns the cluster from the node (MEMBERS).
        learnt = StrataStore()
        assert learnt.setup(nodes[0].address) == 0
        assert learnt.put("learnt", b"y" * 200, ReplicateConfig(replica_num=2)) == 0
        assert [one.is_exist("learnt") for one in direct] == [1, 1]
        learnt.close()

        nodes[1].process.kill()
        nodes[1].process.wait()
        for key, value in values.items():
            assert store.get(key) == value, key
    finally:
        for node in nodes:
            node.stop()
