#!/usr/bin/env bash
# Runs the seeded simulation of a node (strata_engine::sim) for SEEDS seeds from FROM (default 0), STEPS
# steps each (default 400), in a release build. Stops at the first failing seed and prints it with the steps
# that led there; that seed replays exactly:
#   cargo run --release -p strata-engine --example simulate -- --seed N
# STRATA_SIM_TRACE_LINES=100000 keeps every step of a replay's trace instead of the last 60.
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:?usage: scripts/simulate.sh SEEDS [FROM] [STEPS]}
from=${2:-0}
steps=${3:-400}
cargo build --release -q -p strata-engine --example simulate
exec target/release/examples/simulate --seeds "$seeds" --from "$from" --steps "$steps"
