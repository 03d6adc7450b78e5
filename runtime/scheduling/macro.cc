#include "runtime/scheduling/macro.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "runtime/base/rng.h"
#include "runtime/scheduling/schedule.h"

namespace loom::sched {
namespace {

constexpr uint64_t kMacroBatchSalt = 0x6d6163726f;  // "macro"

// The q-quantile of sorted `v` (nearest rank: one of the values).
double Quantile(const std::vector<double>& v, double q) {
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

}  // namespace

std::vector<std::vector<int>> DrawGlobalBatches(int samples, int global_batch, int batches,
                                                uint64_t seed) {
  std::vector<std::vector<int>> out(std::max(batches, 0));
  for (int b = 0; b < batches; ++b) {
    Rng rng(MixSeed(seed, b, kMacroBatchSalt));
    out[b].reserve(global_batch);
    for (int i = 0; i < global_batch; ++i) {
      out[b].push_back(static_cast<int>(rng.UniformInt(0, samples - 1)));
    }
  }
  return out;
}

absl::StatusOr<scheduler::v1::IterationDistribution> SimulateMacroBatches(
    const scheduler::v1::Plan& plan, const std::vector<SampleShape>& shapes,
    const MacroBatchOptions& options) {
  if (shapes.empty()) return absl::InvalidArgumentError("macro-batches: no samples to draw from");
  if (options.batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("macro-batches: want at least one batch, got ", options.batches));
  }
  if (plan.global_batch() < 1) {
    return absl::InvalidArgumentError("macro-batches: the plan has no global batch");
  }
  const std::vector<SampleLoad> loads =
      CostModel(plan.costs()).Loads(shapes, plan.costs().transfer_per_image_token());
  std::vector<double> seconds;
  for (const std::vector<int>& batch : DrawGlobalBatches(
           static_cast<int>(shapes.size()), plan.global_batch(), options.batches, options.seed)) {
    std::vector<std::string> keys;
    std::vector<SampleLoad> batch_loads;
    for (int i : batch) {
      keys.push_back(absl::StrCat("s", keys.size()));
      batch_loads.push_back(loads[i]);
    }
    absl::StatusOr<scheduler::v1::Assignment> a =
        AssignForPlan(plan, keys, batch_loads, options.algorithm, options.ilp_time_limit_seconds);
    if (!a.ok()) return a.status();
    seconds.push_back(a->summary().simulated_iteration_seconds());
  }
  std::sort(seconds.begin(), seconds.end());
  scheduler::v1::IterationDistribution d;
  d.set_batches(static_cast<int>(seconds.size()));
  d.set_algorithm(options.algorithm);
  double sum = 0;
  for (double s : seconds) sum += s;
  d.set_mean(sum / static_cast<double>(seconds.size()));
  d.set_p50(Quantile(seconds, 0.5));
  d.set_p90(Quantile(seconds, 0.9));
  d.set_max(seconds.back());
  return d;
}

absl::StatusOr<scheduler::v1::Plan> ChooseOverMacroBatches(
    const std::vector<scheduler::v1::Plan>& candidates, const std::vector<SampleShape>& shapes,
    const MacroBatchOptions& options, std::vector<scheduler::v1::IterationDistribution>* each) {
  if (candidates.empty()) return absl::InvalidArgumentError("macro-batches: no candidate plans");
  int best = -1;
  scheduler::v1::IterationDistribution best_d;
  for (size_t i = 0; i < candidates.size(); ++i) {
    absl::StatusOr<scheduler::v1::IterationDistribution> d =
        SimulateMacroBatches(candidates[i], shapes, options);
    if (!d.ok()) return d.status();
    if (each != nullptr) each->push_back(*d);
    if (best < 0 || d->mean() < best_d.mean()) {
      best = static_cast<int>(i);
      best_d = *d;
    }
  }
  scheduler::v1::Plan plan = candidates[best];
  *plan.mutable_simulated() = best_d;
  return plan;
}

std::string LayoutText(const scheduler::v1::Plan& plan) {
  return absl::StrCat("encoder_tp: ", plan.encoder().tp(), " encoder_pp: ", plan.encoder().pp(),
                      " encoder_dp: ", plan.encoder().dp(), " llm_tp: ", plan.llm().tp(),
                      " llm_pp: ", plan.llm().pp(), " llm_dp: ", plan.llm().dp(),
                      " microbatches: ", plan.microbatches(),
                      plan.colocated() ? " colocate: true" : "",
                      plan.sequence_parallel() ? " sequence_parallel: true" : "");
}

}  // namespace loom::sched
