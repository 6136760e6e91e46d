#!/usr/bin/env bash
# Every test of the workspace, after installing what the tests need. This is README.md's test command, and
# .ci/run calls it as it is.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the build and the tests use (protoc, etcd, fio, tshark).
scripts/debian-packages.sh

# The kernel guest for the interoperability tests (cached under /var/tmp after the first run).
tests/lab/kernel-nvmf prepare

# Unit, integration and doc tests.
cargo test --workspace
# RDMA verbs (feature rdma): device-free tests here, the rest in a soft-RoCE guest (this machine has no RDMA).
tests/lab/rdma-tests
# The allocator's property and edge-case tests again with its expensive invariant walk after every operation.
cargo test -p strata-alloc --features invariants --test allocator_edge_cases --test allocator_matches_reference_model

# The Python package: a wheel built by maturin, installed in a virtual environment under target/, and its
# pytest suite run against the strata-node binary built above.
python3 -m venv target/pyenv
target/pyenv/bin/pip install -q --disable-pip-version-check -r client/python/requirements-dev.txt
rm -rf target/wheels
target/pyenv/bin/maturin build -q --release -m client/python/Cargo.toml -o target/wheels
target/pyenv/bin/pip install -q --disable-pip-version-check --force-reinstall --no-deps target/wheels/strata-*.whl
cargo build -q --bin strata-node
STRATA_NODE="$PWD/target/debug/strata-node" target/pyenv/bin/python -m pytest -q client/python/tests

# A CI run builds once and never again: with STRATA_PRUNE_BUILD=1 (.ci/run sets it) the Rust build's
# intermediates (about 5 GB) go before the engines' venv, the largest thing on disk; the node binary stays.
if [[ ${STRATA_PRUNE_BUILD:-} == 1 ]]; then
    rm -rf target/debug/deps target/debug/build target/debug/examples target/debug/.fingerprint target/release \
        target/tmp
fi

# The serving engines (vLLM, SGLang, LMCache: client/python/engines.txt) in their own venv under target/,
# reused while their pins are unchanged, and the engine tests run against the same node binary.
scripts/engines-venv.sh
target/engines/bin/pip install -q --disable-pip-version-check --force-reinstall --no-deps target/wheels/strata-*.whl
STRATA_NODE="$PWD/target/debug/strata-node" target/engines/bin/python -m pytest -q -p no:cacheprovider \
    -W ignore::DeprecationWarning client/python/engine_tests
