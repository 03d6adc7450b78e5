#include "kernels/matmul/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <vector>

#include "kernels/matmul/bf16.h"

namespace loom::kernels {

void matmul_forward_reference(float* out, const float* inp, const float* weight, const float* bias,
                              int M, int K, int N) {
  for (int m = 0; m < M; ++m) {
    const float* x = inp + static_cast<long>(m) * K;
    for (int n = 0; n < N; ++n) {
      const float* w = weight + static_cast<long>(n) * K;
      float acc = bias ? bias[n] : 0.0f;
      for (int k = 0; k < K; ++k) acc += x[k] * w[k];
      out[static_cast<long>(m) * N + n] = acc;
    }
  }
}

void matmul_backward_reference(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, int M, int K, int N) {
  for (int m = 0; m < M; ++m) {
    const float* g = dout + static_cast<long>(m) * N;
    const float* x = inp + static_cast<long>(m) * K;
    for (int n = 0; n < N; ++n) {
      const float* w = weight + static_cast<long>(n) * K;
      float* dw = dweight ? dweight + static_cast<long>(n) * K : nullptr;
      for (int k = 0; k < K; ++k) {
        if (dinp) dinp[static_cast<long>(m) * K + k] += g[n] * w[k];
        if (dw) dw[k] += g[n] * x[k];
      }
      if (dbias) dbias[n] += g[n];
    }
  }
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int M,
                    int K, int N) {
  float beta = 0.0f;
  if (bias) {
    for (int m = 0; m < M; ++m) {
      float* row = out + static_cast<long>(m) * N;
      for (int n = 0; n < N; ++n) row[n] = bias[n];
    }
    beta = 1.0f;
  }
  // out (M,N) = inp (M,K) · weight(N,K)ᵀ
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, inp, K, weight, K, beta, out,
              N);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int M, int K, int N) {
  // dinp (M,K) += dout (M,N) · weight (N,K)
  if (dinp) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1.0f, dout, N, weight, K, 1.0f,
                dinp, K);
  }
  // dweight (N,K) += dout (M,N)ᵀ · inp (M,K)
  if (dweight) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1.0f, dout, N, inp, K, 1.0f,
                dweight, K);
  }
  if (dbias) {
    for (int m = 0; m < M; ++m) {
      const float* g = dout + static_cast<long>(m) * N;
      for (int n = 0; n < N; ++n) dbias[n] += g[n];
    }
  }
}

void F32ToBf16(uint16_t* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = F32ToBf16(src[i]);
}

void Bf16ToF32(float* dst, const uint16_t* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToF32(src[i]);
}

void RoundToBf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = RoundToBf16(x[i]);
}

namespace {

// The widened operands, in buffers each thread keeps between calls (the
// CPU ops serve several threads): `slot` 0-2 for the three a call needs.
float* Scratch(int slot, int64_t n) {
  thread_local std::vector<float> buffers[3];
  std::vector<float>& b = buffers[slot];
  if (b.size() < static_cast<size_t>(n)) {
    // The old contents are not needed: free them before the larger
    // allocation (resize() would hold both while it copies).
    b = std::vector<float>();
    b.resize(static_cast<size_t>(n));
  }
  return b.data();
}

const float* Rounded(int slot, const float* x, int64_t n) {
  float* out = Scratch(slot, n);
  std::copy(x, x + n, out);
  RoundToBf16(out, n);
  return out;
}

const float* Widened(int slot, const uint16_t* x, int64_t n) {
  float* out = Scratch(slot, n);
  Bf16ToF32(out, x, n);
  return out;
}

}  // namespace

void matmul_forward_bf16(float* out, const float* inp, const uint16_t* weight, const float* bias,
                         int M, int K, int N) {
  matmul_forward(out, Rounded(0, inp, int64_t{M} * K), Widened(1, weight, int64_t{N} * K), bias, M,
                 K, N);
}

void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const uint16_t* weight, int M, int K, int N) {
  if (dinp == nullptr && dweight == nullptr && dbias == nullptr) return;
  if (dinp != nullptr || dweight != nullptr) {
    const float* g = Rounded(0, dout, int64_t{M} * N);
    const float* x = dweight ? Rounded(1, inp, int64_t{M} * K) : nullptr;
    const float* w = dinp ? Widened(2, weight, int64_t{N} * K) : nullptr;
    matmul_backward(dinp, dweight, nullptr, g, x, w, M, K, N);
  }
  // The bias gradient sums the fp32 output gradient, as without bf16.
  matmul_backward(nullptr, nullptr, dbias, dout, nullptr, nullptr, M, K, N);
}

}  // namespace loom::kernels
