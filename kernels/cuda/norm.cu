// LayerNorm and RMSNorm: one block per row, block reductions in fp32. The
// weight and bias gradients are summed over rows without atomics (the same
// bits on every run and every TP replica); a null one is skipped (frozen).
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

// The input gradient, one block per row. The weight and bias gradients are
// NormParamGrads's, summed over rows in a fixed order (no atomics), so that
// every TP replica of these replicated tensors gets the same bits.
__global__ void LayerNormBackward(float* dinp, const float* dout, const float* inp, const float* w,
                                  const float* mean, const float* rstd, int C) {
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
  }
  const float mean_d = BlockSum(sd, scratch) / C;
  const float mean_dx = BlockSum(sdx, scratch) / C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float xhat = (x[c] - m) * r;
    dx[c] += r * (g[c] * w[c] - mean_d - xhat * mean_dx);
  }
}

// Rows summed per column: a block is 32 columns by kRowGroups row groups;
// each thread sums its column over rows group, group + kRowGroups, ... in
// order, then the groups' partial sums are added in order.
// dw[c] += Σ_n dout[n,c]·x̂[n,c], x̂ = (x − mean)·rstd (LayerNorm) or
// x·rrms (RMSNorm, mean null); db[c] += Σ_n dout[n,c]. Null: skipped.
constexpr int kRowGroups = 8;

__global__ void NormParamGrads(float* dw, float* db, const float* dout, const float* inp,
                               const float* mean, const float* rstd, int N, int C) {
  __shared__ float sw[kRowGroups][33];
  __shared__ float sb[kRowGroups][33];
  const int c = blockIdx.x * 32 + threadIdx.x, ty = threadIdx.y;
  float w = 0, b = 0;
  if (c < C) {
    for (int n = ty; n < N; n += kRowGroups) {
      const int64_t i = static_cast<int64_t>(n) * C + c;
      const float xhat = (mean == nullptr ? inp[i] : inp[i] - mean[n]) * rstd[n];
      w += dout[i] * xhat;
      b += dout[i];
    }
  }
  sw[ty][threadIdx.x] = w;
  sb[ty][threadIdx.x] = b;
  __syncthreads();
  if (ty != 0 || c >= C) return;
  float tw = 0, tb = 0;
  for (int k = 0; k < kRowGroups; ++k) {
    tw += sw[k][threadIdx.x];
    tb += sb[k][threadIdx.x];
  }
  if (dw != nullptr) dw[c] += tw;
  if (db != nullptr) db[c] += tb;
}

void ParamGrads(float* dw, float* db, const float* dout, const float* inp, const float* mean,
                const float* rstd, int N, int C) {
  if ((dw == nullptr && db == nullptr) || N == 0) return;
  LOOM_LAUNCH(NormParamGrads, (C + 31) / 32, dim3(32, kRowGroups), dw, db, dout, inp, mean, rstd, N,
              C);
  LOOM_CUDA_CHECK(cudaGetLastError());
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

__global__ void RmsNormBackward(float* dinp, const float* dout, const float* inp, const float* w,
                                const float* rrms, int C) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  const float* g = dout + row * C;
  const float r = rrms[row];
  float s = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += g[c] * w[c] * x[c];
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
  if (N == 0) return;
  LOOM_LAUNCH(LayerNormBackward, N, kThreads, dinp, dout, inp, weight, mean, rstd, C);
  LOOM_CUDA_CHECK(cudaGetLastError());
  ParamGrads(dweight, dbias, dout, inp, mean, rstd, N, C);
}

void rmsnorm_forward(float* out, float* rrms, const float* inp, const float* weight, int N, int C,
                     float eps) {
  LOOM_LAUNCH(RmsNormForward, N, kThreads, out, rrms, inp, weight, C, eps);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rrms, int N, int C) {
  if (N == 0) return;
  LOOM_LAUNCH(RmsNormBackward, N, kThreads, dinp, dout, inp, weight, rrms, C);
  LOOM_CUDA_CHECK(cudaGetLastError());
  ParamGrads(dweight, nullptr, dout, inp, nullptr, rrms, N, C);
}

}  // namespace loom::kernels::cuda
