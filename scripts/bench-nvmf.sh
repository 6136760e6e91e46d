#!/usr/bin/env bash
# Strata's NVMe-oF/TCP host against Strata's target on loopback, each pinned to one core (target: CPU 1,
# strata-bench: CPU 0), for the rows of the NVMe-oF issue; then the file-namespace rows against
# strata-bench --ioengine=uring (and ring) on the same file locally, run on the target's CPU so that both
# sides reach the disk from the same place. Every row runs REPS times; the table shows the median, and the
# target's CPU time per I/O (from /proc, user + system) and the time the hypervisor stole from the VM.
#   RUNTIME=5 REPS=3 MODES="reactor poll" FILE_ROWS=1 FILE_MODES="reactor poll" CONGESTION=reno scripts/bench-nvmf.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${RUNTIME:-5}
REPS=${REPS:-3}
MODES=${MODES:-"reactor poll"}
FILE_ROWS=${FILE_ROWS:-1}
FILE_MODES=${FILE_MODES:-"reactor poll"}
FILE=${FILE:-target/bench-vs-fio.img}
PORT=${PORT:-4460}
NQN=nqn.2026-12.io.strata:bench
cargo build --release -q --bin strata-bench --bin strata-pool
BENCH=target/release/strata-bench
TICK=$(getconf CLK_TCK)

target_pid=
stop_target() {
  if [ -n "$target_pid" ]; then kill "$target_pid" 2>/dev/null || true; wait "$target_pid" 2>/dev/null || true; fi
  target_pid=
}
MEDIANS=$(mktemp)
trap 'stop_target; rm -f "$MEDIANS"' EXIT

start_target() { # NAMESPACE BUSY_POLL
  stop_target
  # A new port for each target: the listener (SO_REUSEPORT) of one just killed can linger in the kernel while
  # its io_uring is torn down, and a connection steered to it is refused.
  PORT=$((PORT + 1))
  F="trtype=tcp,traddr=127.0.0.1,trsvcid=$PORT,subnqn=$NQN,ns=1"
  local extra=()
  [ -n "${CONGESTION:-}" ] && extra=(--tcp-congestion "$CONGESTION")
  target/release/strata-pool target --listen "127.0.0.1:$PORT" --subsystem "$NQN" --namespace "$1" --cpus 1 \
    --busy-poll "$2" "${extra[@]}" 2>>"${TARGET_LOG:-/dev/null}" &
  target_pid=$!
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && return; sleep 0.1; done
  echo "target did not start" >&2; exit 1
}

target_ticks() { awk '{print $14 + $15}' "/proc/$target_pid/stat"; }
# Time the hypervisor took from this VM's CPUs (all of them). On this project's VMs, busy-polling beside disk
# I/O makes the host freeze the VM for milliseconds in every 100 ms period: a row with steal is throttled.
steal_ticks() { awk '$1 == "cpu" {print $9}' /proc/stat; }

# One run: prints "iops bw_bytes mean_clat_us target_ticks steal_ticks" (steal: the whole VM's, from
# /proc/stat). JOB_CPU: where the job runs (default 0: the target owns CPU 1, and a job that shared it
# measured the scheduler, not the code).
run_once() { # FILENAME ENGINE OPTIONS...
  local filename=$1 engine=$2; shift 2
  local before after steal_before steal_after json status
  if [ -n "$target_pid" ] && ! kill -0 "$target_pid" 2>/dev/null; then
    wait "$target_pid"; status=$?
    echo "the target (pid $target_pid) exited with status $status before this row" >&2; exit 1
  fi
  before=$( [ -n "$target_pid" ] && target_ticks || echo 0)
  steal_before=$(steal_ticks)
  json=$($BENCH --name=row "--filename=$filename" "--ioengine=$engine" --direct=1 --time_based "--runtime=$RUNTIME" \
    "--cpus_allowed=${JOB_CPU:-0}" --output-format=json "$@")
  after=$( [ -n "$target_pid" ] && target_ticks || echo 0)
  steal_after=$(steal_ticks)
  python3 -c '
import json, sys
job = json.loads(sys.argv[1])["jobs"][0]
side = job["read"] if job["read"]["io_bytes"] else job["write"]
print(side["iops"], side["bw_bytes"], side["clat_ns"]["mean"] / 1000, int(sys.argv[2]), int(sys.argv[3]))' "$json" \
    $((after - before)) $((steal_after - steal_before))
}

row() { # LABEL FILENAME ENGINE OPTIONS...; the median IOPS also goes to $MEDIANS as "LABEL<tab>IOPS"
  local label=$1; shift
  local results=()
  for _ in $(seq "$REPS"); do results+=("$(run_once "$@")"); done
  printf '%s\n' "${results[@]}" | MEDIANS=$MEDIANS python3 -c '
import sys, statistics
label, runtime, tick = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
rows = [list(map(float, line.split())) for line in sys.stdin if line.strip()]
rows.sort(key=lambda r: r[0])
iops, bw, lat, ticks, steal = rows[len(rows) // 2]
cpu_us = ticks / tick / (iops * runtime) * 1e6 if ticks else float("nan")
spread = "/".join(f"{r[0] / 1000:.0f}k" for r in rows)
steal_ms = steal / tick / runtime * 1000
print(f"| {label} | {iops / 1000:.1f}k | {bw / 1e9:.2f} GB/s | {lat:.1f} | {cpu_us:.2f} | {steal_ms:.0f} | {spread} |")
import os
with open(os.environ["MEDIANS"], "a") as medians:
    medians.write(f"{label}\t{iops}\n")' "$label" "$RUNTIME" "$TICK"
}

mode_settings() { # MODE: sets busy (the target's --busy-poll) and spin (the host's) for reactor or poll
  if [ "$1" = poll ]; then busy=1s; spin=--spin_before_park=1s; else busy=0; spin=--spin_before_park=0; fi
}

echo "| row (memory namespace) | IOPS | bandwidth | mean clat µs | target CPU µs/IO | host steal ms/s | IOPS of each run |"
echo "|---|---|---|---|---|---|---|"
for mode in $MODES; do
  mode_settings "$mode"
  extra=()
  [ -n "${CONGESTION:-}" ] && extra=("--tcp_congestion=$CONGESTION")
  start_target memory:1GiB "$busy"
  row "$mode 4k randread QD32" "$F" nvmf --rw=randread --bs=4k --iodepth=32 $spin "${extra[@]}"
  row "$mode 4k randread QD1" "$F" nvmf --rw=randread --bs=4k --iodepth=1 $spin "${extra[@]}"
  row "$mode 128k read QD8" "$F" nvmf --rw=read --bs=128k --iodepth=8 $spin "${extra[@]}"
  row "$mode 4k randwrite QD32" "$F" nvmf --rw=randwrite --bs=4k --iodepth=32 $spin "${extra[@]}"
done
stop_target

[ "$FILE_ROWS" = 1 ] || exit 0
[ -s "$FILE" ] || $BENCH --name=layout "--filename=$FILE" --rw=write --bs=1m --iodepth=8 --direct=1 --size=4g >/dev/null
echo
echo "| row (file namespace, $FILE) | IOPS | bandwidth | mean clat µs | target CPU µs/IO | host steal ms/s | IOPS of each run |"
echo "|---|---|---|---|---|---|---|"
labels=()
for spec in "4k randread QD32|--rw=randread --bs=4k --iodepth=32" "4k randread QD1|--rw=randread --bs=4k --iodepth=1" \
  "4k randwrite QD32|--rw=randwrite --bs=4k --iodepth=32" "1m read QD8|--rw=read --bs=1m --iodepth=8" \
  "1m write QD8|--rw=write --bs=1m --iodepth=8"; do
  label=${spec%%|*}; options=${spec#*|}
  labels+=("$label")
  # Local jobs run on CPU 1, where the target will run (and where this VM delivers the disk's interrupts).
  # shellcheck disable=SC2086
  JOB_CPU=1 row "local uring $label" "$FILE" uring $options --size=4g
  # shellcheck disable=SC2086
  JOB_CPU=1 row "local ring $label" "$FILE" ring $options --size=4g
  for mode in $FILE_MODES; do
    mode_settings "$mode"
    start_target "file:$FILE" "$busy"
    # shellcheck disable=SC2086
    row "nvmf $mode $label" "$F" nvmf $options --size=4g $spin
    stop_target
  done
done
echo
echo "Ratios of median IOPS, nvmf / local (target >= 0.9 x uring):"
python3 - "$MEDIANS" "$FILE_MODES" "${labels[@]}" <<'PY'
import sys
medians = dict(line.rstrip("\n").split("\t") for line in open(sys.argv[1]))
modes, labels = sys.argv[2].split(), sys.argv[3:]
for label in labels:
    uring, ring = float(medians[f"local uring {label}"]), float(medians[f"local ring {label}"])
    for mode in modes:
        nvmf = float(medians[f"nvmf {mode} {label}"])
        print(f"  {label:<18} nvmf {mode:<8} {nvmf / uring:5.2f} x local uring  {nvmf / ring:5.2f} x local ring")
PY
