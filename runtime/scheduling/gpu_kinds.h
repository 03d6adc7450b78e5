// A cluster of several GPU kinds, as the heterogeneous plan search takes it
// (plan.h SearchHeterogeneousPlans), read from a JSON file
// (`loom-schedule plan --gpu_kinds FILE`):
//
//   {"kinds": [
//     {"name": "H100", "count": 1024, "tflops": 989, "memory_gib": 80,
//      "price_per_hour": 3.0, "gpus_per_node": 8, "intra_node_gb_per_s": 450,
//      "inter_node_gbps": 400,
//      "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
//     {"name": "L40S", "count": 2048, "tflops": 362, "memory_gib": 48, ...}]}
//
// name, count, tflops (peak dense bf16 of one GPU), memory_gib and
// price_per_hour (of one GPU) are required; gpus_per_node (8),
// intra_node_gb_per_s (GB/s between GPUs of a node, one direction: 450) and
// inter_node_gbps (Gb/s per GPU between nodes: 400) are optional. A kind's
// node_selector is the Kubernetes node labels of its nodes: the chart's
// values place each module of a plan on its kind's nodes with it.
#ifndef LOOM_RUNTIME_SCHEDULING_GPU_KINDS_H_
#define LOOM_RUNTIME_SCHEDULING_GPU_KINDS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/scheduling/plan.h"

namespace loom::sched {

// The kinds of `json_text`. INVALID_ARGUMENT naming the kind and the field
// for text that is not JSON, a missing or mistyped field, a field not
// listed above, a count or gpus_per_node not a whole number from 1 to
// 2^30, a peak, memory or link not above 0, a negative price, or a name
// given twice.
absl::StatusOr<std::vector<GpuKind>> ParseGpuKinds(const std::string& json_text);

// ParseGpuKinds of the file at `path` (NOT_FOUND when there is none).
absl::StatusOr<std::vector<GpuKind>> ReadGpuKinds(const std::string& path);

}  // namespace loom::sched

#endif  // LOOM_RUNTIME_SCHEDULING_GPU_KINDS_H_
