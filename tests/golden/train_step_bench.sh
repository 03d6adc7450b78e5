#!/bin/bash
# Benchmark, not a test: bazel run --config=opt //tests/golden:train_step_bench
set -euo pipefail
here="$(dirname "$0")"
r="${RUNFILES_DIR:-$0.runfiles}/loom"
dump="$(mktemp)"
"$r/tests/golden/golden_dump" --out "$dump" --steps 1 >/dev/null
/usr/bin/python3 "$r/tests/golden/train_step_bench.py" "$dump" "$r/runtime/train/loom-train-local" "$@"
rm -f "$dump"
