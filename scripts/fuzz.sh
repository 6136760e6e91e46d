#!/usr/bin/env bash
# Runs every fuzz target of the project for RUNS executions each (default 10,000,000), with libFuzzer through
# cargo-fuzz (a nightly toolchain; cargo-fuzz is installed if missing), each on its corpus under
# <crate>/fuzz/corpus/<target>, which libFuzzer extends and this script then minimises. Exits non-zero at the
# first crash; libFuzzer leaves the input that crashed under <crate>/fuzz/artifacts/<target>/.
#   scripts/fuzz.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10000000}
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
targets=(proto:frame_decoder nvme:pdu_decoder engine:region_scan)
for entry in "${targets[@]}"; do
    crate=${entry%%:*}
    target=${entry##*:}
    corpus="fuzz/corpus/$target"
    mkdir -p "$crate/$corpus"
    echo "== $crate/$target: $runs runs"
    log=$(mktemp)
    if ! (cd "$crate" && cargo +nightly fuzz run --sanitizer none "$target" "$corpus" -- -runs="$runs" -print_final_stats=1) \
        >"$log" 2>&1; then
        tail -40 "$log" >&2
        echo "$crate/$target: failed (the input is under $crate/fuzz/artifacts/$target)" >&2
        exit 1
    fi
    grep -E "^(Done [0-9]+ runs|stat::number_of_executed_units|stat::peak_rss_mb)" "$log" || true
    rm -f "$log"
    (cd "$crate" && cargo +nightly fuzz cmin --sanitizer none "$target" "$corpus" >/dev/null 2>&1) || true
done
echo "fuzz: every target ran $runs executions without a crash"
