// mfu_bench: model FLOPs utilisation of each module's forward + backward on
// one device, against a square fp32 GEMM through the same ops measured in
// the same run (cuBLAS on CUDA, OpenBLAS on the CPU) and against the
// device's datasheet peak.
//
//   bazel run -c opt --config=cuda //runtime/train/bench:mfu_bench -- --device cuda
//       --config vit300m-llm1b --seq 2048 --tiles 16 --peak_tflops 66.9
//   bazel run -c opt //runtime/train/bench:mfu_bench -- --device cpu --config tiny
//
// Weights are random (FillRandom). The LLM: one packed sequence of --seq
// random tokens, forward, loss and
// backward (every weight trains). The encoder: --tiles random tiles through
// the ViT and the projector, forward and backward. FLOPs are the cost
// model's (sched::AnalyticFlops: training is 3x the forward, causal
// attention counts half of L^2, the encoder per tile and so per patch), as
// loom_train_mfu_ratio counts them. Each figure is the median over --steps
// after --warmup, the device synchronised around each. Exits non-zero when it
// measured nothing.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "runtime/backends/cuda/cuda_backend.h"
#include "runtime/backends/cuda/cuda_ops.h"
#include "runtime/base/bench_timing.h"
#include "runtime/model/config.h"
#include "runtime/model/llm.h"
#include "runtime/model/model.h"
#include "runtime/model/precision.h"
#include "runtime/model/projector.h"
#include "runtime/model/vit.h"
#include "runtime/scheduling/cost_model.h"
#include "runtime/tensor/buffer.h"

ABSL_FLAG(std::string, device, "cpu", "cpu, cuda or cuda:N.");
ABSL_FLAG(std::string, config, "tiny", "Model config (runtime/model/config.h).");
ABSL_FLAG(int, seq, 256, "LLM tokens in the one packed sequence (<= the config's max_seq).");
ABSL_FLAG(int, tiles, 4, "Encoder tiles per step.");
ABSL_FLAG(int, gemm, 1024, "Side of the reference GEMM (M = K = N).");
ABSL_FLAG(int, steps, 5, "Measured steps per module.");
ABSL_FLAG(int, warmup, 2, "Unmeasured steps first.");
ABSL_FLAG(double, peak_tflops, 0,
          "The device's datasheet peak for --precision in TFLOP/s (H100 SXM: fp32 66.9, dense "
          "bf16 989); 0: not printed.");
ABSL_FLAG(std::string, precision, "fp32",
          "fp32, or bf16 mixed precision (runtime/model/precision.h); the reference GEMM too.");
ABSL_FLAG(std::string, modules, "llm,encoder", "Which modules: llm, encoder or both.");

namespace {

// Median seconds of `step` (synchronised) over --steps after --warmup.
template <typename F>
double Time(loom::Ops* ops, F step) {
  return loom::bench::MedianSeconds(
      absl::GetFlag(FLAGS_warmup), absl::GetFlag(FLAGS_steps),
      [ops] { ops->backend()->Synchronize(); }, step);
}

loom::Buffer<float> Random(loom::Ops* ops, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> h(n);
  for (float& x : h) x = d(rng);
  loom::Buffer<float> b(ops->backend());
  b.CopyFromHost(h.data(), n);
  return b;
}

// Random weights, uniform with std 0.02 (norm gains too), drawn fast: the
// speed of the step does not depend on them, and ParamSet::Initialize's
// Box-Muller takes minutes for a billion weights.
void FillRandom(loom::ParamSet& params, loom::Ops* ops, uint64_t seed, loom::Precision precision) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& w : params.data()) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    w = (static_cast<float>(x >> 40) * (1.0f / 16777216.0f) - 0.5f) * 0.0693f;  // sqrt(12) * 0.02
  }
  params.Place(ops->backend(), precision);
}

double HeldGiB(loom::Ops* ops) {
  const loom::CudaMemoryStats s = loom::GetCudaMemoryStats(ops->backend());
  return static_cast<double>(s.in_use_bytes + s.cached_bytes) / (1ull << 30);
}

void Report(const char* what, double flops, double seconds, double gemm_flops_per_s,
            loom::Ops* ops) {
  const double rate = flops / seconds;
  const double peak = absl::GetFlag(FLAGS_peak_tflops) * 1e12;
  std::printf("%-8s %9.4f s  %8.2f TFLOP/s  %5.1f%% of the GEMM", what, seconds, rate / 1e12,
              100 * rate / gemm_flops_per_s);
  if (peak > 0) std::printf("  MFU %5.1f%% of %.1f TFLOP/s", 100 * rate / peak, peak / 1e12);
  if (HeldGiB(ops) > 0) std::printf("  device memory held %.2f GiB", HeldGiB(ops));
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "mfu_bench: %s\n", m.c_str());
    return 1;
  };
  absl::StatusOr<loom::ModelConfig> config = loom::ModelConfigByName(absl::GetFlag(FLAGS_config));
  if (!config.ok()) return fail("--config: " + std::string(config.status().message()));
  std::unique_ptr<loom::Ops> owned;
  absl::StatusOr<loom::Ops*> ops_or = loom::OpsForDevice(absl::GetFlag(FLAGS_device), &owned);
  if (!ops_or.ok()) return fail("--device: " + std::string(ops_or.status().message()));
  loom::Ops* ops = *ops_or;
  const int seq = absl::GetFlag(FLAGS_seq), tiles = absl::GetFlag(FLAGS_tiles);
  const int g = absl::GetFlag(FLAGS_gemm);
  if (seq < 2 || seq > config->llm.max_seq || tiles < 1 || g < 1 ||
      absl::GetFlag(FLAGS_steps) < 1 || absl::GetFlag(FLAGS_warmup) < 0) {
    return fail("--seq in [2, max_seq], --tiles >= 1, --gemm >= 1, --steps >= 1, --warmup >= 0");
  }
  const std::string modules = absl::GetFlag(FLAGS_modules);
  absl::StatusOr<loom::Precision> precision = loom::ParsePrecision(absl::GetFlag(FLAGS_precision));
  if (!precision.ok()) return fail("--precision: " + std::string(precision.status().message()));
  const bool bf16 = *precision == loom::Precision::kBf16;
  const loom::sched::ModelFlops flops = loom::sched::AnalyticFlops(*config, /*recompute=*/false);
  std::printf("mfu_bench: %s on %s (%s), %s, median of %d steps\n", config->name.c_str(),
              absl::GetFlag(FLAGS_device).c_str(), ops->backend()->name(),
              loom::PrecisionName(*precision), absl::GetFlag(FLAGS_steps));

  // The reference: out (g, g) = a (g, g) · b (g, g)ᵀ, 2 g³ FLOPs, in the
  // layers' precision (bf16: the weight side bf16, as a layer's).
  double gemm_rate = 0;
  {
    loom::Buffer<float> a = Random(ops, static_cast<size_t>(g) * g, 1);
    loom::Buffer<float> b = Random(ops, static_cast<size_t>(g) * g, 2);
    loom::Buffer<uint16_t> b16(ops->backend());
    b16.resize(bf16 ? static_cast<size_t>(g) * g : 0);
    if (bf16) ops->f32_to_bf16(b16.data(), b.data(), int64_t{g} * g);
    const loom::WeightRef w(b.data(), bf16 ? b16.data() : nullptr);
    loom::Buffer<float> out(ops->backend());
    out.resize(static_cast<size_t>(g) * g);
    const double s = Time(ops, [&] {
      ops->linear_forward(out.data(), a.data(), w, nullptr, g, g, g);
      return true;
    });
    if (s > 0) gemm_rate = 2.0 * g * g * g / s;
    std::printf("%-8s %9.4f s  %8.2f TFLOP/s  (%d x %d x %d, the reference)\n", "gemm", s,
                gemm_rate / 1e12, g, g, g);
  }
  if (gemm_rate <= 0) return fail("the reference GEMM measured nothing");

  int measured = 0;
  if (modules.find("llm") != std::string::npos) {
    loom::Llm llm(config->llm, nullptr, {}, ops);
    FillRandom(llm.params(), ops, 7, *precision);
    loom::Sample sample;
    std::mt19937 rng(3);
    for (int i = 0; i < seq; ++i) {
      sample.tokens.push_back(static_cast<int32_t>(rng() % config->llm.vocab));
    }
    const loom::LlmBatch batch = loom::PackSamples({&sample});
    std::string error;
    const double s = Time(ops, [&] {
      absl::Status st = llm.Forward(batch, nullptr);
      absl::StatusOr<loom::kernels::LossSum> loss =
          st.ok() ? llm.Backward(1.0f / seq, nullptr) : absl::StatusOr<loom::kernels::LossSum>(st);
      if (!loss.ok()) error = std::string(loss.status().message());
      return loss.ok();
    });
    if (!error.empty()) return fail("llm: " + error);
    const double f = flops.llm_per_token * seq + flops.llm_per_token_sq * seq * seq;
    Report("llm", f, s, gemm_rate, ops);
    ++measured;
  }
  if (modules.find("encoder") != std::string::npos) {
    loom::VitEncoder vit(config->vit, nullptr, {}, ops);
    loom::Projector projector(*config, ops);
    FillRandom(vit.params(), ops, 8, *precision);
    FillRandom(projector.params(), ops, 9, *precision);
    const int S = config->vit.tile_size, Np = config->vit.patches_per_tile();
    loom::Buffer<float> in = Random(ops, static_cast<size_t>(tiles) * 3 * S * S, 4);
    loom::Buffer<float> features(ops->backend()), dfeatures(ops->backend()), out(ops->backend());
    features.resize(static_cast<size_t>(tiles) * Np * config->vit.dim);
    dfeatures.resize(features.size());
    out.resize(static_cast<size_t>(tiles) * config->tokens_per_tile() * config->llm.dim);
    loom::Buffer<float> dout = Random(ops, out.size(), 5);
    std::string error;
    const double s = Time(ops, [&] {
      absl::Status st = vit.Forward(in.data(), tiles, features.data());
      if (st.ok()) {
        projector.Forward(features.data(), tiles, out.data());
        ops->zero(dfeatures.data(), static_cast<int64_t>(dfeatures.size()));
        projector.Backward(dout.data(), dfeatures.data());
        st = vit.Backward(dfeatures.data());
      }
      if (!st.ok()) error = std::string(st.message());
      return st.ok();
    });
    if (!error.empty()) return fail("encoder: " + error);
    Report("encoder", flops.encoder_per_tile * tiles, s, gemm_rate, ops);
    std::printf("         %.3g training FLOPs per patch, %d patches per tile\n",
                flops.encoder_per_tile / Np, Np);
    ++measured;
  }
  if (measured == 0) return fail("--modules named no module (llm, encoder)");
  return 0;
}
