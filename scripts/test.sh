#!/usr/bin/env bash
# Every test of the workspace, after installing what the tests need. This is README.md's test command, and
# .ci/run calls it as it is.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests use as oracles or services. Each issue that adds such a test adds its package here
# (tshark and QEMU for NVMe/TCP interoperability and etcd for the cluster will come).
#   fio: the oracle of strata-bench's JSON contract (tools/tests/json_matches_fio_field_names.rs).
debian_packages=(fio)

missing=()
for package in "${debian_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
    echo "installing Debian packages the tests need: ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi

# Unit, integration and doc tests.
cargo test --workspace
# The allocator's property and edge-case tests again with its expensive invariant walk after every operation.
cargo test -p strata-alloc --features invariants --test allocator_edge_cases --test allocator_matches_reference_model
