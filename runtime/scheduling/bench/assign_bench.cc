// Assignment benchmark: every algorithm on the three datagen presets at 1k,
// 4k and 16k samples per global batch and 8 to 256 bins, side by side in one
// run. Sample costs come from the cost model of a model config on H100s
// (FLOPs at the default efficiency); samples are datagen outlines measured
// the way loom-preprocess measures them (tiles per image, text tokens from
// the tokenizer), so no pixels are drawn.
//
//   bazel run -c opt //runtime/scheduling/bench:assign_bench
//
// Columns: max bin / lower bound per module (the bound is the larger of the
// mean bin and the largest sample), coefficient of variation across the bins,
// the simulated iteration (LLM pipeline of 2 stages, 8 microbatches per rank,
// as many encoder ranks as LLM ranks), and the algorithm's wall time.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "runtime/data/tokenizer.h"
#include "runtime/model/config.h"
#include "runtime/scheduling/bench/outlines.h"
#include "runtime/scheduling/cost_model.h"
#include "runtime/scheduling/plan.h"
#include "runtime/scheduling/schedule.h"

ABSL_FLAG(std::string, config, "vit300m-llm1b", "Model config for the cost model.");
ABSL_FLAG(std::string, sizes, "1024,4096,16384", "Samples per global batch.");
ABSL_FLAG(std::string, bins, "8,32,128,256", "Bins (LLM DP x 8 microbatches).");
ABSL_FLAG(std::string, presets, "caption,interleaved,onevision", "datagen presets.");
ABSL_FLAG(double, ilp_seconds, 10, "Time limit of each ilp solve.");
ABSL_FLAG(int64_t, ilp_max_variables, 65536, "samples x bins above which ilp is not run.");

namespace loom::sched {
namespace {

int Main() {
  absl::StatusOr<ModelConfig> model = ModelConfigByName(absl::GetFlag(FLAGS_config));
  absl::StatusOr<std::unique_ptr<data::Tokenizer>> tok = data::Tokenizer::Load("");
  if (!model.ok() || !tok.ok()) {
    std::fprintf(stderr, "assign_bench: %s\n",
                 std::string((model.ok() ? tok.status() : model.status()).message()).c_str());
    return 2;
  }
  const scheduler::v1::CostCoefficients costs = CoefficientsOnOneGpu(*model, ClusterSpec());
  const CostModel cost_model(costs);
  const std::vector<int> sizes = CsvInts(absl::GetFlag(FLAGS_sizes));
  const int most = *std::max_element(sizes.begin(), sizes.end());
  std::printf("assign_bench: config %s, costs from FLOPs on one H100 at %.0f%% of peak\n",
              model->name.c_str(), ClusterSpec().max_efficiency * 100);
  std::printf("%-11s %6s %4s  %-10s %8s %8s %7s %7s %10s %10s\n", "preset", "samples", "bins",
              "algorithm", "enc/LB", "llm/LB", "enc_cv", "llm_cv", "sim_ms", "wall_ms");
  // Per (preset, size, bins): the objective of each algorithm, for the summary.
  struct Row {
    std::string where;
    std::map<std::string, double> objective, wall, sim;
    double ilp_bound = 0;     // in objective units
    double loom_over_lb = 0;  // loom's largest bin / the lower bound
    bool ilp_optimal = false;
  };
  std::vector<Row> rows;
  for (absl::string_view preset_view : absl::StrSplit(absl::GetFlag(FLAGS_presets), ',')) {
    const std::string preset(preset_view);
    absl::StatusOr<MeasuredBatch> batch = MeasureOutlines(preset, 1, most, *model, **tok);
    if (!batch.ok()) {
      std::fprintf(stderr, "assign_bench: %s\n", std::string(batch.status().message()).c_str());
      return 2;
    }
    const std::vector<std::string>& keys = batch->keys;
    const std::vector<SampleShape>& shapes = batch->shapes;
    const std::vector<SampleLoad> all = cost_model.Loads(shapes, costs.transfer_per_image_token());
    for (int n : sizes) {
      const std::vector<std::string> k(keys.begin(), keys.begin() + n);
      const std::vector<SampleLoad> loads(all.begin(), all.begin() + n);
      for (int bins : CsvInts(absl::GetFlag(FLAGS_bins))) {
        const int m = std::min(8, bins), dp = bins / m;
        scheduler::v1::Plan plan = PlanOfDegrees({dp, m, dp});
        plan.mutable_llm()->set_pp(2);
        Row row;
        row.where = preset + " " + std::to_string(n) + "x" + std::to_string(bins);
        for (const std::string& algorithm : AlgorithmNames()) {
          if (algorithm == "ilp" &&
              static_cast<int64_t>(n) * bins > absl::GetFlag(FLAGS_ilp_max_variables)) {
            std::printf("%-11s %6d %4d  %-10s %8s\n", preset.c_str(), n, bins, "ilp",
                        "(too large)");
            continue;
          }
          absl::StatusOr<scheduler::v1::Assignment> a =
              AssignForPlan(plan, k, loads, algorithm, absl::GetFlag(FLAGS_ilp_seconds));
          if (!a.ok()) {
            std::fprintf(stderr, "assign_bench: %s: %s\n", algorithm.c_str(),
                         std::string(a.status().message()).c_str());
            return 2;
          }
          const auto& s = a->summary();
          std::printf("%-11s %6d %4d  %-10s %8.4f %8.4f %7.4f %7.4f %10.3f %10.3f\n",
                      preset.c_str(), n, bins, algorithm.c_str(),
                      s.encoder().max_over_lower_bound(), s.llm().max_over_lower_bound(),
                      s.encoder().cv(), s.llm().cv(), s.simulated_iteration_seconds() * 1e3,
                      s.wall_seconds() * 1e3);
          row.objective[algorithm] = s.objective();
          row.wall[algorithm] = s.wall_seconds();
          row.sim[algorithm] = s.simulated_iteration_seconds();
          if (algorithm == "loom") row.loom_over_lb = s.largest_bin() / s.lower_bound();
          if (algorithm == "ilp") {
            // largest_bin / objective is the mean bin the objective divides by.
            row.ilp_bound = s.ilp_bound() * s.objective() / s.largest_bin();
            row.ilp_optimal = s.ilp_optimal();
          }
        }
        std::fflush(stdout);
        rows.push_back(row);
      }
    }
  }
  // Summary: loom against the others (objective: the largest bin of either
  // module, in the costs' unit, over the larger module's mean bin; lower is
  // better).
  std::printf(
      "\nsummary (objective = largest bin of either module / the larger module's mean bin):\n");
  std::printf("%-24s %9s %9s %9s %9s %9s %9s %9s %8s\n", "batch", "loom", "best_heur", "ilp",
              "ilp_bound", "loom/ilp", "loom/LB", "sim/best", "loom_ms");
  int ahead = 0, total = 0;
  for (const Row& r : rows) {
    double best = 1e30, best_sim = 1e30;
    for (const char* h : {"sequential", "lpt", "disttrain", "entrain", "greedy"}) {
      best = std::min(best, r.objective.at(h));
      best_sim = std::min(best_sim, r.sim.at(h));
    }
    const double loom = r.objective.at("loom");
    ++total;
    ahead += loom <= best + 1e-12;
    const bool ilp = r.objective.count("ilp") > 0;
    std::printf("%-24s %9.5f %9.5f %9s %9s %9s %9.5f %9.4f %8.2f\n", r.where.c_str(), loom, best,
                ilp ? std::to_string(r.objective.at("ilp")).substr(0, 7).c_str() : "-",
                ilp ? std::to_string(r.ilp_bound).substr(0, 7).c_str() : "-",
                ilp ? std::to_string(loom / r.objective.at("ilp")).substr(0, 6).c_str() : "-",
                r.loom_over_lb, r.sim.at("loom") / best_sim, r.wall.at("loom") * 1e3);
  }
  std::printf("loom at or ahead of every heuristic in %d of %d batches\n", ahead, total);
  if (total == 0) {
    std::fprintf(stderr, "assign_bench: no batch was measured\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace loom::sched

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return loom::sched::Main();
}
