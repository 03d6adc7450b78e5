#!/bin/bash
# The Helm chart rendered offline and checked (see helm_test.py).
set -euo pipefail
r="$TEST_SRCDIR/$TEST_WORKSPACE"
exec /usr/bin/python3 "$r/tests/ops/helm_test.py" "$r/tools/helm-render/helm-render" "$r/helm/loom" "$r" \
  "$r/deploy/grafana/loom.json" "$TEST_TMPDIR"
