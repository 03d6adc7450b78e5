#!/bin/bash
# tokenizer.json BPE against a pure-Python reference (python3-regex, for
# /usr/bin/python3; ./loom setup installs it).
set -euo pipefail
d="$TEST_SRCDIR/$TEST_WORKSPACE/runtime/hf"
/usr/bin/python3 "$d/bpe_reference_test.py" "$d/bpe_encode" "$TEST_TMPDIR"
