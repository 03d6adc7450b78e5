// The static parallel plan (DistTrain's disaggregated model orchestration,
// DFLOP's exhaustive search): from the cluster, the model and macro-batch
// statistics, choose the GPUs of the encoder and of the LLM, each module's
// TP / PP / DP and the microbatch count, minimising the predicted iteration
// time of the 1F1B pipeline under the memory limit. Memory is the runtime's
// (runtime/model/memory.h: what the workers hold on a GPU, stage by stage,
// at the largest microbatch, 1.3 times the mean), under the job's
// `recompute` as the workers run it (full: each stage keeps its in-flight
// microbatches' inputs and one microbatch's activations, and the time model
// adds a forward per backward; none and selective: every in-flight
// microbatch's activations, selective's less its element-wise outputs,
// whose recompute the time model counts as free: it has no GEMM).
//
// Predicted iteration = (m + pp_enc + pp_llm - 1) * max(encoder stage,
// LLM stage, embedding transfer) + the slower module's gradient allreduce, where a
// stage's time is its share of the macro-batch's mean FLOPs at an efficiency
// that grows with the tokens one GPU sees per microbatch (small microbatches
// leave a GPU idle) and shrinks with TP (its all-reduces). TP stays inside a
// node; the encoder gets the GPUs the LLM leaves.
#ifndef LOOM_RUNTIME_SCHEDULING_PLAN_H_
#define LOOM_RUNTIME_SCHEDULING_PLAN_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "loom/scheduler/v1/scheduler.pb.h"
#include "runtime/model/config.h"
#include "runtime/model/memory.h"
#include "runtime/scheduling/cost_model.h"

namespace loom::sched {

struct ClusterSpec {
  int gpus = 8;
  int gpus_per_node = 8;
  double peak_flops = 989e12;  // H100 SXM dense bf16
  double memory_bytes = 80.0 * (1ull << 30);
  double intra_node_bytes_per_second = 450e9;  // NVLink, one direction
  double inter_node_bytes_per_second = 50e9;   // 400 Gb/s per GPU
  double max_efficiency = 0.6;                 // of peak, at large microbatches
  double saturation_tokens = 2048;  // tokens per GPU per microbatch at half of max_efficiency
};

struct BatchStats {
  int global_batch = 0;  // samples per iteration
  double mean_tiles = 0;
  double mean_image_tokens = 0;
  double mean_length = 0;         // packed length L
  double mean_length_sq = 0;      // E[L^2]
  double mean_output_images = 0;  // the generator's pictures per sample
};

// Statistics of a macro-batch of samples for global batches of `global_batch`.
BatchStats StatsOf(const std::vector<SampleShape>& samples, int global_batch);

struct PlanLimits {
  int max_tp = 8;
  int max_llm_pp = 16;
  int max_encoder_pp = 4;
  int max_microbatches = 64;
  // How the workers keep activations (the job's recompute, both modules):
  // full prices a forward again per backward (AnalyticFlops) and one
  // microbatch's activations; none and selective every in-flight
  // microbatch's (the memory model's).
  Recompute recompute = Recompute::kNone;
  // The encoder's, when it differs from the LLM's (`recompute`).
  std::optional<Recompute> encoder_recompute;
  // Choose each module's recompute as well (none, selective, full: the
  // fastest layout that fits, none before selective before full at equal
  // time); `recompute` and `encoder_recompute` are then ignored. Every
  // plan records its modules' recompute (Plan.encoder_recompute,
  // llm_recompute).
  bool search_recompute = false;
  // Consider colocated layouts too (Plan.colocated: the encoder's ranks on
  // the LLM's first-stage GPUs, an encoder TP group over whole LLM TP
  // groups so that they slow together).
  bool colocate = true;
  // Price the encoder's and the LLM's activations under sequence
  // parallelism at tp > 1 (the runtime's; its plans then set
  // Plan.sequence_parallel): the same compute and bytes on the wire, a
  // TP group's stream and norm rows 1/tp on each rank.
  bool sequence_parallel = true;
  // 0: every LLM DP degree is tried. x > 0: every one up to 64, then each
  // at least (1 + x) times the last (a large cluster's search in a
  // fraction of the time, a DP within x of any).
  double dp_step = 0;
  double memory_fraction = 0.9;  // of a GPU's memory the plan may use
  // Modules that do not train: cheaper backward (AnalyticFlops), weights
  // alone in memory (no gradients or moments), no gradient allreduce.
  Frozen frozen;
  // The job's precision and optimizer sharding (ZeRO-1 over each module's
  // DP ranks), which the memory model prices.
  Precision precision = Precision::kBf16;
  bool shard_optimizer = false;
};

// Cost coefficients of one GPU of `cluster` running a whole module at the
// cluster's max_efficiency (for assignments without a searched plan).
// The planner's model of tensor parallelism: TP ranks run a layer at
// tp x TpEfficiency(tp) the speed of one (its all-reduces, smaller GEMMs).
double TpEfficiency(int tp);

scheduler::v1::CostCoefficients CoefficientsOnOneGpu(const ModelConfig& model,
                                                     const ClusterSpec& cluster,
                                                     const Frozen& frozen = {});

// INVALID_ARGUMENT for an impossible input (fewer than 2 GPUs, an empty
// batch, ...); RESOURCE_EXHAUSTED when no configuration fits in memory.
absl::StatusOr<scheduler::v1::Plan> SearchPlan(const ClusterSpec& cluster, const ModelConfig& model,
                                               const BatchStats& stats, const PlanLimits& limits);
// The `count` best layouts that fit (distinct degrees, each at its best
// microbatch count), best first (fewer when fewer fit): the candidates a
// macro-batch simulation chooses among (macro.h). Errors as SearchPlan's.
absl::StatusOr<std::vector<scheduler::v1::Plan>> SearchPlans(const ClusterSpec& cluster,
                                                             const ModelConfig& model,
                                                             const BatchStats& stats,
                                                             const PlanLimits& limits, int count);

// A kind of GPU in a heterogeneous cluster (issue 43 item 5): how many
// there are, one's figures (its ClusterSpec: peak, memory, GPUs per node,
// links within and between nodes, efficiency; `gpus` ignored) and its
// price.
struct GpuKind {
  std::string name;
  int count = 0;
  ClusterSpec gpu;
  double price_per_hour = 0;  // of one GPU
  // The Kubernetes node labels of this kind's nodes (gpu_kinds.h), for the
  // chart's per-module placement; the search does not read them.
  std::map<std::string, std::string> node_selector;
};

struct HeterogeneousOptions {
  // false: the shortest predicted iteration. true: the least cost per
  // sample (the GPUs used times their prices, over the samples an hour)
  // among plans predicted no slower than max_iteration_seconds (0: any),
  // the LLM's kind's count also tried at a half, a quarter and an eighth.
  bool minimise_cost = false;
  double max_iteration_seconds = 0;
};

// The plan search over a cluster of several GPU kinds: each module on one
// kind, every pair tried. Both on one kind: SearchPlans' search on it
// (disaggregated or colocated). On two: the LLM on all of its kind's GPUs
// it has whole replicas for, the encoder on all of its kind's or a half, a
// quarter, ... down to a 128th of them (each at its kind's rates and
// memory; the embeddings over the slower of the two kinds' links). With no
// dp_step in the limits, 0.01. The
// plan's modules name their kind (ModulePlan.gpu_kind) and it carries
// cost_per_hour. The limits' recompute as given (not searched).
// INVALID_ARGUMENT for no kinds, a kind without GPUs, a name twice;
// RESOURCE_EXHAUSTED when nothing fits (or meets the time bound).
absl::StatusOr<scheduler::v1::Plan> SearchHeterogeneousPlan(const std::vector<GpuKind>& kinds,
                                                            const ModelConfig& model,
                                                            const BatchStats& stats,
                                                            const PlanLimits& limits,
                                                            const HeterogeneousOptions& options);
// The `count` best of the search's candidates (the best of each pair of
// kinds and counts tried), best first: what a simulation chooses among.
absl::StatusOr<std::vector<scheduler::v1::Plan>> SearchHeterogeneousPlans(
    const std::vector<GpuKind>& kinds, const ModelConfig& model, const BatchStats& stats,
    const PlanLimits& limits, const HeterogeneousOptions& options, int count);

// The monolithic layout Megatron-LM runs multimodal models in, for
// comparison (DistTrain's baseline): one TP x PP x DP grid for both modules,
// the encoder inside the LLM's first pipeline stage at the LLM's TP and DP;
// searched over the same TP, PP, DP and microbatch counts under the same
// cost model and Megatron's memory (18 bytes a parameter, 34 · hidden
// bytes a token and layer over TP with sequence parallelism, every
// in-flight microbatch's activations kept), the first stage holding both
// modules' state. The
// LLM's layers split as its own pipeline would (balance_first_stage false),
// or with fewer on the first stage so that it, encoder included, is no
// slower than the others (Megatron's --decoder-first-pipeline-num-layers).
// The plan has encoder_in_first_llm_stage set, encoder.pp 1 and
// encoder.gpus 0. Errors as SearchPlan's.
absl::StatusOr<scheduler::v1::Plan> SearchMonolithicPlan(const ClusterSpec& cluster,
                                                         const ModelConfig& model,
                                                         const BatchStats& stats,
                                                         const PlanLimits& limits,
                                                         bool balance_first_stage);

}  // namespace loom::sched

#endif  // LOOM_RUNTIME_SCHEDULING_PLAN_H_
