// Batch files: one sample per line in the scan line format
// (`loom-preprocess scan` writes them), optionally with "encoder_cost" and
// "llm_cost" that override the cost model.
#ifndef LOOM_RUNTIME_SCHEDULING_BATCH_FILE_H_
#define LOOM_RUNTIME_SCHEDULING_BATCH_FILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "loom/scheduler/v1/scheduler.pb.h"

namespace loom::sched {

struct BatchFile {
  std::vector<scheduler::v1::BatchSample> samples;
  bool has_costs = false;  // every line carries both costs
};

// Blank lines are skipped. INVALID_ARGUMENT naming the file and line: bad
// JSON, an unknown field, a negative count or cost, a line with one cost but
// not the other, costs on some lines but not all, a repeated key, no samples.
absl::StatusOr<BatchFile> ParseBatchFile(const std::string& path, const std::string& text);
absl::StatusOr<BatchFile> ReadBatchFile(const std::string& path);

}  // namespace loom::sched

#endif  // LOOM_RUNTIME_SCHEDULING_BATCH_FILE_H_
