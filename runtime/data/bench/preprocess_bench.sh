#!/bin/bash
# Preprocessing benchmark (not a test): Loom's decode + tile + tokenize
# against PIL's decode + resize of the same images to the same sizes, on the
# onevision preset, one thread each, alternating rounds in one run.
#   bazel run -c opt //runtime/data/bench:preprocess_bench -- [SAMPLES]
set -euo pipefail
samples="${1:-300}"
export RUNFILES_DIR="${RUNFILES_DIR:-$(cd "$0.runfiles" && pwd)}"
here="$RUNFILES_DIR/loom/runtime/data/bench"
bin="$here/preprocess_bench_bin"
gen="$RUNFILES_DIR/loom/runtime/data/loom-datagen"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$gen" --preset onevision --samples "$samples" --seed 1 --out "$work/shards" >/dev/null
loom_best=0; pil_best=0
for round in 1 2 3; do
  l=$("$bin" --shards "$work/shards/*.tar" --plan "$work/plan.jsonl" --rounds 1 | sed -n 's/LOOM_SAMPLES_PER_SEC //p')
  p=$(/usr/bin/python3 "$here/pil_bench.py" "$work/plan.jsonl" 1 "$samples" | sed -n 's/PIL_SAMPLES_PER_SEC //p')
  echo "round $round: loom $l samples/s, pil $p samples/s"
  loom_best=$(awk -v a="$loom_best" -v b="$l" 'BEGIN{print (b>a)?b:a}')
  pil_best=$(awk -v a="$pil_best" -v b="$p" 'BEGIN{print (b>a)?b:a}')
done
awk -v l="$loom_best" -v p="$pil_best" -v n="$samples" 'BEGIN {
  printf "onevision, %d samples, one core: loom %.1f samples/s (decode+tile+tokenize), PIL %.1f samples/s (decode+resize); ratio %.2fx\n", n, l, p, l/p }'
