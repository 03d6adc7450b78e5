#!/bin/bash
# Golden test of the Hugging Face LLM families and LLaVA (hf_golden_test.py) with
# Debian's /usr/bin/python3 and python3-torch, then the mutation check: each
# deliberate mistake in the torch reference must fail the comparison.
set -euo pipefail
here="$TEST_SRCDIR/$TEST_WORKSPACE/runtime/hf"
script="$here/hf_golden_test.py"
dump="$here/hf_golden_dump"
tool="$here/loom-model"
/usr/bin/python3 "$script" "$TEST_TMPDIR" "$dump" "$tool"

for mutation in rope-pairs no-rope-scaling gqa-tiled no-qkv-bias vision-last-layer \
                patch-xy-swapped projector-gelu-tanh; do
  if /usr/bin/python3 "$script" "$TEST_TMPDIR" "$dump" "$tool" "$mutation" >"$TEST_TMPDIR/m.log" 2>&1; then
    echo "hf golden mutation $mutation passed the comparison: the test cannot see it"
    cat "$TEST_TMPDIR/m.log"
    exit 1
  fi
  grep -q "hf golden: FAILED" "$TEST_TMPDIR/m.log" || { cat "$TEST_TMPDIR/m.log"; exit 1; }
  echo "hf golden mutation $mutation: fails as it must ($(grep -m1 -A1 'FAILED' "$TEST_TMPDIR/m.log" | tail -1 | cut -c1-100))"
done

# What Loom does not run is refused with the field's name, not loaded wrongly.
refused() {  # DIR, then "python edit of c|field the error must name" ...
  local bad="$1" edit change field
  shift
  for edit in "$@"; do
    change="${edit%%|*}" field="${edit##*|}"
    cp "$bad/config.json" "$bad/config.json.orig"
    /usr/bin/python3 -c "import json; p='$bad/config.json'; c=json.load(open(p)); $change; json.dump(c, open(p, 'w'))"
    if "$tool" logits --hf "$bad" --tokens 1,2 >"$TEST_TMPDIR/e.log" 2>&1; then
      echo "loom-model accepted a config with $change"; exit 1
    fi
    grep -q "$field" "$TEST_TMPDIR/e.log" || { echo "error does not name $field:"; cat "$TEST_TMPDIR/e.log"; exit 1; }
    echo "refused: $(cat "$TEST_TMPDIR/e.log")"
    mv "$bad/config.json.orig" "$bad/config.json"
  done
}
refused "$TEST_TMPDIR/llama-gqa" \
  'c["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}|rope_type' \
  'c["model_type"] = "qwen3"|qwen3' \
  'del c["rms_norm_eps"]|rms_norm_eps' \
  'c["num_key_value_heads"] = 3|num_key_value_heads' \
  'c["attention_bias"] = True|attention_bias'
refused "$TEST_TMPDIR/llava-clip-llama" \
  'c["vision_feature_select_strategy"] = "full"|vision_feature_select_strategy' \
  'c["vision_feature_layer"] = [-2, -5]|vision_feature_layer' \
  'c["vision_feature_layer"] = -9|vision_feature_layer' \
  'c["projector_hidden_act"] = "relu"|projector_hidden_act' \
  'c["vision_config"]["hidden_act"] = "silu"|hidden_act' \
  'del c["image_token_index"]|image_token_index' \
  'c["image_seq_length"] = 577|image_seq_length' \
  'c["vision_config"]["model_type"] = "pixtral"|model_type'
refused "$TEST_TMPDIR/llava-siglip-qwen2" \
  'c["vision_feature_select_strategy"] = "default"|vision_feature_select_strategy' \
  'c["text_config"]["use_sliding_window"] = True|use_sliding_window'

# A LLaVA checkpoint with a tensor the config does not explain is refused by name.
/usr/bin/python3 - "$TEST_TMPDIR/llava-siglip-qwen2/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
buf = open(p, "rb").read()
(n,) = struct.unpack_from("<Q", buf, 0)
h = json.loads(buf[8:8 + n])
end = max(e["data_offsets"][1] for k, e in h.items() if k != "__metadata__")
h["model.multi_modal_projector.linear_3.weight"] = {"dtype": "F32", "shape": [1], "data_offsets": [end, end + 4]}
hb = json.dumps(h).encode()
hb += b" " * ((8 - len(hb) % 8) % 8)
open(p, "wb").write(struct.pack("<Q", len(hb)) + hb + buf[8 + n:] + b"\0" * 4)
PY
if "$tool" logits --hf "$TEST_TMPDIR/llava-siglip-qwen2" --tokens 1,2 >"$TEST_TMPDIR/e.log" 2>&1; then
  echo "loom-model loaded a LLaVA checkpoint with an unknown tensor"; exit 1
fi
grep -q "linear_3.weight is not part of the LLaVA model" "$TEST_TMPDIR/e.log" || { cat "$TEST_TMPDIR/e.log"; exit 1; }
echo "refused: $(cat "$TEST_TMPDIR/e.log")"
