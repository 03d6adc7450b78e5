#!/bin/bash
# tiny-gen trains from loom-datagen's generation shards (text → image mixed
# with understanding) through the preprocessing pipeline: after 80 steps the
# held-out pictures' flow loss is well below the untrained model's, and
# loom-model generate draws from the checkpoint with the data's tokenizer.
set -euo pipefail
bin="$TEST_SRCDIR/$TEST_WORKSPACE"
train="$bin/runtime/train/loom-train-local"
gen="$bin/runtime/data/loom-datagen"
model="$bin/runtime/hf/loom-model"
dir="$TEST_TMPDIR"
"$gen" --preset generation --samples 256 --seed 5 --out "$dir/train" --samples_per_shard 64 >/dev/null
"$gen" --preset generation --samples 48 --seed 6 --out "$dir/held" --samples_per_shard 48 >/dev/null
common=(--config tiny-gen --batch_size 16 --microbatches 2 --seed 3 --shards "$dir/train/*.tar"
  --validation_shards "$dir/held/*.tar" --validation_samples 48)

"$train" "${common[@]}" --steps 1 --validation_every 1 2>/dev/null >"$dir/one.jsonl"
"$train" "${common[@]}" --steps 80 --validation_every 80 --checkpoint_dir "$dir/ck" \
  --checkpoint_every 80 2>"$dir/train.err" >"$dir/full.jsonl"
field() { sed -n "s/.*\"step\":$2,.*\"$3\":\([0-9.]*\).*/\1/p" "$1"; }
before=$(field "$dir/one.jsonl" 1 validation_generation_loss)
after=$(field "$dir/full.jsonl" 80 validation_generation_loss)
images=$(field "$dir/full.jsonl" 80 validation_output_images)
echo "held-out generation loss: $before after 1 step, $after after 80 ($images output images)"
[ -n "$before" ] && [ -n "$after" ] || { cat "$dir/one.jsonl" "$dir/full.jsonl"; exit 1; }
[ "$images" -gt 10 ] || { echo "held-out output images: $images"; exit 1; }
awk -v a="$before" -v b="$after" 'BEGIN { exit !(b < 0.75 * a) }' \
  || { echo "generation loss $before -> $after"; exit 1; }
# Every training step saw output images and understanding samples.
! grep -q '"output_images":0,' "$dir/full.jsonl" || { echo "a step without output images"; exit 1; }

# The checkpoint draws from a prompt tokenized as the data is; the same
# seed the same picture, the untrained weights another; --upscale enlarges.
draw() {  # draw OUT [flags...]
  "$model" generate --config tiny-gen --text "a picture of two red circles in the top left." \
    --euler_steps 8 --out "$1" "${@:2}"
}
draw "$dir/a.png" --checkpoint "$dir/ck/step-80" --upscale 4 >"$dir/a.json"
draw "$dir/b.png" --checkpoint "$dir/ck/step-80" --upscale 4 >/dev/null
draw "$dir/u.png" --upscale 4 >/dev/null
grep -q '"prompt":\[1,[0-9,]*,-2,-2,-2,-2\]' "$dir/a.json" || { cat "$dir/a.json"; exit 1; }
cmp "$dir/a.png" "$dir/b.png"
if cmp -s "$dir/a.png" "$dir/u.png"; then echo "the checkpoint changed nothing"; exit 1; fi
/usr/bin/python3 - "$dir/a.png" <<'PY'
import sys
from PIL import Image
im = Image.open(sys.argv[1])
assert im.size == (64, 64) and im.mode == "RGB", (im.size, im.mode)
px = im.load()
for y in range(0, 64, 4):  # nearest: each 4 x 4 block one colour
    for x in range(0, 64, 4):
        assert len({px[x + i, y + j] for i in range(4) for j in range(4)}) == 1, (x, y)
PY
if "$model" generate --config tiny-gen --text "x" --prompt "image" --out "$dir/x.png" 2>"$dir/err"; then
  exit 1
fi
grep -q -- "--prompt (the synthetic captions' words), --text" "$dir/err" || { cat "$dir/err"; exit 1; }
echo PASS
