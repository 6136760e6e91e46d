#!/usr/bin/env bash
# The cluster's failover row: three strata-node processes (pinned to CPU 1) registered in a real etcd on
# loopback hold 4 KiB values with two replicas; strata-bench kv (pinned to CPU 0) reads them through the
# cluster client, every byte checked, in 100 ms intervals (--log-avg-msec), while one node is killed with
# kill -9 in the middle of the run. Reported: failed gets (target 0), p99 before the kill (the median of the
# intervals' p99 from 0.5 s to the kill), when after the kill the intervals' p99 is back under twice that
# (target <= 1 s), and when the last interval above it ends. The dead node's lease (5 s) expires within the
# run, and the survivors then re-create its replicas (--replicas 2) while the gets go on.
#   RUNTIME=12 KILL_AT=3 DIR=target/bench-failover scripts/bench-failover.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${RUNTIME:-12}
KILL_AT=${KILL_AT:-3}
DIR=${DIR:-target/bench-failover}
ETCD_PORT=${ETCD_PORT:-23890}
cargo build --release -q --bin strata-node --bin strata-bench --bin strata-pool
BENCH=target/release/strata-bench
mkdir -p "$DIR"

source scripts/cluster-common.sh

start_node a 7810 failover --replicas 2
start_node b 7820 failover --replicas 2
start_node c 7830 failover --replicas 2
sleep 2
taskset -c 0 "$BENCH" kv --cluster "$CLUSTER" --cluster-name failover --replicas 2 --metrics off --op put \
  --keys 20000 --once --output-format=json > "$DIR/preload.json"

launched=$(date +%s.%N)
taskset -c 0 "$BENCH" kv --cluster "$CLUSTER" --cluster-name failover --metrics off --no-preload --keys 20000 \
  --verify --runtime "$RUNTIME" --log-avg-msec 100 --output-format=json > "$DIR/run.json" &
bench=$!
sleep "$KILL_AT"
killed=$(date +%s.%N)
kill -9 "${node_pid[c]}"
wait "$bench"

python3 - "$DIR/run.json" "$(echo "$killed - $launched" | bc -l)" <<'PY'
import json, statistics, sys
report = json.load(open(sys.argv[1]))
kill_ms = float(sys.argv[2]) * 1000
intervals = report["intervals"]
before = [i["p99_ns"] for i in intervals if 500 <= i["start_ms"] and i["start_ms"] + 100 <= kill_ms and i["calls"]]
p99_before = statistics.median(before)
after = [i for i in intervals if i["start_ms"] + 100 > kill_ms]
slow = [i for i in after if i["p99_ns"] > 2 * p99_before or not i["calls"]]
first_back = next((i["start_ms"] - kill_ms for i in after if i not in slow and i["start_ms"] >= kill_ms), None)
last_slow = max((i["start_ms"] + 100 - kill_ms for i in slow), default=0)
errors = report["errors"] + report["mismatches"]
print(f"failover: 4 KiB gets, R=2, kill -9 of 1 of 3 nodes at {kill_ms / 1000:.2f} s of {report['runtime_s']:.0f} s: "
      f"failed gets {errors}  p99 before {p99_before / 1000:.0f} us  back under 2x {max(first_back or 0, 0):.0f} ms "
      f"after the kill  last interval above 2x ends {last_slow:.0f} ms after it  "
      f"({len(slow)} of {len(after)} intervals after the kill above 2x; worst p99 "
      f"{max(i['p99_ns'] for i in after) / 1000:.0f} us; {report['ops_per_sec']:.0f} gets/s)")
print("  above 2x (ms after the kill: p99 us):",
      ", ".join(f"{i['start_ms'] - kill_ms:.0f}: {i['p99_ns'] / 1000:.0f}" for i in slow))
PY
