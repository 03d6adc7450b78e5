// Macro-batches (Entrain): a plan judged on the distribution of global
// batches, not on one mean batch. Global batches are drawn from the data
// set's scan (each of global_batch samples, drawn with replacement: a scan
// is itself a sample of the data set), each is assigned under the plan by
// the job's algorithm (runtime/scheduling/assign.h) with the plan's cost
// coefficients, and its iteration simulated as the workers run it
// (simulate.h). A plan whose mean batch balances well can still lose on
// the batches whose long sequences or many images fall on one bin; the
// search (plan.h SearchPlans) hands its best candidates to
// ChooseOverMacroBatches, which keeps the one with the least mean simulated
// iteration (the throughput over many iterations) and records its p50, p90
// and max.
#ifndef LOOM_RUNTIME_SCHEDULING_MACRO_H_
#define LOOM_RUNTIME_SCHEDULING_MACRO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "loom/scheduler/v1/scheduler.pb.h"
#include "runtime/scheduling/cost_model.h"

namespace loom::sched {

struct MacroBatchOptions {
  int batches = 32;  // global batches drawn
  uint64_t seed = 1;
  std::string algorithm = "loom";  // the assignment's (assign.h)
  double ilp_time_limit_seconds = 10;
};

// `batches` global batches of `global_batch` indices into `samples` samples,
// drawn with replacement from MixSeed(seed, batch): the same seed draws the
// same batches on every machine.
std::vector<std::vector<int>> DrawGlobalBatches(int samples, int global_batch, int batches,
                                                uint64_t seed);

// The simulated iteration of `plan` (its degrees, cost coefficients and
// global batch) over global batches drawn from `shapes`. INVALID_ARGUMENT
// for no samples, no batches, or a plan without a global batch; the
// assignment's errors.
absl::StatusOr<scheduler::v1::IterationDistribution> SimulateMacroBatches(
    const scheduler::v1::Plan& plan, const std::vector<SampleShape>& shapes,
    const MacroBatchOptions& options);

// Of `candidates` (best predicted first), the one with the least mean
// simulated iteration over the same drawn batches (the first on a tie),
// with its distribution in `simulated`; every candidate's distribution, in
// their order, into `each` when given. INVALID_ARGUMENT for no candidates.
absl::StatusOr<scheduler::v1::Plan> ChooseOverMacroBatches(
    const std::vector<scheduler::v1::Plan>& candidates, const std::vector<SampleShape>& shapes,
    const MacroBatchOptions& options,
    std::vector<scheduler::v1::IterationDistribution>* each = nullptr);

// A plan's layout as a job's `parallel { }` body reads it, e.g.
// "encoder_tp: 1 encoder_pp: 1 encoder_dp: 2 llm_tp: 2 llm_pp: 2 llm_dp: 3 microbatches: 4".
std::string LayoutText(const scheduler::v1::Plan& plan);

}  // namespace loom::sched

#endif  // LOOM_RUNTIME_SCHEDULING_MACRO_H_
