// frozen_bench: the step time of LLaVA's stage 1 (vision and LLM frozen: the
// projector alone trains) and stage 2 (the tower frozen) against full
// training, measured side by side in one run on the same model, batch and
// weights (LocalTrainer, the single-process reference), next to the ratio
// the cost model predicts (sched::AnalyticFlops).
//
//   bazel run -c opt //runtime/train/bench:frozen_bench -- --config tiny-deep
//   bazel run -c opt //runtime/train/bench:frozen_bench -- --llava DIR   # Hugging Face
//                                        (or --llm_from DIR --vision_from DIR)
//
// The configurations take turns step by step so that drift in the machine's
// speed hits them alike; each figure is the median over --steps steps after
// --warmup. Exits non-zero when it measured nothing.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "runtime/base/bench_timing.h"
#include "runtime/hf/model_flags.h"
#include "runtime/hf/pretrained.h"
#include "runtime/model/model.h"
#include "runtime/scheduling/cost_model.h"
#include "runtime/train/synthetic_data.h"
#include "runtime/train/trainer.h"

ABSL_FLAG(std::string, config, "tiny-deep", "Model config.");
ABSL_FLAG(int, steps, 15, "Measured steps per configuration.");
ABSL_FLAG(int, warmup, 2, "Unmeasured steps per configuration first.");
ABSL_FLAG(int, batch_size, 16, "Samples per global batch.");

using loom::bench::Median;

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const loom::hf::ModelSource source = loom::hf::ModelSourceFromFlags(absl::GetFlag(FLAGS_config));
  absl::StatusOr<loom::hf::PretrainedModel> pretrained = loom::hf::ResolveModel(source);
  if (!pretrained.ok()) {
    std::fprintf(stderr, "frozen_bench: %s%s\n", source.pretrained() ? "--" : "--config: ",
                 std::string(pretrained.status().message()).c_str());
    return 1;
  }
  const loom::ModelConfig* config = &pretrained->config;
  const int steps = absl::GetFlag(FLAGS_steps), warmup = absl::GetFlag(FLAGS_warmup);
  const int batch_size = absl::GetFlag(FLAGS_batch_size);
  if (steps < 1 || warmup < 0 || batch_size < 1) {
    std::fprintf(stderr, "frozen_bench: --steps >= 1, --warmup >= 0, --batch_size >= 1\n");
    return 1;
  }
  struct Run {
    const char* name;
    const char* freeze;
    std::unique_ptr<loom::MultimodalModel> model;
    std::unique_ptr<loom::LocalTrainer> trainer;
    std::vector<double> seconds;
    double predicted = 0;  // training FLOPs per sample of the batch's shape
  };
  std::vector<Run> runs;
  runs.push_back({"full training", ""});
  runs.push_back({"stage 2 (vision frozen)", "vision"});
  runs.push_back({"stage 1 (vision, llm frozen)", "vision,llm"});
  loom::SyntheticCaptions data(*config, 1, false);
  std::vector<std::vector<loom::Sample>> batches(warmup + steps);
  for (size_t s = 0; s < batches.size(); ++s) {
    for (int i = 0; i < batch_size; ++i) batches[s].push_back(data.Get(s * batch_size + i));
  }
  // The cost model's training FLOPs of the first batch under each freeze.
  int64_t tiles = 0, tokens = 0;
  for (const loom::Sample& s : batches[0]) {
    tiles += s.num_tiles;
    tokens += static_cast<int64_t>(s.tokens.size());
  }
  for (Run& r : runs) {
    absl::StatusOr<loom::Frozen> frozen = loom::ParseFrozen(r.freeze);
    if (!frozen.ok()) return 1;
    r.model = std::make_unique<loom::MultimodalModel>(*config);
    r.model->Initialize(1);
    if (absl::Status st = loom::hf::LoadPretrainedWeights(*pretrained, r.model.get()); !st.ok()) {
      std::fprintf(stderr, "frozen_bench: --%s\n", std::string(st.message()).c_str());
      return 1;
    }
    r.model->Freeze(*frozen);
    r.trainer = std::make_unique<loom::LocalTrainer>(r.model.get(), loom::TrainOptions());
    const loom::sched::ModelFlops f = loom::sched::AnalyticFlops(*config, false, *frozen);
    r.predicted = f.encoder_per_tile * tiles + f.llm_per_token * tokens;
  }
  for (int s = 0; s < warmup + steps; ++s) {
    for (Run& r : runs) {
      const loom::StepStats st = r.trainer->Step(batches[s]);
      if (s >= warmup) r.seconds.push_back(st.seconds);
    }
  }
  const double full = Median(runs[0].seconds);
  if (!(full > 0)) {
    std::fprintf(stderr, "frozen_bench: no step time measured\n");
    return 1;
  }
  std::printf("frozen_bench: %s, %d samples per step, median of %d steps (after %d warm-up)\n",
              config->name.c_str(), batch_size, steps, warmup);
  std::printf("%-30s %12s %14s %16s\n", "", "step (ms)", "vs full", "predicted (FLOPs)");
  for (const Run& r : runs) {
    const double t = Median(r.seconds);
    std::printf("%-30s %12.2f %13.3fx %15.3fx\n", r.name, 1e3 * t, t / full,
                r.predicted / runs[0].predicted);
  }
  return 0;
}
