#!/usr/bin/env bash
# RDMA in the soft-RoCE guest (tests/lab/rdma-guest): strata-bench kv --transport rdma against strata-node
# --rdma-device rxe0, and perftest's ib_write_bw / ib_read_bw at the same message size, in the same guest run
# on the same emulated device. One guest CPU under TCG runs everything (node, bench, rxe): the figures are
# slow in absolute terms; the ratios are the point.
#   SIZE=1m BATCH=8 CONNECTIONS=1 RUNTIME=10 scripts/bench-rdma.sh
# Prints one line per row and the ratios; the guest's own lines are in /var/tmp/strata-rdma-guest/last-run.log.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${SIZE:-1m}
BATCH=${BATCH:-8}
RUNTIME=${RUNTIME:-10}
KEYS=${KEYS:-64}
CONNECTIONS=${CONNECTIONS:-1}
cargo build --release -q -p strata-tools --features rdma --bin strata-node --bin strata-bench
bytes=$(python3 -c "import sys; s=sys.argv[1].lower(); m={'k':1<<10,'m':1<<20,'g':1<<30}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$SIZE")
iterations=$((256 * 1048576 / bytes))
script=$(mktemp)
trap 'rm -f "$script"' EXIT
cat >"$script" <<GUEST
strata-node --listen 10.0.2.15:7600 --cpus 0 --dram 1GiB --dram-only --hugepages false --metrics 127.0.0.1:9600 \
  --rdma-device rxe0 >/tmp/node.log 2>&1 &
node=\$!
for i in \$(seq 1 300); do grep -q ready /tmp/node.log && break; sleep 0.2; done
grep -q ready /tmp/node.log || { cat /tmp/node.log; exit 1; }
kv() { strata-bench kv --server 10.0.2.15:7600 --metrics off --output-format=json --transport rdma \
  --rdma-device rxe0 --value-size $SIZE --keys $KEYS --batch $BATCH --connections $CONNECTIONS "\$@"; }
# Stored once, each byte checked once; then the timed rows.
kv --op put --once >/dev/null
echo "verify \$(kv --op get --no-preload --verify --runtime 2)"
echo "get \$(kv --op get --no-preload --runtime $RUNTIME)"
echo "get-unchecked \$(kv --op get --no-preload --skip-crc --runtime $RUNTIME)"
echo "put \$(kv --op put --no-preload --runtime $RUNTIME)"
# What waiting for completions cost: reactor waits against work requests posted, over the whole run.
wget -qO- http://127.0.0.1:9600/metrics | grep -E '^strata_rdma_(waits|work_requests|failures)_total' |
  sed 's/^/metric /'
# perftest TOOL: its server in the background, its client 2 s later, the client's line for this size.
perftest() {
  \$1 -d rxe0 -x 1 -F -s $bytes -n $iterations >/tmp/\$1.out 2>&1 &
  server=\$!
  sleep 2
  \$1 -d rxe0 -x 1 -F -s $bytes -n $iterations 10.0.2.15 >/tmp/\$1-client.out 2>&1
  wait \$server
  echo "\$1 \$(grep -E '^ *$bytes ' /tmp/\$1-client.out | tail -1)"
}
perftest ib_write_bw
perftest ib_read_bw
kill -INT \$node 2>/dev/null
GUEST
tests/lab/rdma-guest run 900 "$script" target/release/strata-node target/release/strata-bench >/dev/null
python3 - "$bytes" /var/tmp/strata-rdma-guest/last-run.log <<'PY'
import json, sys
size, log = int(sys.argv[1]), sys.argv[2]
rows = {}
for line in open(log):
    line = line[len("RDMA: "):].strip() if line.startswith("RDMA: ") else ""
    name, _, rest = line.partition(" ")
    if name in ("verify", "get", "get-unchecked", "put"):
        rows[name] = json.loads(rest)
    elif name == "metric":
        key, value = rest.rsplit(" ", 1)
        rows[key.split("{")[0]] = rows.get(key.split("{")[0], 0) + float(value)
    elif name in ("ib_write_bw", "ib_read_bw") and rest:
        rows[name] = float(rest.split()[3]) * 1e6  # BW average [MB/sec], MB = 10^6 bytes
assert rows["verify"]["errors"] == 0 and rows["verify"]["mismatches"] == 0, rows["verify"]
for op, reference in (("get", "ib_write_bw"), ("get-unchecked", "ib_write_bw"), ("put", "ib_read_bw")):
    assert rows[op]["errors"] == 0, rows[op]
    ours = rows[op]["ops_per_sec"] * size
    print(f"{op} {size} B by RDMA: {ours / 1e6:8.1f} MB/s   {reference}: {rows[reference] / 1e6:8.1f} MB/s   "
          f"ratio {ours / rows[reference]:.2f}   (p50 {rows[op]['lat_ns']['p50'] / 1e3:.0f} us per call)")
posted, waits = rows.get("strata_rdma_work_requests_total", 0), rows.get("strata_rdma_waits_total", 0)
print(f"node: {posted:.0f} RDMA work requests, {waits:.0f} reactor waits ({waits / max(posted, 1):.2f} per request), "
      f"{rows.get('strata_rdma_failures_total', 0):.0f} failed")
PY
