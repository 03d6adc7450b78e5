#include "runtime/parallel/pipeline_schedule.h"

#include <algorithm>

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

std::string FormatSchedule(const std::vector<PipelineOp>& ops) {
  std::string out;
  for (const PipelineOp& op : ops) {
    absl::StrAppend(&out, out.empty() ? "" : " ", op.kind == PipelineOp::kForward ? "F" : "B",
                    op.microbatch);
  }
  return out;
}

}  // namespace loom::parallel
