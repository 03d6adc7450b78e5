// LayerNorm and RMSNorm: one block per row, block reductions in fp32.
#include "kernels/cuda/common.h"
#include "kernels/cuda/ops.h"

namespace loom::kernels::cuda {
namespace {

__global__ void LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* w, const float* b, int C, float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  float* y = out + row * C;
  float s = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += x[c];
  const float m = BlockSum(s, scratch) / C;
  float v = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) v += (x[c] - m) * (x[c] - m);
  const float r = rsqrtf(BlockSum(v, scratch) / C + eps);
  for (int c = threadIdx.x; c < C; c += blockDim.x) y[c] = (x[c] - m) * r * w[c] + b[c];
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

__global__ void LayerNormBackward(float* dinp, float* dw, float* db, const float* dout,
                                  const float* inp, const float* w, const float* mean,
                                  const float* rstd, int C) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  const float* g = dout + row * C;
  float* dx = dinp + row * C;
  const float m = mean[row], r = rstd[row];
  float sd = 0, sdx = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float xhat = (x[c] - m) * r, d = g[c] * w[c];
    sd += d;
    sdx += d * xhat;
    atomicAdd(&dw[c], g[c] * xhat);
    atomicAdd(&db[c], g[c]);
  }
  const float mean_d = BlockSum(sd, scratch) / C;
  const float mean_dx = BlockSum(sdx, scratch) / C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float xhat = (x[c] - m) * r;
    dx[c] += r * (g[c] * w[c] - mean_d - xhat * mean_dx);
  }
}

__global__ void RmsNormForward(float* out, float* rrms, const float* inp, const float* w, int C,
                               float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  float s = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += x[c] * x[c];
  const float r = rsqrtf(BlockSum(s, scratch) / C + eps);
  for (int c = threadIdx.x; c < C; c += blockDim.x) out[row * C + c] = x[c] * r * w[c];
  if (threadIdx.x == 0) rrms[row] = r;
}

__global__ void RmsNormBackward(float* dinp, float* dw, const float* dout, const float* inp,
                                const float* w, const float* rrms, int C) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  const float* g = dout + row * C;
  const float r = rrms[row];
  float s = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    s += g[c] * w[c] * x[c];
    atomicAdd(&dw[c], g[c] * x[c] * r);
  }
  const float k = BlockSum(s, scratch) / C * r * r;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    dinp[row * C + c] += r * (g[c] * w[c] - x[c] * k);
  }
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps) {
  LOOM_LAUNCH(LayerNormForward, N, kThreads, out, mean, rstd, inp, weight, bias, C, eps);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  LOOM_LAUNCH(LayerNormBackward, N, kThreads, dinp, dweight, dbias, dout, inp, weight, mean, rstd,
              C);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void rmsnorm_forward(float* out, float* rrms, const float* inp, const float* weight, int N, int C,
                     float eps) {
  LOOM_LAUNCH(RmsNormForward, N, kThreads, out, rrms, inp, weight, C, eps);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rrms, int N, int C) {
  LOOM_LAUNCH(RmsNormBackward, N, kThreads, dinp, dweight, dout, inp, weight, rrms, C);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace loom::kernels::cuda
