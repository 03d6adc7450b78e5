#include "runtime/model/ops.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/attention/attention.h"
#include "kernels/embedding/embedding.h"
#include "kernels/matmul/bf16.h"
#include "kernels/matmul/matmul.h"
#include "kernels/norm/norm.h"
#include "kernels/pixel_shuffle/pixel_shuffle.h"
#include "kernels/rope/rope.h"

namespace loom {

namespace {

class Cpu final : public Ops {
 public:
  Backend* backend() const override { return CpuBackend::Get(); }

  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int M,
                      int K, int N) override {
    kernels::matmul_forward(out, inp, weight, bias, M, K, N);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int M, int K, int N) override {
    kernels::matmul_backward(dinp, dweight, dbias, dout, inp, weight, M, K, N);
  }
  void matmul_forward_bf16(float* out, const float* inp, const uint16_t* weight, const float* bias,
                           int M, int K, int N) override {
    kernels::matmul_forward_bf16(out, inp, weight, bias, M, K, N);
  }
  void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout,
                            const float* inp, const uint16_t* weight, int M, int K,
                            int N) override {
    kernels::matmul_backward_bf16(dinp, dweight, dbias, dout, inp, weight, M, K, N);
  }
  void f32_to_bf16(uint16_t* dst, const float* src, int64_t n) override {
    kernels::F32ToBf16(dst, src, n);
  }
  void bf16_to_f32(float* dst, const uint16_t* src, int64_t n) override {
    kernels::Bf16ToF32(dst, src, n);
  }
  void round_to_bf16(float* x, int64_t n) override { kernels::RoundToBf16(x, n); }

  void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                    const kernels::AdamWConfig& config, int64_t step) override {
    kernels::adamw_update(param, grad, m, v, n, config, step);
  }
  double sum_of_squares(const float* x, int64_t n) override {
    return kernels::sum_of_squares({{const_cast<float*>(x), n}});
  }
  void scale(float* x, float factor, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) x[i] *= factor;
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C, float eps) override {
    kernels::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    kernels::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void rmsnorm_forward(float* out, float* rrms, const float* inp, const float* weight, int N, int C,
                       float eps) override {
    kernels::rmsnorm_forward(out, rrms, inp, weight, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                        const float* weight, const float* rrms, int N, int C) override {
    kernels::rmsnorm_backward(dinp, dweight, dout, inp, weight, rrms, N, C);
  }

  void activation_forward(kernels::Activation act, float* out, const float* inp,
                          int64_t n) override {
    kernels::activation_forward(act, out, inp, n);
  }
  void activation_backward(kernels::Activation act, float* dinp, const float* inp,
                           const float* dout, int64_t n) override {
    kernels::activation_backward(act, dinp, inp, dout, n);
  }
  void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) override {
    kernels::swiglu_forward(out, gate, up, n);
  }
  void swiglu_backward(float* dgate, float* dup, const float* gate, const float* up,
                       const float* dout, int64_t n) override {
    kernels::swiglu_backward(dgate, dup, gate, up, dout, n);
  }

  void rope_forward(float* qkv, const int32_t* positions, const float* inv_freq, int T, int NH,
                    int NKV, int HD) override {
    kernels::rope_forward(qkv, positions, inv_freq, T, NH, NKV, HD);
  }
  void rope_backward(float* dqkv, const int32_t* positions, const float* inv_freq, int T, int NH,
                     int NKV, int HD) override {
    kernels::rope_backward(dqkv, positions, inv_freq, T, NH, NKV, HD);
  }

  void attention_forward(float* out, float* lse, const float* qkv, const int32_t* cu_seqlens, int S,
                         int, int NH, int NKV, int HD, bool causal, bool bf16) override {
    kernels::flash_attention_forward(out, lse, qkv, cu_seqlens, S, NH, NKV, HD, causal, bf16);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* lse, const int32_t* cu_seqlens, int S, int, int NH, int NKV,
                          int HD, bool causal, bool bf16) override {
    kernels::flash_attention_backward(dqkv, dout, qkv, out, lse, cu_seqlens, S, NH, NKV, HD, causal,
                                      bf16);
  }

  void patchify(float* patches, const float* tiles, int N, int S, int P) override {
    kernels::patchify(patches, tiles, N, S, P);
  }
  void add_position_forward(float* x, const float* pos, int N, int Np, int C) override {
    kernels::add_position_forward(x, pos, N, Np, C);
  }
  void add_position_backward(float* dpos, const float* dx, int N, int Np, int C) override {
    kernels::add_position_backward(dpos, dx, N, Np, C);
  }

  void pixel_shuffle_forward(float* out, const float* inp, int N, int G, int C) override {
    kernels::pixel_shuffle_forward(out, inp, N, G, C);
  }
  void pixel_shuffle_backward(float* dinp, const float* dout, int N, int G, int C) override {
    kernels::pixel_shuffle_backward(dinp, dout, N, G, C);
  }

  void vocab_embedding_forward(float* out, const int32_t* tokens, const float* table, int T, int C,
                               int vocab_start, int v_shard) override {
    std::fill(out, out + static_cast<int64_t>(T) * C, 0.0f);
    for (int t = 0; t < T; ++t) {
      const int v = tokens[t] - vocab_start;
      if (tokens[t] < 0 || v < 0 || v >= v_shard) continue;
      std::memcpy(out + static_cast<int64_t>(t) * C, table + static_cast<int64_t>(v) * C,
                  sizeof(float) * C);
    }
  }
  void vocab_embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int T,
                                int C, int vocab_start, int v_shard) override {
    for (int t = 0; t < T; ++t) {
      const int v = tokens[t] - vocab_start;
      if (tokens[t] < 0 || v < 0 || v >= v_shard) continue;
      float* d = dtable + static_cast<int64_t>(v) * C;
      const float* g = dout + static_cast<int64_t>(t) * C;
      for (int c = 0; c < C; ++c) d[c] += g[c];
    }
  }

  kernels::LossSum crossentropy_forward(const float* logits, const int32_t* targets, int T,
                                        int V) override {
    return kernels::crossentropy_forward(logits, targets, T, V);
  }
  kernels::LossSum crossentropy_forward_backward(float* dlogits, const float* logits,
                                                 const int32_t* targets, int T, int V,
                                                 float grad_scale) override {
    return kernels::crossentropy_forward_backward(dlogits, logits, targets, T, V, grad_scale);
  }

  void crossentropy_shard_max(float* mx, const float* logits, int T, int V) override {
    for (int t = 0; t < T; ++t) {
      const float* x = logits + static_cast<int64_t>(t) * V;
      mx[t] = *std::max_element(x, x + V);
    }
  }
  void crossentropy_shard_sums(double* sums, const float* logits, const float* mx,
                               const int32_t* targets, int T, int V, int vocab_start) override {
    std::fill(sums, sums + 2 * static_cast<int64_t>(T), 0.0);
    for (int t = 0; t < T; ++t) {
      if (targets[t] < 0) continue;
      const float* x = logits + static_cast<int64_t>(t) * V;
      double s = 0;
      for (int v = 0; v < V; ++v) s += std::exp(static_cast<double>(x[v] - mx[t]));
      sums[2 * t] = s;
      const int v = targets[t] - vocab_start;
      if (v >= 0 && v < V) sums[2 * t + 1] = x[v] - mx[t];
    }
  }
  kernels::LossSum crossentropy_shard_finish(float* dlogits, const float* logits, const float* mx,
                                             const double* sums, const int32_t* targets, int T,
                                             int V, int vocab_start, float grad_scale) override {
    kernels::LossSum out;
    for (int t = 0; t < T; ++t) {
      float* d = dlogits == nullptr ? nullptr : dlogits + static_cast<int64_t>(t) * V;
      if (targets[t] < 0) {
        if (d != nullptr) std::fill(d, d + V, 0.0f);
        continue;
      }
      const double lse = std::log(sums[2 * t]);
      out.sum += lse - sums[2 * t + 1];
      ++out.count;
      if (d == nullptr) continue;
      const float* x = logits + static_cast<int64_t>(t) * V;
      for (int v = 0; v < V; ++v) {
        d[v] = static_cast<float>(std::exp(static_cast<double>(x[v] - mx[t]) - lse)) * grad_scale;
      }
      const int v = targets[t] - vocab_start;
      if (v >= 0 && v < V) d[v] -= grad_scale;
    }
    return out;
  }

  void add(float* x, const float* y, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
  }
  void add_bias(float* out, const float* bias, int M, int N) override {
    for (int m = 0; m < M; ++m) {
      for (int n = 0; n < N; ++n) out[static_cast<int64_t>(m) * N + n] += bias[n];
    }
  }
  void copy(float* dst, const float* src, int64_t n) override {
    if (n > 0) std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(n));
  }
  void zero(float* x, int64_t n) override { std::fill(x, x + n, 0.0f); }
  void scatter_rows(float* dst, const float* src, const int32_t* rows, int n, int C) override {
    for (int i = 0; i < n; ++i) {
      std::memcpy(dst + static_cast<int64_t>(rows[i]) * C, src + static_cast<int64_t>(i) * C,
                  sizeof(float) * C);
    }
  }
  void gather_add_rows(float* dst, const float* src, const int32_t* rows, int n, int C) override {
    for (int i = 0; i < n; ++i) {
      add(dst + static_cast<int64_t>(i) * C, src + static_cast<int64_t>(rows[i]) * C, C);
    }
  }
};

}  // namespace

Ops* CpuOps() {
  static Cpu* const ops = new Cpu();
  return ops;
}

absl::StatusOr<int> ParseDevice(const std::string& name) {
  if (name == "cpu") return -1;
  if (name == "cuda") return 0;
  int index = -1;
  if (absl::StartsWith(name, "cuda:") && absl::SimpleAtoi(name.substr(5), &index) && index >= 0 &&
      index < 1024) {
    return index;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("want cpu, cuda or cuda:N (N a device index), got \"", name, "\""));
}

absl::StatusOr<int> ResolveDevice(const std::string& name, int local_rank, int devices) {
  absl::StatusOr<int> index = ParseDevice(name);
  if (!index.ok() || name != "cuda" || devices <= 0) return index;
  return local_rank % devices;
}

absl::StatusOr<int> LocalRankFromEnvironment() {
  for (const char* var :
       {"LOOM_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"}) {
    const char* v = std::getenv(var);
    if (v == nullptr || *v == '\0') continue;
    int rank = -1;
    if (!absl::SimpleAtoi(v, &rank) || rank < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(var, "=", v, ": want the process's local rank, an integer >= 0"));
    }
    return rank;
  }
  return 0;
}

}  // namespace loom
