#!/usr/bin/env bash
# The serving engines' virtual environment, target/engines: vLLM with its dependencies, then SGLang and
# LMCache without theirs (they pin other torch builds than vLLM's; what they need on CPU is listed), as pinned
# in client/python/engines.txt, one pip install per line. Reused while that file is unchanged; rebuilt from
# scratch when it changes. Nothing is cached or byte-compiled at install (about 5 GB less on disk): Python
# compiles only what the tests import.
set -euo pipefail
cd "$(dirname "$0")/.."

pins=client/python/engines.txt
venv=target/engines
wanted=$(sha256sum "$pins" | cut -d' ' -f1)
if [[ -x $venv/bin/python && -f $venv/.pins && $(cat "$venv/.pins") == "$wanted" ]]; then
    exit 0
fi

echo "building $venv from $pins (vLLM and torch: about 4.3 GB to download)"
rm -rf "$venv"
python3 -m venv "$venv"
pip=("$venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir --no-compile)
while read -r line; do
    line=${line%%#*}
    read -r -a words <<<"$line"
    ((${#words[@]})) || continue
    "${pip[@]}" "${words[@]}"
done <"$pins"
echo "$wanted" >"$venv/.pins"
