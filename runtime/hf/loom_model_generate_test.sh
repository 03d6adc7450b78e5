#!/bin/bash
# loom-model generate --config tiny-gen: an image drawn by a trained
# checkpoint's generator, written as a PNG of the generator's size; the same
# seed draws the same bytes, another seed or the untrained weights others;
# bad prompts and configs are named. export --config writes the checkpoint
# in Loom's own form, which generate --config reads back.
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

# export --config: the checkpoint as safetensors with Loom's config.json;
# generate --config reads it back and draws the checkpoint's bytes (f32);
# bf16 narrows every tensor and still draws.
"$model" export --config tiny-gen --checkpoint "$t/ck/step-5" --out "$t/export" --dtype f32
/usr/bin/python3 - "$t/export" <<'PY'
import json, struct, sys
d = sys.argv[1]
c = json.load(open(d + "/config.json"))
assert c["model_type"] == "loom" and c["loom_config"] == "tiny-gen", c
assert c["text_config"]["gen_queries"] == 4 and c["generator_config"]["queries"] == 4, c
raw = open(d + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
names = [k for k in header if k != "__metadata__"]
sets = {k.split(".")[0] for k in names}
assert sets == {"encoder", "projector", "llm", "generator", "generator_denoiser"}, sets
assert all(header[k]["dtype"] == "F32" for k in names)
assert "llm.gen_queries" in names, sorted(names)[:8]
PY
line="$("$model" generate --config "$t/export" --prompt "image of one red square left" \
  --euler_steps 4 --out "$t/exported.png")"
grep -q '"prompt":\[1,3,4,5,8,14,17,-2,-2,-2,-2\]' <<<"$line"
cmp "$t/a.png" "$t/exported.png"
# Without --config: the checkpoint's own model (its COMPLETE identity).
"$model" export --checkpoint "$t/ck/step-5" --out "$t/export16" >/dev/null
grep -q '"torch_dtype": "bfloat16"' "$t/export16/config.json"
grep -q '"loom_config": "tiny-gen"' "$t/export16/config.json"
"$model" generate --config "$t/export16" --prompt "image of one red square left" \
  --euler_steps 4 --out "$t/exported16.png" >/dev/null

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
fails_with 'not a Loom export' \
  "$model" generate --config "$t/ck/step-5" --prompt "image" --out "$t/x.png"
fails_with '--checkpoint: an export' "$model" generate --config "$t/export" \
  --checkpoint "$t/ck/step-5" --prompt "image" --out "$t/x.png"
fails_with 'export --config NAME (one of Loom' \
  "$model" export --config tiny-gen --out "$t/nockpt"
fails_with '--checkpoint:' \
  "$model" export --config tiny-deep --checkpoint "$t/ck/step-5" --out "$t/wrong"
echo "loom-model generate and export --config: PASS"
