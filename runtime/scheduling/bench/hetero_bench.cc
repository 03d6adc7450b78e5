// Heterogeneous-cluster benchmark (not a test): in simulation, the plan
// SearchHeterogeneousPlan finds on a cluster of several GPU kinds against
// the best plan on one kind at the same budget (dollars an hour), side by
// side in one run.
//
//   bazel run -c opt //runtime/scheduling/bench:hetero_bench
//
// The kinds are vendor spec-sheet figures (dense bf16 peak, memory, NVLink or
// PCIe within a node, the network between nodes); the prices are
// assumptions (typical on-demand rates, --prices). Per model config: a
// global batch of measured onevision outlines (outlines.h); the
// heterogeneous search, fastest and cheapest per sample (no slower than
// --slowdown times the fastest); for each, the best homogeneous plan of
// each kind buying as many GPUs as the budget pays for; every plan's
// iteration simulated with the `loom` assignment (runtime/scheduling/
// simulate.h) for samples/s and dollars per million samples.
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/data/tokenizer.h"
#include "runtime/model/config.h"
#include "runtime/scheduling/bench/outlines.h"
#include "runtime/scheduling/plan.h"

ABSL_FLAG(std::string, configs, "vit300m-llm7b,vit300m-llm70b", "Model configs.");
ABSL_FLAG(std::string, counts, "1024,1024,2048", "GPUs of each kind: H100, A100, L40S.");
ABSL_FLAG(std::string, prices, "3.0,1.5,1.0",
          "Dollars per GPU-hour of each kind (assumed on-demand rates): H100, A100, L40S.");
ABSL_FLAG(int, global_batch, 4096, "Samples per iteration.");
ABSL_FLAG(double, slowdown, 1.25,
          "The cheapest plan may be this many times slower than the fastest.");
ABSL_FLAG(int, seed, 1, "datagen seed.");

namespace loom::sched {
namespace {

// Spec-sheet figures: H100 SXM5 (989 TFLOP/s dense bf16, 80 GB, NVLink 4
// 450 GB/s a direction, 400 Gb/s a GPU between nodes); A100 SXM4 80 GB
// (312 TFLOP/s, NVLink 3 300 GB/s, 200 Gb/s); L40S (362 TFLOP/s dense bf16,
// 48 GB, no NVLink: PCIe Gen4 x16 32 GB/s, 200 Gb/s).
std::vector<GpuKind> Kinds(const std::vector<int>& counts, const std::vector<double>& prices) {
  std::vector<GpuKind> k(3);
  k[0].name = "H100";
  k[1].name = "A100";
  k[1].gpu.peak_flops = 312e12;
  k[1].gpu.intra_node_bytes_per_second = 300e9;
  k[1].gpu.inter_node_bytes_per_second = 25e9;
  k[2].name = "L40S";
  k[2].gpu.peak_flops = 362e12;
  k[2].gpu.memory_bytes = 48.0 * (1ull << 30);
  k[2].gpu.intra_node_bytes_per_second = 32e9;
  k[2].gpu.inter_node_bytes_per_second = 25e9;
  for (size_t i = 0; i < k.size(); ++i) {
    k[i].count = counts[i];
    k[i].price_per_hour = prices[i];
  }
  return k;
}

std::string Layout(const scheduler::v1::Plan& p) {
  const auto& e = p.encoder();
  const auto& l = p.llm();
  return absl::StrCat("enc ", e.gpu_kind(), " TP", e.tp(), " PP", e.pp(), " DP", e.dp(),
                      p.colocated() ? " in " : " + ", "LLM ", l.gpu_kind(), " TP", l.tp(), " PP",
                      l.pp(), " DP", l.dp(), " m", p.microbatches());
}

struct Figures {
  double seconds = 0, samples_per_second = 0, dollars_per_million = 0;
};

absl::StatusOr<Figures> Measure(const MeasuredBatch& batch, const scheduler::v1::Plan& plan) {
  absl::StatusOr<SimulationResult> sim = SimulatePlan(batch, plan, "loom");
  if (!sim.ok()) return sim.status();
  Figures f;
  f.seconds = sim->iteration_seconds;
  f.samples_per_second = plan.global_batch() / f.seconds;
  f.dollars_per_million = plan.cost_per_hour() / 3600 / f.samples_per_second * 1e6;
  return f;
}

// Of a search's candidates, the one its simulation puts first: the most
// samples/s, or with `cost` the fewest dollars per sample.
struct Chosen {
  scheduler::v1::Plan plan;
  Figures figures;
  int candidates = 0;
};

absl::StatusOr<Chosen> ChooseBySimulation(const MeasuredBatch& batch,
                                          const std::vector<scheduler::v1::Plan>& plans,
                                          bool cost) {
  std::optional<Chosen> best;
  for (const scheduler::v1::Plan& p : plans) {
    absl::StatusOr<Figures> f = Measure(batch, p);
    if (!f.ok()) return f.status();
    const bool better = !best || (cost ? f->dollars_per_million < best->figures.dollars_per_million
                                       : f->samples_per_second > best->figures.samples_per_second);
    if (better) best = Chosen{p, *f, static_cast<int>(plans.size())};
  }
  if (!best) return absl::NotFoundError("no candidate");
  return *std::move(best);
}

void PrintRow(const std::string& what, const Chosen& c) {
  std::printf("  %-34s %-56s %6d %7.0f %7.3f %9.0f %8.2f\n", what.c_str(), Layout(c.plan).c_str(),
              c.plan.cluster_gpus(), c.plan.cost_per_hour(), c.figures.seconds,
              c.figures.samples_per_second, c.figures.dollars_per_million);
}

int Main() {
  std::vector<int> counts;
  std::vector<double> prices;
  for (absl::string_view x : absl::StrSplit(absl::GetFlag(FLAGS_counts), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(x, &n)) counts.clear();
    counts.push_back(n);
  }
  for (absl::string_view x : absl::StrSplit(absl::GetFlag(FLAGS_prices), ',')) {
    double d = 0;
    if (!absl::SimpleAtod(x, &d)) prices.clear();
    prices.push_back(d);
  }
  if (counts.size() != 3 || prices.size() != 3) {
    std::fprintf(stderr, "hetero_bench: --counts and --prices want three numbers each\n");
    return 2;
  }
  const std::vector<GpuKind> kinds = Kinds(counts, prices);
  absl::StatusOr<std::unique_ptr<data::Tokenizer>> tok = data::Tokenizer::Load("");
  if (!tok.ok()) {
    std::fprintf(stderr, "hetero_bench: %s\n", std::string(tok.status().message()).c_str());
    return 2;
  }
  const int global_batch = absl::GetFlag(FLAGS_global_batch);
  std::printf("hetero_bench: %d samples per iteration (onevision outlines, seed %d); kinds:\n",
              global_batch, absl::GetFlag(FLAGS_seed));
  for (const GpuKind& k : kinds) {
    std::printf(
        "  %-5s x%-5d %4.0f TFLOP/s  %3.0f GiB  %4.0f GB/s in a node  %3.0f GB/s between  "
        "$%.2f/h (assumed)\n",
        k.name.c_str(), k.count, k.gpu.peak_flops / 1e12, k.gpu.memory_bytes / (1 << 30),
        k.gpu.intra_node_bytes_per_second / 1e9, k.gpu.inter_node_bytes_per_second / 1e9,
        k.price_per_hour);
  }
  int figures = 0;
  for (absl::string_view config : absl::StrSplit(absl::GetFlag(FLAGS_configs), ',')) {
    absl::StatusOr<ModelConfig> model = ModelConfigByName(std::string(config));
    if (!model.ok()) {
      std::fprintf(stderr, "hetero_bench: %s\n", std::string(model.status().message()).c_str());
      return 2;
    }
    absl::StatusOr<MeasuredBatch> batch =
        MeasureOutlines("onevision", absl::GetFlag(FLAGS_seed), global_batch, *model, **tok);
    if (!batch.ok()) {
      std::fprintf(stderr, "hetero_bench: %s\n", std::string(batch.status().message()).c_str());
      return 2;
    }
    const BatchStats stats = StatsOf(batch->shapes, global_batch);
    PlanLimits limits;
    limits.recompute = Recompute::kSelective;
    std::printf("\n%s (recompute selective):\n", model->name.c_str());
    std::printf("  %-34s %-56s %6s %7s %7s %9s %8s\n", "plan", "layout", "GPUs", "$/h", "sim_s",
                "samples/s", "$/Msamp");
    constexpr int kCandidates = 8;
    HeterogeneousOptions fastest, cheapest;
    absl::StatusOr<std::vector<scheduler::v1::Plan>> fast =
        SearchHeterogeneousPlans(kinds, *model, stats, limits, fastest, kCandidates);
    absl::StatusOr<std::vector<scheduler::v1::Plan>> cheap = fast;  // its error, if any
    if (fast.ok()) {
      cheapest.minimise_cost = true;
      cheapest.max_iteration_seconds =
          absl::GetFlag(FLAGS_slowdown) * fast->front().predicted_iteration_seconds();
      cheap = SearchHeterogeneousPlans(kinds, *model, stats, limits, cheapest, kCandidates);
    }
    if (!cheap.ok()) {
      std::fprintf(stderr, "hetero_bench: %s: %s\n", model->name.c_str(),
                   std::string(cheap.status().message()).c_str());
      return 1;
    }
    for (const auto& [what, plans, cost] :
         {std::tuple<const char*, const std::vector<scheduler::v1::Plan>*, bool>{
              "heterogeneous, fastest", &*fast, false},
          {"heterogeneous, cheapest per sample", &*cheap, true}}) {
      absl::StatusOr<Chosen> het = ChooseBySimulation(*batch, *plans, cost);
      if (!het.ok()) {
        std::fprintf(stderr, "hetero_bench: %s\n", std::string(het.status().message()).c_str());
        return 1;
      }
      PrintRow(what, *het);
      // The best of the candidates with the modules on two kinds, if any.
      std::vector<scheduler::v1::Plan> mixed;
      for (const scheduler::v1::Plan& p : *plans) {
        if (p.encoder().gpu_kind() != p.llm().gpu_kind()) mixed.push_back(p);
      }
      if (!mixed.empty()) {
        absl::StatusOr<Chosen> two = ChooseBySimulation(*batch, mixed, cost);
        if (!two.ok()) {
          std::fprintf(stderr, "hetero_bench: %s\n", std::string(two.status().message()).c_str());
          return 1;
        }
        PrintRow("  its best on two kinds", *two);
      }
      std::printf(
          "    (search %.2f s, %lld configurations; of its %d best, the simulation's "
          "choice)\n",
          plans->front().search_seconds(), static_cast<long long>(plans->front().candidates()),
          het->candidates);
      // One kind at the same budget: as many GPUs as it pays for.
      std::optional<Chosen> best_one;
      std::string best_name;
      for (const GpuKind& k : kinds) {
        GpuKind only = k;
        only.count = static_cast<int>(het->plan.cost_per_hour() / k.price_per_hour);
        absl::StatusOr<std::vector<scheduler::v1::Plan>> p =
            SearchHeterogeneousPlans({only}, *model, stats, limits, fastest, kCandidates);
        if (!p.ok()) {
          std::printf("  %-34s %s\n", absl::StrCat("  ", k.name, " alone").c_str(),
                      std::string(p.status().message()).c_str());
          continue;
        }
        absl::StatusOr<Chosen> one = ChooseBySimulation(*batch, *p, false);
        if (!one.ok()) {
          std::fprintf(stderr, "hetero_bench: %s\n", std::string(one.status().message()).c_str());
          return 1;
        }
        PrintRow(absl::StrCat("  ", k.name, " alone, same budget"), *one);
        const bool better =
            !best_one ||
            (cost ? one->figures.dollars_per_million < best_one->figures.dollars_per_million
                  : one->figures.samples_per_second > best_one->figures.samples_per_second);
        if (better) {
          best_one = *std::move(one);
          best_name = k.name;
        }
      }
      if (best_one) {
        std::printf(
            "  -> %s over the best one kind (%s) at its budget: %.3fx samples/s, %.3fx "
            "dollars per sample\n",
            what, best_name.c_str(),
            het->figures.samples_per_second / best_one->figures.samples_per_second,
            het->figures.dollars_per_million / best_one->figures.dollars_per_million);
        ++figures;
      }
    }
  }
  if (figures == 0) {
    std::fprintf(stderr, "hetero_bench: no comparison was made\n");
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
