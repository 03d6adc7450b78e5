#!/bin/bash
# loom-train-local trains from WebDataset shards through the preprocessing
# pipeline: the loss falls, and a run stopped at step 6 and resumed (model,
# optimizer and data cursor from the checkpoint) gives the same losses at
# steps 7-12 as an uninterrupted run.
set -euo pipefail
train=runtime/train/loom-train-local
gen=runtime/data/loom-datagen
dir="$TEST_TMPDIR"
"$gen" --preset caption --samples 64 --seed 5 --out "$dir/shards" --samples_per_shard 16 >/dev/null
common=(--config tiny --batch_size 8 --microbatches 2 --seed 3 --shards "$dir/shards/*.tar")

"$train" "${common[@]}" --steps 12 2>/dev/null > "$dir/full.jsonl"
"$train" "${common[@]}" --steps 6 --checkpoint_dir "$dir/ckpt" --checkpoint_every 6 2>/dev/null > "$dir/a.jsonl"
"$train" "${common[@]}" --steps 12 --checkpoint_dir "$dir/ckpt" --resume 2>"$dir/b.err" > "$dir/b.jsonl"
test -f "$dir/ckpt/step-6/data_cursor.binpb"

loss() { sed -n "s/.*\"step\":$2,\"loss\":\([0-9.]*\).*/\1/p" "$1"; }
steps() { sed -n 's/.*"step":\([0-9]*\),.*/\1/p' "$1" | tr '\n' ' '; }
# The resumed run trains exactly steps 7-12: one that ignored --resume would
# train 1-12 and print the same losses at 7-12.
[ "$(steps "$dir/b.jsonl")" = "7 8 9 10 11 12 " ] || { echo "resumed steps: $(steps "$dir/b.jsonl")"; exit 1; }
for s in 1 2 3 4 5 6; do
  [ "$(loss "$dir/full.jsonl" $s)" = "$(loss "$dir/a.jsonl" $s)" ] || { echo "step $s differs"; exit 1; }
done
for s in 7 8 9 10 11 12; do
  full=$(loss "$dir/full.jsonl" $s); resumed=$(loss "$dir/b.jsonl" $s)
  [ -n "$full" ] && [ "$full" = "$resumed" ] || { echo "step $s: $full vs resumed $resumed"; exit 1; }
done
first=$(loss "$dir/full.jsonl" 1); last=$(loss "$dir/full.jsonl" 12)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }' || { echo "loss $first -> $last"; exit 1; }

# A fresh run in the reused checkpoint folder (stopped at 4) is a new run:
# --resume continues it at 4, never the older run's step 6; another seed is
# refused, naming the identity.
"$train" "${common[@]}" --steps 4 --checkpoint_dir "$dir/ckpt" --checkpoint_every 4 2>/dev/null >/dev/null
"$train" "${common[@]}" --steps 5 --checkpoint_dir "$dir/ckpt" --resume 2>"$dir/c.err" > "$dir/c.jsonl"
[ "$(steps "$dir/c.jsonl")" = "5 " ] || { echo "fresh run resumed at: $(steps "$dir/c.jsonl")"; exit 1; }
[ "$(loss "$dir/c.jsonl" 5)" = "$(loss "$dir/full.jsonl" 5)" ] || { echo "step 5 differs"; exit 1; }
if "$train" --config tiny --batch_size 8 --microbatches 2 --seed 4 --shards "$dir/shards/*.tar" \
    --steps 5 --checkpoint_dir "$dir/ckpt" --resume 2>"$dir/err" >/dev/null; then exit 1; fi
grep -q "another identity" "$dir/err" || { cat "$dir/err"; exit 1; }

# A mixture given in epochs: 64 + 16 samples at weights 3:1, one epoch in
# batches of 8 is 10 steps; stopped at 4 and resumed, it gives the same
# losses as the run straight through (each source's position is in the cursor).
"$gen" --preset caption --samples 16 --seed 6 --out "$dir/more" --samples_per_shard 8 >/dev/null
mix=(--config tiny --batch_size 8 --microbatches 2 --seed 3 --shards "$dir/shards/*.tar=3,$dir/more/*.tar=1")
"$train" "${mix[@]}" --epochs 1 2>"$dir/m.err" > "$dir/mfull.jsonl"
grep -q "1 epochs of 80 samples in batches of 8: 10 steps" "$dir/m.err" || { cat "$dir/m.err"; exit 1; }
[ "$(steps "$dir/mfull.jsonl")" = "1 2 3 4 5 6 7 8 9 10 " ] || { echo "mixture steps: $(steps "$dir/mfull.jsonl")"; exit 1; }
"$train" "${mix[@]}" --steps 4 --checkpoint_dir "$dir/ckm" --checkpoint_every 4 2>/dev/null >/dev/null
"$train" "${mix[@]}" --epochs 1 --checkpoint_dir "$dir/ckm" --resume 2>/dev/null > "$dir/mres.jsonl"
[ "$(steps "$dir/mres.jsonl")" = "5 6 7 8 9 10 " ] || { echo "mixture resumed: $(steps "$dir/mres.jsonl")"; exit 1; }
for s in 5 6 7 8 9 10; do
  full=$(loss "$dir/mfull.jsonl" $s); resumed=$(loss "$dir/mres.jsonl" $s)
  [ -n "$full" ] && [ "$full" = "$resumed" ] || { echo "mixture step $s: $full vs resumed $resumed"; exit 1; }
done
# Another source than the checkpoint's is refused, naming the cursor.
if "$train" --config tiny --batch_size 8 --microbatches 2 --seed 3 --shards "$dir/shards/*.tar" \
    --steps 6 --checkpoint_dir "$dir/ckm" --resume 2>"$dir/err" >/dev/null; then exit 1; fi
grep -q "another identity\|cursor" "$dir/err" || { cat "$dir/err"; exit 1; }

# Clear errors for bad flags.
if "$train" --config tiny --steps 1 --shards "$dir/none/*.tar" 2>"$dir/err"; then exit 1; fi
grep -q "no shard matches" "$dir/err"
if "$train" "${common[@]}" --steps 1 --shuffle_images 2>"$dir/err"; then exit 1; fi
grep -q "cannot be used with --shards" "$dir/err"
if "$train" --config tiny --steps 1 --shards "$dir/shards/*.tar=0" 2>"$dir/err"; then exit 1; fi
grep -q "weight must be a finite number > 0" "$dir/err" || { cat "$dir/err"; exit 1; }
if "$train" --config tiny --epochs 0.01 --batch_size 8 --shards "$dir/shards/*.tar" 2>"$dir/err"; then exit 1; fi
grep -q "do not fill one batch" "$dir/err" || { cat "$dir/err"; exit 1; }
echo "PASS: loss $first -> $last; resume equal at steps 7-12; a mixture resumed equal at 5-10"
