#!/bin/bash
# The Dockerfiles checked without a container runtime (see docker_test.py).
set -euo pipefail
r="$TEST_SRCDIR/$TEST_WORKSPACE"
exec /usr/bin/python3 "$r/tests/ops/docker_test.py" "$r" \
  //services:binaries //services/scheduler:loomctl //runtime/data:libloom_spm.so \
  //runtime/data:tokenizer_model
