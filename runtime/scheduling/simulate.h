// Discrete-event simulation of one training iteration under a plan and an
// assignment, in exactly the order the workers run it
// (services/worker/training_worker_stages.cc):
//
//   encoder stage  every bin of its DP rank forward, slot by slot (microbatch,
//                  then LLM rank), then every backward in the same order;
//                  text-only bins (no encoder cost) skip the encoder;
//   LLM stage      its replica's microbatches in the 1F1B order of the
//                  combined pipeline (parallel::OneFOneBSchedule, encoder
//                  stages first), the same function the workers call;
//   between them   a bin's embeddings from the last encoder stage to the first
//                  LLM stage after `transfer`, their gradients back the same;
//   recompute      a stage keeps each bin's input and runs the forward again
//                  before a backward unless that bin's activations are live
//                  (the last forward the stage ran);
//   allreduce      each stage's gradient allreduce after its last backward.
//
// With `encoder_in_first_llm_stage` (the monolithic layout, Megatron-LM's
// for multimodal models) there are no encoder stages: the first LLM stage of
// each replica runs a bin's encoder forward before its own forward and the
// encoder backward after its own backward, on the same GPUs (no transfer),
// and its allreduce covers the encoder's gradients too. Colocated
// (`colocated`), the encoder keeps its own stages and ranks, run on the
// first LLM stage's GPUs beside that stage's tasks.
//
// With a generator (`generator_dp` > 0) the combined pipeline has one more
// stage after the LLM's last: each generator replica runs its bins'
// pictures (BinAssignment::generator_rank) slot by slot, each bin's
// forward then its backward (the last stage of a 1F1B pipeline: its
// activations are live); a bin's generator forward waits for the LLM's
// last-stage forward (the query states), and that stage's backward of the
// bin for the generator's backward (their gradients). Bins without
// pictures skip it. In the monolithic layout the generator runs inside the
// LLM's last stage instead, as the encoder runs inside its first.
//
// A bin's cost (BinAssignment::encoder, ::llm) is its forward + backward on
// one rank of the module, all stages together; a stage takes its share of it
// (stage shares: runtime/model/config.h's LlmStages / VitStages), and the
// forward is `forward_share` of that. A task starts when its stage is free
// and its inputs have arrived (and with `shared_devices` runs slower while
// other tasks share the devices).
#ifndef LOOM_RUNTIME_SCHEDULING_SIMULATE_H_
#define LOOM_RUNTIME_SCHEDULING_SIMULATE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "runtime/scheduling/assign.h"

namespace loom::sched {

struct SimulationOptions {
  int encoder_dp = 1;
  int encoder_pp = 1;
  int llm_dp = 1;
  int llm_pp = 1;
  int microbatches = 1;
  double encoder_allreduce_seconds = 0;  // per stage, after its last backward
  double llm_allreduce_seconds = 0;
  // Each stage's share of a bin's time; empty: even. Must have pp entries
  // that sum to 1 otherwise.
  std::vector<double> encoder_stage_share, llm_stage_share;
  double encoder_forward_share = 1.0 / 3;  // of forward + backward
  double llm_forward_share = 1.0 / 3;
  // A recomputed forward's time over the forward's (caches are warm the
  // second time).
  double encoder_recompute_ratio = 1;
  double llm_recompute_ratio = 1;
  // Per module: a backward whose activations are not live runs the
  // forward again first (the workers' recompute full); false: activations
  // kept (none, selective).
  bool encoder_recompute = true;
  bool llm_recompute = true;
  // The monolithic layout above: needs encoder_pp 1, encoder_dp == llm_dp
  // and each bin's encoder_rank equal to its llm_rank.
  bool encoder_in_first_llm_stage = false;
  bool timeline = false;  // fill SimulationResult::timeline
  // Ranks that share devices (a CPU job on one host): the forward and
  // backward tasks running at once share `shared_devices` devices, a task
  // of a module taking its TP of them, each progressing at
  // min(1, shared_devices / the running tasks' demand) of its own speed.
  // 0: a device per rank (the GPU model).
  int shared_devices = 0;
  int encoder_tp = 1;
  int llm_tp = 1;
  // Colocated (Plan.colocated): encoder rank k runs on LLM rank k's GPU,
  // one of the LLM's first stage (runtime/parallel/grid.h's rank order;
  // needs encoder_tp x encoder_pp x encoder_dp = llm_tp x llm_dp). Each such
  // GPU is shared (processor sharing) by the tasks running on it at once;
  // a TP task runs at its busiest GPU's pace. Ignored with shared_devices.
  bool colocated = false;
  // The generator's replicas (its stage after the LLM's last); 0: none,
  // or, with encoder_in_first_llm_stage, inside the LLM's last stage.
  int generator_dp = 0;
  int generator_tp = 1;
  double generator_allreduce_seconds = 0;  // in the monolithic layout: the last stage's
  double generator_forward_share = 1.0 / 3;
};

// One task of the simulated timeline (seconds from the iteration's start).
struct SimulatedTask {
  enum Kind { kForward, kBackward, kAllreduce };
  Kind kind = kForward;
  bool encoder = false;
  bool generator = false;  // a generator task (stage llm_pp: after the LLM's last)
  int dp = 0;
  int stage = 0;
  int bin = -1;             // index into the bins; -1 for an allreduce
  bool recomputed = false;  // a backward that ran its forward again first
  double start = 0;
  double end = 0;
};

struct SimulationResult {
  double iteration_seconds = 0;
  double llm_compute_seconds = 0;  // the bins' costs, summed (no recompute)
  double encoder_compute_seconds = 0;
  double generator_compute_seconds = 0;
  // Fraction of the stages' time (iteration x stages) spent on the bins'
  // forward + backward (recompute counts as lost).
  double llm_utilization = 0;
  double encoder_utilization = 0;
  double generator_utilization = 0;
  // Idle share of each stage's time from the iteration's start to the end of
  // its last backward (what the workers measure as their bubble), over all
  // of a module's stages together; 0 for a module without tasks.
  double llm_bubble_fraction = 0;
  double encoder_bubble_fraction = 0;
  double generator_bubble_fraction = 0;
  double recompute_seconds = 0;  // summed over all stages
  int tasks = 0;
  std::vector<SimulatedTask> timeline;  // with options.timeline, by start
};

// INVALID_ARGUMENT if the bins do not match the options (a rank, microbatch
// or encoder rank outside them, a (rank, microbatch) twice or missing, an
// encoder rank other than the LLM rank in the monolithic layout), or the
// stage shares are malformed.
absl::StatusOr<SimulationResult> SimulateIteration(const std::vector<BinAssignment>& bins,
                                                   const SimulationOptions& options);

}  // namespace loom::sched

#endif  // LOOM_RUNTIME_SCHEDULING_SIMULATE_H_
