#!/bin/bash
# The chart checked by the real tools, for machines that have them (helm 3
# and kubeconform; neither is packaged by Debian, so `./loom test` renders
# the chart with tools/helm-render instead: //tests/ops:helm_test).
#
#   scripts/helm-check.sh            # lint + render + schema-check every object
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in helm kubeconform; do
  command -v "$tool" >/dev/null || { echo "helm-check: $tool not found on PATH" >&2; exit 2; }
done
all_on=(--set serviceMonitor.enabled=true --set podDisruptionBudget.enabled=true
        --set rdma.enabled=true --set resumeStep=100
        --set storage.checkpoints.existingClaim=loom-ckpt --set job.checkpoint.every=100)
helm lint --strict helm/loom
helm lint --strict helm/loom "${all_on[@]}"
# ServiceMonitor is a CRD: kubeconform has no schema for it without a CRD catalog.
helm template train helm/loom | kubeconform -strict -summary -kubernetes-version 1.28.0 -
helm template train helm/loom "${all_on[@]}" |
  kubeconform -strict -summary -kubernetes-version 1.28.0 -skip ServiceMonitor -
