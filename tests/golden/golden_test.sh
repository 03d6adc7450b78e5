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
# comparison; the generator's conditioning on the tiny-gen dump.
source "$TEST_SRCDIR/$TEST_WORKSPACE/tests/golden/mutation_check.sh"
for mutation in rope-pairs rms-eps no-causal gelu-erf rope-theta decay-all; do
  expect_mutation_fails "$script" "$TEST_TMPDIR/golden.bin" "$mutation"
done
expect_mutation_fails "$script" "$TEST_TMPDIR/golden__config=tiny_gen.bin" states-before-norm
