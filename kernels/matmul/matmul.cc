#include "kernels/matmul/matmul.h"

#include <cblas.h>

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

}  // namespace loom::kernels
