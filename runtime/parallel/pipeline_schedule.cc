#include "runtime/parallel/pipeline_schedule.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "runtime/base/log.h"

namespace loom::parallel {

std::vector<PipelineOp> OneFOneBSchedule(int stages, int stage, int m) {
  LOOM_CHECK(stages >= 1 && stage >= 0 && stage < stages && m >= 1)
      << "stages " << stages << ", stage " << stage << ", microbatches " << m;
  const int warmup = std::min(m, stages - stage - 1);
  std::vector<PipelineOp> ops;
  int forward = 0, backward = 0;
  for (; forward < warmup; ++forward) ops.push_back({PipelineOp::kForward, forward});
  while (forward < m) {  // steady state: one forward, one backward
    ops.push_back({PipelineOp::kForward, forward++});
    ops.push_back({PipelineOp::kBackward, backward++});
  }
  while (backward < m) ops.push_back({PipelineOp::kBackward, backward++});
  return ops;
}

std::vector<int> SplitLayers(int layers, int stages, double first_extra, double last_extra) {
  LOOM_CHECK(stages >= 1 && stages <= layers) << stages << " stages for " << layers << " layers";
  // best[k][i]: the least largest cost of layers [0, i) in k stages.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(layers + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(layers + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k) {
    for (int i = k; i <= layers - (stages - k); ++i) {
      for (int j = k - 1; j < i; ++j) {  // stage k-1 holds [j, i)
        if (best[k - 1][j] == inf) continue;
        double cost = i - j;
        if (k == 1) cost += first_extra;
        if (k == stages) cost += last_extra;
        const double worst = std::max(best[k - 1][j], cost);
        if (worst < best[k][i]) {  // <: the earliest cut, so later stages are larger
          best[k][i] = worst;
          cut[k][i] = j;
        }
      }
    }
  }
  std::vector<int> bounds(stages + 1);
  bounds[stages] = layers;
  for (int k = stages, i = layers; k >= 1; --k) {
    bounds[k - 1] = cut[k][i];
    i = cut[k][i];
  }
  return bounds;
}

std::string FormatSchedule(const std::vector<PipelineOp>& ops) {
  std::string out;
  for (const PipelineOp& op : ops) {
    absl::StrAppend(&out, out.empty() ? "" : " ", op.kind == PipelineOp::kForward ? "F" : "B",
                    op.microbatch);
  }
  return out;
}

}  // namespace loom::parallel
