// Batches for the scheduling benchmarks: datagen outlines measured the way
// loom-preprocess measures samples (tiles per image from the tile grid, text
// tokens from the tokenizer), so no pixels are drawn; samples longer than
// the model's sequence are skipped as loom-preprocess skips them.
#ifndef LOOM_RUNTIME_SCHEDULING_BENCH_OUTLINES_H_
#define LOOM_RUNTIME_SCHEDULING_BENCH_OUTLINES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/data/tokenizer.h"
#include "runtime/model/config.h"
#include "runtime/scheduling/cost_model.h"
#include "runtime/scheduling/simulate.h"

namespace loom::sched {

// "1024,4096" -> {1024, 4096} (the benchmarks' list flags).
std::vector<int> CsvInts(const std::string& csv);

struct MeasuredBatch {
  std::vector<std::string> keys;
  std::vector<SampleShape> shapes;
};

// The first `samples` samples of `preset` (runtime/data/datagen.h) at `seed`
// that fit `model`. An unknown preset is datagen's error.
absl::StatusOr<MeasuredBatch> MeasureOutlines(const std::string& preset, uint64_t seed, int samples,
                                              const ModelConfig& model,
                                              const data::Tokenizer& tokenizer);

// One iteration of `batch` under `plan`, simulated as its workers run it:
// every sample priced by the plan's coefficients, assigned by `algorithm`
// (ILP's limit 10 s), each module recomputing as the plan says.
absl::StatusOr<SimulationResult> SimulatePlan(const MeasuredBatch& batch,
                                              const scheduler::v1::Plan& plan,
                                              const std::string& algorithm);

}  // namespace loom::sched

#endif  // LOOM_RUNTIME_SCHEDULING_BENCH_OUTLINES_H_
