// Packed varlen attention, one block per (query row, head): scores into the
// saved `att` rows, block softmax, then the weighted sum of v. Backward is
// three passes without atomics (below). A straightforward kernel, the
// correctness reference on the GPU; a fused flash-style kernel replaces it
// for long sequences later.
#include <algorithm>

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

// Backward in three passes, each element written by one thread in a fixed
// order (no atomics: the same bits on every run), from the saved
// probabilities p and recomputed dP = dO·Vᵀ:
//   D[t, h] = Σ_j p_tj dP_tj                      (one block per row, head)
//   dQ_t   += Σ_j dS_tj K_j                       (one block per row, head)
//   dK_j   += Σ_{h in group, i} dS_ij Q_i, dV_j += Σ p_ij dO_i (one block per
//             key row, key/value head)
// with dS_ij = p_ij (dP_ij − D_i) / sqrt(HD). j and i go in chunks of the
// block's threads through shared memory.
constexpr int kAttentionThreads = 128;

struct Rows {
  __device__ Rows(const int32_t* cu, int S, int t) {
    s = SequenceOf(cu, S, t);
    start = cu[s];
    L = cu[s + 1] - start;
    i = t - start;
  }
  int s, start, L, i;
};

// Query row t, head h (this block's): its sequence, the keys it sees (n),
// its saved probabilities p and its output gradient g.
struct QueryRow {
  __device__ QueryRow(const float* att, const float* dout, const int32_t* cu, int S, int NH,
                      int NKV, int HD, bool causal)
      : t(blockIdx.x), h(blockIdx.y), y(NH, NKV, HD, h), r(cu, S, t) {
    n = causal ? r.i + 1 : r.L;
    p = att + AttOffset(cu, r.s, NH) + (static_cast<int64_t>(h) * r.L + r.i) * r.L;
    g = dout + static_cast<int64_t>(t) * NH * HD + h * HD;
  }
  int t, h;
  Heads y;
  Rows r;
  int n;
  const float* p;
  const float* g;
};

__device__ float Dot(const float* a, const float* b, int n) {
  float d = 0;
  for (int e = 0; e < n; ++e) d += a[e] * b[e];
  return d;
}

__global__ void AttentionRowDots(float* D, const float* dout, const float* qkv, const float* att,
                                 const int32_t* cu, int S, int NH, int NKV, int HD, bool causal) {
  __shared__ float scratch[32];
  const QueryRow q(att, dout, cu, S, NH, NKV, HD, causal);
  float dot = 0;
  for (int j = threadIdx.x; j < q.n; j += blockDim.x) {
    dot += q.p[j] * Dot(q.g, qkv + (q.r.start + j) * q.y.ld + q.y.v, HD);
  }
  dot = BlockSum(dot, scratch);
  if (threadIdx.x == 0) D[static_cast<int64_t>(q.t) * NH + q.h] = dot;
}

__global__ void AttentionBackwardQ(float* dqkv, const float* D, const float* dout, const float* qkv,
                                   const float* att, const int32_t* cu, int S, int NH, int NKV,
                                   int HD, bool causal, float scale) {
  __shared__ float ds[kAttentionThreads];
  const QueryRow q(att, dout, cu, S, NH, NKV, HD, causal);
  const int64_t ld = q.y.ld, start = q.r.start;
  const float d_row = D[static_cast<int64_t>(q.t) * NH + q.h];
  float* dq = dqkv + q.t * ld + q.y.q;
  for (int j0 = 0; j0 < q.n; j0 += blockDim.x) {
    const int j = j0 + threadIdx.x;
    ds[threadIdx.x] =
        j < q.n ? q.p[j] * (Dot(q.g, qkv + (start + j) * ld + q.y.v, HD) - d_row) * scale : 0.0f;
    __syncthreads();
    const int m = std::min(static_cast<int>(blockDim.x), q.n - j0);
    for (int e = threadIdx.x; e < HD; e += blockDim.x) {
      float acc = 0;
      for (int k = 0; k < m; ++k) acc += ds[k] * qkv[(start + j0 + k) * ld + q.y.k + e];
      dq[e] += acc;
    }
    __syncthreads();
  }
}

__global__ void AttentionBackwardKV(float* dqkv, const float* D, const float* dout,
                                    const float* qkv, const float* att, const int32_t* cu, int S,
                                    int NH, int NKV, int HD, bool causal, float scale) {
  __shared__ float ps[kAttentionThreads];
  __shared__ float ds[kAttentionThreads];
  const int t = blockIdx.x, hk = blockIdx.y, C = NH * HD, group = NH / NKV;
  const Rows r(cu, S, t);  // t is key row j = r.i of its sequence
  const int64_t off = AttOffset(cu, r.s, NH), ld = static_cast<int64_t>(NH + 2 * NKV) * HD;
  const float* v = qkv + t * ld + (NH + NKV + hk) * HD;
  float* dk = dqkv + t * ld + (NH + hk) * HD;
  float* dv = dqkv + t * ld + (NH + NKV + hk) * HD;
  for (int h = hk * group; h < (hk + 1) * group; ++h) {
    for (int i0 = causal ? r.i : 0; i0 < r.L; i0 += blockDim.x) {
      const int i = i0 + threadIdx.x;
      float p = 0, d = 0;
      if (i < r.L) {
        const int64_t ti = r.start + i;
        p = att[off + (static_cast<int64_t>(h) * r.L + i) * r.L + r.i];
        d = p * (Dot(dout + ti * C + h * HD, v, HD) - D[ti * NH + h]) * scale;
      }
      ps[threadIdx.x] = p;
      ds[threadIdx.x] = d;
      __syncthreads();
      const int m = std::min(static_cast<int>(blockDim.x), r.L - i0);
      for (int e = threadIdx.x; e < HD; e += blockDim.x) {
        float av = 0, ak = 0;
        for (int k = 0; k < m; ++k) {
          const int64_t ti = r.start + i0 + k;
          av += ps[k] * dout[ti * C + h * HD + e];
          ak += ds[k] * qkv[ti * ld + h * HD + e];
        }
        dv[e] += av;
        dk[e] += ak;
      }
      __syncthreads();
    }
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
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));
  LOOM_LAUNCH(AttentionRowDots, dim3(T, NH), kAttentionThreads, scratch, dout, qkv, att, cu_seqlens,
              S, NH, NKV, HD, causal);
  LOOM_CUDA_CHECK(cudaGetLastError());
  LOOM_LAUNCH(AttentionBackwardQ, dim3(T, NH), kAttentionThreads, dqkv, scratch, dout, qkv, att,
              cu_seqlens, S, NH, NKV, HD, causal, scale);
  LOOM_CUDA_CHECK(cudaGetLastError());
  LOOM_LAUNCH(AttentionBackwardKV, dim3(T, NKV), kAttentionThreads, dqkv, scratch, dout, qkv, att,
              cu_seqlens, S, NH, NKV, HD, causal, scale);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace loom::kernels::cuda
