#!/usr/bin/env bash
# run-fuzz.sh — runs every libFuzzer target in a build folder for a bounded time,
# starting from its seed corpus in fuzz/corpus/<target>/ (copied, so the
# committed seeds stay as they are).  Usage: scripts/run-fuzz.sh BUILD SECONDS
set -euo pipefail
build=$1; secs=$2
root=$(cd "$(dirname "$0")/.." && pwd)
shopt -s nullglob
ran=0
for bin in "$build"/fuzz_*; do
  [[ -x "$bin" && -f "$bin" ]] || continue
  name=$(basename "$bin")
  work=$(mktemp -d)
  [[ -d "$root/fuzz/corpus/$name" ]] && cp -r "$root/fuzz/corpus/$name/." "$work/"
  echo "fuzz: $name for ${secs}s"
  ASAN_OPTIONS=detect_leaks=1 "$bin" -max_total_time="$secs" -max_len=65536 \
     -print_final_stats=0 "$work" 2>&1 | tail -n 3
  rm -rf "$work"
  ran=$((ran + 1))
done
if ((ran == 0)); then echo "run-fuzz: no fuzz targets in $build" >&2; exit 1; fi
