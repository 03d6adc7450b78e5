#!/bin/bash
# Golden test of the Hugging Face LLM families (hf_golden_test.py) with
# Debian's /usr/bin/python3 and python3-torch, then the mutation check: each
# deliberate mistake in the torch reference must fail the comparison.
set -euo pipefail
here="$TEST_SRCDIR/$TEST_WORKSPACE/runtime/hf"
script="$here/hf_golden_test.py"
dump="$here/hf_golden_dump"
tool="$here/loom-model"
/usr/bin/python3 "$script" "$TEST_TMPDIR" "$dump" "$tool"

for mutation in rope-pairs no-rope-scaling gqa-tiled no-qkv-bias; do
  if /usr/bin/python3 "$script" "$TEST_TMPDIR" "$dump" "$tool" "$mutation" >"$TEST_TMPDIR/m.log" 2>&1; then
    echo "hf golden mutation $mutation passed the comparison: the test cannot see it"
    cat "$TEST_TMPDIR/m.log"
    exit 1
  fi
  grep -q "hf golden: FAILED" "$TEST_TMPDIR/m.log" || { cat "$TEST_TMPDIR/m.log"; exit 1; }
  echo "hf golden mutation $mutation: fails as it must ($(grep -m1 -A1 'FAILED' "$TEST_TMPDIR/m.log" | tail -1 | cut -c1-100))"
done

# What Loom does not run is refused with the field's name, not loaded wrongly.
bad="$TEST_TMPDIR/llama-gqa"
for edit in 'c["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}|rope_type' \
            'c["model_type"] = "qwen3"|qwen3' \
            'del c["rms_norm_eps"]|rms_norm_eps' \
            'c["num_key_value_heads"] = 3|num_key_value_heads' \
            'c["attention_bias"] = True|attention_bias'; do
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
