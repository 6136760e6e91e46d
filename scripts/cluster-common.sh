# Sourced by the cluster benchmarks: a real etcd (Debian's etcd-server) on loopback and strata-node
# processes registered in it, pinned to CPU 1, all stopped when the script exits. Needs DIR and ETCD_PORT;
# NODE_TIER sets the nodes' tiers (default: 1 GiB of DRAM only); sets CLUSTER and node_pid[ID].
pids=()
stop_all() {
  # Last started first: nodes stop before the etcd and NVMe-oF target they use (a node flushing to a
  # target that is gone waits out its controller-loss timeout). SIGTERM: a background job of a
  # non-interactive shell ignores SIGINT.
  local at
  for ((at = ${#pids[@]} - 1; at >= 0; at--)); do
    kill -TERM "${pids[at]}" 2>/dev/null || true
    wait "${pids[at]}" 2>/dev/null || true
  done
  pids=()
}
trap stop_all EXIT

rm -rf "$DIR/etcd"
etcd --name bench --data-dir "$DIR/etcd" --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
  --initial-cluster "bench=http://127.0.0.1:$((ETCD_PORT + 1))" > "$DIR/etcd.log" 2>&1 &
pids+=($!)
CLUSTER="etcd://127.0.0.1:$ETCD_PORT"

declare -A node_pid
start_node() { # id port cluster-name [strata-node flags...]: returns once the node serves in the cluster
  local id=$1 port=$2 name=$3
  shift 3
  # shellcheck disable=SC2086 # NODE_TIER is a list of flags
  taskset -c 1 target/release/strata-node --listen "127.0.0.1:$port" --cores 1 --cpus 1 --metrics off \
    ${NODE_TIER:---dram 1GiB --dram-only} --cluster "$CLUSTER" --cluster-name "$name" --node-id "$id" "$@" > "$DIR/node-$id.log" 2>&1 &
  pids+=($!)
  node_pid[$id]=$!
  # Serving, not only registered: a node joins first and serves once recovered, and a client places keys
  # on serving nodes only (keys put while a node still joins land elsewhere, and read as misses after).
  for _ in $(seq 600); do
    target/release/strata-pool cluster status --cluster "$CLUSTER" --cluster-name "$name" --output-format=json \
      2>/dev/null | python3 -c "import json, sys; members = json.load(sys.stdin)['members']
sys.exit(0 if any(m['id'] == '$id' and m['state'] == 'serving' for m in members) else 1)" 2>/dev/null && return
    sleep 0.1
  done
  cat "$DIR/node-$id.log" >&2; echo "node $id does not serve" >&2; exit 1
}
