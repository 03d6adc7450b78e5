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

ABSL_FLAG(std::string, out, "", "Dump file to write.");
ABSL_FLAG(int, steps, 10, "Training steps whose losses are compared.");
ABSL_FLAG(uint64_t, seed, 1, "Seed for weights and data.");
ABSL_FLAG(bool, pixel_shuffle, false, "Use the pixel-shuffle projector.");

namespace {

class DumpWriter {
 public:
  void F32(const std::string& name, const std::vector<int64_t>& dims, const float* data) {
    Record(name, 0, dims, data, 4);
  }
  void I32(const std::string& name, const std::vector<int64_t>& dims, const int32_t* data) {
    Record(name, 2, dims, data, 4);
  }
  bool Write(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return false;
    const uint32_t version = 1, n = count_;
    std::fwrite("LOOMGOLD", 1, 8, f);
    std::fwrite(&version, 4, 1, f);
    std::fwrite(&n, 4, 1, f);
    std::fwrite(body_.data(), 1, body_.size(), f);
    return std::fclose(f) == 0;
  }

 private:
  void Put(const void* p, size_t n) { body_.append(static_cast<const char*>(p), n); }
  void Record(const std::string& name, uint8_t dtype, const std::vector<int64_t>& dims,
              const void* data, size_t elem) {
    const uint32_t len = name.size(), ndim = dims.size();
    Put(&len, 4);
    Put(name.data(), len);
    Put(&dtype, 1);
    Put(&ndim, 4);
    int64_t n = 1;
    for (int64_t d : dims) {
      Put(&d, 8);
      n *= d;
    }
    Put(data, static_cast<size_t>(n) * elem);
    ++count_;
  }
  std::string body_;
  uint32_t count_ = 0;
};

void DumpParams(DumpWriter& w, const std::string& prefix, loom::ParamSet& ps, bool grads) {
  for (int i = 0; i < static_cast<int>(ps.specs().size()); ++i) {
    const loom::ParamSpec& s = ps.spec(i);
    w.F32(prefix + s.name, s.shape, grads ? ps.grad(i) : ps.param(i));
  }
}

void DumpTolerance(DumpWriter& w, const std::string& name, const loom::testing::Tolerance& t) {
  const float v[2] = {static_cast<float>(t.atol), static_cast<float>(t.rtol)};
  w.F32("tolerance/" + name, {2}, v);
}

}  // namespace

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
