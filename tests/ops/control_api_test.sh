#!/bin/bash
# The control API from python3-grpcio (Debian; /usr/bin/python3).
set -euo pipefail
r="$TEST_SRCDIR/$TEST_WORKSPACE"
exec /usr/bin/python3 "$r/tests/ops/control_api_test.py" \
  "$r/proto/loom/control/v1/control_descriptor_set.pb" "$r/deploy/launcher/loom-up" \
  "$r" "$r/services/scheduler/loomctl" "$TEST_TMPDIR"
