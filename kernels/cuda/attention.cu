// Packed varlen attention, one block per (query row, head): scores into the
// saved `att` rows, block softmax, then the weighted sum of v. Backward is
// three passes without atomics (below). A straightforward kernel, the
// correctness reference on the GPU; a fused flash-style kernel replaces it
// for long sequences later.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/attention_common.h"
#include "kernels/cuda/common.h"
#include "kernels/cuda/ops.h"

namespace loom::kernels::cuda {
namespace {

// Where sequence s's (NH, L, L) probabilities start in `att`.
__device__ int64_t AttOffset(const int32_t* cu, int s, int NH) {
  int64_t off = 0;
  for (int k = 0; k < s; ++k) {
    const int64_t L = cu[k + 1] - cu[k];
    off += NH * L * L;
  }
  return off;
}

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

// Memory-efficient attention (kernels/attention/attention.h flash_*): a
// block takes kFlashRows consecutive packed rows (one thread each; a block
// may span sequences, each row masks keys outside its own) and walks the
// keys its rows see in tiles of kFlashKeys through shared memory. Head
// dimensions up to HDM (a template argument: registers are indexed with
// constants only). The backward: D = rowsum(dO ⊙ O); dQ with a thread per
// query row over the keys; dK and dV with a thread per key row over the
// queries and the query heads of its group. Each output row is written by
// one thread, in a fixed order: no atomics, the same bits on every run.
constexpr int kFlashRows = 32;
constexpr int kFlashKeys = 16;
constexpr int kFlashBackwardTile = 8;

template <int HDM>
__global__ void FlashForward(float* out, float* lse, const float* qkv, const int32_t* cu, int S,
                             int T, int NH, int NKV, int HD, bool causal, float scale) {
  __shared__ float qs[kFlashRows][HDM + 1];  // +1: a thread's row in its own bank
  __shared__ float ks[kFlashKeys][HDM];
  __shared__ float vs[kFlashKeys][HDM];
  const int h = blockIdx.y, t0 = blockIdx.x * kFlashRows, t = t0 + threadIdx.x;
  const Heads y(NH, NKV, HD, h);
  const bool active = t < T;
  int lo = 0, hi = 0;  // the keys row t sees
  if (active) {
    const int s = SequenceOf(cu, S, t);
    lo = cu[s];
    hi = causal ? t + 1 : cu[s + 1];
  }
  int block_lo, block_hi;
  RowRange(cu, S, T, t0, kFlashRows, causal, &block_lo, &block_hi);
  for (int e = threadIdx.x; e < kFlashRows * HD; e += blockDim.x) {
    const int r = e / HD, d = e % HD;
    qs[r][d] = t0 + r < T ? qkv[(t0 + r) * y.ld + y.q + d] * scale : 0.0f;
  }
  float o[HDM];
  LOOM_UNROLL
  for (int d = 0; d < HDM; ++d) o[d] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int j0 = block_lo; j0 < block_hi; j0 += kFlashKeys) {
    __syncthreads();
    for (int e = threadIdx.x; e < kFlashKeys * HD; e += blockDim.x) {
      const int r = e / HD, d = e % HD, j = j0 + r;
      ks[r][d] = j < block_hi ? qkv[j * y.ld + y.k + d] : 0.0f;
      vs[r][d] = j < block_hi ? qkv[j * y.ld + y.v + d] : 0.0f;
    }
    __syncthreads();
    float p[kFlashKeys];
    float mx = m;
    LOOM_UNROLL
    for (int r = 0; r < kFlashKeys; ++r) {
      const int j = j0 + r;
      float dot = -INFINITY;
      if (active && j >= lo && j < hi) {
        dot = 0.0f;
        LOOM_UNROLL
        for (int d = 0; d < HDM; ++d) {
          if (d < HD) dot += qs[threadIdx.x][d] * ks[r][d];
        }
      }
      p[r] = dot;
      mx = fmaxf(mx, dot);
    }
    if (mx == -INFINITY) continue;  // none of this tile's keys is row t's
    const float corr = expf(m - mx);
    float sum = 0.0f;
    LOOM_UNROLL
    for (int r = 0; r < kFlashKeys; ++r) {
      p[r] = expf(p[r] - mx);  // 0 for keys the row does not see
      sum += p[r];
    }
    l = l * corr + sum;
    m = mx;
    LOOM_UNROLL
    for (int d = 0; d < HDM; ++d) {
      if (d >= HD) continue;
      float acc = o[d] * corr;
      LOOM_UNROLL
      for (int r = 0; r < kFlashKeys; ++r) acc += p[r] * vs[r][d];
      o[d] = acc;
    }
  }
  if (!active) return;
  const float inv = 1.0f / l;
  float* orow = out + static_cast<int64_t>(t) * NH * HD + h * HD;
  LOOM_UNROLL
  for (int d = 0; d < HDM; ++d) {
    if (d < HD) orow[d] = o[d] * inv;
  }
  lse[static_cast<int64_t>(t) * NH + h] = m + logf(l);
}

// dsum[t, h] = dout[t, h] · out[t, h] (dout rounded to bf16 under bf16, as
// dP = dO · Vᵀ takes it).
__global__ void FlashRowDots(float* dsum, const float* dout, const float* out, int T, int NH,
                             int HD, bool bf16) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<int64_t>(T) * NH) return;
  const float* g = dout + i * HD;  // (t, h) rows of HD are contiguous in (T, NH * HD)
  const float* o = out + i * HD;
  float d = 0.0f;
  for (int e = 0; e < HD; ++e) {
    d += (bf16 ? __bfloat162float(__float2bfloat16_rn(g[e])) : g[e]) * o[e];
  }
  dsum[i] = d;
}

template <int HDM>
__global__ void FlashBackwardQ(float* dqkv, const float* dsum, const float* dout, const float* qkv,
                               const float* lse, const int32_t* cu, int S, int T, int NH, int NKV,
                               int HD, bool causal, float scale) {
  __shared__ float qs[kFlashRows][HDM + 1];
  __shared__ float gs[kFlashRows][HDM + 1];
  __shared__ float ks[kFlashBackwardTile][HDM];
  __shared__ float vs[kFlashBackwardTile][HDM];
  const int h = blockIdx.y, t0 = blockIdx.x * kFlashRows, t = t0 + threadIdx.x;
  const Heads y(NH, NKV, HD, h);
  const int C = NH * HD;
  const bool active = t < T;
  int lo = 0, hi = 0;
  float row_lse = 0.0f, row_d = 0.0f;
  if (active) {
    const int s = SequenceOf(cu, S, t);
    lo = cu[s];
    hi = causal ? t + 1 : cu[s + 1];
    row_lse = lse[static_cast<int64_t>(t) * NH + h];
    row_d = dsum[static_cast<int64_t>(t) * NH + h];
  }
  int block_lo, block_hi;
  RowRange(cu, S, T, t0, kFlashRows, causal, &block_lo, &block_hi);
  for (int e = threadIdx.x; e < kFlashRows * HD; e += blockDim.x) {
    const int r = e / HD, d = e % HD;
    const bool in = t0 + r < T;
    qs[r][d] = in ? qkv[(t0 + r) * y.ld + y.q + d] * scale : 0.0f;
    gs[r][d] = in ? dout[static_cast<int64_t>(t0 + r) * C + h * HD + d] : 0.0f;
  }
  float dq[HDM];
  LOOM_UNROLL
  for (int d = 0; d < HDM; ++d) dq[d] = 0.0f;
  for (int j0 = block_lo; j0 < block_hi; j0 += kFlashBackwardTile) {
    __syncthreads();
    for (int e = threadIdx.x; e < kFlashBackwardTile * HD; e += blockDim.x) {
      const int r = e / HD, d = e % HD, j = j0 + r;
      ks[r][d] = j < block_hi ? qkv[j * y.ld + y.k + d] : 0.0f;
      vs[r][d] = j < block_hi ? qkv[j * y.ld + y.v + d] : 0.0f;
    }
    __syncthreads();
    if (!active) continue;
    LOOM_UNROLL
    for (int r = 0; r < kFlashBackwardTile; ++r) {
      const int j = j0 + r;
      if (j < lo || j >= hi) continue;
      float sc = 0.0f, dp = 0.0f;
      LOOM_UNROLL
      for (int d = 0; d < HDM; ++d) {
        if (d < HD) {
          sc += qs[threadIdx.x][d] * ks[r][d];
          dp += gs[threadIdx.x][d] * vs[r][d];
        }
      }
      const float ds = expf(sc - row_lse) * (dp - row_d);
      LOOM_UNROLL
      for (int d = 0; d < HDM; ++d) dq[d] += ds * ks[r][d];
    }
  }
  if (!active) return;
  float* dqrow = dqkv + t * y.ld + y.q;
  LOOM_UNROLL
  for (int d = 0; d < HDM; ++d) {
    if (d < HD) dqrow[d] += scale * dq[d];
  }
}

template <int HDM>
__global__ void FlashBackwardKV(float* dqkv, const float* dsum, const float* dout, const float* qkv,
                                const float* lse, const int32_t* cu, int S, int T, int NH, int NKV,
                                int HD, bool causal, float scale) {
  __shared__ float ks[kFlashRows][HDM + 1];
  __shared__ float vs[kFlashRows][HDM + 1];
  __shared__ float qs[kFlashBackwardTile][HDM];
  __shared__ float gs[kFlashBackwardTile][HDM];
  __shared__ float ls[kFlashBackwardTile], ds_[kFlashBackwardTile];
  const int kvh = blockIdx.y, group = NH / NKV, t0 = blockIdx.x * kFlashRows;
  const int j = t0 + threadIdx.x, C = NH * HD;
  const Heads yk(NH, NKV, HD, kvh * group);  // the key/value head's offsets
  const bool active = j < T;
  int qlo = 0, qhi = 0;  // the queries that see key j
  if (active) {
    const int s = SequenceOf(cu, S, j);
    qlo = causal ? j : cu[s];
    qhi = cu[s + 1];
  }
  // The queries any key of the block is seen by.
  const int last = std::min(T, t0 + kFlashRows) - 1;
  const int block_lo = causal ? t0 : cu[SequenceOf(cu, S, t0)];
  const int block_hi = cu[SequenceOf(cu, S, last) + 1];
  for (int e = threadIdx.x; e < kFlashRows * HD; e += blockDim.x) {
    const int r = e / HD, d = e % HD;
    const bool in = t0 + r < T;
    ks[r][d] = in ? qkv[(t0 + r) * yk.ld + yk.k + d] : 0.0f;
    vs[r][d] = in ? qkv[(t0 + r) * yk.ld + yk.v + d] : 0.0f;
  }
  float dk[HDM], dv[HDM];
  LOOM_UNROLL
  for (int d = 0; d < HDM; ++d) dk[d] = dv[d] = 0.0f;
  for (int g = 0; g < group; ++g) {
    const int h = kvh * group + g;
    const Heads y(NH, NKV, HD, h);
    for (int i0 = block_lo; i0 < block_hi; i0 += kFlashBackwardTile) {
      __syncthreads();
      for (int e = threadIdx.x; e < kFlashBackwardTile * HD; e += blockDim.x) {
        const int r = e / HD, d = e % HD, i = i0 + r;
        qs[r][d] = i < block_hi ? qkv[i * y.ld + y.q + d] * scale : 0.0f;
        gs[r][d] = i < block_hi ? dout[static_cast<int64_t>(i) * C + h * HD + d] : 0.0f;
      }
      if (threadIdx.x < kFlashBackwardTile) {
        const int i = i0 + threadIdx.x;
        ls[threadIdx.x] = i < block_hi ? lse[static_cast<int64_t>(i) * NH + h] : 0.0f;
        ds_[threadIdx.x] = i < block_hi ? dsum[static_cast<int64_t>(i) * NH + h] : 0.0f;
      }
      __syncthreads();
      if (!active) continue;
      LOOM_UNROLL
      for (int r = 0; r < kFlashBackwardTile; ++r) {
        const int i = i0 + r;
        if (i < qlo || i >= qhi) continue;
        float sc = 0.0f, dp = 0.0f;
        LOOM_UNROLL
        for (int d = 0; d < HDM; ++d) {
          if (d < HD) {
            sc += qs[r][d] * ks[threadIdx.x][d];
            dp += gs[r][d] * vs[threadIdx.x][d];
          }
        }
        const float p = expf(sc - ls[r]);
        const float ds = p * (dp - ds_[r]);
        LOOM_UNROLL
        for (int d = 0; d < HDM; ++d) {
          dv[d] += p * gs[r][d];
          dk[d] += ds * qs[r][d];  // qs holds scale · q
        }
      }
    }
  }
  if (!active) return;
  float* dkrow = dqkv + j * yk.ld + yk.k;
  float* dvrow = dqkv + j * yk.ld + yk.v;
  LOOM_UNROLL
  for (int d = 0; d < HDM; ++d) {
    if (d < HD) {
      dkrow[d] += dk[d];
      dvrow[d] += dv[d];
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

namespace {

template <int HDM>
struct ForwardLaunch {
  static void Run(float* out, float* lse, const float* qkv, const int32_t* cu, int S, int T, int NH,
                  int NKV, int HD, bool causal, float scale) {
    LOOM_LAUNCH(FlashForward<HDM>, dim3((T + kFlashRows - 1) / kFlashRows, NH), kFlashRows, out,
                lse, qkv, cu, S, T, NH, NKV, HD, causal, scale);
    LOOM_CUDA_CHECK(cudaGetLastError());
  }
};

template <int HDM>
struct BackwardLaunch {
  static void Run(float* dqkv, const float* dsum, const float* dout, const float* qkv,
                  const float* lse, const int32_t* cu, int S, int T, int NH, int NKV, int HD,
                  bool causal, float scale) {
    const int blocks = (T + kFlashRows - 1) / kFlashRows;
    LOOM_LAUNCH(FlashBackwardQ<HDM>, dim3(blocks, NH), kFlashRows, dqkv, dsum, dout, qkv, lse, cu,
                S, T, NH, NKV, HD, causal, scale);
    LOOM_CUDA_CHECK(cudaGetLastError());
    LOOM_LAUNCH(FlashBackwardKV<HDM>, dim3(blocks, NKV), kFlashRows, dqkv, dsum, dout, qkv, lse, cu,
                S, T, NH, NKV, HD, causal, scale);
    LOOM_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace

void flash_attention_forward(float* out, float* lse, const float* qkv, const int32_t* cu_seqlens,
                             int S, int T, int NH, int NKV, int HD, bool causal, bool bf16) {
  if (T == 0) return;
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));
  if (bf16) {
    FlashForwardBf16Launch(out, lse, qkv, cu_seqlens, S, T, NH, NKV, HD, causal, scale);
  } else {
    ForHeadDim<ForwardLaunch>(HD, out, lse, qkv, cu_seqlens, S, T, NH, NKV, HD, causal, scale);
  }
}

void flash_attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                              const float* out, const float* lse, const int32_t* cu_seqlens, int S,
                              int T, int NH, int NKV, int HD, bool causal, bool bf16) {
  if (T == 0) return;
  const int64_t rows = static_cast<int64_t>(T) * NH;
  LOOM_LAUNCH(FlashRowDots, static_cast<int>((rows + 255) / 256), 256, scratch, dout, out, T, NH,
              HD, bf16);
  LOOM_CUDA_CHECK(cudaGetLastError());
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));
  if (bf16) {
    FlashBackwardBf16Launch(dqkv, scratch, dout, qkv, lse, cu_seqlens, S, T, NH, NKV, HD, causal,
                            scale);
  } else {
    ForHeadDim<BackwardLaunch>(HD, dqkv, scratch, dout, qkv, lse, cu_seqlens, S, T, NH, NKV, HD,
                               causal, scale);
  }
}

}  // namespace loom::kernels::cuda
