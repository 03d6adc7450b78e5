// Discrete-event simulation of one training iteration under a plan and an
// assignment: encoder DP ranks (each a pipeline of encoder stages), the
// embedding transfer to the LLM, LLM DP ranks each a pipeline of stages in
// 1F1B, the gradients back, and the gradient allreduce of each module.
//
// Every stage is a resource that runs its tasks in a fixed order: an LLM
// stage s of p_llm does p_llm-s-1 warm-up forwards, then one forward one
// backward, then the drain; an encoder stage s (the combined pipeline has
// p = p_enc + p_llm stages) runs the forwards of microbatch slot t and then
// the backwards of slot t-(p-s-1). A task starts when its stage is free and
// its inputs have arrived. Forward is 1/3 of a bin's cost, backward 2/3, split
// evenly over a module's stages.
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
};

struct SimulationResult {
  double iteration_seconds = 0;
  double llm_compute_seconds = 0;  // summed over LLM stages
  double encoder_compute_seconds = 0;
  // Fraction of the LLM stages' time (iteration x stages) spent computing.
  double llm_utilization = 0;
  double encoder_utilization = 0;
  int tasks = 0;
};

// INVALID_ARGUMENT if the bins do not match the options (a rank, microbatch
// or encoder rank outside them, a (rank, microbatch) twice or missing).
absl::StatusOr<SimulationResult> SimulateIteration(const std::vector<BinAssignment>& bins,
                                                   const SimulationOptions& options);

}  // namespace loom::sched

#endif  // LOOM_RUNTIME_SCHEDULING_SIMULATE_H_
