// Writes the golden dump (tests/golden/dump_format.md) for the tiny model:
// initial weights, inputs of every step, step 0's logits, loss and gradients,
// and the losses of N training steps. golden_test.py rebuilds the model in
// PyTorch and checks all of it.
//
//   golden_dump --out FILE [--steps 10] [--seed 1] [--pixel_shuffle]
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "kernels/testing/tolerances.h"
#include "runtime/model/model.h"
#include "runtime/train/synthetic_data.h"
#include "runtime/train/trainer.h"
#include "tests/golden/dump_writer.h"

ABSL_FLAG(std::string, out, "", "Dump file to write.");
ABSL_FLAG(int, steps, 10, "Training steps whose losses are compared.");
ABSL_FLAG(uint64_t, seed, 1, "Seed for weights and data.");
ABSL_FLAG(bool, pixel_shuffle, false, "Use the pixel-shuffle projector.");

using loom::golden::DumpParams;
using loom::golden::DumpTolerance;
using loom::golden::DumpWriter;

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::fprintf(stderr, "golden_dump: --out is required\n");
    return 1;
  }
  loom::ModelConfig c = *loom::ModelConfigByName("tiny");
  c.projector.pixel_shuffle = absl::GetFlag(FLAGS_pixel_shuffle);
  const int steps = absl::GetFlag(FLAGS_steps), batch = 8;
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  loom::TrainOptions opt;
  opt.microbatches = 2;
  opt.warmup_steps = 3;
  opt.adam.weight_decay = 0.1f;  // the usual LLM value; large enough that the golden
                                 // losses see which tensors decay (the decay-all mutation)
  opt.clip_norm = 1.0;

  loom::MultimodalModel model(c);
  model.Initialize(seed);
  loom::SyntheticCaptions data(c, seed, /*shuffle_images=*/false);
  DumpWriter w;
  const int32_t config[] = {c.vit.tile_size,
                            c.vit.patch,
                            c.vit.dim,
                            c.vit.layers,
                            c.vit.heads,
                            c.vit.mlp_hidden,
                            c.projector.pixel_shuffle,
                            c.projector.hidden,
                            c.llm.vocab,
                            c.llm.dim,
                            c.llm.layers,
                            c.llm.heads,
                            c.llm.ffn_hidden,
                            steps,
                            opt.microbatches,
                            opt.warmup_steps};
  w.I32("config", {16}, config);
  const float hp[] = {opt.adam.lr,     opt.adam.beta1,        opt.adam.beta2,
                      opt.adam.eps,    opt.adam.weight_decay, static_cast<float>(opt.clip_norm),
                      c.llm.rope_theta};
  w.F32("hparams", {7}, hp);
  DumpTolerance(w, "logits", loom::testing::kGoldenLogits);
  DumpTolerance(w, "grads", loom::testing::kGoldenGrads);
  DumpTolerance(w, "losses", loom::testing::kGoldenLosses);
  DumpParams(w, "param/vit/", model.vit().params(), false);
  DumpParams(w, "param/projector/", model.projector().params(), false);
  DumpParams(w, "param/llm/", model.llm().params(), false);

  std::vector<std::vector<loom::Sample>> batches(steps);
  for (int s = 0; s < steps; ++s) {
    std::vector<float> tiles;
    std::vector<int32_t> counts, lengths, tokens;
    for (int i = 0; i < batch; ++i) {
      batches[s].push_back(data.Get(static_cast<int64_t>(s) * batch + i));
      const loom::Sample& x = batches[s].back();
      tiles.insert(tiles.end(), x.tiles.begin(), x.tiles.end());
      counts.push_back(x.num_tiles);
      lengths.push_back(static_cast<int32_t>(x.tokens.size()));
      tokens.insert(tokens.end(), x.tokens.begin(), x.tokens.end());
    }
    const std::string p = "step" + std::to_string(s) + "/";
    const int64_t S = c.vit.tile_size;
    w.F32(p + "tiles", {static_cast<int64_t>(tiles.size() / (3 * S * S)), 3, S, S}, tiles.data());
    w.I32(p + "tile_counts", {batch}, counts.data());
    w.I32(p + "lengths", {batch}, lengths.data());
    w.I32(p + "tokens", {static_cast<int64_t>(tokens.size())}, tokens.data());
  }

  // Step 0 at the initial weights: logits and loss of the whole batch at once,
  // gradients microbatched exactly as the trainer does.
  std::vector<const loom::Sample*> all;
  int64_t loss_tokens = 0;
  for (const loom::Sample& x : batches[0]) {
    all.push_back(&x);
    loss_tokens += loom::LossTokens(x);
  }
  const loom::kernels::LossSum l0 = model.Evaluate(all);
  const std::vector<float> logits = model.llm().logits();
  w.F32("logits", {static_cast<int64_t>(logits.size() / c.llm.vocab), c.llm.vocab}, logits.data());
  const float loss0 = static_cast<float>(l0.sum / loss_tokens);
  w.F32("loss", {1}, &loss0);
  model.ZeroGrad();
  for (int m = 0; m < opt.microbatches; ++m) {
    std::vector<const loom::Sample*> mb(all.begin() + batch * m / opt.microbatches,
                                        all.begin() + batch * (m + 1) / opt.microbatches);
    model.ForwardBackward(mb, 1.0f / loss_tokens);
  }
  DumpParams(w, "grad/vit/", model.vit().params(), true);
  DumpParams(w, "grad/projector/", model.projector().params(), true);
  DumpParams(w, "grad/llm/", model.llm().params(), true);

  loom::LocalTrainer trainer(&model, opt);
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s)
    losses.push_back(static_cast<float>(trainer.Step(batches[s]).loss));
  w.F32("losses", {steps}, losses.data());
  if (!w.Write(out)) {
    std::fprintf(stderr, "golden_dump: cannot write %s\n", out.c_str());
    return 1;
  }
  std::printf("golden_dump: wrote %s (loss %.6f, %d steps)\n", out.c_str(), loss0, steps);
  return 0;
}
