#!/bin/bash
# loom-model generate --config tiny-gen: an image drawn by a trained
# checkpoint's generator, written as a PNG of the generator's size; the same
# seed draws the same bytes, another seed or the untrained weights others;
# bad prompts and configs are named.
set -euo pipefail
bin="$TEST_SRCDIR/$TEST_WORKSPACE"
model="$bin/runtime/hf/loom-model"
train="$bin/runtime/train/loom-train-local"
t="$TEST_TMPDIR"
"$train" --config tiny-gen --steps 5 --batch_size 8 --checkpoint_dir "$t/ck" \
  --checkpoint_every 5 >"$t/train.log"
ls "$t/ck/step-5/generator.ckpt" "$t/ck/step-5/generator_denoiser.ckpt" >/dev/null

draw() {  # draw OUT [flags...]
  local out="$1"
  shift
  "$model" generate --config tiny-gen --prompt "image of one red square left" \
    --euler_steps 4 --out "$out" "$@"
}
line="$(draw "$t/a.png" --checkpoint "$t/ck/step-5")"
echo "$line"
grep -q '"prompt":\[1,3,4,5,8,14,17,-2,-2,-2,-2\]' <<<"$line"
grep -q '"euler_steps":4' <<<"$line"
draw "$t/b.png" --checkpoint "$t/ck/step-5" >/dev/null
draw "$t/c.png" --checkpoint "$t/ck/step-5" --seed 2 >/dev/null
draw "$t/untrained.png" >/dev/null
cmp "$t/a.png" "$t/b.png"
if cmp -s "$t/a.png" "$t/c.png"; then echo "another seed drew the same image"; exit 1; fi
if cmp -s "$t/a.png" "$t/untrained.png"; then echo "the checkpoint changed nothing"; exit 1; fi
/usr/bin/python3 - "$t/a.png" <<'PY'
import sys
from PIL import Image
im = Image.open(sys.argv[1])
assert im.size == (16, 16) and im.mode == "RGB", (im.size, im.mode)
assert len(set(im.getdata())) > 1, "a flat image"
PY

fails_with() {  # fails_with TEXT command...
  local want="$1"
  shift
  if "$@" >"$t/out.log" 2>&1; then echo "accepted: $*"; exit 1; fi
  grep -qF -- "$want" "$t/out.log" || { echo "want \"$want\" in:"; cat "$t/out.log"; exit 1; }
}
fails_with '"mauve" is not a word the model knows' \
  "$model" generate --config tiny-gen --prompt "image of one mauve square" --out "$t/x.png"
fails_with '--config tiny: has no generator' \
  "$model" generate --config tiny --prompt "image" --out "$t/x.png"
fails_with '--config or --hf: one of them' \
  "$model" generate --config tiny-gen --hf /nonexistent --prompt "image" --out "$t/x.png"
fails_with '--out IMAGE.png is required' "$model" generate --config tiny-gen --prompt "image"
fails_with '--euler_steps: must be >= 1' \
  "$model" generate --config tiny-gen --prompt "image" --out "$t/x.png" --euler_steps 0
echo "loom-model generate: PASS"
