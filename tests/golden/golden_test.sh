#!/bin/bash
# Golden test: Loom's tiny model against PyTorch (Debian python3-torch).
# Runs golden_dump, then golden_test.py with /usr/bin/python3, for the plain
# projector and the pixel-shuffle projector.
set -euo pipefail
dump="$TEST_SRCDIR/$TEST_WORKSPACE/tests/golden/golden_dump"
script="$TEST_SRCDIR/$TEST_WORKSPACE/tests/golden/golden_test.py"
for variant in "" "--pixel_shuffle"; do
  out="$TEST_TMPDIR/golden${variant//-/_}.bin"
  "$dump" --out "$out" --steps 10 $variant
  /usr/bin/python3 "$script" "$out"
done
