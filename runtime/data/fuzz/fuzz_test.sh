#!/bin/bash
# Replays each libFuzzer target's committed regression inputs
# (regressions/<target>/: truncated and malformed tars, PNG/JPEG headers that
# claim huge images, empty files; add every reproducer a run finds), then runs
# it for a short time (FUZZ_SECONDS, default 15) from a seed corpus of
# loom-datagen output with a fixed -seed (FUZZ_SEED, default 1), so a failure
# reproduces. Any crash, sanitizer report, leak or timeout fails the test and
# leaves the reproducer in the test's undeclared outputs.
set -euo pipefail
secs="${FUZZ_SECONDS:-15}"
seed="${FUZZ_SEED:-1}"
out="${TEST_UNDECLARED_OUTPUTS_DIR:-$TEST_TMPDIR}"
work="$TEST_TMPDIR/fuzz"
mkdir -p "$work/tar" "$work/image" "$work/shards"
runtime/data/loom-datagen --preset interleaved --samples 12 --seed 1 --out "$work/shards" \
  --samples_per_shard 3 >/dev/null
cp "$work/shards"/*.tar "$work/tar/"
(cd "$work/image" && for t in "$work"/shards/*.tar; do tar xf "$t"; done && rm -f ./*.json)
# WebP, GIF, BMP and CMYK JPEG seeds (regressions/image/seed-*), beside datagen's PNG and JPEG.
cp runtime/data/fuzz/regressions/image/seed-* "$work/image/"

for target in fuzz_tar:tar fuzz_image:image; do
  bin="runtime/data/fuzz/${target%%:*}"
  corpus="$work/${target##*:}"
  regressions=(runtime/data/fuzz/regressions/"${target##*:}"/*)
  echo "== $bin: ${#regressions[@]} regression inputs"
  "$bin" -rss_limit_mb=2048 -timeout=10 -artifact_prefix="$out/" "${regressions[@]}" 2>&1 | tail -n 3
  echo "== $bin for ${secs}s on $(ls "$corpus" | wc -l) seeds, -seed=$seed"
  "$bin" -seed="$seed" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -max_len=262144 \
    -artifact_prefix="$out/" -print_final_stats=1 "$corpus" 2>&1 | tail -n 12
done
echo PASS
