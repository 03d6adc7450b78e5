// loom-train-local: trains the multimodal model in one process and prints
// one JSON line per step:
//   {"step":1,"loss":3.21,"samples":16,"tokens":384,"step_seconds":0.05}
//
//   loom-train-local --config tiny --steps 200 --seed 1
//   loom-train-local --config tiny --steps 200 --seed 1 --shuffle_images   # control
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "runtime/model/config.h"
#include "runtime/model/model.h"
#include "runtime/train/synthetic_data.h"
#include "runtime/train/trainer.h"

ABSL_FLAG(std::string, config, "tiny", "Model config: tiny, vit300m-llm1b, vit300m-llm7b.");
ABSL_FLAG(int, steps, 100, "Optimizer steps.");
ABSL_FLAG(uint64_t, seed, 1, "Seed for the weights and the data.");
ABSL_FLAG(bool, shuffle_images, false,
          "Pair each caption with another sample's image (the control run).");
ABSL_FLAG(int, batch_size, 16, "Samples per global batch.");
ABSL_FLAG(int, microbatches, 2, "Microbatches per global batch.");
ABSL_FLAG(double, lr, 1e-3, "Peak AdamW learning rate.");
ABSL_FLAG(int, warmup_steps, 10, "Linear learning-rate warm-up steps.");
ABSL_FLAG(double, clip_norm, 1.0, "Global gradient-norm clip; <= 0 disables.");
ABSL_FLAG(double, weight_decay, 0.0, "AdamW decoupled weight decay.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("loom-train-local: single-process multimodal training.");
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<loom::ModelConfig> config = loom::ModelConfigByName(absl::GetFlag(FLAGS_config));
  if (!config.ok()) {
    std::fprintf(stderr, "loom-train-local: --config: %s\n",
                 std::string(config.status().message()).c_str());
    return 1;
  }
  const int steps = absl::GetFlag(FLAGS_steps), batch = absl::GetFlag(FLAGS_batch_size);
  if (steps < 0 || batch < 1 || absl::GetFlag(FLAGS_microbatches) < 1) {
    std::fprintf(stderr,
                 "loom-train-local: --steps >= 0, --batch_size >= 1, --microbatches >= 1\n");
    return 1;
  }
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  loom::MultimodalModel model(*config);
  model.Initialize(seed);
  loom::SyntheticCaptions data(*config, seed, absl::GetFlag(FLAGS_shuffle_images));
  loom::TrainOptions options;
  options.microbatches = absl::GetFlag(FLAGS_microbatches);
  options.adam.lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
  options.adam.weight_decay = static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
  options.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  options.clip_norm = absl::GetFlag(FLAGS_clip_norm);
  loom::LocalTrainer trainer(&model, options);

  for (int s = 0; s < steps; ++s) {
    std::vector<loom::Sample> global_batch;
    for (int i = 0; i < batch; ++i)
      global_batch.push_back(data.Get(static_cast<int64_t>(s) * batch + i));
    loom::StepStats st = trainer.Step(global_batch);
    std::printf(
        "{\"step\":%lld,\"loss\":%.6f,\"samples\":%lld,\"tokens\":%lld,\"step_seconds\":%.4f,"
        "\"grad_norm\":%.4f,\"lr\":%.6g}\n",
        static_cast<long long>(st.step), st.loss, static_cast<long long>(st.samples),
        static_cast<long long>(st.tokens), st.seconds, st.grad_norm, st.lr);
    std::fflush(stdout);
  }
  return 0;
}
