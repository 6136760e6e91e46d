#!/usr/bin/env bash
# The serving engines' virtual environment, target/engines: vLLM with its dependencies, then SGLang and
# LMCache without theirs (they pin other torch builds than vLLM's; what they need on CPU is listed), as pinned
# in client/python/engines.txt. Reused while that file is unchanged; rebuilt from scratch when it changes.
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
pip=("$venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir)
with_deps=()
without_deps=()
while read -r line; do
    line=${line%%#*}
    read -r -a words <<<"$line"
    ((${#words[@]})) || continue
    if [[ ${words[0]} == --no-deps ]]; then
        without_deps+=("${words[@]:1}")
    else
        with_deps+=("${words[@]}")
    fi
done <"$pins"
"${pip[@]}" "${with_deps[@]}"
"${pip[@]}" --no-deps "${without_deps[@]}"
echo "$wanted" >"$venv/.pins"
