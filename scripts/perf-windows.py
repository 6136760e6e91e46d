#!/usr/bin/env python3
"""Splits a CPU profile of the node by the kind of window it was taken in: where an event subscriber's
cost lands, inside one run (the run-to-run drift of this host is larger than the effect).

    taskset -c 1 strata-node --listen 127.0.0.1:7790 --cores 1 --cpus 1 --dram-only ...   # wait for "ready"
    perf record -k CLOCK_REALTIME -C 1 -g -o perf.data -- sleep 24 &
    taskset -c 0 strata-bench kv --server 127.0.0.1:7790 --op put --value-size 64 --keys 200000 \
        --batch 128 --connections 2 --no-preload --runtime 20 --subscribe-windows 250ms \
        --output-format json > report.json
    scripts/perf-windows.py perf.data report.json [--skip SECONDS]

Each sample is given the kind of the window it fell in (the windows' origin, length and settle time come
from the report; samples in a window's settle time or outside the windows are left out, and so are the
first --skip seconds: a fresh node still growing its index). It prints samples per million puts for each
kind and the difference, by category (the shard's event code, the subscriber's task, softirq network work)
and by leaf symbol, largest differences last. A sample is one period of perf's clock (250 us at its
default 4,000 Hz), so 4 samples per million puts are 1 ns per put.
"""

import argparse
import collections
import json
import re
import subprocess
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("perf_data")
    parser.add_argument("report_json")
    parser.add_argument("--skip", type=float, default=0.0, help="seconds of the run to leave out at its start")
    parser.add_argument("--top", type=int, default=25, help="symbols to list")
    args = parser.parse_args()

    report = json.load(open(args.report_json))
    windows = report.get("windows")
    if not windows:
        sys.exit("the report has no windows: run strata-bench kv with --subscribe-windows")
    start, window, settle = windows["started_unix_s"], windows["window_s"], windows["settle_s"]
    count = windows["windows_each"] * 2
    counted_s = windows["windows_each"] * (window - settle)
    mputs = [windows["puts_per_sec_unobserved"] * counted_s / 1e6, windows["puts_per_sec_observed"] * counted_s / 1e6]

    def kind_of(time):
        offset = time - start
        index = int(offset // window)
        if offset < args.skip or index < 0 or index >= count or offset - index * window < settle:
            return None
        # Off, on, on, off: as subscribe_windows.rs orders them.
        return 1 if index % 4 in (1, 2) else 0

    script = subprocess.run(
        ["perf", "script", "-i", args.perf_data, "-F", "time,ip,sym"], capture_output=True, text=True, check=True
    ).stdout
    leaves = [collections.Counter(), collections.Counter()]
    categories = [collections.Counter(), collections.Counter()]
    for block in script.split("\n\n"):
        lines = [line.strip() for line in block.strip().splitlines() if line.strip()]
        stamp = re.match(r"([0-9.]+):", lines[0]) if lines else None
        if not stamp:
            continue
        kind = kind_of(float(stamp.group(1)))
        if kind is None:
            continue
        symbols = [line.split(" ", 1)[1] if " " in line else line for line in lines[1:]] or ["[unknown]"]
        leaves[kind][symbols[0]] += 1
        stack = " ".join(symbols)
        if "handle_subscribe" in stack:
            category = "the subscriber's task"
        elif "EventLog" in stack or "strata_proto::events" in stack:
            category = "event log"
        elif "handle_softirqs" in stack or "net_rx_action" in stack:
            category = "softirq (network)"
        elif "do_idle" in stack or "cpuidle" in stack:
            category = "idle"
        else:
            category = "other"
        categories[kind][category] += 1

    def per_mput(counter, kind, key):
        return counter[kind][key] / max(mputs[kind], 1e-9)

    print(f"samples per million puts ({mputs[0]:.2f} M unobserved, {mputs[1]:.2f} M observed counted)")
    print(f"  {'unobserved':>10} {'observed':>10} {'diff':>8}")
    totals = [sum(leaves[kind].values()) / max(mputs[kind], 1e-9) for kind in (0, 1)]
    print(f"  {totals[0]:10.0f} {totals[1]:10.0f} {totals[1] - totals[0]:+8.0f}  total")
    for category in sorted(set(categories[0]) | set(categories[1])):
        before, after = per_mput(categories, 0, category), per_mput(categories, 1, category)
        print(f"  {before:10.0f} {after:10.0f} {after - before:+8.0f}  [{category}]")
    rows = sorted(
        (per_mput(leaves, 1, symbol) - per_mput(leaves, 0, symbol), symbol)
        for symbol in set(leaves[0]) | set(leaves[1])
    )
    for difference, symbol in rows[:5] + rows[-args.top :]:
        before = per_mput(leaves, 0, symbol)
        print(f"  {before:10.1f} {before + difference:10.1f} {difference:+8.1f}  {symbol[:100]}")


if __name__ == "__main__":
    main()
