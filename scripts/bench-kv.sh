#!/usr/bin/env bash
# The storage node's benchmark rows, side by side with their ceilings in the same run: strata-node pinned to
# CPU 1, strata-bench kv (and iperf3's client) pinned to CPU 0; fio reads the node's file from CPU 1, where
# the node reads it (and where this VM delivers the disk's interrupts), while the node idles between rows.
# Installs iperf3 and fio if missing.
#   RUNTIME=5 REPS=3 DIR=target/bench-kv SECTIONS="stalls dram nvme qd1 depth" NODE_POLL=1 SPIN=200us scripts/bench-kv.sh
# The depth section (NVMe-tier gets of 4 KiB and 64 KiB at 1, 8 and 32 in flight, as connections x batch
# 1x1 8x1 32x1 4x8 1x32 or the DEPTH_SHAPES given, of the DEPTH_SIZES given (4k 64k); fio at the same depth on
# the same file beside each) runs the node on its reactor and the client without spinning (DEPTH_POLL=1 to
# poll), so that the node's CPU per get is its own work, comparable with fio's CPU per I/O; each row also
# prints the disk's busy share and average queue, from the kernel's counts, during Strata's runs and fio's,
# and the row's ceiling without the disk: the same shape's gets from DRAM on the same node.
# DEPTH_TRANSPORT=shm moves the depth rows' values over the shared-memory path (a co-located client, the
# default of a serving engine's ranks on the node's host) instead of loopback TCP.
# NODE_EXTRA="--spin-before-park 1s" adds flags to the node's command line (here: glommio spins for
# completions before it parks, instead of the node polling its sockets; pair it with NODE_POLL=0).
# NODE_POLL=0 runs the node without --busy-poll (and SPIN=0 stops the client spinning): on a VM whose host
# caps its CPU, a polling core beside disk I/O gets the VM throttled (docs/BENCHMARKS.md compares the two).
# Every row runs REPS times (iperf3 alternating with Strata for the 4 MiB rows); the table shows medians, and
# the node's CPU time per key from its metrics (strata_process_cpu_seconds_total). Each NVMe row is followed
# by its ceiling on this machine at this hour: the same gets from DRAM on the same node, measured beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${RUNTIME:-5}
REPS=${REPS:-3}
DIR=${DIR:-target/bench-kv}
PORT=${PORT:-7650}
METRICS=${METRICS:-127.0.0.1:9650}
SPIN=${SPIN:-200us}
NODE_POLL=${NODE_POLL:-1}
SECTIONS=${SECTIONS:-"stalls dram nvme qd1 depth"}
wants() { [[ " $SECTIONS " == *" $1 "* ]]; }
for tool in iperf3 fio; do
  command -v "$tool" >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$tool"; }
done
cargo build --release -q --bin strata-node --bin strata-bench
BENCH=target/release/strata-bench
mkdir -p "$DIR"

node_pid=
stop_node() {
  if [ -n "$node_pid" ]; then kill -INT "$node_pid" 2>/dev/null || true; wait "$node_pid" 2>/dev/null || true; fi
  node_pid=
}
trap 'stop_node; pkill -f "iperf3 -s -p 5299" 2>/dev/null || true' EXIT

start_node() { # extra flags...
  stop_node
  rm -f "$DIR/ns0.img"
  local poll=()
  [ "$NODE_POLL" = 1 ] && poll=(--busy-poll)
  taskset -c 1 target/release/strata-node --listen "127.0.0.1:$PORT" --cores 1 --cpus 1 --metrics "$METRICS" \
    --nvme "file:$DIR/ns0.img,size=8GiB" "${poll[@]}" ${NODE_EXTRA:-} "$@" > "$DIR/node.log" 2>&1 &
  node_pid=$!
  for _ in $(seq 600); do grep -q ready "$DIR/node.log" 2>/dev/null && return; sleep 0.1; done
  cat "$DIR/node.log" >&2; echo "node did not start" >&2; exit 1
}

kv() { # strata-bench kv flags...; prints the JSON report. The client busy-polls (--spin) only with one
  # connection: several spinning threads on the bench's one core would take turns by the scheduler's slices.
  local spin=(--spin "$SPIN")
  [[ " $* " == *" --connections 1 "* || " $* " != *" --connections "* ]] || spin=()
  [ "$SPIN" = 0 ] && spin=()
  taskset -c 0 "$BENCH" kv --server "127.0.0.1:$PORT" --metrics "$METRICS" "${spin[@]}" --runtime "$RUNTIME" \
    --output-format=json "$@"
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
field() { python3 -c "import json,sys; r=json.load(sys.stdin); print(eval('r' + sys.argv[1]))" "$1"; }

row() { # name target flags...
  local name=$1 target=$2; shift 2
  local values=() cpus=() p50s=() p99s=()
  for _ in $(seq "$REPS"); do
    local json; json=$(kv "$@")
    values+=("$(echo "$json" | field "['ops_per_sec']")")
    cpus+=("$(echo "$json" | field "['server_cpu_ns_per_op']")")
    p50s+=("$(echo "$json" | field "['lat_ns']['p50']")")
    p99s+=("$(echo "$json" | field "['lat_ns']['p99']")")
    [ "$(echo "$json" | field "['errors'] + r['mismatches']")" = 0 ] || { echo "$name: errors: $json" >&2; exit 1; }
  done
  printf '%-44s %12.0f keys/s  p50 %7.1f us  p99 %7.1f us  node %6.0f ns/key  (%s)\n' "$name" \
    "$(printf '%s\n' "${values[@]}" | median)" "$(printf '%s\n' "${p50s[@]}" | median | awk '{print $1/1000}')" \
    "$(printf '%s\n' "${p99s[@]}" | median | awk '{print $1/1000}')" "$(printf '%s\n' "${cpus[@]}" | median)" "$target"
}

if wants stalls; then
echo "== This machine's stall floor (both cores watched at once, before the node starts): no p99 below it"
taskset -c 0 "$BENCH" stalls --cpu 0 --runtime "${RUNTIME}s" > "$DIR/stalls0.txt" &
taskset -c 1 "$BENCH" stalls --cpu 1 --runtime "${RUNTIME}s" > "$DIR/stalls1.txt"
wait
cat "$DIR/stalls0.txt" "$DIR/stalls1.txt"
fi

if wants dram; then
echo "== DRAM rows (write-back: no NVMe traffic on the put path)"
start_node --dram 6GiB --write-policy write-back
taskset -c 1 iperf3 -s -p 5299 -D >/dev/null
sleep 0.5
iperf=() get4m=() put4m=()
for _ in $(seq "$REPS"); do
  iperf+=("$(taskset -c 0 iperf3 -c 127.0.0.1 -p 5299 -l 1M -t "$RUNTIME" -J | field "['end']['sum_received']['bits_per_second']/8")")
  get4m+=("$(kv --op get --value-size 4m --keys 256 --connections 2 | field "['bytes_per_sec']")")
  put4m+=("$(kv --op put --value-size 4m --keys 256 --connections 2 --no-preload | field "['bytes_per_sec']")")
done
pkill -f "iperf3 -s -p 5299" || true
i=$(printf '%s\n' "${iperf[@]}" | median); g=$(printf '%s\n' "${get4m[@]}" | median); p=$(printf '%s\n' "${put4m[@]}" | median)
printf '%-44s %8.2f GB/s\n' "iperf3 -l 1M, one stream" "$(echo "$i" | awk '{print $1/1e9}')"
printf '%-44s %8.2f GB/s  = %.2f x iperf3 (target >= 0.8)\n' "4 MiB get, 2 connections" "$(echo "$g" | awk '{print $1/1e9}')" "$(echo "$g $i" | awk '{print $1/$2}')"
printf '%-44s %8.2f GB/s  = %.2f x iperf3 (target >= 0.8)\n' "4 MiB put, 2 connections" "$(echo "$p" | awk '{print $1/1e9}')" "$(echo "$p $i" | awk '{print $1/$2}')"
row "4 KiB batch get x32, 1 connection" ">= 250K" --op get --value-size 4k --keys 100000 --batch 32
row "4 KiB batch put x32, 1 connection" ">= 150K" --op put --value-size 4k --keys 100000 --batch 32 --no-preload
row "batch exists x32, 1 connection" ">= 1M" --op exists --value-size 4k --keys 100000 --batch 32 --no-preload
row "single 4 KiB get, one in flight" "p50 <= 50 us" --op get --value-size 4k --keys 100000 --no-preload
peak=$(kv --op get --value-size 64k --keys 16384 --no-preload | field "['calls_per_sec']")
row "64 KiB get, 1 connection, peak" "peak" --op get --value-size 64k --keys 16384 --no-preload
row "64 KiB get, 1 connection, at half of peak" "p99 <= 300 us" --op get --value-size 64k --keys 16384 --no-preload \
  --rate "$(echo "$peak" | awk '{print $1/2}')"
fi

if wants nvme; then
echo "== NVMe rows (64 MiB of DRAM, 2 GiB working set, no promotion: every get is an NVMe read)"
start_node --dram 64MiB --write-policy write-through --promote-window 0s
taskset -c 0 "$BENCH" kv --server "127.0.0.1:$PORT" --metrics off --op put --value-size 64k --keys 32768 \
  --batch 16 --no-preload --once --runtime 600 >/dev/null
# A second key set, 32 MiB, written last and so still in DRAM (nothing is promoted): the same get from the
# same node without the device read, measured beside each NVMe run. A get from NVMe costs a device read
# plus what a DRAM get costs (the 64 KiB reply on loopback, the client's receive and check); a closed loop
# that cannot overlap the two moves at most fio x dram / (fio + dram), which the script prints as the
# ceiling of the row on this machine at this hour (docs/BENCHMARKS.md, "the NVMe rows taken apart").
taskset -c 0 "$BENCH" kv --server "127.0.0.1:$PORT" --metrics off --op put --value-size 64k --keys 512 --seed 7 \
  --batch 16 --no-preload --once --runtime 600 >/dev/null
for qd in 1 4; do
  fio_bw=() kv_bw=() dram_bw=()
  for _ in $(seq "$REPS"); do
    fio_bw+=("$(taskset -c 1 fio --name=r --filename="$DIR/ns0.img" --rw=randread --bs=64k --iodepth="$qd" --direct=1 \
      --ioengine=io_uring --size=2g --offset=1m --runtime="$RUNTIME" --time_based --output-format=json | field "['jobs'][0]['read']['bw_bytes']")")
    kv_bw+=("$(kv --op get --value-size 64k --keys 32768 --connections "$qd" --no-preload | field "['bytes_per_sec']")")
    dram_bw+=("$(kv --op get --value-size 64k --keys 512 --seed 7 --connections "$qd" --no-preload | field "['bytes_per_sec']")")
  done
  f=$(printf '%s\n' "${fio_bw[@]}" | median); k=$(printf '%s\n' "${kv_bw[@]}" | median)
  d=$(printf '%s\n' "${dram_bw[@]}" | median)
  printf '%-44s fio %7.0f MB/s  strata %7.0f MB/s  = %.2f x fio (target >= 0.8)\n' "64 KiB random read from NVMe, QD $qd" \
    "$(echo "$f" | awk '{print $1/1e6}')" "$(echo "$k" | awk '{print $1/1e6}')" "$(echo "$k $f" | awk '{print $1/$2}')"
  printf '%-44s dram %6.0f MB/s  ceiling %6.0f MB/s = %.2f x fio; strata at %.2f x the ceiling\n' \
    "  the same gets from DRAM, QD $qd" "$(echo "$d" | awk '{print $1/1e6}')" \
    "$(echo "$f $d" | awk '{print $1*$2/($1+$2)/1e6}')" "$(echo "$f $d" | awk '{print $2/($1+$2)}')" \
    "$(echo "$k $f $d" | awk '{print $1/($2*$3/($2+$3))}')"
done
curl -s "http://$METRICS/metrics" | grep -E '^strata_tier_hits_total' || true
fi

if wants qd1; then
echo "== One 4 KiB NVMe-tier get in flight: a busy-polled node (its file on a ring of its own), the client spinning"
NODE_POLL=1 start_node --dram 64MiB --write-policy write-through --promote-window 0s
taskset -c 0 "$BENCH" kv --server "127.0.0.1:$PORT" --metrics off --op put --value-size 4k --keys 204800 \
  --batch 32 --connections 2 --no-preload --once --runtime 600 >/dev/null
fio_p50=() kv_p50=() kv_rate=()
for _ in $(seq "$REPS"); do
  # fio's completion latency at QD 1 on the same file from the node's CPU, while the node idles.
  fio_p50+=("$(taskset -c 1 fio --name=r --filename="$DIR/ns0.img" --rw=randread --bs=4k --iodepth=1 --direct=1 \
    --ioengine=io_uring --size=900m --offset=1m --runtime="$RUNTIME" --time_based --output-format=json |
    python3 -c "import json,sys; print(json.load(sys.stdin)['jobs'][0]['read']['clat_ns']['percentile']['50.000000'])")")
  json=$(SPIN=1s kv --op get --value-size 4k --keys 204800 --connections 1 --batch 1 --no-preload)
  [ "$(echo "$json" | field "['errors'] + r['mismatches']")" = 0 ] || { echo "errors: $json" >&2; exit 1; }
  kv_p50+=("$(echo "$json" | field "['lat_ns']['p50']")"); kv_rate+=("$(echo "$json" | field "['ops_per_sec']")")
done
f=$(printf '%s\n' "${fio_p50[@]}" | median); k=$(printf '%s\n' "${kv_p50[@]}" | median)
printf '%-30s strata p50 %6.1f us (%6.0f gets/s)   fio QD1 clat p50 %6.1f us   strata - fio = %5.1f us (target <= 40)\n' \
  "4k, 1 conn x batch 1, polled" "$(echo "$k" | awk '{print $1/1000}')" "$(printf '%s\n' "${kv_rate[@]}" | median)" \
  "$(echo "$f" | awk '{print $1/1000}')" "$(echo "$k $f" | awk '{print ($1-$2)/1000}')"
stop_node
fi

wants depth || exit 0
# fio's CPU per I/O: (user + system) over the job's runtime, per I/O, in ns.
fio_cpu() { python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; r=j['read']; print(r['iops'], (j['usr_cpu']+j['sys_cpu'])/100*j['job_runtime']*1e6/max(r['total_ios'],1))"; }
fio_iops_sum() { python3 -c "import json,sys; print(sum(j['read']['iops'] for j in json.load(sys.stdin)['jobs']))"; }
# The block device under $DIR, as the kernel counts it (/sys/dev/block/MAJ:MIN/stat): whether a load keeps
# its queue full is read off the device, not inferred from rates.
disk_stat=/sys/dev/block/$(findmnt -n -o MAJ:MIN -T "$DIR" | tr -d ' ')/stat
disk_mark() { echo "$(date +%s.%N) $(cat "$disk_stat")"; }
# The device between two marks: the share of the time it had a request in flight (io_ticks) and its
# average queue (time_in_queue over the wall time), as "busy queue".
disk_use() { # mark-before mark-after
  python3 -c "import sys; a, b = (list(map(float, m.split())) for m in sys.argv[1:3]); wall = (b[0] - a[0]) * 1000
print(f'{(b[10] - a[10]) / wall:.2f} {(b[11] - a[11]) / wall:.1f}')" "$1" "$2"
}
depth_rows() { # value size, keys, record span in MiB, keys that fit in DRAM
  local size=$1 keys=$2 span=$3 dram_keys=$4 transport=(--transport "${DEPTH_TRANSPORT:-tcp}")
  echo "== NVMe-tier gets of $size by depth over ${DEPTH_TRANSPORT:-tcp}: $keys keys (~$span MiB, >= 10x the 64 MiB of DRAM), no promotion"
  NODE_POLL=${DEPTH_POLL:-0} start_node --dram 64MiB --write-policy write-through --promote-window 0s
  taskset -c 0 "$BENCH" kv --server "127.0.0.1:$PORT" --metrics off --op put --value-size "$size" --keys "$keys" \
    --batch 32 --connections 2 --no-preload --once --runtime 600 >/dev/null
  # The row's ceiling without the disk: a second key set (another seed), written last and small enough to
  # stay in DRAM, read at the same shape on the same node.
  taskset -c 0 "$BENCH" kv --server "127.0.0.1:$PORT" --metrics off --op put --value-size "$size" \
    --keys "$dram_keys" --seed 7 --batch 32 --connections 2 --no-preload --once --runtime 600 >/dev/null
  local shape
  for shape in ${DEPTH_SHAPES:-1x1 8x1 32x1 4x8 1x32}; do
    local connections=${shape%x*} batch=${shape#*x} fio_iops=() fio_ns=() kv_rate=() kv_ns=() fio_pattern=()
    local depth=$((connections * batch)) fio_disk=() kv_disk=() mark dram_rate=() dram_ns=()
    for _ in $(seq "$REPS"); do
      mark=$(disk_mark)
      local fio_out; fio_out=$(taskset -c 1 fio --name=r --filename="$DIR/ns0.img" --rw=randread --bs="$size" \
        --iodepth="$depth" --direct=1 --ioengine=io_uring --size="${span}m" --offset=1m --runtime="$RUNTIME" \
        --time_based --output-format=json | fio_cpu)
      fio_disk+=("$(disk_use "$mark" "$(disk_mark)")")
      fio_iops+=("${fio_out% *}"); fio_ns+=("${fio_out#* }")
      # The clients' own pattern, without the network: each of `connections` jobs submits `batch` reads at
      # once and waits for all of them. This disk completes requests in rounds, so a closed loop of
      # batches gets less from it than fio's steady queue: the bound of the row on this machine.
      if [ "$batch" -gt 1 ]; then
        fio_pattern+=("$(taskset -c 1 fio --name=r --filename="$DIR/ns0.img" --rw=randread --bs="$size" \
          --numjobs="$connections" --iodepth="$batch" --iodepth_batch_submit="$batch" \
          --iodepth_batch_complete_min="$batch" --direct=1 --ioengine=io_uring --size="${span}m" --offset=1m \
          --runtime="$RUNTIME" --time_based --output-format=json | fio_iops_sum)")
      fi
      mark=$(disk_mark)
      local json; json=$(SPIN=0 kv --op get --value-size "$size" --keys "$keys" --connections "$connections" \
        --batch "$batch" --no-preload "${transport[@]}")
      kv_disk+=("$(disk_use "$mark" "$(disk_mark)")")
      [ "$(echo "$json" | field "['errors'] + r['mismatches']")" = 0 ] || { echo "errors: $json" >&2; exit 1; }
      kv_rate+=("$(echo "$json" | field "['ops_per_sec']")"); kv_ns+=("$(echo "$json" | field "['server_cpu_ns_per_op']")")
      json=$(SPIN=0 kv --op get --value-size "$size" --keys "$dram_keys" --seed 7 --connections "$connections" \
        --batch "$batch" --no-preload "${transport[@]}")
      [ "$(echo "$json" | field "['errors'] + r['mismatches'] + r['not_found']")" = 0 ] || { echo "errors: $json" >&2; exit 1; }
      dram_rate+=("$(echo "$json" | field "['ops_per_sec']")"); dram_ns+=("$(echo "$json" | field "['server_cpu_ns_per_op']")")
    done
    local f k fn kn
    f=$(printf '%s\n' "${fio_iops[@]}" | median); k=$(printf '%s\n' "${kv_rate[@]}" | median)
    fn=$(printf '%s\n' "${fio_ns[@]}" | median); kn=$(printf '%s\n' "${kv_ns[@]}" | median)
    printf '%-30s strata %8.0f gets/s  fio QD%-2d %8.0f IOPS  = %.2f x fio   CPU/get: node %6.0f ns  fio %6.0f ns = %.2f x\n' \
      "$size, $connections conn x batch $batch" "$k" "$depth" "$f" "$(echo "$k $f" | awk '{print $1/$2}')" "$kn" "$fn" \
      "$(echo "$kn $fn" | awk '{print $1/$2}')"
    printf '  %-28s busy %.2f, queue %4.1f   fio: busy %.2f, queue %4.1f\n' "the disk (medians)" \
      "$(printf '%s\n' "${kv_disk[@]%% *}" | median)" "$(printf '%s\n' "${kv_disk[@]##* }" | median)" \
      "$(printf '%s\n' "${fio_disk[@]%% *}" | median)" "$(printf '%s\n' "${fio_disk[@]##* }" | median)"
    local d dn; d=$(printf '%s\n' "${dram_rate[@]}" | median); dn=$(printf '%s\n' "${dram_ns[@]}" | median)
    printf '  %-28s %8.0f gets/s = %.2f x fio QD%d, node %6.0f ns/get; strata at %.2f x this ceiling\n' \
      "the same shape from DRAM" "$d" "$(echo "$d $f" | awk '{print $1/$2}')" "$depth" "$dn" \
      "$(echo "$k $d" | awk '{print $1/$2}')"
    # One core that serves the get as from DRAM and reads the disk at fio's CPU cost cannot go faster: the
    # bound of a row the node's core limits (on the reactor, its CPU per get is its own work; busy-polled,
    # it is the core's whole time per get, so the bound errs low).
    local bound; bound=$(echo "$dn $fn" | awk '{print 1e9/($1+$2)}')
    printf '  %-28s %8.0f gets/s = %.2f x fio QD%d; strata at %.2f x this bound\n' \
      "one core: DRAM get + fio read" "$bound" "$(echo "$bound $f" | awk '{print $1/$2}')" "$depth" \
      "$(echo "$k $bound" | awk '{print $1/$2}')"
    if [ "$batch" -gt 1 ]; then
      local pattern; pattern=$(printf '%s\n' "${fio_pattern[@]}" | median)
      printf '  %-28s fio %8.0f IOPS = %.2f x fio QD%d; strata at %.2f x this bound\n' \
        "fio in batches of $batch x $connections" "$pattern" "$(echo "$pattern $f" | awk '{print $1/$2}')" "$depth" \
        "$(echo "$k $pattern" | awk '{print $1/$2}')"
    fi
  done
  curl -s "http://$METRICS/metrics" | grep -E '^strata_(tier_hits_total|nvme_reads_in_flight_peak)' || true
}
for size in ${DEPTH_SIZES:-4k 64k}; do
  case $size in
    4k) depth_rows 4k 204800 900 4096 ;;
    64k) depth_rows 64k 16384 1100 256 ;;
    *) echo "DEPTH_SIZES: 4k or 64k, not $size" >&2; exit 1 ;;
  esac
done
