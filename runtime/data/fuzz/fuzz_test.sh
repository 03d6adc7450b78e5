#!/bin/bash
# Runs each libFuzzer target for a short time (FUZZ_SECONDS, default 15)
# from a seed corpus of loom-datagen output. Any crash, sanitizer report,
# leak or timeout fails the test and leaves the reproducer in the test's
# undeclared outputs.
set -euo pipefail
secs="${FUZZ_SECONDS:-15}"
out="${TEST_UNDECLARED_OUTPUTS_DIR:-$TEST_TMPDIR}"
work="$TEST_TMPDIR/fuzz"
mkdir -p "$work/tar" "$work/image" "$work/shards"
runtime/data/loom-datagen --preset interleaved --samples 12 --seed 1 --out "$work/shards" \
  --samples_per_shard 3 >/dev/null
cp "$work/shards"/*.tar "$work/tar/"
(cd "$work/image" && for t in "$work"/shards/*.tar; do tar xf "$t"; done && rm -f ./*.json)

for target in fuzz_tar:tar fuzz_image:image; do
  bin="runtime/data/fuzz/${target%%:*}"
  corpus="$work/${target##*:}"
  echo "== $bin for ${secs}s on $(ls "$corpus" | wc -l) seeds"
  "$bin" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -max_len=262144 \
    -artifact_prefix="$out/" -print_final_stats=1 "$corpus" 2>&1 | tail -n 12
done
echo PASS
