// The assignment with a generator (issue 44): loom's three-load assignment
// against Megatron's sequential assignment and against loom blind to the
// generator (its two-module objective: the generator's costs left out when
// placing, counted when measuring), side by side in one run, on a mix where
// `output_share` of the samples are text → image (the generation preset's,
// one 256 x 256 output image each) and the rest understanding samples (the
// onevision preset's), in random arrival order.
//
//   bazel run -c opt //runtime/scheduling/bench:generator_assign_bench
//
// Costs: the model's FLOPs on one H100 at the default efficiency
// (CoefficientsOnOneGpu), each module's scaled so that its total equals the
// LLM's: the modules' GPUs divided in proportion to their work, as a
// disaggregated plan divides them, so no module is idle by construction
// and every module's mean bin is the same. The figure is the slot time the
// assignment sets: the largest bin of any module over that mean (1.0 is a
// perfect split).
//
// Then the plan at --gpus H100s for --global_batch samples of the same mix:
// Loom's searched disaggregated three-module plan (the generator on GPUs
// of its own after the LLM's last stage; each module's recompute chosen)
// against the monolithic layout (one TP x PP x DP grid, the encoder inside
// the LLM's first stage and the generator inside its last, with the LLM's
// own layer split and with the first stage balanced), each predicted by the
// plan search's model (runtime/scheduling/plan.h) and simulated on the
// batch itself (runtime/scheduling/simulate.h: Loom's with the loom
// assignment, the monolithic ones in arrival order).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "runtime/base/rng.h"
#include "runtime/data/tokenizer.h"
#include "runtime/model/config.h"
#include "runtime/scheduling/assign.h"
#include "runtime/scheduling/bench/outlines.h"
#include "runtime/scheduling/cost_model.h"
#include "runtime/scheduling/plan.h"

ABSL_FLAG(std::string, config, "vit300m-llm7b-gen", "Model config (with a generator).");
ABSL_FLAG(std::string, sizes, "1024,4096", "Samples per global batch.");
ABSL_FLAG(std::string, bins, "32,128",
          "Bins (LLM DP x 8 microbatches; as many encoder and "
          "generator replicas as LLM ones).");
ABSL_FLAG(double, output_share, 0.2, "Share of text → image samples.");
ABSL_FLAG(std::string, plan_configs, "vit300m-llm7b-gen,vit300m-llm70b-gen",
          "Model configs for the plans (the mix as --config measures it).");
ABSL_FLAG(int, gpus, 1172, "GPUs of the cluster for the plans (H100 SXM, 8 per node).");
ABSL_FLAG(int, global_batch, 4096, "Samples per iteration for the plans.");

namespace loom::sched {
namespace {

int Fail(const std::string& why) {
  std::fprintf(stderr, "generator_assign_bench: %s\n", why.c_str());
  return 2;
}

int Plans(const ClusterSpec& cluster, const ModelConfig& m, const MeasuredBatch& batch,
          int global_batch);

int Main() {
  absl::StatusOr<ModelConfig> model = ModelConfigByName(absl::GetFlag(FLAGS_config));
  if (!model.ok()) return Fail(std::string(model.status().message()));
  if (!model->has_generator()) return Fail("--config " + model->name + " has no generator");
  absl::StatusOr<std::unique_ptr<data::Tokenizer>> tok = data::Tokenizer::Load("");
  if (!tok.ok()) return Fail(std::string(tok.status().message()));
  const double share = absl::GetFlag(FLAGS_output_share);
  if (!(share > 0 && share < 1)) return Fail("--output_share: between 0 and 1");
  const std::vector<int> sizes = CsvInts(absl::GetFlag(FLAGS_sizes));
  if (sizes.empty()) return Fail("--sizes: at least one");
  const int global_batch = absl::GetFlag(FLAGS_global_batch);
  if (global_batch < 1) return Fail("--global_batch: at least 1");
  const int most = std::max(*std::max_element(sizes.begin(), sizes.end()), global_batch);

  // The mix: understanding samples and text → image ones, in random order.
  absl::StatusOr<MeasuredBatch> understand = MeasureOutlines("onevision", 1, most, *model, **tok);
  absl::StatusOr<MeasuredBatch> generation =
      MeasureOutlines("generation", 1, 4 * most, *model, **tok);
  if (!understand.ok()) return Fail(std::string(understand.status().message()));
  if (!generation.ok()) return Fail(std::string(generation.status().message()));
  std::vector<SampleShape> drawing;  // text → image: an output image, no input image
  for (const SampleShape& s : generation->shapes) {
    if (s.output_images > 0 && s.tiles == 0) drawing.push_back(s);
  }
  std::vector<SampleShape> mix;
  Rng rng(7);
  size_t u = 0, g = 0;
  while (static_cast<int>(mix.size()) < most) {
    const bool draw = rng.Bernoulli(share);
    if (draw && g < drawing.size()) {
      mix.push_back(drawing[g++]);
    } else if (!draw && u < understand->shapes.size()) {
      mix.push_back(understand->shapes[u++]);
    } else {
      return Fail("too few outlines for the mix");
    }
  }

  const scheduler::v1::CostCoefficients costs = CoefficientsOnOneGpu(*model, ClusterSpec());
  const CostModel cost_model(costs);
  std::printf(
      "generator_assign_bench: config %s (generator %.0fM parameters, %d queries), %.0f%% of "
      "samples text -> image, costs from FLOPs on one H100 at %.0f%% of peak, each module's "
      "total scaled to the LLM's\n",
      model->name.c_str(), VitParameterCount(model->generator.denoiser) / 1e6,
      model->generator.queries, share * 100, ClusterSpec().max_efficiency * 100);
  std::printf("%7s %4s  %-12s %8s %8s %8s %9s\n", "samples", "bins", "assignment", "enc/LB",
              "llm/LB", "gen/LB", "slot/mean");
  int rows = 0;
  for (int n : sizes) {
    std::vector<SampleLoad> loads = cost_model.Loads(
        std::vector<SampleShape>(mix.begin(), mix.begin() + n), costs.transfer_per_image_token());
    double te = 0, tl = 0, tg = 0;
    int outputs = 0;
    for (const SampleLoad& l : loads) {
      te += l.encoder;
      tl += l.llm;
      tg += l.generator;
      outputs += l.generator > 0;
    }
    if (te <= 0 || tg <= 0) {
      return Fail(absl::StrCat("the first ", n, " samples have no image or no output image"));
    }
    for (SampleLoad& l : loads) {
      l.encoder *= tl / te;
      l.generator *= tl / tg;
    }
    std::vector<SampleLoad> blind = loads;  // the generator left out when placing
    for (SampleLoad& l : blind) l.generator = 0;
    for (int bins : CsvInts(absl::GetFlag(FLAGS_bins))) {
      AssignOptions o;
      o.microbatches = std::min(8, bins);
      o.llm_dp = o.encoder_dp = o.generator_dp = bins / o.microbatches;
      double slot[3] = {0, 0, 0};
      const char* names[] = {"sequential", "loom-2", "loom"};
      for (int k = 0; k < 3; ++k) {
        absl::StatusOr<AssignResult> r =
            Assign(k == 1 ? blind : loads, o, k == 0 ? "sequential" : "loom");
        if (!r.ok()) return Fail(std::string(r.status().message()));
        if (k == 1) {  // measured with the generator's real costs
          for (BinAssignment& b : r->bins) {
            b.generator = 0;
            for (int i : b.samples) b.generator += loads[i].generator;
          }
        }
        const AssignmentQuality q = MeasureAssignment(loads, *r);
        slot[k] = q.objective;
        std::printf("%7d %4d  %-12s %8.4f %8.4f %8.4f %9.4f\n", n, bins, names[k],
                    q.encoder.max_over_lower_bound, q.llm.max_over_lower_bound,
                    q.generator.max_over_lower_bound, q.objective);
      }
      std::printf(
          "%7d %4d  %d output images: loom's slot is %.3fx shorter than sequential's, %.3fx "
          "shorter than loom blind to the generator\n",
          n, bins, outputs, slot[0] / slot[2], slot[1] / slot[2]);
      std::fflush(stdout);
      ++rows;
    }
  }
  if (rows == 0) return Fail("no batch was measured");

  // The plans.
  ClusterSpec cluster;
  cluster.gpus = absl::GetFlag(FLAGS_gpus);
  MeasuredBatch batch;  // the first global batch of the mix
  batch.shapes.assign(mix.begin(), mix.begin() + global_batch);
  for (int i = 0; i < global_batch; ++i) batch.keys.push_back(absl::StrCat("s", i));
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_plan_configs), ',')) {
    absl::StatusOr<ModelConfig> m = ModelConfigByName(std::string(name));
    if (!m.ok()) return Fail(std::string(m.status().message()));
    if (int rc = Plans(cluster, *m, batch, global_batch); rc != 0) return rc;
  }
  return 0;
}

// Loom's three-module plan against the monolithic layouts for `model`.
int Plans(const ClusterSpec& cluster, const ModelConfig& m, const MeasuredBatch& batch,
          int global_batch) {
  const ModelConfig* model = &m;
  const BatchStats stats = StatsOf(batch.shapes, global_batch);
  PlanLimits loom_limits;
  loom_limits.search_recompute = true;
  loom_limits.dp_step = 0.02;
  const PlanLimits limits;
  absl::StatusOr<scheduler::v1::Plan> loom = SearchPlan(cluster, *model, stats, loom_limits);
  absl::StatusOr<scheduler::v1::Plan> even =
      SearchMonolithicPlan(cluster, *model, stats, limits, false);
  absl::StatusOr<scheduler::v1::Plan> balanced =
      SearchMonolithicPlan(cluster, *model, stats, limits, true);
  for (const auto* p : {&loom, &even, &balanced}) {
    if (!p->ok()) return Fail(std::string(p->status().message()));
  }
  auto degrees = [](const scheduler::v1::ModulePlan& m) {
    return absl::StrFormat("tp%d pp%d dp%d (%d GPUs)", m.tp(), m.pp(), m.dp(), m.gpus());
  };
  std::printf(
      "\n%s at %d H100s, %d samples an iteration (%.3f output images a sample), predicted by "
      "the plan search's model:\n",
      model->name.c_str(), cluster.gpus, global_batch, stats.mean_output_images);
  const char* names[] = {"loom (three modules)", "monolithic, LLM split", "monolithic, balanced"};
  int k = 0;
  for (const auto* p : {&loom, &even, &balanced}) {
    const scheduler::v1::Plan& x = **p;
    std::printf("  %-22s %8.4f s  MFU %5.1f%%  m %d  encoder %s  llm %s  generator %s\n",
                names[k++], x.predicted_iteration_seconds(), x.predicted_mfu() * 100,
                x.microbatches(), degrees(x.encoder()).c_str(), degrees(x.llm()).c_str(),
                degrees(x.generator()).c_str());
  }
  const double mono =
      std::min(even->predicted_iteration_seconds(), balanced->predicted_iteration_seconds());
  std::printf("predicted gain of the disaggregated three-module plan: %.3fx\n",
              mono / loom->predicted_iteration_seconds());
  // The same plans simulated on the batch itself (Loom's with the loom
  // assignment, the monolithic ones in arrival order).
  double simulated[3] = {0, 0, 0};
  k = 0;
  for (const auto* p : {&loom, &even, &balanced}) {
    absl::StatusOr<SimulationResult> sim = SimulatePlan(batch, **p, k == 0 ? "loom" : "sequential");
    if (!sim.ok()) return Fail(std::string(sim.status().message()));
    simulated[k] = sim->iteration_seconds;
    std::printf("  %-22s simulated %8.4f s  (generator bubble %.2f)\n", names[k],
                sim->iteration_seconds, sim->generator_bubble_fraction);
    ++k;
  }
  std::printf("simulated gain of the disaggregated three-module plan: %.3fx\n",
              std::min(simulated[1], simulated[2]) / simulated[0]);
  return 0;
}

}  // namespace
}  // namespace loom::sched

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return loom::sched::Main();
}
