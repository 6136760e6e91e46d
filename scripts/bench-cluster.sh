#!/usr/bin/env bash
# The cluster client's benchmark rows, each beside its reference in the same run: a real etcd (Debian's
# etcd-server) on loopback, strata-node processes registered in it and pinned to CPU 1, strata-bench kv
# pinned to CPU 0.
#   RUNTIME=5 REPS=3 DIR=target/bench-cluster scripts/bench-cluster.sh
# - overhead: 4 KiB gets through the cluster client (--cluster, placement over the members read from etcd)
#   against gets sent straight to the node (--server), alternated REPS times, on a cluster of one node so that
#   both reach the same node and the difference is the client's own work.
# - lookups: prefix matches of 1,000-key chains over a cluster of three nodes (one frame per node, sent to
#   all three before any reply is read), against the same chains on one node, through the cluster client
#   and straight. The three nodes share CPU 1 (this machine has two cores). SPIN=500us has the client
#   busy-poll each lookup's replies that long before sleeping (as vLLM's scheduler-side connector does).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${RUNTIME:-5}
REPS=${REPS:-3}
DIR=${DIR:-target/bench-cluster}
ETCD_PORT=${ETCD_PORT:-23790}
SPIN=${SPIN:-0}
lookup_spin=()
[ "$SPIN" != 0 ] && lookup_spin=(--spin "$SPIN")
cargo build --release -q --bin strata-node --bin strata-bench --bin strata-pool
BENCH=target/release/strata-bench
mkdir -p "$DIR"

source scripts/cluster-common.sh

field() { python3 -c "import json,sys; r=json.load(sys.stdin); print(eval('r' + sys.argv[1]))" "$1"; }
kv() { # strata-bench kv flags...: prints "p50_us keys_per_s", and fails on any error
  local json; json=$(taskset -c 0 "$BENCH" kv --metrics off --runtime "$RUNTIME" --output-format=json "$@")
  [ "$(echo "$json" | field "['errors'] + r['mismatches']")" = 0 ] || { echo "errors: $json" >&2; exit 1; }
  echo "$(echo "$json" | field "['lat_ns']['p50'] / 1000") $(echo "$json" | field "['ops_per_sec']")"
}
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

start_node a 7710 bench
taskset -c 0 "$BENCH" kv --server 127.0.0.1:7710 --metrics off --op put --keys 10000 --once --output-format=json \
  > /dev/null
direct=() cluster=()
for _ in $(seq "$REPS"); do
  direct+=("$(kv --server 127.0.0.1:7710 --no-preload --keys 10000 --verify | cut -d' ' -f1)")
  cluster+=("$(kv --cluster "$CLUSTER" --cluster-name bench --no-preload --keys 10000 --verify | cut -d' ' -f1)")
done
d=$(median "${direct[@]}") c=$(median "${cluster[@]}")
printf 'overhead: 4 KiB get p50  cluster %s us  direct %s us  ratio %.3f  (runs: cluster %s; direct %s)\n' \
  "$c" "$d" "$(echo "$c / $d" | bc -l)" "${cluster[*]}" "${direct[*]}"

one=$(kv --server 127.0.0.1:7710 --op prefix-match --batch 1000 --keys 10000 "${lookup_spin[@]}" | cut -d' ' -f1)
one_cluster=$(kv --cluster "$CLUSTER" --cluster-name bench --no-preload --op prefix-match --batch 1000 --keys 10000 \
  "${lookup_spin[@]}" | cut -d' ' -f1)
floor_one=$(kv --server 127.0.0.1:7710 --op prefix-match --batch 8 --keys 10000 "${lookup_spin[@]}" | cut -d' ' -f1)
start_node b 7720 bench
start_node c 7730 bench
taskset -c 0 "$BENCH" kv --cluster "$CLUSTER" --cluster-name bench --metrics off --op put --keys 10000 --once \
  --output-format=json > /dev/null
three=$(kv --cluster "$CLUSTER" --cluster-name bench --no-preload --op prefix-match --batch 1000 --keys 10000 \
  "${lookup_spin[@]}" | cut -d' ' -f1)
printf 'lookups: 1,000-key prefix match p50  3 nodes %s us  1 node through the cluster client %s us  1 node direct %s us\n' \
  "$three" "$one_cluster" "$one"
# The fan-out's own floor on this machine, same run: 8-key chains over the three nodes (a frame to each,
# nearly empty) against the same chains on node a alone (measured above, before b and c joined).
floor_three=$(kv --cluster "$CLUSTER" --cluster-name bench --no-preload --op prefix-match --batch 8 --keys 10000 \
  "${lookup_spin[@]}" | cut -d' ' -f1)
printf 'lookups floor: 8-key prefix match p50  3 nodes %s us  node a direct %s us\n' "$floor_three" "$floor_one"
