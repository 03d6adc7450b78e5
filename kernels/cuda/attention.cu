// Packed varlen attention, one block per (query row, head): scores into the
// saved `att` rows, block softmax, then the weighted sum of v. Backward is
// three passes without atomics (below). A straightforward kernel, the
// correctness reference on the GPU; a fused flash-style kernel replaces it
// for long sequences later.
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/common.h"
#include "kernels/cuda/ops.h"

namespace loom::kernels::cuda {
namespace {

namespace wmma = nvcuda::wmma;

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

// The packed rows [lo, hi) that rows [t0, min(T, t0 + n)) may attend to.
__device__ void RowRange(const int32_t* cu, int S, int T, int t0, int n, bool causal, int* lo,
                         int* hi) {
  const int last = std::min(T, t0 + n) - 1;
  *lo = cu[SequenceOf(cu, S, t0)];
  *hi = causal ? last + 1 : cu[SequenceOf(cu, S, last) + 1];
}

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

// The bf16 path (kernels/attention's bf16): the products on tensor cores
// through the warp matrix functions (WMMA, 16 x 16 x 16, bf16 in, fp32
// sums). A block of kWarps warps takes kTq query rows (forward, dQ) or kTk
// key rows (dK, dV) and walks the other side in tiles through shared
// memory, in bf16 rows padded by 8 (16 bytes: a row starts in another
// bank). The scores of a tile go to shared memory in fp32; four threads a
// row apply the mask and the softmax there, and write P (or dS) in bf16 over
// the scores they read (each row's bf16 values fit in its fp32 row's bytes;
// a barrier separates the reads from the writes). The forward keeps O in
// shared memory (each tile rescales its rows); dQ, dK and dV sum in
// fragments and each output row is written by one block: no atomics, the
// same bits on every run.
constexpr int kTq = 32, kTk = 32, kWarps = 4, kTensorThreads = 32 * kWarps;
constexpr int kSld = kTk + 4;   // fp32 score rows
constexpr int kPld = 2 * kSld;  // the bf16 rows over them

template <int HDM>
constexpr int Hld() {  // bf16 operand rows
  return HDM + 8;
}
// Output tiles (2 x HDM/16 of 16 x 16) per warp.
template <int HDM>
constexpr int TilesPerWarp() {
  return (2 * (HDM / 16) + kWarps - 1) / kWarps;
}

using BfFragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using BfFragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::col_major>;
using BfFragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using BfFragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major>;
using AccFrag = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// dst (32 x kSld fp32, the 16 x 16 tile of warp `warp`) = A · Bᵀ over HDM
// columns: A and B are 32 rows of bf16 with leading dimension ld.
template <int HDM>
__device__ void TileScores(float* dst, const __nv_bfloat16* A, const __nv_bfloat16* B, int warp) {
  constexpr int ld = Hld<HDM>();
  const int tr = warp >> 1, tc = warp & 1;
  AccFrag acc;
  wmma::fill_fragment(acc, 0.0f);
  LOOM_UNROLL
  for (int kk = 0; kk < HDM / 16; ++kk) {
    BfFragA a;
    BfFragBT b;
    wmma::load_matrix_sync(a, A + 16 * tr * ld + 16 * kk, ld);
    wmma::load_matrix_sync(b, B + 16 * tc * ld + 16 * kk, ld);
    wmma::mma_sync(acc, a, b, acc);
  }
  wmma::store_matrix_sync(dst + 16 * tr * kSld + 16 * tc, acc, kSld, wmma::mem_row_major);
}

// rows [t0, t0 + n) of one head's HD columns of `src` (row stride ld,
// column offset col, times `mul`) as bf16 into dst (n x Hld), 0 past T or HD.
template <int HDM>
__device__ void LoadRowsBf16(__nv_bfloat16* dst, const float* src, int64_t ld, int col, int t0,
                             int n, int T, int HD) {
  for (int e = threadIdx.x; e < n * HDM; e += blockDim.x) {
    const int r = e / HDM, d = e % HDM, t = t0 + r;
    dst[r * Hld<HDM>() + d] = __float2bfloat16_rn(t < T && d < HD ? src[t * ld + col + d] : 0.0f);
  }
}

// The keys [lo, hi) that packed row t sees (none for t >= T).
__device__ void KeysOf(const int32_t* cu, int S, int T, int t, bool causal, int* lo, int* hi) {
  *lo = *hi = 0;
  if (t >= T) return;
  const int s = SequenceOf(cu, S, t);
  *lo = cu[s];
  *hi = causal ? t + 1 : cu[s + 1];
}

template <int HDM>
struct ForwardShared {
  alignas(32) __nv_bfloat16 q[kTq][Hld<HDM>()];
  alignas(32) __nv_bfloat16 k[kTk][Hld<HDM>()];
  alignas(32) __nv_bfloat16 v[kTk][Hld<HDM>()];
  union alignas(32) ScoresOrP {
    float s[kTq][kSld];
    __nv_bfloat16 p[kTq][kPld];
  } sp;
  alignas(32) float o[kTq][HDM];
  float m[kTq], l[kTq], corr[kTq];
};

template <int HDM>
__global__ void __launch_bounds__(kTensorThreads)
    FlashForwardBf16(float* out, float* lse, const float* qkv, const int32_t* cu, int S, int T,
                     int NH, int NKV, int HD, bool causal, float scale) {
  __shared__ ForwardShared<HDM> sh;
  constexpr int ld = Hld<HDM>();
  const int h = blockIdx.y, t0 = blockIdx.x * kTq, warp = threadIdx.x / 32;
  const Heads y(NH, NKV, HD, h);
  const int r = threadIdx.x >> 2, c0 = (threadIdx.x & 3) * (kTk / 4);  // this thread's 8 scores
  int lo, hi;
  KeysOf(cu, S, T, t0 + r, causal, &lo, &hi);
  int block_lo, block_hi;
  RowRange(cu, S, T, t0, kTq, causal, &block_lo, &block_hi);
  LoadRowsBf16<HDM>(&sh.q[0][0], qkv, y.ld, y.q, t0, kTq, T, HD);
  for (int e = threadIdx.x; e < kTq * HDM; e += blockDim.x) sh.o[e / HDM][e % HDM] = 0.0f;
  if (threadIdx.x < kTq) {
    sh.m[threadIdx.x] = -INFINITY;
    sh.l[threadIdx.x] = 0.0f;
  }
  for (int j0 = block_lo; j0 < block_hi; j0 += kTk) {
    __syncthreads();
    LoadRowsBf16<HDM>(&sh.k[0][0], qkv, y.ld, y.k, j0, kTk, block_hi, HD);
    LoadRowsBf16<HDM>(&sh.v[0][0], qkv, y.ld, y.v, j0, kTk, block_hi, HD);
    __syncthreads();
    TileScores<HDM>(&sh.sp.s[0][0], &sh.q[0][0], &sh.k[0][0], warp);
    __syncthreads();
    float x[kTk / 4];
    float mx = -INFINITY;
    LOOM_UNROLL
    for (int i = 0; i < kTk / 4; ++i) {
      const int j = j0 + c0 + i;
      x[i] = j >= lo && j < hi ? sh.sp.s[r][c0 + i] * scale : -INFINITY;
      mx = fmaxf(mx, x[i]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_old = sh.m[r], m_new = fmaxf(m_old, mx);
    float sum = 0.0f;
    LOOM_UNROLL
    for (int i = 0; i < kTk / 4; ++i) {
      x[i] = m_new == -INFINITY ? 0.0f : expf(x[i] - m_new);  // 0 where masked
      sum += x[i];
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    __syncthreads();  // every score read before P overwrites them
    LOOM_UNROLL
    for (int i = 0; i < kTk / 4; ++i) sh.sp.p[r][c0 + i] = __float2bfloat16_rn(x[i]);
    if ((threadIdx.x & 3) == 0) {
      const float corr = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
      sh.l[r] = sh.l[r] * corr + sum;
      sh.m[r] = m_new;
      sh.corr[r] = corr;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < kTq * HDM; e += blockDim.x)
      sh.o[e / HDM][e % HDM] *= sh.corr[e / HDM];
    __syncthreads();
    for (int t = warp; t < 2 * (HDM / 16); t += kWarps) {  // O += P · V
      const int tr = t / (HDM / 16), tc = t % (HDM / 16);
      AccFrag acc;
      wmma::load_matrix_sync(acc, &sh.o[16 * tr][16 * tc], HDM, wmma::mem_row_major);
      LOOM_UNROLL
      for (int kk = 0; kk < kTk / 16; ++kk) {
        BfFragA a;
        BfFragB b;
        wmma::load_matrix_sync(a, &sh.sp.p[16 * tr][16 * kk], kPld);
        wmma::load_matrix_sync(b, &sh.v[16 * kk][16 * tc], ld);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(&sh.o[16 * tr][16 * tc], acc, HDM, wmma::mem_row_major);
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kTq * HDM; e += blockDim.x) {
    const int rr = e / HDM, d = e % HDM, t = t0 + rr;
    if (t < T && d < HD)
      out[static_cast<int64_t>(t) * NH * HD + h * HD + d] = sh.o[rr][d] / sh.l[rr];
  }
  if (threadIdx.x < kTq && t0 + static_cast<int>(threadIdx.x) < T) {
    lse[static_cast<int64_t>(t0 + threadIdx.x) * NH + h] =
        sh.m[threadIdx.x] + logf(sh.l[threadIdx.x]);
  }
}

// The backward's per-tile step, shared by dQ and dK/dV: S = Q · Kᵀ and
// dP = dO · Vᵀ of the warp's tile into s and dp, then each thread's 8
// entries (row r, columns c0..): P = exp(scale · S − lse) where `valid`,
// else 0, and dS = P ⊙ (dP − D); P and dS overwrite s and dp in bf16.
template <int HDM>
struct BackwardTiles {
  alignas(32) __nv_bfloat16 q[kTq][Hld<HDM>()];
  alignas(32) __nv_bfloat16 g[kTq][Hld<HDM>()];  // dO
  alignas(32) __nv_bfloat16 k[kTk][Hld<HDM>()];
  alignas(32) __nv_bfloat16 v[kTk][Hld<HDM>()];
  union alignas(32) ScoresOrP {
    float s[kTq][kSld];
    __nv_bfloat16 p[kTq][kPld];
  } sp;
  union alignas(32) DpOrDs {
    float dp[kTq][kSld];
    __nv_bfloat16 ds[kTq][kPld];
  } dd;
  float lse[kTq], dsum[kTq];
};

template <int HDM>
__device__ void BackwardTile(BackwardTiles<HDM>& sh, int warp, int r, int c0,
                             const bool (&valid)[kTk / 4], float scale) {
  TileScores<HDM>(&sh.sp.s[0][0], &sh.q[0][0], &sh.k[0][0], warp);
  TileScores<HDM>(&sh.dd.dp[0][0], &sh.g[0][0], &sh.v[0][0], warp);
  __syncthreads();
  float p[kTk / 4], ds[kTk / 4];
  LOOM_UNROLL
  for (int i = 0; i < kTk / 4; ++i) {
    p[i] = valid[i] ? expf(sh.sp.s[r][c0 + i] * scale - sh.lse[r]) : 0.0f;
    ds[i] = p[i] * (sh.dd.dp[r][c0 + i] - sh.dsum[r]);
  }
  __syncthreads();  // every score read before P and dS overwrite them
  LOOM_UNROLL
  for (int i = 0; i < kTk / 4; ++i) {
    sh.sp.p[r][c0 + i] = __float2bfloat16_rn(p[i]);
    sh.dd.ds[r][c0 + i] = __float2bfloat16_rn(ds[i]);
  }
  __syncthreads();
}

// lse and D of query rows [i0, i0 + kTq) of head h (0 past T).
template <int HDM>
__device__ void LoadRowStats(BackwardTiles<HDM>& sh, const float* lse, const float* dsum, int i0,
                             int T, int NH, int h) {
  if (threadIdx.x < kTq) {
    const int i = i0 + threadIdx.x;
    sh.lse[threadIdx.x] = i < T ? lse[static_cast<int64_t>(i) * NH + h] : 0.0f;
    sh.dsum[threadIdx.x] = i < T ? dsum[static_cast<int64_t>(i) * NH + h] : 0.0f;
  }
}

// rows [t0, t0 + n) of dqkv's columns [col, col + HD) += mul · the tiles of
// `acc` (the warp's output tiles of an n x HDM block), through `stage`
// (n x HDM floats of shared memory nothing else uses now).
template <int HDM>
__device__ void AddTiles(float* dqkv, int64_t ld, int col, int t0, int T, int HD, float mul,
                         const AccFrag (&acc)[TilesPerWarp<HDM>()], float* stage, int warp) {
  __syncthreads();
  LOOM_UNROLL
  for (int i = 0; i < TilesPerWarp<HDM>(); ++i) {
    const int t = warp + i * kWarps;
    if (t >= 2 * (HDM / 16)) break;
    const int tr = t / (HDM / 16), tc = t % (HDM / 16);
    wmma::store_matrix_sync(stage + 16 * tr * HDM + 16 * tc, acc[i], HDM, wmma::mem_row_major);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < 32 * HDM; e += blockDim.x) {
    const int r = e / HDM, d = e % HDM, t = t0 + r;
    if (t < T && d < HD) dqkv[t * ld + col + d] += mul * stage[e];
  }
}

// A backward kernel's shared memory: its tiles, then (AddTiles) the staging
// of its `Rows` x HDM output block.
template <int HDM, int Rows>
union BackwardShared {
  BackwardTiles<HDM> tiles;
  float stage[Rows][HDM];
};

template <int HDM>
__global__ void __launch_bounds__(kTensorThreads)
    FlashBackwardQBf16(float* dqkv, const float* dsum, const float* dout, const float* qkv,
                       const float* lse, const int32_t* cu, int S, int T, int NH, int NKV, int HD,
                       bool causal, float scale) {
  __shared__ BackwardShared<HDM, kTq> u;
  BackwardTiles<HDM>& sh = u.tiles;
  const int h = blockIdx.y, t0 = blockIdx.x * kTq, warp = threadIdx.x / 32;
  const Heads y(NH, NKV, HD, h);
  const int r = threadIdx.x >> 2, c0 = (threadIdx.x & 3) * (kTk / 4);
  int lo, hi;
  KeysOf(cu, S, T, t0 + r, causal, &lo, &hi);
  int block_lo, block_hi;
  RowRange(cu, S, T, t0, kTq, causal, &block_lo, &block_hi);
  LoadRowsBf16<HDM>(&sh.q[0][0], qkv, y.ld, y.q, t0, kTq, T, HD);
  LoadRowsBf16<HDM>(&sh.g[0][0], dout, static_cast<int64_t>(NH) * HD, h * HD, t0, kTq, T, HD);
  LoadRowStats(sh, lse, dsum, t0, T, NH, h);
  AccFrag dq[TilesPerWarp<HDM>()];
  LOOM_UNROLL
  for (int i = 0; i < TilesPerWarp<HDM>(); ++i) wmma::fill_fragment(dq[i], 0.0f);
  for (int j0 = block_lo; j0 < block_hi; j0 += kTk) {
    __syncthreads();
    LoadRowsBf16<HDM>(&sh.k[0][0], qkv, y.ld, y.k, j0, kTk, block_hi, HD);
    LoadRowsBf16<HDM>(&sh.v[0][0], qkv, y.ld, y.v, j0, kTk, block_hi, HD);
    __syncthreads();
    bool valid[kTk / 4];
    LOOM_UNROLL
    for (int i = 0; i < kTk / 4; ++i) valid[i] = j0 + c0 + i >= lo && j0 + c0 + i < hi;
    BackwardTile(sh, warp, r, c0, valid, scale);
    LOOM_UNROLL
    for (int i = 0; i < TilesPerWarp<HDM>(); ++i) {  // dQ += dS · K
      const int t = warp + i * kWarps;
      if (t >= 2 * (HDM / 16)) break;
      const int tr = t / (HDM / 16), tc = t % (HDM / 16);
      LOOM_UNROLL
      for (int kk = 0; kk < kTk / 16; ++kk) {
        BfFragA a;
        BfFragB b;
        wmma::load_matrix_sync(a, &sh.dd.ds[16 * tr][16 * kk], kPld);
        wmma::load_matrix_sync(b, &sh.k[16 * kk][16 * tc], Hld<HDM>());
        wmma::mma_sync(dq[i], a, b, dq[i]);
      }
    }
  }
  AddTiles<HDM>(dqkv, y.ld, y.q, t0, T, HD, scale, dq, &u.stage[0][0], warp);
}

template <int HDM>
__global__ void __launch_bounds__(kTensorThreads)
    FlashBackwardKVBf16(float* dqkv, const float* dsum, const float* dout, const float* qkv,
                        const float* lse, const int32_t* cu, int S, int T, int NH, int NKV, int HD,
                        bool causal, float scale) {
  __shared__ BackwardShared<HDM, kTk> u;
  BackwardTiles<HDM>& sh = u.tiles;
  const int kvh = blockIdx.y, group = NH / NKV, t0 = blockIdx.x * kTk, warp = threadIdx.x / 32;
  const Heads yk(NH, NKV, HD, kvh * group);
  const int r = threadIdx.x >> 2, c0 = (threadIdx.x & 3) * (kTk / 4);
  // The queries any key of the block is seen by.
  const int last = std::min(T, t0 + kTk) - 1;
  const int block_lo = causal ? t0 : cu[SequenceOf(cu, S, t0)];
  const int block_hi = cu[SequenceOf(cu, S, last) + 1];
  LoadRowsBf16<HDM>(&sh.k[0][0], qkv, yk.ld, yk.k, t0, kTk, T, HD);
  LoadRowsBf16<HDM>(&sh.v[0][0], qkv, yk.ld, yk.v, t0, kTk, T, HD);
  AccFrag dk[TilesPerWarp<HDM>()], dv[TilesPerWarp<HDM>()];
  LOOM_UNROLL
  for (int i = 0; i < TilesPerWarp<HDM>(); ++i) {
    wmma::fill_fragment(dk[i], 0.0f);
    wmma::fill_fragment(dv[i], 0.0f);
  }
  for (int g = 0; g < group; ++g) {
    const int h = kvh * group + g;
    const Heads y(NH, NKV, HD, h);
    for (int i0 = block_lo; i0 < block_hi; i0 += kTq) {
      __syncthreads();
      LoadRowsBf16<HDM>(&sh.q[0][0], qkv, y.ld, y.q, i0, kTq, block_hi, HD);
      LoadRowsBf16<HDM>(&sh.g[0][0], dout, static_cast<int64_t>(NH) * HD, h * HD, i0, kTq, block_hi,
                        HD);
      LoadRowStats(sh, lse, dsum, i0, block_hi, NH, h);
      __syncthreads();
      int lo, hi;  // the keys query row i0 + r sees
      KeysOf(cu, S, block_hi, i0 + r, causal, &lo, &hi);
      bool valid[kTk / 4];
      LOOM_UNROLL
      for (int i = 0; i < kTk / 4; ++i) {
        const int j = t0 + c0 + i;
        valid[i] = j < T && j >= lo && j < hi;
      }
      BackwardTile(sh, warp, r, c0, valid, scale);
      LOOM_UNROLL
      for (int i = 0; i < TilesPerWarp<HDM>(); ++i) {  // dV += Pᵀ · dO ; dK += dSᵀ · Q
        const int t = warp + i * kWarps;
        if (t >= 2 * (HDM / 16)) break;
        const int tr = t / (HDM / 16), tc = t % (HDM / 16);
        LOOM_UNROLL
        for (int kk = 0; kk < kTq / 16; ++kk) {
          BfFragAT a;
          BfFragB b;
          wmma::load_matrix_sync(a, &sh.sp.p[16 * kk][16 * tr], kPld);
          wmma::load_matrix_sync(b, &sh.g[16 * kk][16 * tc], Hld<HDM>());
          wmma::mma_sync(dv[i], a, b, dv[i]);
          wmma::load_matrix_sync(a, &sh.dd.ds[16 * kk][16 * tr], kPld);
          wmma::load_matrix_sync(b, &sh.q[16 * kk][16 * tc], Hld<HDM>());
          wmma::mma_sync(dk[i], a, b, dk[i]);
        }
      }
    }
  }
  AddTiles<HDM>(dqkv, yk.ld, yk.k, t0, T, HD, scale, dk, &u.stage[0][0], warp);
  AddTiles<HDM>(dqkv, yk.ld, yk.v, t0, T, HD, 1.0f, dv, &u.stage[0][0], warp);
}

// Calls F<HDM> for the smallest supported HDM >= HD.
template <template <int> class F, typename... Args>
void ForHeadDim(int HD, Args... args) {
  if (HD <= 16) return F<16>::Run(args...);
  if (HD <= 32) return F<32>::Run(args...);
  if (HD <= 64) return F<64>::Run(args...);
  if (HD <= 128) return F<128>::Run(args...);
  std::fprintf(stderr, "flash attention: head dimension %d > 128 is not supported\n", HD);
  std::abort();
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

template <int HDM>
struct ForwardLaunchBf16 {
  static void Run(float* out, float* lse, const float* qkv, const int32_t* cu, int S, int T, int NH,
                  int NKV, int HD, bool causal, float scale) {
    LOOM_LAUNCH(FlashForwardBf16<HDM>, dim3((T + kTq - 1) / kTq, NH), kTensorThreads, out, lse, qkv,
                cu, S, T, NH, NKV, HD, causal, scale);
    LOOM_CUDA_CHECK(cudaGetLastError());
  }
};

template <int HDM>
struct BackwardLaunchBf16 {
  static void Run(float* dqkv, const float* dsum, const float* dout, const float* qkv,
                  const float* lse, const int32_t* cu, int S, int T, int NH, int NKV, int HD,
                  bool causal, float scale) {
    LOOM_LAUNCH(FlashBackwardQBf16<HDM>, dim3((T + kTq - 1) / kTq, NH), kTensorThreads, dqkv, dsum,
                dout, qkv, lse, cu, S, T, NH, NKV, HD, causal, scale);
    LOOM_CUDA_CHECK(cudaGetLastError());
    LOOM_LAUNCH(FlashBackwardKVBf16<HDM>, dim3((T + kTk - 1) / kTk, NKV), kTensorThreads, dqkv,
                dsum, dout, qkv, lse, cu, S, T, NH, NKV, HD, causal, scale);
    LOOM_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace

void flash_attention_forward(float* out, float* lse, const float* qkv, const int32_t* cu_seqlens,
                             int S, int T, int NH, int NKV, int HD, bool causal, bool bf16) {
  if (T == 0) return;
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));
  if (bf16) {
    ForHeadDim<ForwardLaunchBf16>(HD, out, lse, qkv, cu_seqlens, S, T, NH, NKV, HD, causal, scale);
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
    ForHeadDim<BackwardLaunchBf16>(HD, dqkv, scratch, dout, qkv, lse, cu_seqlens, S, T, NH, NKV, HD,
                                   causal, scale);
  } else {
    ForHeadDim<BackwardLaunch>(HD, dqkv, scratch, dout, qkv, lse, cu_seqlens, S, T, NH, NKV, HD,
                               causal, scale);
  }
}

}  // namespace loom::kernels::cuda
