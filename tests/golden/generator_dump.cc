// Writes the generator's golden dump (dump_format.md, "The generator"):
// its weights and the denoiser's, a batch of output images with their
// timesteps, noise and LLM conditions, and Loom's loss, velocity, every
// parameter gradient and the condition's gradient. generator_golden_test.py
// rebuilds the generator in PyTorch and checks all of it.
//
//   generator_dump --out FILE [--seed 1] [--images 3]
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "kernels/testing/tolerances.h"
#include "runtime/model/generator.h"
#include "tests/golden/dump_writer.h"

ABSL_FLAG(std::string, out, "", "Dump file to write.");
ABSL_FLAG(uint64_t, seed, 1, "Seed for weights and data.");
ABSL_FLAG(int, images, 3, "Output images in the batch.");

using loom::golden::DumpParams;
using loom::golden::DumpTolerance;
using loom::golden::DumpWriter;

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string out = absl::GetFlag(FLAGS_out);
  const int N = absl::GetFlag(FLAGS_images);
  if (out.empty() || N < 1) {
    std::fprintf(stderr, "generator_dump: --out is required, --images at least 1\n");
    return 1;
  }
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const loom::GeneratorConfig c = loom::TinyGeneratorConfig(/*cond_dim=*/48);
  loom::Generator gen(c);
  gen.params().Initialize(seed);
  gen.denoiser_params().Initialize(seed);

  // Images with structure (the pixels of image n are smooth functions of
  // their place), timesteps and noise as training draws them, conditions
  // from the noise stream of another sample.
  const int S = c.denoiser.tile_size;
  loom::GeneratorBatch b;
  b.N = N;
  std::vector<float> cond;
  for (int n = 0; n < N; ++n) {
    for (int ch = 0; ch < 3; ++ch) {
      for (int y = 0; y < S; ++y) {
        for (int x = 0; x < S; ++x) {
          b.images.push_back(
              static_cast<float>(std::sin(0.3 * (x + 1) * (n + 1) + ch) * std::cos(0.2 * y - n)));
        }
      }
    }
    loom::GenerationDraw d = loom::DrawGeneration(seed, /*step=*/0, /*sample=*/n, 0, c.pixels());
    b.t.push_back(d.t);
    b.noise.insert(b.noise.end(), d.noise.begin(), d.noise.end());
    loom::GenerationDraw h =
        loom::DrawGeneration(seed, 0, /*sample=*/1000 + n, 0, c.queries * c.cond_dim);
    cond.insert(cond.end(), h.noise.begin(), h.noise.end());
  }
  if (absl::Status s = gen.Forward(b, cond.data()); !s.ok()) {
    std::fprintf(stderr, "generator_dump: %s\n", s.ToString().c_str());
    return 1;
  }
  const float loss = static_cast<float>(gen.LossSum() / N);
  gen.params().ZeroGrad();
  gen.denoiser_params().ZeroGrad();
  std::vector<float> dcond(cond.size(), 0.0f);
  if (absl::Status s = gen.Backward(1.0f / N, dcond.data()); !s.ok()) {
    std::fprintf(stderr, "generator_dump: %s\n", s.ToString().c_str());
    return 1;
  }
  std::vector<float> x_t(b.images.size());
  for (size_t i = 0; i < x_t.size(); ++i) {
    const float t = b.t[i / c.pixels()];
    x_t[i] = (1.0f - t) * b.images[i] + t * b.noise[i];
  }
  absl::StatusOr<std::vector<float>> v = gen.Velocity(x_t, b.t, cond.data(), N);
  if (!v.ok()) {
    std::fprintf(stderr, "generator_dump: %s\n", v.status().ToString().c_str());
    return 1;
  }

  DumpWriter w;
  const loom::VitConfig& d = c.denoiser;
  const int32_t config[] = {S,         d.patch,    d.dim,        d.layers, d.heads, d.mlp_hidden,
                            c.queries, c.cond_dim, c.time_freqs, N};
  w.I32("config", {10}, config);
  const float hp[] = {c.time_scale, d.norm_eps};
  w.F32("hparams", {2}, hp);
  DumpTolerance(w, "logits", loom::testing::kGoldenLogits);
  DumpTolerance(w, "grads", loom::testing::kGoldenGrads);
  DumpParams(w, "param/generator/", gen.params(), false);
  DumpParams(w, "param/denoiser/", gen.denoiser_params(), false);
  w.F32("images", {N, 3, S, S}, b.images.data());
  w.F32("noise", {N, 3, S, S}, b.noise.data());
  w.F32("t", {N}, b.t.data());
  w.F32("cond", {N * c.queries, c.cond_dim}, cond.data());
  w.F32("loss", {1}, &loss);
  w.F32("velocity", {N, 3, S, S}, v->data());
  DumpParams(w, "grad/generator/", gen.params(), true);
  DumpParams(w, "grad/denoiser/", gen.denoiser_params(), true);
  w.F32("grad/cond", {N * c.queries, c.cond_dim}, dcond.data());
  if (!w.Write(out)) {
    std::fprintf(stderr, "generator_dump: cannot write %s\n", out.c_str());
    return 1;
  }
  std::printf("generator_dump: wrote %s (loss %.6f, %d images)\n", out.c_str(), loss, N);
  return 0;
}
