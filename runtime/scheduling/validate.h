// Validation of the scheduler's predictions (`loom-schedule validate`): one
// job run under several layouts, each with the same measured profile
// (loom-scheduler --profile: the plan's coefficients are the profile's and
// stay fixed), so that every iteration's predicted timeline is the
// profile's prediction of exactly the iteration the workers ran. A run's
// merged trace (loom up --trace) holds both; its figures are read here:
//   predicted_s, measured_s: from the iteration's measured start to the end
//     of its last forward/backward/recompute span (the simulator models the
//     pipeline and the gradient all-reduce, not the optimizer step or the
//     fetches around it), medians over the iterations after the warm-up;
//   step_s: the median wall time of a whole step (loom up's JSON lines);
//   per stage (module, pipeline stage): compute seconds of its busiest rank
//     (measured) or replica (predicted), medians;
//   peak memory per module: the largest rank's measured and predicted bytes
//     (the workers' "measured_bytes" log records).
#ifndef LOOM_RUNTIME_SCHEDULING_VALIDATE_H_
#define LOOM_RUNTIME_SCHEDULING_VALIDATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loom/job/v1/job.pb.h"
#include "loom/trace/v1/trace.pb.h"

namespace loom::sched {

// `layout`, the text of a `parallel { }` body (e.g. "encoder_tp: 2
// llm_pp: 2 microbatches: 4"), over `job`'s parallel: the fields it names
// replace the job's. INVALID_ARGUMENT naming the layout when it does not
// parse.
absl::Status ApplyLayout(const std::string& layout, job::v1::JobConfig* job);

// "encoder_tp: 2 llm_pp: 2 ..." (semicolons separate layouts on the
// command line, so one layout has none).
std::vector<std::string> SplitLayouts(const std::string& layouts);

struct StageFigures {
  bool encoder = false;
  int stage = 0;
  double measured_s = 0, predicted_s = 0;
};

struct LayoutResult {
  std::string layout;
  int iterations = 0;  // compared: those after the warm-up with both timelines
  double predicted_s = 0, measured_s = 0, step_s = 0;
  std::vector<StageFigures> stages;
  int64_t encoder_measured_bytes = -1, encoder_predicted_bytes = -1;
  int64_t llm_measured_bytes = -1, llm_predicted_bytes = -1;
  // Worker ranks of the layout, and the cores of the host they ran on
  // (0: not known): where ranks outnumber cores they share them (loom up
  // tells the scheduler's simulator so: Plan.shared_devices).
  int ranks = 0;
  int host_cores = 0;
  std::string tp_scaled;  // which modules' TP the profile did not measure
  std::string error;      // non-empty: the run gave no figures, and why
};

// The figures of one finished run of `job` (its parallel is the layout's):
// `trace` its merged trace, `json_lines` what loom up --json printed,
// `log_texts` its workers' logs (each "encoder" or "llm" with its text).
// FAILED_PRECONDITION when no iteration after `warmup` has both timelines.
absl::StatusOr<LayoutResult> LayoutFigures(
    const job::v1::JobConfig& job, const trace::v1::TraceFile& trace, const std::string& json_lines,
    const std::vector<std::pair<bool, std::string>>& log_texts, int warmup);

// One JSON line of a layout's figures.
std::string LayoutJson(const LayoutResult& r);

// The closing JSON line: the layouts ranked by predicted and by measured
// time (fastest first, failed ones left out), whether the two agree on the
// fastest, and the largest |predicted / measured - 1|.
std::string RankingJson(const std::vector<LayoutResult>& results);

}  // namespace loom::sched

#endif  // LOOM_RUNTIME_SCHEDULING_VALIDATE_H_
