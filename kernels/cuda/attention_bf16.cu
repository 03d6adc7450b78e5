// The memory-efficient attention's bf16 path (attention.cu has fp32 and
// the dispatch).
#include <cuda_bf16.h>
#include <mma.h>

#include "kernels/cuda/attention_common.h"
#include "kernels/cuda/common.h"
#include "kernels/cuda/ops.h"

namespace loom::kernels::cuda {
namespace {

namespace wmma = nvcuda::wmma;

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

void FlashForwardBf16Launch(float* out, float* lse, const float* qkv, const int32_t* cu, int S,
                            int T, int NH, int NKV, int HD, bool causal, float scale) {
  ForHeadDim<ForwardLaunchBf16>(HD, out, lse, qkv, cu, S, T, NH, NKV, HD, causal, scale);
}

void FlashBackwardBf16Launch(float* dqkv, const float* dsum, const float* dout, const float* qkv,
                             const float* lse, const int32_t* cu, int S, int T, int NH, int NKV,
                             int HD, bool causal, float scale) {
  ForHeadDim<BackwardLaunchBf16>(HD, dqkv, dsum, dout, qkv, lse, cu, S, T, NH, NKV, HD, causal,
                                 scale);
}

}  // namespace loom::kernels::cuda
