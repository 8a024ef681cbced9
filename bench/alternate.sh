#!/usr/bin/env bash
# Two builds of the extensions compared in alternated processes (bench/NOTES.md, "next tree"
# prefetch): each pair runs build A then build B (their worker/_*.so swapped in from two
# directories), PAIRS times; each run prints bench/quick.py's rows/s a model.
#   bench/alternate.sh DIR_A DIR_B [PAIRS]
set -euo pipefail
cd "$(dirname "$0")/.."
A="$1" B="$2" PAIRS="${3:-10}"
keep=$(mktemp -d)
cp worker/_*.so "$keep"/
trap 'cp "$keep"/_*.so worker/; rm -rf "$keep"' EXIT
for i in $(seq "$PAIRS"); do
  for side in A B; do
    dir=$A; [[ $side == B ]] && dir=$B
    cp "$dir"/_*.so worker/
    .venv/bin/python bench/quick.py | sed "s/^/pair $i $side /"
  done
done
