#!/usr/bin/env bash
# The Debian packages the build and the tests need, installed when missing. scripts/test.sh runs it first,
# and .ci/run before its lints (the build needs protoc). Each issue that adds such a package adds it here.
#   protobuf-compiler: protoc, which etcd-client's build script runs on etcd's .proto files.
#   etcd-server: the real etcd the cluster tests start (tools/tests/nodes_register_in_etcd.rs).
#   fio: the oracle of strata-bench's JSON contract (tools/tests/json_matches_fio_field_names.rs).
#   tshark: the independent NVMe/TCP decoder (nvme/tests/tshark_decodes_every_pdu_we_send.rs).
#   iproute2: `ip`, which builds the network namespaces of the partition test
#     (tools/tests/cluster_takes_over_a_cut_off_nodes_tier.rs).
#   libibverbs-dev, librdmacm-dev, libclang-dev: feature `rdma` (rdma-sys runs bindgen over the system's
#     verbs headers and links its rdma-core); the guest that runs those tests takes Debian's rdma-core too
#     (tests/lab/rdma-guest).
# The Linux kernel NVMe/TCP guest (QEMU, busybox, nvme-cli, Debian's kernel) is installed and built by
# tests/lab/kernel-nvmf prepare, from scripts/test.sh.
set -euo pipefail

debian_packages=(protobuf-compiler etcd-server fio tshark iproute2 libibverbs-dev librdmacm-dev libclang-dev)

# tshark asks whether non-root users may capture; answer before installing, so apt never waits.
echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections 2>/dev/null || true
missing=()
for package in "${debian_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
    echo "installing Debian packages the build and the tests need: ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi
