#!/usr/bin/env bash
# Streamed against whole GET replies, in the same run: NVMe-tier gets in batches (one connection × 32 by
# default) from a busy-polled node on CPU 1 (64 MiB of DRAM, a file tier, no promotion), strata-bench on
# CPU 0 alternating `--no-streamed-replies` and the default. Prints each run and the medians.
#   SIZE=64k KEYS=16384 SHAPES="1x32" RUNTIME=4 REPS=5 DIR=target/bench-streamed scripts/bench-streamed.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${SIZE:-64k}
KEYS=${KEYS:-16384}
SHAPES=${SHAPES:-1x32}
RUNTIME=${RUNTIME:-4}
REPS=${REPS:-5}
DIR=${DIR:-target/bench-streamed}
PORT=${PORT:-7680}
METRICS=${METRICS:-127.0.0.1:9680}
cargo build --release -q --bin strata-node --bin strata-bench
mkdir -p "$DIR"
rm -f "$DIR/ns0.img"
taskset -c 1 target/release/strata-node --listen "127.0.0.1:$PORT" --cores 1 --cpus 1 --metrics "$METRICS" \
  --nvme "file:$DIR/ns0.img,size=8GiB" --busy-poll --dram 64MiB --write-policy write-through \
  --promote-window 0s > "$DIR/node.log" 2>&1 &
node_pid=$!
trap 'kill -INT $node_pid 2>/dev/null || true; wait $node_pid 2>/dev/null || true' EXIT
for _ in $(seq 600); do grep -q ready "$DIR/node.log" 2>/dev/null && break; sleep 0.1; done
grep -q ready "$DIR/node.log" || { cat "$DIR/node.log" >&2; echo "node did not start" >&2; exit 1; }

kv() { taskset -c 0 target/release/strata-bench kv --server "127.0.0.1:$PORT" --metrics "$METRICS" \
  --output-format=json --value-size "$SIZE" --keys "$KEYS" --no-preload "$@"; }
field() { python3 -c "import json,sys; r=json.load(sys.stdin); print(eval('r' + sys.argv[1]))" "$1"; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

kv --op put --batch 32 --connections 2 --once --runtime 600 > /dev/null
for shape in $SHAPES; do
  connections=${shape%x*} batch=${shape#*x}
  declare -A rate=() p50=()
  for _ in $(seq "$REPS"); do
    for mode in whole streamed; do
      extra=()
      [ "$mode" = whole ] && extra=(--no-streamed-replies)
      json=$(kv --op get --connections "$connections" --batch "$batch" --runtime "$RUNTIME" "${extra[@]}")
      [ "$(echo "$json" | field "['errors'] + r['mismatches']")" = 0 ] || { echo "errors: $json" >&2; exit 1; }
      r=$(echo "$json" | field "['ops_per_sec']"); l=$(echo "$json" | field "['lat_ns']['p50']")
      printf '%s %s %s: %.0f gets/s, p50 %.0f us\n' "$SIZE" "$shape" "$mode" "$r" "$(echo "$l" | awk '{print $1/1000}')"
      rate[$mode]+="$r "; p50[$mode]+="$l "
    done
  done
  s=$(printf '%s\n' ${rate[streamed]} | median); w=$(printf '%s\n' ${rate[whole]} | median)
  printf '== %s %s: streamed %.0f gets/s (p50 %.0f us), whole %.0f gets/s (p50 %.0f us): %.3f x\n' "$SIZE" \
    "$shape" "$s" "$(printf '%s\n' ${p50[streamed]} | median | awk '{print $1/1000}')" "$w" \
    "$(printf '%s\n' ${p50[whole]} | median | awk '{print $1/1000}')" "$(echo "$s $w" | awk '{print $1/$2}')"
done
