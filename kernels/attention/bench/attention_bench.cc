// attention_bench: the memory-efficient attention (flash_attention_*)
// against the standard kernels (the L x L probabilities kept; OpenBLAS GEMMs
// on the CPU, the per-row kernels on CUDA) on the same shapes, forward +
// backward, side by side in one run, with each one's memory beyond qkv, out
// and the gradients.
//
//   bazel run -c opt //kernels/attention/bench:attention_bench -- --device cpu --length 512
//   attention_bench --device cuda --sequences 1 --length 4096 --heads 16 --head_dim 128 --causal
//
// FLOPs as FlashAttention-2's benchmark counts them: the forward 4 L² HD per
// head and sequence (half of it when causal), the backward 2.5x the forward.
// Medians over --steps after --warmup. Exits non-zero when it measured
// nothing.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "kernels/attention/attention.h"
#include "kernels/cuda/ops.h"
#include "runtime/backends/cuda/device.h"
#include "runtime/base/bench_timing.h"

#ifdef LOOM_WITH_CUDA
#include <cuda_runtime.h>

#include "runtime/backends/cuda/cuda_check.h"
#endif

ABSL_FLAG(std::string, device, "cpu", "cpu or cuda (device 0).");
ABSL_FLAG(int, sequences, 1, "Sequences packed in the batch.");
ABSL_FLAG(int, length, 512, "Tokens per sequence.");
ABSL_FLAG(int, heads, 16, "Query heads.");
ABSL_FLAG(int, kv_heads, 0, "Key/value heads (0: --heads).");
ABSL_FLAG(int, head_dim, 128, "Head dimension.");
ABSL_FLAG(bool, causal, true, "Causal (the LLM) or full (the ViT's tiles).");
ABSL_FLAG(std::string, precision, "fp32",
          "fp32, or bf16: flash's bf16 path (on CUDA the tensor cores; the standard kernels "
          "stay fp32).");
ABSL_FLAG(int, steps, 5, "Measured steps.");
ABSL_FLAG(int, warmup, 2, "Unmeasured steps first.");
ABSL_FLAG(bool, standard, true,
          "Also time the standard kernels (false: flash alone, e.g. at lengths whose L x L "
          "probabilities would not fit; then the peak RSS is flash's).");

namespace {

// Memory of the device the bench runs on: host vectors or device buffers.
class Mem {
 public:
  explicit Mem(bool gpu) : gpu_(gpu) {}
  ~Mem() {
    for (float* p : owned_) Free(p);
  }
  float* Alloc(size_t n, uint32_t seed) {
    std::vector<float> h(n);
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (float& x : h) x = d(rng);
    float* p = nullptr;
#ifdef LOOM_WITH_CUDA
    if (gpu_) {
      LOOM_CUDA_CHECK(cudaMalloc(&p, sizeof(float) * std::max<size_t>(n, 1)));
      LOOM_CUDA_CHECK(cudaMemcpy(p, h.data(), sizeof(float) * n, cudaMemcpyHostToDevice));
    }
#endif
    if (!gpu_) {
      p = new float[n];
      std::copy(h.begin(), h.end(), p);
    }
    owned_.push_back(p);
    return p;
  }
  int32_t* Ints(const std::vector<int32_t>& h) {
    if (!gpu_) return ints_.emplace_back(h).data();
    int32_t* p = nullptr;
#ifdef LOOM_WITH_CUDA
    LOOM_CUDA_CHECK(cudaMalloc(&p, sizeof(int32_t) * h.size()));
    LOOM_CUDA_CHECK(cudaMemcpy(p, h.data(), sizeof(int32_t) * h.size(), cudaMemcpyHostToDevice));
    owned_.push_back(reinterpret_cast<float*>(p));
#endif
    return p;
  }
  void Sync() {
#ifdef LOOM_WITH_CUDA
    if (gpu_) LOOM_CUDA_CHECK(cudaDeviceSynchronize());
#endif
  }

 private:
  void Free(float* p) {
#ifdef LOOM_WITH_CUDA
    if (gpu_) {
      cudaFree(p);
      return;
    }
#endif
    delete[] p;
  }
  bool gpu_;
  std::vector<float*> owned_;
  std::vector<std::vector<int32_t>> ints_;
};

double PeakRssMiB() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;  // KiB on Linux
}

double MedianSeconds(Mem& mem, const std::function<void()>& step) {
  return loom::bench::MedianSeconds(
      absl::GetFlag(FLAGS_warmup), absl::GetFlag(FLAGS_steps), [&mem] { mem.Sync(); }, step);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string device = absl::GetFlag(FLAGS_device);
  const bool gpu = device == "cuda";
  const int S = absl::GetFlag(FLAGS_sequences), L = absl::GetFlag(FLAGS_length);
  const int NH = absl::GetFlag(FLAGS_heads), HD = absl::GetFlag(FLAGS_head_dim);
  const int NKV = absl::GetFlag(FLAGS_kv_heads) > 0 ? absl::GetFlag(FLAGS_kv_heads) : NH;
  const bool causal = absl::GetFlag(FLAGS_causal);
  const std::string precision = absl::GetFlag(FLAGS_precision);
  if (precision != "fp32" && precision != "bf16") {
    std::fprintf(stderr, "attention_bench: --precision %s: want fp32 or bf16\n", precision.c_str());
    return 2;
  }
  const bool bf16 = precision == "bf16";
  if ((device != "cpu" && !gpu) || S < 1 || L < 1 || NH < 1 || HD < 1 || NH % NKV != 0 ||
      absl::GetFlag(FLAGS_steps) < 1 || absl::GetFlag(FLAGS_warmup) < 0) {
    std::fprintf(stderr,
                 "attention_bench: --device cpu|cuda, positive sizes, --kv_heads dividing "
                 "--heads, --steps >= 1\n");
    return 1;
  }
  if (gpu && !(loom::cuda::CompiledWithCuda() && loom::cuda::DeviceCount() > 0)) {
    std::fprintf(stderr, "attention_bench: --device cuda: no usable CUDA device in this build\n");
    return 1;
  }
  const int T = S * L, C = NH * HD, W = (NH + 2 * NKV) * HD;
  std::vector<int32_t> cu(S + 1);
  for (int s = 0; s <= S; ++s) cu[s] = s * L;
  const int64_t na = loom::kernels::attention_att_size(cu.data(), S, NH);
  Mem mem(gpu);
  float* qkv = mem.Alloc(static_cast<size_t>(T) * W, 1);
  float* dout = mem.Alloc(static_cast<size_t>(T) * C, 2);
  float* out = mem.Alloc(static_cast<size_t>(T) * C, 3);
  float* dqkv = mem.Alloc(static_cast<size_t>(T) * W, 4);
  float* lse = mem.Alloc(static_cast<size_t>(T) * NH, 5);
  [[maybe_unused]] float* scratch = mem.Alloc(static_cast<size_t>(T) * NH, 6);
  int32_t* dcu = mem.Ints(cu);
  namespace k = loom::kernels;
  const double flash_s = MedianSeconds(mem, [&] {
    if (gpu) {
#ifdef LOOM_WITH_CUDA
      k::cuda::flash_attention_forward(out, lse, qkv, dcu, S, T, NH, NKV, HD, causal, bf16);
      k::cuda::flash_attention_backward(dqkv, scratch, dout, qkv, out, lse, dcu, S, T, NH, NKV, HD,
                                        causal, bf16);
#endif
    } else {
      k::flash_attention_forward(out, lse, qkv, dcu, S, NH, NKV, HD, causal, bf16);
      k::flash_attention_backward(dqkv, dout, qkv, out, lse, dcu, S, NH, NKV, HD, causal, bf16);
    }
  });
  // flash's peak, before the standard kernels allocate (the process's peak
  // resident set on the CPU: the inputs, outputs and lse).
  const double flash_peak_mib = PeakRssMiB();
  std::printf(
      "attention_bench on %s, flash in %s, standard in fp32: %d x %d tokens, %d heads "
      "(%d kv) x %d, %s\n",
      device.c_str(), precision.c_str(), S, L, NH, NKV, HD, causal ? "causal" : "full");
  const double fwd = 4.0 * S * L * static_cast<double>(L) * HD * NH / (causal ? 2 : 1);
  const double flops = 3.5 * fwd;
  if (flash_s <= 0) {
    std::fprintf(stderr, "attention_bench: measured nothing\n");
    return 1;
  }
  std::printf("  flash     %9.4f s  %8.2f TFLOP/s  memory beyond the tensors %8.2f MiB (lse)\n",
              flash_s, flops / flash_s / 1e12, 4.0 * T * NH * 2 / (1 << 20));
  if (!gpu) std::printf("  peak RSS with flash alone %.1f MiB\n", flash_peak_mib);
  if (!absl::GetFlag(FLAGS_standard)) return 0;
  float* att = mem.Alloc(static_cast<size_t>(na), 7);
  [[maybe_unused]] float* att_scratch = mem.Alloc(static_cast<size_t>(T) * NH, 8);
  const double standard_s = MedianSeconds(mem, [&] {
    if (gpu) {
#ifdef LOOM_WITH_CUDA
      k::cuda::attention_forward(out, att, qkv, dcu, S, T, NH, NKV, HD, causal);
      k::cuda::attention_backward(dqkv, att_scratch, dout, qkv, att, dcu, S, T, NH, NKV, HD,
                                  causal);
#endif
    } else {
      k::attention_forward(out, att, qkv, dcu, S, NH, NKV, HD, causal);
      k::attention_backward(dqkv, dout, qkv, att, dcu, S, NH, NKV, HD, causal);
    }
  });
  if (standard_s <= 0) {
    std::fprintf(stderr, "attention_bench: measured nothing\n");
    return 1;
  }
  std::printf("  standard  %9.4f s  %8.2f TFLOP/s  memory beyond the tensors %8.2f MiB (L x L)\n",
              standard_s, flops / standard_s / 1e12,
              4.0 * (na + static_cast<double>(T) * NH) / (1 << 20));
  std::printf("  flash / standard time %.3f\n", flash_s / standard_s);
  return 0;
}
