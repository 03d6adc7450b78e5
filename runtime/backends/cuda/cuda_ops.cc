#include "runtime/backends/cuda/cuda_ops.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "runtime/backends/cuda/cuda_backend.h"
#include "runtime/tensor/buffer.h"

#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/ops.h"
#include "runtime/backends/cuda/cuda_check.h"
#endif

namespace loom {

#ifdef LOOM_WITH_CUDA
namespace {

namespace k = kernels::cuda;

class CudaOps final : public Ops {
 public:
  explicit CudaOps(std::unique_ptr<Backend> backend) : backend_(std::move(backend)) {}

  Backend* backend() const override { return backend_.get(); }

  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int M,
                      int K, int N) override {
    k::matmul_forward(out, inp, weight, bias, M, K, N);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int M, int K, int N) override {
    k::matmul_backward(dinp, dweight, dbias, dout, inp, weight, M, K, N);
  }
  void matmul_forward_bf16(float* out, const float* inp, const uint16_t* weight, const float* bias,
                           int M, int K, int N) override {
    uint16_t* inp16 = HalfScratch(int64_t{M} * K);
    k::f32_to_bf16(inp16, inp, int64_t{M} * K);
    k::matmul_forward_bf16(out, inp16, weight, bias, M, K, N);
  }
  void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout,
                            const float* inp, const uint16_t* weight, int M, int K,
                            int N) override {
    const int64_t mn = int64_t{M} * N, mk = int64_t{M} * K;
    uint16_t* dout16 = HalfScratch(mn + (dweight != nullptr ? mk : 0));
    k::f32_to_bf16(dout16, dout, mn);
    uint16_t* inp16 = nullptr;
    if (dweight != nullptr) {
      inp16 = dout16 + mn;
      k::f32_to_bf16(inp16, inp, mk);
    }
    k::matmul_backward_bf16(dinp, dweight, dbias, dout, dout16, inp16, weight, M, K, N);
  }
  void f32_to_bf16(uint16_t* dst, const float* src, int64_t n) override {
    k::f32_to_bf16(dst, src, n);
  }
  void bf16_to_f32(float* dst, const uint16_t* src, int64_t n) override {
    k::bf16_to_f32(dst, src, n);
  }
  void round_to_bf16(float* x, int64_t n) override { k::round_to_bf16(x, n); }

  void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                    const kernels::AdamWConfig& c, int64_t step) override {
    if (n > 0)
      k::adamw_update(param, grad, m, v, n, c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, step);
  }
  double sum_of_squares(const float* x, int64_t n) override {
    if (n <= 0) return 0.0;
    float* sum = Scratch(1 + k::kSumSquaresPartials);  // the sum, then the blocks' partials
    backend_->Fill(sum, 0, sizeof(float));
    k::sum_squares(sum, sum + 1, x, n);
    float host = 0;
    backend_->CopyToHost(&host, sum, sizeof(float));
    return host;
  }
  void scale(float* x, float factor, int64_t n) override {
    if (n > 0) k::scale(x, factor, n);
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C, float eps) override {
    k::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    k::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void rmsnorm_forward(float* out, float* rrms, const float* inp, const float* weight, int N, int C,
                       float eps) override {
    k::rmsnorm_forward(out, rrms, inp, weight, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                        const float* weight, const float* rrms, int N, int C) override {
    k::rmsnorm_backward(dinp, dweight, dout, inp, weight, rrms, N, C);
  }

  void activation_forward(kernels::Activation act, float* out, const float* inp,
                          int64_t n) override {
    k::activation_forward(act, out, inp, n);
  }
  void activation_backward(kernels::Activation act, float* dinp, const float* inp,
                           const float* dout, int64_t n) override {
    k::activation_backward(act, dinp, inp, dout, n);
  }
  void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) override {
    k::swiglu_forward(out, gate, up, n);
  }
  void swiglu_backward(float* dgate, float* dup, const float* gate, const float* up,
                       const float* dout, int64_t n) override {
    k::swiglu_backward(dgate, dup, gate, up, dout, n);
  }

  void rope_forward(float* qkv, const int32_t* positions, const float* inv_freq, int T, int NH,
                    int NKV, int HD) override {
    k::rope_forward(qkv, positions, inv_freq, T, NH, NKV, HD);
  }
  void rope_backward(float* dqkv, const int32_t* positions, const float* inv_freq, int T, int NH,
                     int NKV, int HD) override {
    k::rope_backward(dqkv, positions, inv_freq, T, NH, NKV, HD);
  }

  void attention_forward(float* out, float* lse, const float* qkv, const int32_t* cu_seqlens, int S,
                         int T, int NH, int NKV, int HD, bool causal, bool bf16) override {
    k::flash_attention_forward(out, lse, qkv, cu_seqlens, S, T, NH, NKV, HD, causal, bf16);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* lse, const int32_t* cu_seqlens, int S, int T, int NH,
                          int NKV, int HD, bool causal, bool bf16) override {
    float* scratch = Scratch(static_cast<int64_t>(T) * NH);  // a value per row and head
    k::flash_attention_backward(dqkv, scratch, dout, qkv, out, lse, cu_seqlens, S, T, NH, NKV, HD,
                                causal, bf16);
  }

  void patchify(float* patches, const float* tiles, int N, int S, int P) override {
    k::patchify(patches, tiles, N, S, P);
  }
  void add_position_forward(float* x, const float* pos, int N, int Np, int C) override {
    k::add_position_forward(x, pos, N, Np, C);
  }
  void add_position_backward(float* dpos, const float* dx, int N, int Np, int C) override {
    k::add_position_backward(dpos, dx, N, Np, C);
  }
  void pixel_shuffle_forward(float* out, const float* inp, int N, int G, int C) override {
    k::pixel_shuffle_forward(out, inp, N, G, C);
  }
  void pixel_shuffle_backward(float* dinp, const float* dout, int N, int G, int C) override {
    k::pixel_shuffle_backward(dinp, dout, N, G, C);
  }
  void vocab_embedding_forward(float* out, const int32_t* tokens, const float* table, int T, int C,
                               int vocab_start, int v_shard) override {
    k::vocab_embedding_forward(out, tokens, table, T, C, vocab_start, v_shard);
  }
  void vocab_embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int T,
                                int C, int vocab_start, int v_shard) override {
    // The shard's tokens grouped by table row on the host (stable: token
    // order within a row), so that each row's sum is deterministic.
    std::vector<int32_t> host(T);
    LOOM_CUDA_CHECK(cudaMemcpy(host.data(), tokens, sizeof(int32_t) * T, cudaMemcpyDeviceToHost));
    std::vector<std::pair<int32_t, int32_t>> pairs;  // (row, token index)
    for (int t = 0; t < T; ++t) {
      const int v = host[t] - vocab_start;
      if (host[t] >= 0 && v >= 0 && v < v_shard) pairs.emplace_back(v, t);
    }
    std::stable_sort(pairs.begin(), pairs.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<int32_t> runs;  // rows | offsets | order, one upload
    std::vector<int32_t> offsets{0}, order;
    for (size_t k = 0; k < pairs.size(); ++k) {
      if (k == 0 || pairs[k].first != pairs[k - 1].first) {
        if (k > 0) offsets.push_back(static_cast<int32_t>(k));
        runs.push_back(pairs[k].first);
      }
      order.push_back(pairs[k].second);
    }
    if (runs.empty()) return;
    offsets.push_back(static_cast<int32_t>(pairs.size()));
    const int R = static_cast<int>(runs.size());
    runs.insert(runs.end(), offsets.begin(), offsets.end());
    runs.insert(runs.end(), order.begin(), order.end());
    int32_t* dev = IntScratch(static_cast<int64_t>(runs.size()));
    LOOM_CUDA_CHECK(
        cudaMemcpy(dev, runs.data(), sizeof(int32_t) * runs.size(), cudaMemcpyHostToDevice));
    k::embedding_backward_runs(dtable, dout, dev, dev + R, dev + 2 * R + 1, R, C);
  }

  kernels::LossSum crossentropy_forward(const float* logits, const int32_t* targets, int T,
                                        int V) override {
    return CrossEntropy(nullptr, Scratch(T), logits, targets, T, V, 0.0f);  // the losses only
  }
  kernels::LossSum crossentropy_forward_backward(float* dlogits, const float* logits,
                                                 const int32_t* targets, int T, int V,
                                                 float grad_scale) override {
    return CrossEntropy(dlogits, Scratch(T), logits, targets, T, V, grad_scale);
  }

  void crossentropy_shard_max(float* mx, const float* logits, int T, int V) override {
    k::crossentropy_shard_max(mx, logits, T, V);
  }
  void crossentropy_shard_sums(double* sums, const float* logits, const float* mx,
                               const int32_t* targets, int T, int V, int vocab_start) override {
    k::crossentropy_shard_sums(sums, logits, mx, targets, T, V, vocab_start);
  }
  kernels::LossSum crossentropy_shard_finish(float* dlogits, const float* logits, const float* mx,
                                             const double* sums, const int32_t* targets, int T,
                                             int V, int vocab_start, float grad_scale) override {
    if (dlogits != nullptr) {
      k::crossentropy_shard_grad(dlogits, logits, mx, sums, targets, T, V, vocab_start, grad_scale);
    }
    // The loss from the sums, on the host in row order as on the CPU.
    std::vector<double> s(2 * static_cast<size_t>(T));
    std::vector<int32_t> tgt(T);
    LOOM_CUDA_CHECK(cudaMemcpy(s.data(), sums, sizeof(double) * s.size(), cudaMemcpyDeviceToHost));
    LOOM_CUDA_CHECK(cudaMemcpy(tgt.data(), targets, sizeof(int32_t) * T, cudaMemcpyDeviceToHost));
    kernels::LossSum out;
    for (int t = 0; t < T; ++t) {
      if (tgt[t] < 0) continue;
      out.sum += std::log(s[2 * t]) - s[2 * t + 1];
      ++out.count;
    }
    return out;
  }

  void add(float* x, const float* y, int64_t n) override { k::add(x, y, n); }
  void add_bias(float* out, const float* bias, int M, int N) override {
    k::add_bias(out, bias, M, N);
  }
  void copy(float* dst, const float* src, int64_t n) override {
    if (n <= 0) return;
    LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, sizeof(float) * n, cudaMemcpyDeviceToDevice, 0));
  }
  void zero(float* x, int64_t n) override {
    if (n <= 0) return;
    LOOM_CUDA_CHECK(cudaMemsetAsync(x, 0, sizeof(float) * n, 0));
  }
  void scatter_rows(float* dst, const float* src, const int32_t* rows, int n, int C) override {
    k::scatter_rows(dst, src, rows, n, C);
  }
  void gather_add_rows(float* dst, const float* src, const int32_t* rows, int n, int C) override {
    k::gather_add_rows(dst, src, rows, n, C);
  }

 private:
  // Per-row losses summed on the host in row order (double), the count of
  // rows with a target from the host copy of the targets.
  kernels::LossSum CrossEntropy(float* dlogits, float* losses, const float* logits,
                                const int32_t* targets, int T, int V, float grad_scale) {
    k::crossentropy_forward_backward(dlogits, losses, logits, targets, T, V, grad_scale);
    std::vector<float> host(T);
    std::vector<int32_t> tgt(T);
    LOOM_CUDA_CHECK(cudaMemcpy(host.data(), losses, sizeof(float) * T, cudaMemcpyDeviceToHost));
    LOOM_CUDA_CHECK(cudaMemcpy(tgt.data(), targets, sizeof(int32_t) * T, cudaMemcpyDeviceToHost));
    kernels::LossSum out;
    for (int t = 0; t < T; ++t) {
      if (tgt[t] < 0) continue;
      out.sum += host[t];
      ++out.count;
    }
    return out;
  }

  // At least `n` floats (ints) of device memory, kept between calls (one
  // user at a time: see cuda_ops.h).
  float* Scratch(int64_t n) {
    scratch_.resize(static_cast<size_t>(n));
    return scratch_.data();
  }
  uint16_t* HalfScratch(int64_t n) {  // bf16 operands narrowed for a GEMM
    half_scratch_.resize(static_cast<size_t>(n));
    return half_scratch_.data();
  }
  int32_t* IntScratch(int64_t n) {
    int_scratch_.resize(static_cast<size_t>(n));
    return int_scratch_.data();
  }

  std::unique_ptr<Backend> backend_;
  Buffer<float> scratch_{backend_.get()};
  Buffer<int32_t> int_scratch_{backend_.get()};
  Buffer<uint16_t> half_scratch_{backend_.get()};
};

}  // namespace

absl::StatusOr<std::unique_ptr<Ops>> MakeCudaOps(int device) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend(device);
  if (!backend.ok()) return backend.status();
  LOOM_CUDA_CHECK(cudaSetDevice(device));  // the calling thread's, see cuda_ops.h
  return std::unique_ptr<Ops>(new CudaOps(*std::move(backend)));
}

#else  // !LOOM_WITH_CUDA

absl::StatusOr<std::unique_ptr<Ops>> MakeCudaOps(int device) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend(device);
  return backend.status();  // UNIMPLEMENTED
}

#endif  // LOOM_WITH_CUDA

absl::StatusOr<Ops*> OpsForDevice(const std::string& device, std::unique_ptr<Ops>* owned) {
  absl::StatusOr<int> index = ParseDevice(device);
  if (!index.ok()) return index.status();
  if (*index < 0) return CpuOps();
  absl::StatusOr<std::unique_ptr<Ops>> made = MakeCudaOps(*index);
  if (!made.ok()) return made.status();
  *owned = *std::move(made);
  return owned->get();
}

}  // namespace loom
