#!/usr/bin/env bash
# The serving-engine benchmark rows, each side by side with its reference in the same run: strata-node pinned to CPU 1
# (busy-polling), the clients (strata-bench kv, the Python package, iperf3's client) pinned to CPU 0.
#   RUNTIME=5 REPS=3 DIR=target/bench-serving ROWS=python,mooncake,prefix,events,links,overlap scripts/bench-serving.sh
# NODE=path/to/strata-node runs another build of the node against this tree's clients (to compare builds).
# The mooncake row installs PyPI's mooncake-transfer-engine-non-cuda in target/mooncake-venv and runs its
# master and a segment-holding store on CPU 1 (MC_TCP_BIND_ADDRESS=127.0.0.1), its client on CPU 0.
# Rows: Python batch_get_into (32 keys, registered buffers) against the Rust client at 4 KiB and against
# iperf3 -l 1M at 64 KiB, alternating (rust, python, rust, python, ...); a 1,000-key prefix match on one
# shard; puts with an event subscriber connected in alternate windows of one run (WINDOWED_RUNTIME seconds
# each, REPS runs), then puts with and without one in separate runs, alternating, and the events/s; puts of
# blocks linked in chains against unlinked puts, alternating, over a working set larger than DRAM (so the
# linked runs also cascade); a block of 32 layers computed 0.5 ms each and loaded by a decode thread, stored
# whole after its compute or progressively during it, alternating (the transfer time left exposed).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${RUNTIME:-5}
REPS=${REPS:-3}
DIR=${DIR:-target/bench-serving}
PORT=${PORT:-7660}
ROWS=${ROWS:-python,mooncake,prefix,events,links,overlap}
WINDOWED_RUNTIME=${WINDOWED_RUNTIME:-20}
wants() { [[ ",$ROWS," == *",$1,"* ]]; }
METRICS=${METRICS:-127.0.0.1:9660}
command -v iperf3 >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3; }
cargo build --release -q --bin strata-node --bin strata-bench
python3 -m venv target/pyenv
target/pyenv/bin/pip install -q --disable-pip-version-check -r client/python/requirements-dev.txt
rm -rf target/wheels
target/pyenv/bin/maturin build -q --release -m client/python/Cargo.toml -o target/wheels
target/pyenv/bin/pip install -q --disable-pip-version-check --force-reinstall --no-deps target/wheels/strata-*.whl
BENCH=target/release/strata-bench
NODE=${NODE:-target/release/strata-node}
PY=target/pyenv/bin/python
mkdir -p "$DIR"

node_pid=
stop_node() {
  if [ -n "$node_pid" ]; then kill -INT "$node_pid" 2>/dev/null || true; wait "$node_pid" 2>/dev/null || true; fi
  node_pid=
}
trap 'stop_node; pkill -f "iperf3 -s -p 5298" 2>/dev/null || true' EXIT
start_node() { # extra flags... (NODE_CPUS: the CPUs the node may use; its one shard is on CPU 1)
  stop_node
  taskset -c "${NODE_CPUS:-1}" "$NODE" --listen "127.0.0.1:$PORT" --cores 1 --cpus 1 --metrics "$METRICS" \
    --dram-only "$@" > "$DIR/node.log" 2>&1 &
  node_pid=$!
  for _ in $(seq 600); do grep -q ready "$DIR/node.log" 2>/dev/null && return; sleep 0.1; done
  cat "$DIR/node.log" >&2; echo "node did not start" >&2; exit 1
}
kv() { taskset -c 0 "$BENCH" kv --server "127.0.0.1:$PORT" --metrics "$METRICS" --runtime "$RUNTIME" --output-format=json "$@"; }
py() { taskset -c 0 "$PY" client/python/benches/batch_get_into.py --server "127.0.0.1:$PORT" --runtime "$RUNTIME" "$@"; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
field() { python3 -c "import json,sys; r=json.load(sys.stdin); print(eval('r' + sys.argv[1]))" "$1"; }
check() { [ "$(echo "$1" | field "['errors']")" = 0 ] || { echo "errors: $1" >&2; exit 1; }; }

if wants python; then
echo "== Python batch_get_into (32 keys into registered buffers) vs the Rust client, same node"
start_node --dram 4GiB --busy-poll
for size in 4096 65536; do
  keys=$((size == 4096 ? 20000 : 4000))
  kv --op put --value-size "$size" --keys "$keys" --batch 32 --once >/dev/null
  rust=() python=() iperf=()
  if [ "$size" = 65536 ]; then taskset -c 1 iperf3 -s -p 5298 -D >/dev/null; sleep 0.5; fi
  for _ in $(seq "$REPS"); do
    json=$(kv --op get --value-size "$size" --keys "$keys" --batch 32 --no-preload); check "$json"
    rust+=("$(echo "$json" | field "['ops_per_sec']")")
    json=$(py --value-size "$size" --keys "$keys" --batch 32); check "$json"
    python+=("$(echo "$json" | field "['ops_per_sec']")")
    if [ "$size" = 65536 ]; then
      iperf+=("$(taskset -c 0 iperf3 -c 127.0.0.1 -p 5298 -l 1M -t "$RUNTIME" -J | field "['end']['sum_received']['bits_per_second']/8")")
    fi
  done
  r=$(printf '%s\n' "${rust[@]}" | median); p=$(printf '%s\n' "${python[@]}" | median)
  printf '%-52s %10.0f keys/s\n' "Rust client batch_get_into x32, $((size / 1024)) KiB" "$r"
  printf '%-52s %10.0f keys/s = %.2f x Rust\n' "Python batch_get_into x32, $((size / 1024)) KiB" "$p" "$(echo "$p $r" | awk '{print $1/$2}')"
  if [ "$size" = 65536 ]; then
    pkill -f "iperf3 -s -p 5298" || true
    i=$(printf '%s\n' "${iperf[@]}" | median)
    printf '%-52s %10.2f GB/s\n' "iperf3 -l 1M, one stream" "$(echo "$i" | awk '{print $1/1e9}')"
    printf '%-52s %10.2f GB/s = %.2f x iperf3 (target >= 0.7)\n' "Python batch_get_into x32, 64 KiB" \
      "$(echo "$p" | awk '{print $1*65536/1e9}')" "$(echo "$p $i" | awk '{print $1*65536/$2}')"
  fi
done

fi

if wants mooncake; then
echo "== Python batch_get_into x32, 4 KiB: Strata's package vs Mooncake Store's, alternating (servers on CPU 1)"
MOONCAKE=target/mooncake-venv
[ -x "$MOONCAKE/bin/mooncake_master" ] || {
  python3 -m venv "$MOONCAKE"
  "$MOONCAKE/bin/pip" install -q --disable-pip-version-check mooncake-transfer-engine-non-cuda==0.3.13.post1 numpy==2.4.6
}
export MC_TCP_BIND_ADDRESS=127.0.0.1
taskset -c 1 "$MOONCAKE/bin/mooncake_master" --enable_http_metadata_server=true --http_metadata_server_host=127.0.0.1 \
  --http_metadata_server_port=18080 --rpc_address=127.0.0.1 --rpc_port=50151 > "$DIR/mooncake-master.log" 2>&1 &
master_pid=$!
sleep 2
taskset -c 1 "$MOONCAKE/bin/python" client/python/benches/mooncake_holder.py 4096 20000 50151 18080 > "$DIR/mooncake-holder.log" 2>&1 &
holder_pid=$!
trap 'stop_node; kill $holder_pid $master_pid 2>/dev/null || true; pkill -f "iperf3 -s -p 5298" 2>/dev/null || true' EXIT
for _ in $(seq 120); do grep -q ready "$DIR/mooncake-holder.log" 2>/dev/null && break; sleep 0.5; done
grep -q ready "$DIR/mooncake-holder.log" || { cat "$DIR/mooncake-holder.log" >&2; echo "mooncake did not start" >&2; exit 1; }
# The Strata node sleeps when idle here (no --busy-poll): it shares CPU 1 with Mooncake's processes.
start_node --dram 4GiB
kv --op put --value-size 4096 --keys 20000 --batch 32 --once >/dev/null
strata=() mooncake=()
for _ in $(seq "$REPS"); do
  json=$(py --value-size 4096 --keys 20000 --batch 32); check "$json"
  strata+=("$(echo "$json" | field "['ops_per_sec']")")
  json=$(taskset -c 0 "$MOONCAKE/bin/python" client/python/benches/mooncake_batch_get_into.py 4096 20000 32 "$RUNTIME" 50151 18080 2>/dev/null | tail -1)
  check "$json"
  mooncake+=("$(echo "$json" | field "['ops_per_sec']")")
done
kill "$holder_pid" "$master_pid" 2>/dev/null || true
s=$(printf '%s\n' "${strata[@]}" | median); m=$(printf '%s\n' "${mooncake[@]}" | median)
printf '%-52s %10.0f keys/s\n' "Mooncake Store (Python) batch_get_into x32, 4 KiB" "$m"
printf '%-52s %10.0f keys/s = %.1f x Mooncake (target >= 10)\n' "Strata (Python) batch_get_into x32, 4 KiB" "$s" "$(echo "$s $m" | awk '{print $1/$2}')"
fi

if wants prefix; then
echo "== prefix match of a 1,000-key chain, one shard"
start_node --dram 1GiB --busy-poll
json=$(kv --op prefix-match --batch 1000 --keys 20000 --value-size 64); check "$json"
printf '%-52s p50 %7.1f us  p99 %7.1f us  (target <= 200 us)\n' "prefix_match, 1,000 stored keys" \
  "$(echo "$json" | field "['lat_ns']['p50']/1000")" "$(echo "$json" | field "['lat_ns']['p99']/1000")"

fi

# Puts with `$3` (word-split flags), alternating without and with the extra flags `$4`, REPS times each;
# prints both medians (puts/s, node CPU per put) labelled `$1` and `$2`, and sets RATIO and CPU_RATIO (second
# over first) and B_JSONS (the second variant's reports).
put_pair() {
  local first=() second=() first_cpu=() second_cpu=() json a b ac bc
  B_JSONS=()
  for _ in $(seq "$REPS"); do
    # shellcheck disable=SC2086
    json=$(kv --op put $3); check "$json"
    first+=("$(echo "$json" | field "['ops_per_sec']")")
    first_cpu+=("$(echo "$json" | field "['server_cpu_ns_per_op']")")
    # shellcheck disable=SC2086
    json=$(kv --op put $3 $4); check "$json"
    second+=("$(echo "$json" | field "['ops_per_sec']")")
    second_cpu+=("$(echo "$json" | field "['server_cpu_ns_per_op']")")
    B_JSONS+=("$json")
  done
  a=$(printf '%s\n' "${first[@]}" | median); b=$(printf '%s\n' "${second[@]}" | median)
  ac=$(printf '%s\n' "${first_cpu[@]}" | median); bc=$(printf '%s\n' "${second_cpu[@]}" | median)
  printf '%-52s %10.0f puts/s  node %5.0f ns/put\n' "$1" "$a" "$ac"
  printf '%-52s %10.0f puts/s  node %5.0f ns/put\n' "$2" "$b" "$bc"
  RATIO=$(echo "$b $a" | awk '{print $1/$2}'); CPU_RATIO=$(echo "$bc $ac" | awk '{print $1/$2}')
}

if wants events; then
echo "== puts of 64 B values in batches of 128 on two connections, with and without an event subscriber (alternating)"
# The node sleeps when idle here (no --busy-poll), so its CPU time per put is what a put costs it; two put
# connections keep it near saturation (one waits on its replies and leaves it a quarter idle). The
# subscriber's reader thread shares CPU 0 with the put clients (two cores: nowhere else to put it). The node
# may use CPU 0 too, for its event sender thread (the shard stays on CPU 1); each run is paired with one of a
# node that writes the frames on the shard's core (--event-cpus inline), the way it runs with no spare CPU.
# The slowdown, measured inside each run: a subscriber connected in alternate pairs of 250 ms windows (off,
# on, on, off, ...) and puts/s compared between the two kinds of window. Separate runs seconds apart differ
# by up to a third on this shared machine (the node's cost per put drifts with its neighbours' memory
# traffic), which hides a few per cent; windows alternate faster than that drift.
windowed() { # array name prefix, node flags...
  local -n ratios_=$1_ratios cpu_=$1_cpu off_=$1_off on_=$1_on
  shift
  NODE_CPUS=0,1 start_node --dram 4GiB "$@"
  json=$(taskset -c 0 "$BENCH" kv --server "127.0.0.1:$PORT" --metrics "$METRICS" --output-format=json --op put \
    --value-size 64 --keys 200000 --batch 128 --connections 2 --no-preload --runtime "$WINDOWED_RUNTIME" \
    --subscribe-windows 250ms --node-pid "$node_pid"); check "$json"
  ratios_+=("$(echo "$json" | field "['windows']['ratio']")")
  cpu_+=("$(echo "$json" | field "['server_cpu_ns_per_op']")")
  off_+=("$(echo "$json" | field "['windows']['node_cpu_ns_per_op_unobserved']")")
  on_+=("$(echo "$json" | field "['windows']['node_cpu_ns_per_op_observed']")")
  [ "$(echo "$json" | field "['windows']['events_missed']")" = 0 ] || { echo "$json" >&2; echo "events missed" >&2; exit 1; }
}
# The node's own CPU time per put in each kind of window (all its threads' schedstat, the sender thread's
# included, stolen time excluded): what an observed put costs the node, apart from what the subscriber
# costs the client's core.
report_windows() { # array name prefix, label
  local -n ratios_=$1_ratios cpu_=$1_cpu off_=$1_off on_=$1_on
  printf '%-52s %10.3f x puts/s (target >= 0.95; runs: %s); node %.0f ns/put over the runs\n' \
    "  $2" "$(printf '%s\n' "${ratios_[@]}" | median)" \
    "$(printf '%.3f ' "${ratios_[@]}")" "$(printf '%s\n' "${cpu_[@]}" | median)"
  off=$(printf '%s\n' "${off_[@]}" | median); on=$(printf '%s\n' "${on_[@]}" | median)
  printf '%-52s %10.0f / %.0f ns = %.3f x (runs: %s)\n' "    node CPU per put, observed / unobserved windows" \
    "$on" "$off" "$(echo "$on $off" | awk '{print $1/$2}')" \
    "$(for i in "${!on_[@]}"; do echo "${on_[$i]} ${off_[$i]}"; done | awk '{printf "%.3f ", $1/$2}')"
}
thread_ratios=() thread_cpu=() thread_off=() thread_on=()
inline_ratios=() inline_cpu=() inline_off=() inline_on=()
for _ in $(seq "$REPS"); do
  windowed thread
  windowed inline --event-cpus inline
done
report_windows thread "observed / unobserved windows, one run"
report_windows inline "the same, frames written by the shard (inline)"
NODE_CPUS=0,1 start_node --dram 4GiB
# The events/s (and, for the record, the drift-prone ratio of whole runs): separate runs with and without a
# subscriber throughout, alternating.
put_pair "puts, no subscriber" "puts, one subscriber" \
  "--value-size 64 --keys 200000 --batch 128 --connections 2 --no-preload" --subscribe
printf '%-52s %10.3f x puts/s, %.3f x node CPU per put\n' "  with / without, separate runs" "$RATIO" "$CPU_RATIO"
# Block events: one per key an event names (an event on the wire names one key or many, vLLM's list form).
rates=() wire=() missed=() sub_cpu=()
for json in "${B_JSONS[@]}"; do
  rates+=("$(echo "$json" | field "['events_per_sec']")")
  wire+=("$(echo "$json" | field "['events_per_sec']*r['wire_events_received']/max(r['events_received'],1)")")
  missed+=("$(echo "$json" | field "['events_missed']")")
  sub_cpu+=("$(echo "$json" | field "['subscriber_cpu_ns_per_event']")")
done
rate=$(printf '%s\n' "${rates[@]}" | median); sc=$(printf '%s\n' "${sub_cpu[@]}" | median)
printf '%-52s %10.0f events/s, missed %s (target >= 500000)\n' "block events delivered to the subscriber" \
  "$rate" "$(printf '%s\n' "${missed[@]}" | median)"
printf '%-52s %10.0f events/s (%.0f keys each)\n' "  in events on the wire" "$(printf '%s\n' "${wire[@]}" | median)" \
  "$(echo "$rate $(printf '%s\n' "${wire[@]}" | median)" | awk '{print $1/$2}')"
# Where a slower put rate comes from on two cores: the node's extra CPU per observed put (CPU 1), and the
# subscriber's thread, which takes its share of CPU 0 from the put clients.
printf '%-52s %10.0f ns/event = %.1f %% of CPU 0 at that rate\n' "  the subscriber's own thread" "$sc" \
  "$(echo "$sc $rate" | awk '{print $1*$2/1e7}')"
fi

if wants links; then
echo "== puts of 4 KiB blocks in chains of 16 (each naming the one before) vs unlinked puts, alternating"
# 256 MiB of DRAM under a 400 MiB working set, DRAM only: the clock evicts throughout, and in the linked
# runs every eviction takes the rest of its chain with it.
cascades() { python3 -c "import re,sys,urllib.request; t=urllib.request.urlopen('http://$METRICS/metrics').read().decode(); print(sum(int(v) for v in re.findall(r'^strata_cascade_removals_total (\d+)', t, re.M)))"; }
start_node --dram 256MiB
put_pair "puts, unlinked" "puts, chains of 16" "--value-size 4k --keys 100000 --batch 32 --no-preload" \
  "--link-parents 16"
printf '%-52s %10.3f x puts/s, %.3f x node CPU per put; %s cascaded removals\n' "  linked / unlinked" \
  "$RATIO" "$CPU_RATIO" "$(cascades)"
fi

if wants overlap; then
echo "== a 32-layer block (64 KiB per layer, 0.5 ms of compute each): stored whole vs progressively, alternating"
start_node --dram 1GiB --busy-poll
json=$(taskset -c 0 "$PY" client/python/benches/progressive_overlap.py --server "127.0.0.1:$PORT" --blocks 20)
printf '%-52s exposed p50 %7.0f us  p90 %7.0f us\n' "whole: put after the last layer, then get_into" \
  "$(echo "$json" | field "['whole']['exposed_us_p50']")" "$(echo "$json" | field "['whole']['exposed_us_p90']")"
printf '%-52s exposed p50 %7.0f us  p90 %7.0f us\n' "progressive: each layer read as soon as sent" \
  "$(echo "$json" | field "['progressive']['exposed_us_p50']")" \
  "$(echo "$json" | field "['progressive']['exposed_us_p90']")"
fi
