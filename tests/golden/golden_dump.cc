// Writes the golden dump (tests/golden/dump_format.md) for the tiny model:
// initial weights, inputs of every step, step 0's logits, loss and gradients,
// and the losses of N training steps. golden_test.py rebuilds the model in
// PyTorch and checks all of it.
//
//   golden_dump --out FILE [--steps 10] [--seed 1] [--pixel_shuffle] [--config tiny-gen]
//
// With a generator (tiny-gen) it also dumps the generator's weights, each
// step's output images with the timesteps and noise the trainer draws for
// them, the generator's gradients and each step's generation loss.
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
ABSL_FLAG(std::string, config, "tiny", "tiny, or tiny-gen (with a generator).");

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
  absl::StatusOr<loom::ModelConfig> named = loom::ModelConfigByName(absl::GetFlag(FLAGS_config));
  if (!named.ok() || (named->name != "tiny" && named->name != "tiny-gen")) {
    std::fprintf(stderr, "golden_dump: --config tiny or tiny-gen\n");
    return 1;
  }
  loom::ModelConfig c = *named;
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
  const bool gen = c.has_generator();
  if (gen) {
    const loom::GeneratorConfig& g = c.generator;
    const loom::VitConfig& d = g.denoiser;
    const int32_t gc[] = {d.tile_size,  d.patch,   d.dim,      d.layers,     d.heads,
                          d.mlp_hidden, g.queries, g.cond_dim, g.time_freqs, 0};
    w.I32("gen/config", {10}, gc);
    const float gh[] = {g.time_scale, d.norm_eps, static_cast<float>(opt.generation_weight)};
    w.F32("gen/hparams", {3}, gh);
    DumpParams(w, "param/generator/", model.generator()->params(), false);
    DumpParams(w, "param/generator_denoiser/", model.generator()->denoiser_params(), false);
  }

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
    if (!gen) continue;
    // The output images in sample order, with the draws of step s + 1 (the
    // trainer's 1-based step) for each sample's id.
    std::vector<int32_t> gen_counts;
    std::vector<float> images, t, noise;
    for (const loom::Sample& x : batches[s]) {
      gen_counts.push_back(x.num_gen_images);
      images.insert(images.end(), x.gen_images.begin(), x.gen_images.end());
      for (int j = 0; j < x.num_gen_images; ++j) {
        const loom::GenerationDraw d =
            loom::DrawGeneration(seed, s + 1, x.id, j, c.generator.pixels());
        t.push_back(d.t);
        noise.insert(noise.end(), d.noise.begin(), d.noise.end());
      }
    }
    const int64_t n = static_cast<int64_t>(t.size()), Sg = c.generator.denoiser.tile_size;
    w.I32(p + "gen_counts", {batch}, gen_counts.data());
    w.F32(p + "gen_images", {n, 3, Sg, Sg}, images.data());
    w.F32(p + "gen_t", {n}, t.data());
    w.F32(p + "gen_noise", {n, 3, Sg, Sg}, noise.data());
  }

  // Step 0 at the initial weights: logits and loss of the whole batch at once,
  // gradients microbatched exactly as the trainer does.
  std::vector<const loom::Sample*> all;
  int64_t loss_tokens = 0, gen_images = 0;
  for (const loom::Sample& x : batches[0]) {
    all.push_back(&x);
    loss_tokens += loom::LossTokens(x);
    gen_images += x.num_gen_images;
  }
  model.set_generation_draws(seed, 1);  // step 0's, as the trainer draws them
  const loom::kernels::LossSum l0 = model.Evaluate(all);
  const std::vector<float> logits = model.llm().logits();
  w.F32("logits", {static_cast<int64_t>(logits.size() / c.llm.vocab), c.llm.vocab}, logits.data());
  const float loss0 = static_cast<float>(l0.sum / loss_tokens);
  w.F32("loss", {1}, &loss0);
  model.ZeroGrad();
  for (int m = 0; m < opt.microbatches; ++m) {
    std::vector<const loom::Sample*> mb(all.begin() + batch * m / opt.microbatches,
                                        all.begin() + batch * (m + 1) / opt.microbatches);
    model.ForwardBackward(
        mb, 1.0f / loss_tokens,
        gen_images > 0 ? static_cast<float>(opt.generation_weight) / gen_images : 0.0f);
  }
  DumpParams(w, "grad/vit/", model.vit().params(), true);
  DumpParams(w, "grad/projector/", model.projector().params(), true);
  DumpParams(w, "grad/llm/", model.llm().params(), true);
  if (gen) {
    DumpParams(w, "grad/generator/", model.generator()->params(), true);
    DumpParams(w, "grad/generator_denoiser/", model.generator()->denoiser_params(), true);
  }

  opt.seed = seed;
  loom::LocalTrainer trainer(&model, opt);
  std::vector<float> losses, gen_losses;
  for (int s = 0; s < steps; ++s) {
    const loom::StepStats st = trainer.Step(batches[s]);
    losses.push_back(static_cast<float>(st.loss));
    gen_losses.push_back(static_cast<float>(st.generation_loss));
  }
  w.F32("losses", {steps}, losses.data());
  if (gen) w.F32("gen/losses", {steps}, gen_losses.data());
  if (!w.Write(out)) {
    std::fprintf(stderr, "golden_dump: cannot write %s\n", out.c_str());
    return 1;
  }
  std::printf("golden_dump: wrote %s (loss %.6f, %d steps)\n", out.c_str(), loss0, steps);
  return 0;
}
