#!/bin/bash
# Golden test of the generator against PyTorch (Debian python3-torch), then
# the mutation check: each deliberate change to the reference must fail.
set -euo pipefail
dir="$TEST_SRCDIR/$TEST_WORKSPACE/tests/golden"
out="$TEST_TMPDIR/generator.bin"
"$dir/generator_dump" --out "$out" --images 3
/usr/bin/python3 "$dir/generator_golden_test.py" "$out"
source "$dir/mutation_check.sh"
for mutation in time-sin-first target-noise causal no-prefix-positions; do
  expect_mutation_fails "$dir/generator_golden_test.py" "$out" "$mutation"
done
