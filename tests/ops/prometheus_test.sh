#!/bin/bash
# A real Prometheus (Debian package prometheus) scraping a real `loom up`.
set -euo pipefail
r="$TEST_SRCDIR/$TEST_WORKSPACE"
exec /usr/bin/python3 "$r/tests/ops/prometheus_test.py" "$r/deploy/launcher/loom-up" "$r" \
  "$r/services/scheduler/loomctl" "$r/deploy/prometheus/prometheus.yml" "$r/deploy/grafana/loom.json" \
  "$TEST_TMPDIR"
