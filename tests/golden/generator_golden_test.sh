#!/bin/bash
# Golden test of the generator against PyTorch (Debian python3-torch), then
# the mutation check: each deliberate change to the reference must fail.
set -euo pipefail
dir="$TEST_SRCDIR/$TEST_WORKSPACE/tests/golden"
out="$TEST_TMPDIR/generator.bin"
"$dir/generator_dump" --out "$out" --images 3
/usr/bin/python3 "$dir/generator_golden_test.py" "$out"
for mutation in time-sin-first target-noise causal no-prefix-positions; do
  if /usr/bin/python3 "$dir/generator_golden_test.py" "$out" "$mutation" >"$TEST_TMPDIR/m.log" 2>&1; then
    echo "generator mutation $mutation passed the comparison: the golden test cannot see it"
    cat "$TEST_TMPDIR/m.log"
    exit 1
  fi
  grep -q "golden: FAILED" "$TEST_TMPDIR/m.log" || { cat "$TEST_TMPDIR/m.log"; exit 1; }
  echo "generator mutation $mutation: fails as it must ($(grep -m1 -o '^  [a-z/_.0-9]*' "$TEST_TMPDIR/m.log" | tr -d ' '))"
done
