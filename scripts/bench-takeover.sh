#!/usr/bin/env bash
# The cluster's takeover row: two strata-node processes (pinned to CPU 1) whose NVMe tiers are file-backed
# namespaces of one `strata-pool target` (CPU 0), registered in a real etcd on loopback, hold GIB GiB of
# durable 64 KiB values with one replica; node b is killed with kill -9. Reported, from
# `strata-pool cluster status` polled every 50 ms: when b's lease expired (its entry left the members) and
# when its tier was released (node a claimed it, fenced b, recovered its region log and moved every key to
# its owner), with a's own timings of the recovery and the whole takeover, and the recovery's seconds per
# GiB of log. Then every key is read back through the cluster client, every byte checked: failed gets must
# be 0. Target: expiry to release <= 2 x TTL plus the recovery. Beside it, the same run's ceiling of the
# move, which reads every key from b's tier and writes it durably to a's, both through the one target: the
# read-back's rate (the gets above, from a's tier) and the rate of as many fresh durable 64 KiB puts as
# keys moved, from a client on CPU 0 straight into node a; a copy of each byte at those two rates in turn
# is the bound.
#   GIB=1 TTL=2 DIR=target/bench-takeover scripts/bench-takeover.sh
set -euo pipefail
cd "$(dirname "$0")/.."
GIB=${GIB:-1}
TTL=${TTL:-2}
DIR=${DIR:-target/bench-takeover}
ETCD_PORT=${ETCD_PORT:-23990}
TARGET_PORT=${TARGET_PORT:-24420}
NQN=nqn.2026-12.io.strata:bench-takeover
KEYS=$((GIB * 16384))
cargo build --release -q --bin strata-node --bin strata-bench --bin strata-pool
BENCH=target/release/strata-bench
mkdir -p "$DIR"
rm -f "$DIR"/ns*.img

source scripts/cluster-common.sh

size=$((GIB * 2 + 1))GiB
taskset -c 0 target/release/strata-pool target --listen "127.0.0.1:$TARGET_PORT" --subsystem "$NQN" \
  --namespace "file:$DIR/ns1.img,size=$size" --namespace "file:$DIR/ns2.img,size=$size" > "$DIR/target.log" 2>&1 &
pids+=($!)
sleep 1
namespace() { echo "nvmf:trtype=tcp,traddr=127.0.0.1,trsvcid=$TARGET_PORT,subnqn=$NQN,ns=$1"; }
NODE_TIER="--dram 64MiB --write-policy durable"
start_node a 7910 takeover --nvme "$(namespace 1)" --lease-ttl "${TTL}s" --max-replicas 1 --repair-rate 4GiB
start_node b 7920 takeover --nvme "$(namespace 2)" --lease-ttl "${TTL}s" --max-replicas 1 --repair-rate 4GiB
sleep 1
taskset -c 0 "$BENCH" kv --cluster "$CLUSTER" --cluster-name takeover --metrics off --op put --keys "$KEYS" \
  --value-size 64k --batch 8 --connections 4 --once --runtime 600 --output-format=json > "$DIR/preload.json"

kill -9 "${node_pid[b]}"
# Poll the cluster's status: when b left the members (its lease expired), when its tier was released.
python3 - "$CLUSTER" "$DIR/times.json" <<'PY'
import json, subprocess, sys, time
killed = time.time()
command = ["target/release/strata-pool", "cluster", "status", "--cluster", sys.argv[1], "--cluster-name", "takeover",
           "--output-format=json"]
expired = released = None
while time.time() - killed < 120 and released is None:
    status = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    now = time.time() - killed
    if expired is None and all(member["id"] != "b" for member in status["members"]):
        expired = now
    tier = next(tier for tier in status["tiers"] if tier["node"] == "b")
    if tier["state"] == "released":
        released = now
    time.sleep(0.05)
json.dump({"expired_s": expired, "released_s": released}, open(sys.argv[2], "w"))
PY
taskset -c 0 "$BENCH" kv --cluster "$CLUSTER" --cluster-name takeover --metrics off --op get --no-preload \
  --keys "$KEYS" --value-size 64k --batch 8 --verify --once --runtime 600 --output-format=json > "$DIR/check.json"

moved=$(grep -o "moved=[0-9]*" "$DIR/node-a.log" | tail -1 | cut -d= -f2)
taskset -c 0 "$BENCH" kv --server 127.0.0.1:7910 --metrics off --op put --keys "$moved" --seed 2 \
  --write-policy durable --value-size 64k --batch 8 --connections 4 --once --runtime 600 --output-format=json \
  > "$DIR/ceiling.json"

python3 - "$DIR" "$TTL" "$GIB" <<'PY'
import json, re, sys
directory, ttl, gib = sys.argv[1], float(sys.argv[2]), sys.argv[3]
times = json.load(open(f"{directory}/times.json"))
check = json.load(open(f"{directory}/check.json"))
line = next(l for l in open(f"{directory}/node-a.log") if "takeover: the tier's keys moved" in l)
field = lambda name: int(re.search(rf"{name}=(\d+)", line).group(1))
recovery_s, total_s, log_gib = field("recovery_ms") / 1e3, field("total_ms") / 1e3, field("log_bytes") / 2**30
took = times["released_s"] - times["expired_s"]
failed = check["errors"] + check["mismatches"]
print(f"takeover: {gib} GiB of durable 64 KiB values over 2 nodes, R=1, kill -9 of b (lease TTL {ttl:.0f} s): "
      f"lease expired {times['expired_s']:.2f} s after the kill; tier released {took:.2f} s after that "
      f"(target <= 2 x TTL + recovery = {2 * ttl + recovery_s:.2f} s); claim to release {total_s:.2f} s: "
      f"{field('records')} records recovered from {log_gib:.2f} GiB of log in {recovery_s:.2f} s "
      f"({recovery_s / max(log_gib, 1e-9):.2f} s/GiB), {field('moved')} keys moved; "
      f"then {check['keys_done']} gets: {failed} failed")
ceiling = json.load(open(f"{directory}/ceiling.json"))
moved_bytes = field("moved") * 65536
move_s = total_s - recovery_s
write_rate = ceiling["keys_done"] * 65536 / ceiling["runtime_s"] / 1e6
read_rate = check["keys_done"] * 65536 / check["runtime_s"] / 1e6
bound = 1 / (1 / write_rate + 1 / read_rate)
move_rate = moved_bytes / move_s / 1e6
print(f"move: {moved_bytes / 1e6:.0f} MB in {move_s:.2f} s = {move_rate:.0f} MB/s; same run, through the same target: "
      f"gets {read_rate:.0f} MB/s, durable puts into a {write_rate:.0f} MB/s, so a copy at most {bound:.0f} MB/s; "
      f"ratio {move_rate / bound:.2f}; the move at that bound would take {moved_bytes / 1e6 / bound:.2f} s")
PY
