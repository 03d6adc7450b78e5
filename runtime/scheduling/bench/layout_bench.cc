// Layout benchmark (not a test): at cluster scale in simulation, Loom's
// searched disaggregated plan with the `loom` assignment against the
// monolithic layout Megatron-LM runs multimodal models in (the encoder inside
// the LLM's first pipeline stage, one TP / PP / DP for both modules, samples
// in arrival order: `sequential`), side by side in one run.
//
//   bazel run -c opt //runtime/scheduling/bench:layout_bench
//
// Per model config and datagen preset: a global batch of measured outlines
// (runtime/scheduling/bench/outlines.h); each layout searched by the same
// cost model (runtime/scheduling/plan.h: SearchPlan, SearchMonolithicPlan,
// the latter with the LLM's own layer split and with its first stage
// balanced for the encoder), each under its own runtime's memory: Loom's
// memory model with the recompute its workers run (--loom_recompute: full,
// a stage's forward again before its backward, one microbatch's activations
// live; none or selective, every in-flight microbatch's kept), Megatron's
// (activations kept, sequence parallelism); every sample's cost from the
// layout's coefficients; the assignment; and the iteration simulated in the
// order the workers run it (runtime/scheduling/simulate.h), recomputing as
// each runtime does. Rows: Loom's plan with
// `loom` and with `sequential` (what the order adds), the monolithic layouts
// with `sequential`; the ratio is the better monolithic layout's simulated
// iteration over Loom's.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "runtime/data/tokenizer.h"
#include "runtime/model/config.h"
#include "runtime/scheduling/bench/outlines.h"
#include "runtime/scheduling/cost_model.h"
#include "runtime/scheduling/plan.h"
#include "runtime/scheduling/schedule.h"
#include "runtime/scheduling/simulate.h"

ABSL_FLAG(std::string, configs, "vit300m-llm7b,vit300m-llm70b", "Model configs.");
ABSL_FLAG(std::string, loom_recompute, "auto",
          "The recompute Loom's workers run (job.recompute, both modules): full, none or "
          "selective; its plan searched, priced and simulated so. auto: the plan search chooses "
          "each module's.");
ABSL_FLAG(std::string, presets, "onevision,interleaved", "datagen presets.");
ABSL_FLAG(int, gpus, 1172, "GPUs of the cluster (H100 SXM, 8 per node).");
ABSL_FLAG(int, global_batch, 4096, "Samples per iteration.");
ABSL_FLAG(int, seed, 1, "datagen seed.");

namespace loom::sched {
namespace {

struct Row {
  std::string layout, algorithm;
  const scheduler::v1::Plan* plan;
  double simulated = 0, bubble = 0;
};

std::string Grid(const scheduler::v1::Plan& p) {
  const auto& e = p.encoder();
  const auto& l = p.llm();
  if (p.encoder_in_first_llm_stage()) {
    std::string shares;
    for (double x : p.costs().llm_stage_share()) {
      absl::StrAppend(&shares, shares.empty() ? "" : "/", static_cast<int>(x * 100 + 0.5));
    }
    return absl::StrCat("TP", l.tp(), " PP", l.pp(), " DP", l.dp(), " m", p.microbatches(),
                        " (LLM % per stage ", shares, ")");
  }
  // With each module's recompute (f: full, s: selective, n: none).
  return absl::StrCat("enc TP", e.tp(), " PP", e.pp(), " DP", e.dp(), " ",
                      p.encoder_recompute().substr(0, 1),
                      p.colocated() ? " in LLM TP" : " + LLM TP", l.tp(), " PP", l.pp(), " DP",
                      l.dp(), " ", p.llm_recompute().substr(0, 1), " m", p.microbatches());
}

// Simulated iteration of `plan` under `algorithm`, each module recomputing
// as the plan says its runtime runs it (Loom's plan: the search's choice;
// Megatron's: activations kept).
absl::Status Simulate(const MeasuredBatch& batch, Row* row) {
  absl::StatusOr<SimulationResult> sim = SimulatePlan(batch, *row->plan, row->algorithm);
  if (!sim.ok()) return sim.status();
  row->simulated = sim->iteration_seconds;
  row->bubble = sim->llm_bubble_fraction;
  return absl::OkStatus();
}

int Main() {
  absl::StatusOr<std::unique_ptr<data::Tokenizer>> tok = data::Tokenizer::Load("");
  if (!tok.ok()) {
    std::fprintf(stderr, "layout_bench: %s\n", std::string(tok.status().message()).c_str());
    return 2;
  }
  ClusterSpec cluster;
  cluster.gpus = absl::GetFlag(FLAGS_gpus);
  const int global_batch = absl::GetFlag(FLAGS_global_batch);
  std::printf(
      "layout_bench: %d H100s (%.0f TFLOP/s bf16, %.0f GiB, %d per node, %.0f GB/s between nodes), "
      "%d samples per iteration, datagen seed %d\n",
      cluster.gpus, cluster.peak_flops / 1e12, cluster.memory_bytes / (1 << 30),
      cluster.gpus_per_node, cluster.inter_node_bytes_per_second / 1e9, global_batch,
      absl::GetFlag(FLAGS_seed));
  int figures = 0;
  std::vector<std::string> summary;
  for (absl::string_view config : absl::StrSplit(absl::GetFlag(FLAGS_configs), ',')) {
    absl::StatusOr<ModelConfig> model = ModelConfigByName(std::string(config));
    if (!model.ok()) {
      std::fprintf(stderr, "layout_bench: %s\n", std::string(model.status().message()).c_str());
      return 2;
    }
    for (absl::string_view preset_view : absl::StrSplit(absl::GetFlag(FLAGS_presets), ',')) {
      const std::string preset(preset_view);
      absl::StatusOr<MeasuredBatch> batch =
          MeasureOutlines(preset, absl::GetFlag(FLAGS_seed), global_batch, *model, **tok);
      if (!batch.ok()) {
        std::fprintf(stderr, "layout_bench: %s\n", std::string(batch.status().message()).c_str());
        return 2;
      }
      const BatchStats stats = StatsOf(batch->shapes, global_batch);
      // Loom's plan priced as its workers run (recompute: its memory model's
      // one live microbatch, its time's extra forward); Megatron's layout
      // as Megatron runs it (activations kept, its own memory).
      PlanLimits loom_limits;
      const std::string loom_recompute = absl::GetFlag(FLAGS_loom_recompute);
      absl::StatusOr<Recompute> recompute = ParseRecompute(loom_recompute);
      if (loom_recompute == "auto") {
        loom_limits.search_recompute = true;
      } else if (!recompute.ok()) {
        std::fprintf(stderr, "layout_bench: --loom_recompute: %s (or auto)\n",
                     std::string(recompute.status().message()).c_str());
        return 1;
      } else {
        loom_limits.recompute = *recompute;
      }
      const PlanLimits limits;
      absl::StatusOr<scheduler::v1::Plan> loom = SearchPlan(cluster, *model, stats, loom_limits);
      absl::StatusOr<scheduler::v1::Plan> even =
          SearchMonolithicPlan(cluster, *model, stats, limits, false);
      absl::StatusOr<scheduler::v1::Plan> balanced =
          SearchMonolithicPlan(cluster, *model, stats, limits, true);
      for (const auto* p : {&loom, &even, &balanced}) {
        if (!p->ok()) {
          std::fprintf(stderr, "layout_bench: %s %s: %s\n", model->name.c_str(), preset.c_str(),
                       std::string(p->status().message()).c_str());
          return 1;
        }
      }
      std::printf("\n%s, %s: mean %.2f tiles, %.0f tokens per sample (E[L^2] / E[L]^2 = %.2f)\n",
                  model->name.c_str(), preset.c_str(), stats.mean_tiles, stats.mean_length,
                  stats.mean_length_sq / (stats.mean_length * stats.mean_length));
      std::vector<Row> rows = {{"loom", "loom", &*loom},
                               {"loom", "sequential", &*loom},
                               {"monolithic, LLM split", "sequential", &*even},
                               {"monolithic, balanced", "sequential", &*balanced}};
      std::printf("  %-22s %-10s %-52s %9s %9s %6s %7s\n", "layout", "order", "grid", "plan_s",
                  "sim_s", "MFU", "bubble");
      for (Row& r : rows) {
        if (absl::Status s = Simulate(*batch, &r); !s.ok()) {
          std::fprintf(stderr, "layout_bench: %s %s %s: %s\n", model->name.c_str(), preset.c_str(),
                       r.layout.c_str(), std::string(s.message()).c_str());
          return 1;
        }
        const scheduler::v1::Plan& p = *r.plan;
        // The plan's MFU at the simulated time instead of its own estimate.
        const double mfu = p.predicted_mfu() * p.predicted_iteration_seconds() / r.simulated;
        std::printf("  %-22s %-10s %-52s %9.3f %9.3f %5.1f%% %6.1f%%\n", r.layout.c_str(),
                    r.algorithm.c_str(), Grid(p).c_str(), p.predicted_iteration_seconds(),
                    r.simulated, mfu * 100, r.bubble * 100);
      }
      const double mono = std::min(rows[2].simulated, rows[3].simulated);
      std::printf(
          "  monolithic (better of the two) / loom: %.3f   of which the plan: %.3f (monolithic / "
          "loom plan in sequential order), the order: %.3f (sequential / loom on Loom's plan)\n",
          mono / rows[0].simulated, mono / rows[1].simulated,
          rows[1].simulated / rows[0].simulated);
      summary.push_back(
          absl::StrFormat("  %-16s %-12s %7.3f", model->name, preset, mono / rows[0].simulated));
      ++figures;
    }
  }
  std::printf(
      "\nsimulated speed-up of Loom over the monolithic layout (DistTrain reports up to "
      "2.2x over Megatron-LM):\n");
  for (const std::string& line : summary) std::printf("%s\n", line.c_str());
  if (figures == 0) {
    std::fprintf(stderr, "layout_bench: no configuration was measured\n");
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
