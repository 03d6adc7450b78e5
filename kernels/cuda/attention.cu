// Packed varlen attention, one block per (query row, head): scores into the
// saved `att` rows, block softmax, then the weighted sum of v. Backward keeps
// dq in the block and scatters dk and dv with atomics. A straightforward
// kernel, the correctness reference on the GPU; a fused flash-style kernel
// replaces it for long sequences later.
#include "kernels/cuda/common.h"
#include "kernels/cuda/ops.h"

namespace loom::kernels::cuda {
namespace {

// The sequence a row belongs to: binary search over cu_seqlens.
__device__ int SequenceOf(const int32_t* cu, int S, int t) {
  int lo = 0, hi = S - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Where sequence s's (NH, L, L) probabilities start in `att`.
__device__ int64_t AttOffset(const int32_t* cu, int s, int NH) {
  int64_t off = 0;
  for (int k = 0; k < s; ++k) {
    const int64_t L = cu[k + 1] - cu[k];
    off += NH * L * L;
  }
  return off;
}

// Row t's query head h and its key/value head (grouped-query attention):
// offsets into a row of (NH + 2 NKV) HD floats.
struct Heads {
  __device__ Heads(int NH, int NKV, int HD, int h)
      : ld(static_cast<int64_t>(NH + 2 * NKV) * HD),
        q(h * HD),
        k((NH + h / (NH / NKV)) * HD),
        v((NH + NKV + h / (NH / NKV)) * HD) {}
  int64_t ld;
  int q, k, v;
};

__global__ void AttentionForward(float* out, float* att, const float* qkv, const int32_t* cu, int S,
                                 int NH, int NKV, int HD, bool causal, float scale) {
  __shared__ float scratch[32];
  const int t = blockIdx.x, h = blockIdx.y, C = NH * HD;
  const Heads y(NH, NKV, HD, h);
  const int s = SequenceOf(cu, S, t);
  const int start = cu[s], L = cu[s + 1] - start, i = t - start;
  const int n = causal ? i + 1 : L;
  float* p = att + AttOffset(cu, s, NH) + (static_cast<int64_t>(h) * L + i) * L;
  const float* q = qkv + t * y.ld + y.q;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < L; j += blockDim.x) {
    float dot = -INFINITY;
    if (j < n) {
      const float* k = qkv + (start + j) * y.ld + y.k;
      dot = 0;
      for (int d = 0; d < HD; ++d) dot += q[d] * k[d];
      dot *= scale;
    }
    p[j] = dot;
    mx = fmaxf(mx, dot);
  }
  mx = BlockMax(mx, scratch);
  float sum = 0;
  for (int j = threadIdx.x; j < L; j += blockDim.x) {
    const float e = j < n ? expf(p[j] - mx) : 0.0f;
    p[j] = e;
    sum += e;
  }
  const float inv = 1.0f / BlockSum(sum, scratch);
  for (int j = threadIdx.x; j < L; j += blockDim.x) p[j] *= inv;
  __syncthreads();
  for (int d = threadIdx.x; d < HD; d += blockDim.x) {
    float acc = 0;
    for (int j = 0; j < n; ++j) acc += p[j] * qkv[(start + j) * y.ld + y.v + d];
    out[static_cast<int64_t>(t) * C + h * HD + d] = acc;
  }
}

__global__ void AttentionBackward(float* dqkv, const float* dout, const float* qkv,
                                  const float* att, const int32_t* cu, int S, int NH, int NKV,
                                  int HD, bool causal, float scale, float* dp_scratch) {
  __shared__ float scratch[32];
  const int t = blockIdx.x, h = blockIdx.y, C = NH * HD;
  const Heads y(NH, NKV, HD, h);
  const int s = SequenceOf(cu, S, t);
  const int start = cu[s], L = cu[s + 1] - start, i = t - start;
  const int n = causal ? i + 1 : L;
  const int64_t row_off = AttOffset(cu, s, NH) + (static_cast<int64_t>(h) * L + i) * L;
  const float* p = att + row_off;
  float* dp = dp_scratch + row_off;  // same layout as att
  const float* g = dout + static_cast<int64_t>(t) * C + h * HD;
  float dot = 0;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float* v = qkv + (start + j) * y.ld + y.v;
    float* dv = dqkv + (start + j) * y.ld + y.v;
    float d = 0;
    for (int e = 0; e < HD; ++e) {
      d += g[e] * v[e];
      atomicAdd(&dv[e], p[j] * g[e]);
    }
    dp[j] = d;
    dot += p[j] * d;
  }
  dot = BlockSum(dot, scratch);
  __syncthreads();
  const float* q = qkv + t * y.ld + y.q;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float ds = p[j] * (dp[j] - dot) * scale;
    dp[j] = ds;
    float* dk = dqkv + (start + j) * y.ld + y.k;
    for (int e = 0; e < HD; ++e) atomicAdd(&dk[e], ds * q[e]);
  }
  __syncthreads();
  float* dq = dqkv + t * y.ld + y.q;
  for (int e = threadIdx.x; e < HD; e += blockDim.x) {
    float acc = 0;
    for (int j = 0; j < n; ++j) acc += dp[j] * qkv[(start + j) * y.ld + y.k + e];
    dq[e] += acc;
  }
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, const int32_t* cu_seqlens, int S,
                       int T, int NH, int NKV, int HD, bool causal) {
  if (T == 0) return;
  LOOM_LAUNCH(AttentionForward, dim3(T, NH), 128, out, att, qkv, cu_seqlens, S, NH, NKV, HD, causal,
              1.0f / sqrtf(static_cast<float>(HD)));
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, const int32_t* cu_seqlens, int S, int T, int NH, int NKV,
                        int HD, bool causal) {
  if (T == 0) return;
  LOOM_LAUNCH(AttentionBackward, dim3(T, NH), 128, dqkv, dout, qkv, att, cu_seqlens, S, NH, NKV, HD,
              causal, 1.0f / sqrtf(static_cast<float>(HD)), scratch);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace loom::kernels::cuda
