// One iteration's assignment under a plan, as the service and loom-schedule
// hand it out: the algorithm's bins with sample keys, and a summary (quality
// against the lower bounds, the simulated iteration, the algorithm's time).
#ifndef LOOM_RUNTIME_SCHEDULING_SCHEDULE_H_
#define LOOM_RUNTIME_SCHEDULING_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "loom/scheduler/v1/scheduler.pb.h"
#include "loom/trace/v1/trace.pb.h"
#include "runtime/scheduling/assign.h"
#include "runtime/scheduling/simulate.h"

namespace loom::sched {

// The degrees a job or the flags give instead of a plan file (0: not given).
struct Degrees {
  int llm_dp = 0;
  int microbatches = 0;
  int encoder_dp = 0;
  int llm_tp = 1;
  int encoder_tp = 1;
  int llm_pp = 1;
  int encoder_pp = 1;
  bool colocate = false;  // Plan.colocated
  int generator_dp = 0;   // 0: no generator (Plan.generator unset)
  int generator_tp = 1;
  int generator_pp = 1;
};

// The worker processes of a plan: the encoder's, the LLM's and the
// generator's ranks.
inline int PlanWorkerRanks(const scheduler::v1::Plan& plan) {
  return plan.encoder().gpus() + plan.llm().gpus() + plan.generator().gpus();
}

// A plan of the given degrees with no cost prediction (`--llm_dp ...`).
scheduler::v1::Plan PlanOfDegrees(const Degrees& d);

// The job's plan from `--plan FILE` (JSON of loom-schedule plan) or from the
// degrees; INVALID_ARGUMENT naming the flag when both or neither are given,
// or the file is not a plan.
absl::StatusOr<scheduler::v1::Plan> PlanFromFileOrDegrees(const std::string& path,
                                                          const Degrees& d);

// The simulator's options for a plan: its degrees, allreduce times, stage
// and forward shares, recompute ratios and each module's recompute (full
// where the plan names none, as the workers run by default).
SimulationOptions SimulationOptionsFor(const scheduler::v1::Plan& plan);

// INVALID_ARGUMENT: a plan without degrees, keys and loads of different
// lengths; otherwise Assign's errors. In a monolithic plan
// (encoder_in_first_llm_stage) each bin's encoder rank is its LLM rank. With `timeline`, the
// simulated iteration's tasks and bins go there (PredictedTrace).
struct PredictedIteration {
  std::vector<BinAssignment> bins;
  SimulationResult simulation;  // with its timeline
};
absl::StatusOr<scheduler::v1::Assignment> AssignForPlan(const scheduler::v1::Plan& plan,
                                                        const std::vector<std::string>& keys,
                                                        const std::vector<SampleLoad>& loads,
                                                        const std::string& algorithm,
                                                        double ilp_time_limit_seconds,
                                                        PredictedIteration* timeline = nullptr);

// The predicted timeline of `iteration` as trace spans (runtime/base/trace.h:
// pid 2, one track per module replica and stage, microseconds from the
// iteration's start), named as the workers name theirs; with `name_tracks`,
// each track's name too.
trace::v1::TraceFile PredictedTrace(const PredictedIteration& p, int64_t iteration,
                                    bool name_tracks);

}  // namespace loom::sched

#endif  // LOOM_RUNTIME_SCHEDULING_SCHEDULE_H_
