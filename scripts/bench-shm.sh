#!/usr/bin/env bash
# The shared-memory path beside TCP and memcpy, in the same run: strata-node (DRAM only) pinned to CPU 1,
# strata-bench pinned to CPU 0. Rows alternate the transports REPS times; the table shows medians.
#   RUNTIME=5 REPS=3 DIR=target/bench-shm NODE_POLL=0 SPIN=0 scripts/bench-shm.sh
# NODE_POLL=1 runs the node with --busy-poll (its TCP and Unix sockets polled), SPIN=200us has the client
# busy-poll each reply that long: both transports alike.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${RUNTIME:-5}
REPS=${REPS:-3}
DIR=${DIR:-target/bench-shm}
PORT=${PORT:-7660}
METRICS=${METRICS:-127.0.0.1:9660}
NODE_POLL=${NODE_POLL:-0}
SPIN=${SPIN:-0}
poll=()
[ "$NODE_POLL" = 1 ] && poll=(--busy-poll)
spin=()
[ "$SPIN" != 0 ] && spin=(--spin "$SPIN")
cargo build --release -q --bin strata-node --bin strata-bench
BENCH=target/release/strata-bench
mkdir -p "$DIR"
taskset -c 1 target/release/strata-node --listen "127.0.0.1:$PORT" --cores 1 --cpus 1 --dram 2GiB --dram-only \
  --metrics "$METRICS" "${poll[@]}" > "$DIR/node.log" 2>&1 &
node_pid=$!
trap 'kill -INT $node_pid 2>/dev/null || true; wait $node_pid 2>/dev/null || true' EXIT
for _ in $(seq 600); do grep -q ready "$DIR/node.log" 2>/dev/null && break; sleep 0.1; done
grep -q ready "$DIR/node.log" || { cat "$DIR/node.log" >&2; echo "node did not start" >&2; exit 1; }

field() { python3 -c "import json,sys; r=json.load(sys.stdin); print(eval('r' + sys.argv[1]))" "$1"; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
kv() { # transport flags... (RUNTIME from the environment)
  local transport=$1; shift
  taskset -c 0 "$BENCH" kv --server "127.0.0.1:$PORT" --metrics "$METRICS" --runtime "${RUNTIME}" \
    --output-format=json --transport "$transport" "${spin[@]}" "$@"
}

# Preload once over TCP (each row reads what the preload wrote; --verify checks every byte). Keys derive
# from the index and the seed: the two working sets have seeds of their own.
kv tcp --op put --value-size 4m --keys 64 --once > /dev/null
kv tcp --op put --value-size 4k --keys 20000 --once --batch 32 --seed 2 > /dev/null

compare() { # name flags...
  local name=$1; shift
  local tcp=() shm=() tcp_p50=() shm_p50=()
  # Every byte checked by the bench in a short run of each transport first; the timed runs then leave the
  # check to the client's crc32c (the bench's own pass over each value would count in keys/s).
  for transport in tcp shm; do
    local json; json=$(RUNTIME=1 kv "$transport" --no-preload --verify "$@")
    [ "$(echo "$json" | field "['errors'] + r['mismatches']")" = 0 ] || { echo "$name: errors: $json" >&2; exit 1; }
  done
  for _ in $(seq "$REPS"); do
    for transport in tcp shm; do
      local json; json=$(kv "$transport" --no-preload "$@")
      [ "$(echo "$json" | field "['errors']")" = 0 ] || { echo "$name: errors: $json" >&2; exit 1; }
      if [ "$transport" = tcp ]; then
        tcp+=("$(echo "$json" | field "['ops_per_sec']")"); tcp_p50+=("$(echo "$json" | field "['lat_ns']['p50']")")
      else
        shm+=("$(echo "$json" | field "['ops_per_sec']")"); shm_p50+=("$(echo "$json" | field "['lat_ns']['p50']")")
      fi
    done
  done
  local t s; t=$(printf '%s\n' "${tcp[@]}" | median); s=$(printf '%s\n' "${shm[@]}" | median)
  printf '%-34s shm %10.0f keys/s (p50 %7.1f us)  tcp %10.0f keys/s (p50 %7.1f us)  shm/tcp %.2f\n' "$name" "$s" \
    "$(printf '%s\n' "${shm_p50[@]}" | median | awk '{print $1/1000}')" "$t" \
    "$(printf '%s\n' "${tcp_p50[@]}" | median | awk '{print $1/1000}')" "$(echo "$s $t" | awk '{print $1/$2}')"
  echo "$s" > "$DIR/last-shm"
}

compare "get 4 MiB, 1 key per call" --op get --value-size 4m --keys 64
shm_4m=$(cat "$DIR/last-shm")
# memcpy of 4 MiB: from one source (in cache) and from 64 in turn (the get row's working set, from memory).
for sources in 1 64; do
  copies=()
  for _ in $(seq "$REPS"); do
    copies+=("$(taskset -c 0 "$BENCH" memcpy --size 4m --sources "$sources" --runtime "$RUNTIME" | field "['copies_per_sec']")")
  done
  memcpy=$(printf '%s\n' "${copies[@]}" | median)
  printf '%-34s %10.0f copies/s; shm get / memcpy %.2f\n' "memcpy 4 MiB, one thread, $sources src" "$memcpy" \
    "$(echo "$shm_4m $memcpy" | awk '{print $1/$2}')"
done
compare "get 4 KiB, 32 keys per call" --op get --value-size 4k --keys 20000 --batch 32 --seed 2
compare "put 4 MiB, 1 key per call" --op put --value-size 4m --keys 64
