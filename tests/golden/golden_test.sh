#!/bin/bash
# Golden test: Loom's tiny model against PyTorch (Debian python3-torch).
# Runs golden_dump, then golden_test.py with /usr/bin/python3, for the plain
# projector, the pixel-shuffle projector and tiny-gen (a generator after the
# LLM).
set -euo pipefail
dump="$TEST_SRCDIR/$TEST_WORKSPACE/tests/golden/golden_dump"
script="$TEST_SRCDIR/$TEST_WORKSPACE/tests/golden/golden_test.py"
for variant in "" "--pixel_shuffle" "--config=tiny-gen"; do
  out="$TEST_TMPDIR/golden${variant//-/_}.bin"
  "$dump" --out "$out" --steps 10 $variant
  /usr/bin/python3 "$script" "$out"
done

# Mutation check: each deliberate change to the reference model must fail the
# comparison (exit 1, "golden: FAILED"), or the tolerances could hide it.
for mutation in rope-pairs rms-eps no-causal gelu-erf rope-theta decay-all; do
  if /usr/bin/python3 "$script" "$TEST_TMPDIR/golden.bin" "$mutation" >"$TEST_TMPDIR/m.log" 2>&1; then
    echo "golden mutation $mutation passed the comparison: the golden test cannot see it"
    cat "$TEST_TMPDIR/m.log"
    exit 1
  fi
  grep -q "golden: FAILED" "$TEST_TMPDIR/m.log" || { cat "$TEST_TMPDIR/m.log"; exit 1; }
  echo "golden mutation $mutation: fails as it must ($(grep -m1 -o '^  [a-z/_.0-9]*' "$TEST_TMPDIR/m.log" | tr -d ' '))"
done
# The generator's conditioning, on the tiny-gen dump.
for mutation in states-before-norm; do
  if /usr/bin/python3 "$script" "$TEST_TMPDIR/golden__config=tiny_gen.bin" "$mutation" >"$TEST_TMPDIR/m.log" 2>&1; then
    echo "golden mutation $mutation passed the comparison: the golden test cannot see it"
    cat "$TEST_TMPDIR/m.log"
    exit 1
  fi
  grep -q "golden: FAILED" "$TEST_TMPDIR/m.log" || { cat "$TEST_TMPDIR/m.log"; exit 1; }
  echo "golden mutation $mutation: fails as it must ($(grep -m1 -o '^  [a-z/_.0-9]*' "$TEST_TMPDIR/m.log" | tr -d ' '))"
done
