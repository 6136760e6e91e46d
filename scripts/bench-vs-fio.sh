#!/usr/bin/env bash
# strata-bench against fio, side by side on one pre-written file: for each row, fio and strata-bench run
# alternately, PAIRS times each, with the same command line (--ioengine=io_uring: strata-bench's `ring`,
# which works as fio's engine does; STRATA_EXTRA=--ioengine=uring measures glommio's instead); the table
# shows the median of each and the ratio of medians. Alternating pairs, not one long run of each, because
# this machine is shared and noisy.
#
#   scripts/bench-vs-fio.sh [FILE]        FILE defaults to ./target/bench-vs-fio.img (4 GiB, written once)
#   RUNTIME=15 PAIRS=3 SIZE=4g            environment overrides
#   ROWS=qd1                               only the rows whose name matches this (grep -E) pattern
#   STRATA_EXTRA=--spin_before_park=50us   options for strata-bench only (Strata's own settings)
#   FIO_EXTRA=--iodepth_batch_submit=32    options for fio only (e.g. its batching, off by default)
#   MIN_PROBE_IOPS=20000                   refuse to run below this 4 KiB QD 32 probe (a throttled disk)
set -euo pipefail
cd "$(dirname "$0")/.."

file=${1:-target/bench-vs-fio.img}
runtime=${RUNTIME:-15}
pairs=${PAIRS:-3}
size=${SIZE:-4g}

if ! command -v fio >/dev/null; then
    echo "installing fio"
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q fio
fi
cargo build --release -q --bin strata-bench
bench=target/release/strata-bench
mkdir -p "$(dirname "$file")"
if [ ! -f "$file" ] || [ "$(stat -c %s "$file")" -lt "$(numfmt --from=iec "${size^^}")" ]; then
    echo "writing $file ($size) once with fio, so both tools read the same real blocks"
    fio --name=layout --filename="$file" --size="$size" --rw=write --bs=1m --iodepth=8 --direct=1 \
        --ioengine=io_uring --output-format=json >/dev/null
fi
# A throttled virtual disk (seen at 0.2-6 K IOPS for hours, against ~76 K) makes both tools wait on it and
# every ratio ~1: say so before spending the run. MIN_PROBE_IOPS=0 skips the check.
probe=$(fio --name=probe --filename="$file" --rw=randread --bs=4k --iodepth=32 --direct=1 --size="$size" \
    --runtime=2 --time_based --ioengine=io_uring --output-format=json |
    python3 -c 'import json, sys; print(int(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))')
if [ "$probe" -lt "${MIN_PROBE_IOPS:-20000}" ]; then
    echo "the disk gives $probe IOPS at 4 KiB QD 32 (LAB.md: ~76 K): throttled; the ratios would measure it," \
        "not the software. Rerun later, or set MIN_PROBE_IOPS=0 to run anyway." >&2
    exit 2
fi

rows=(
    "4k-randread-qd32|--rw=randread --bs=4k --iodepth=32"
    "4k-randread-qd1|--rw=randread --bs=4k --iodepth=1"
    "4k-randwrite-qd32|--rw=randwrite --bs=4k --iodepth=32"
    "1m-read-qd8|--rw=read --bs=1m --iodepth=8"
    "1m-write-qd8|--rw=write --bs=1m --iodepth=8"
)
results=$(mktemp -d)
common="--direct=1 --size=$size --runtime=$runtime --time_based --filename=$file --lat_percentiles=1 --output-format=json"
selected=()
for row in "${rows[@]}"; do
    if [[ -z "${ROWS:-}" ]] || grep -Eq "${ROWS}" <<<"${row%%|*}"; then selected+=("$row"); fi
done
rows=("${selected[@]}")
# Runs a tool with its JSON report in PREFIX.json and, where perf can count tracepoints, its io_uring_enter
# calls in PREFIX.enters (the issue of system calls per I/O is read off the kernel, not the tools).
count_enters=0
perf stat -x, -e syscalls:sys_enter_io_uring_enter -o /dev/null true 2>/dev/null && count_enters=1
counted() { # PREFIX command...
    local prefix=$1; shift
    if [ "$count_enters" = 1 ]; then
        perf stat -x, -e syscalls:sys_enter_io_uring_enter -o "$prefix.perf" -- "$@" >"$prefix.json"
        awk -F, '/io_uring_enter/ {print $1}' "$prefix.perf" >"$prefix.enters"
    else
        "$@" >"$prefix.json"
    fi
}
for row in "${rows[@]}"; do
    name=${row%%|*}
    options=${row#*|}
    for pair in $(seq 1 "$pairs"); do
        echo "row $name, pair $pair/$pairs" >&2
        # shellcheck disable=SC2086
        counted "$results/$name.fio.$pair" fio --name="$name" $options $common --ioengine=io_uring ${FIO_EXTRA:-}
        # shellcheck disable=SC2086
        counted "$results/$name.strata.$pair" "$bench" --name="$name" $options $common --ioengine=io_uring \
            ${STRATA_EXTRA:-}
    done
done

python3 - "$results" "$pairs" "${rows[@]}" <<'PY'
import json, statistics, sys
results, pairs, rows = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

def enters(path):
    try:
        return float(open(path).read().strip())
    except (OSError, ValueError):
        return float("nan")

def figures(prefix):
    job = json.load(open(f"{prefix}.json"))["jobs"][0]
    side = job["read"] if job["read"]["total_ios"] > 0 else job["write"]
    ios = side["total_ios"]
    runtime_s = side["runtime"] / 1000.0
    cpu_us_per_io = (job["usr_cpu"] + job["sys_cpu"]) / 100.0 * runtime_s / ios * 1e6 if ios else float("nan")
    return {
        "iops": side["iops"],
        "mib_s": side["bw_bytes"] / 2**20,
        "p99_us": side["clat_ns"]["percentile"]["99.000000"] / 1000.0,
        "mean_us": side["clat_ns"]["mean"] / 1000.0,
        # fio's split: submission (slat) + completion (clat) = total (lat). strata-bench cannot split where
        # one system call both submits and waits (glommio's reactor in `uring`; `ring` whenever nothing has
        # completed yet, which is every I/O at depth 1) and counts that submission in clat: compare lat too.
        "slat_mean_us": side["slat_ns"]["mean"] / 1000.0,
        "lat_mean_us": side["lat_ns"]["mean"] / 1000.0,
        "lat_p99_us": side["lat_ns"]["percentile"]["99.000000"] / 1000.0,
        "cpu_us_per_io": cpu_us_per_io,
        "enters_per_io": enters(f"{prefix}.enters") / ios if ios else float("nan"),
    }

print(f"{'row':<18} {'metric':<14} {'fio':>10} {'strata':>10} {'ratio':>7}   (medians of {pairs} alternating pairs)")
for row in rows:
    name = row.split("|")[0]
    fio = [figures(f"{results}/{name}.fio.{p}") for p in range(1, pairs + 1)]
    strata = [figures(f"{results}/{name}.strata.{p}") for p in range(1, pairs + 1)]
    metrics = ["iops", "mib_s", "mean_us", "p99_us", "slat_mean_us", "lat_mean_us", "lat_p99_us", "cpu_us_per_io"]
    for metric in metrics + ["enters_per_io"]:
        a = statistics.median(f[metric] for f in fio)
        b = statistics.median(f[metric] for f in strata)
        print(f"{name:<18} {metric:<14} {a:>10.1f} {b:>10.1f} {b / a if a else float('nan'):>7.3f}")
PY
echo "raw JSON: $results"
