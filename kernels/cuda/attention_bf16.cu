// The memory-efficient attention's bf16 path (attention.cu has fp32 and
// the dispatch).
#include <cuda_bf16.h>

#include "kernels/cuda/attention_common.h"
#include "kernels/cuda/common.h"
#include "kernels/cuda/ops.h"

namespace loom::kernels::cuda {
namespace {

// The bf16 path (kernels/attention's bf16), FlashAttention-2's way: the
// products on tensor cores through mma.sync m16n8k16 (bf16 in, fp32 sums),
// each warp owning 16 rows whose scores, softmax statistics and output
// sums stay in its registers. Shared memory holds only the operand tiles,
// in bf16 rows padded by 8 (the fragment loads below then touch 32
// distinct banks). The score fragments become the next product's operand
// in registers (the accumulator's layout is the A operand's), so a tile
// takes two block barriers: one before its operands are staged, one after.
//
// Fragments (the PTX ISA's layouts; lane = 4 g + q): A, 16 x 16 row-major,
// a[0] = row g, columns 2q and 2q + 1; a[1] = row g + 8, the same columns;
// a[2], a[3] = those rows at columns 8 + 2q, 9 + 2q. B, 16 x 8: b[0] =
// rows 2q, 2q + 1 of column g; b[1] = rows 8 + 2q, 9 + 2q. C, 16 x 8:
// c[0], c[1] = row g, columns 2q, 2q + 1; c[2], c[3] = row g + 8. Each
// 32-bit register holds two bf16, the lower index in the low half.
//
// Forward: a block of 4 warps takes 64 query rows and walks their keys in
// tiles of 64. Backward, with no atomics (each output element is summed by
// one lane, so two runs give the same bits): dQ by blocks of 64 query rows
// over key tiles of 32; dK and dV by blocks of 64 key rows over query tiles
// of 16, for every query head of the key's group.
constexpr int kWarps = 4, kTensorThreads = 32 * kWarps;
constexpr int kFwdRows = 64, kFwdKeys = 64;   // forward block, key tile
constexpr int kDqRows = 64, kDqKeys = 32;     // dQ block, key tile
constexpr int kKvRows = 64, kKvQueries = 16;  // dK/dV block, query tile

template <int HDM>
constexpr int Ld() {  // a bf16 row of shared memory
  return HDM + 8;
}

#ifdef LOOM_CUDA_EMU
struct alignas(16) Vec4 {
  float x, y, z, w;
};
inline uint16_t Bf16Bits(float x) { return __float2bfloat16_rn(x).x; }
inline float Bf16Value(uint32_t bits) {
  return __bfloat162float(__nv_bfloat16{static_cast<uint16_t>(bits)});
}
#else
using Vec4 = float4;
__device__ inline uint16_t Bf16Bits(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
#endif

// Two values as one register of bf16 (lo in the low half).
__device__ inline uint32_t Pack(float lo, float hi) {
  return static_cast<uint32_t>(Bf16Bits(lo)) | static_cast<uint32_t>(Bf16Bits(hi)) << 16;
}
__device__ inline uint32_t Load32(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
// p[0] and p[ld] (two rows of one column) as one register.
__device__ inline uint32_t LoadColumnPair(const uint16_t* p, int ld) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[ld]) << 16;
}

// c += a · b, one m16n8k16 product of the warp. The emulation gathers each
// lane's rows of A and columns of B from the lanes holding them (warp
// shuffles) and sums k in order.
__device__ inline void Mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef LOOM_CUDA_EMU
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  float a0[16], a1[16], b0[16], b1[16];  // rows g, g + 8 of A; columns 2q, 2q + 1 of B
  auto split = [](uint32_t x, float* at) {
    at[0] = Bf16Value(x & 0xffffu);
    at[1] = Bf16Value(x >> 16);
  };
  auto pair = [](uint32_t lo, uint32_t hi) { return static_cast<uint64_t>(hi) << 32 | lo; };
  const uint64_t a02 = pair(a[0], a[2]), a13 = pair(a[1], a[3]), b01 = pair(b[0], b[1]);
  for (int s = 0; s < 4; ++s) {  // a shuffle moves 8 bytes: two registers at once
    const uint64_t x = __shfl_sync(0xffffffffu, a02, 4 * g + s);
    const uint64_t y = __shfl_sync(0xffffffffu, a13, 4 * g + s);
    const uint64_t u = __shfl_sync(0xffffffffu, b01, 8 * q + s);
    const uint64_t v = __shfl_sync(0xffffffffu, b01, 8 * q + 4 + s);
    split(static_cast<uint32_t>(x), a0 + 2 * s);
    split(static_cast<uint32_t>(x >> 32), a0 + 8 + 2 * s);
    split(static_cast<uint32_t>(y), a1 + 2 * s);
    split(static_cast<uint32_t>(y >> 32), a1 + 8 + 2 * s);
    split(static_cast<uint32_t>(u), b0 + 2 * s);
    split(static_cast<uint32_t>(u >> 32), b0 + 8 + 2 * s);
    split(static_cast<uint32_t>(v), b1 + 2 * s);
    split(static_cast<uint32_t>(v >> 32), b1 + 8 + 2 * s);
  }
  for (int k = 0; k < 16; ++k) {
    c[0] += a0[k] * b0[k];
    c[1] += a0[k] * b1[k];
    c[2] += a1[k] * b0[k];
    c[3] += a1[k] * b1[k];
  }
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// The A fragment of rows [r0, r0 + 16) and columns [c0, c0 + 16) of a
// row-major bf16 tile with rows of `ld`.
__device__ inline void LoadA(uint32_t (&a)[4], const uint16_t* tile, int ld, int r0, int c0) {
  const int g = (threadIdx.x & 31) >> 2, q = threadIdx.x & 3;
  const uint16_t* p = tile + (r0 + g) * ld + c0 + 2 * q;
  a[0] = Load32(p);
  a[1] = Load32(p + 8 * ld);
  a[2] = Load32(p + 8);
  a[3] = Load32(p + 8 * ld + 8);
}

// The B fragment of Xᵀ, X row-major (rows [n0, n0 + 8) of X are B's
// columns, X's columns [k0, k0 + 16) its rows): B = X[n0.., k0..]ᵀ.
__device__ inline void LoadBTransposed(uint32_t (&b)[2], const uint16_t* tile, int ld, int n0,
                                       int k0) {
  const int g = (threadIdx.x & 31) >> 2, q = threadIdx.x & 3;
  const uint16_t* p = tile + (n0 + g) * ld + k0 + 2 * q;
  b[0] = Load32(p);
  b[1] = Load32(p + 8);
}

// The B fragment of X itself: rows [k0, k0 + 16), columns [n0, n0 + 8).
__device__ inline void LoadB(uint32_t (&b)[2], const uint16_t* tile, int ld, int k0, int n0) {
  const int g = (threadIdx.x & 31) >> 2, q = threadIdx.x & 3;
  const uint16_t* p = tile + (k0 + 2 * q) * ld + n0 + g;
  b[0] = LoadColumnPair(p, ld);
  b[1] = LoadColumnPair(p + 8 * ld, ld);
}

// Rows [t0, t0 + n) of one head's HD columns of `src` (row stride ld,
// column offset col) as bf16 into dst (n rows of Ld), 0 past `end` or HD.
// 16-byte loads where the rows allow them.
template <int HDM>
__device__ void StageRows(uint16_t* dst, const float* src, int64_t ld, int col, int t0, int n,
                          int end, int HD) {
  constexpr int L = Ld<HDM>();
  if (HD == HDM && ld % 4 == 0 && col % 4 == 0 &&
      reinterpret_cast<uintptr_t>(src) % sizeof(Vec4) == 0) {
    for (int e = threadIdx.x; e < n * (HDM / 4); e += blockDim.x) {
      const int r = e / (HDM / 4), d = 4 * (e % (HDM / 4)), t = t0 + r;
      Vec4 x{0.0f, 0.0f, 0.0f, 0.0f};
      if (t < end) x = *reinterpret_cast<const Vec4*>(src + t * ld + col + d);
      uint32_t* out = reinterpret_cast<uint32_t*>(dst + r * L + d);
      out[0] = Pack(x.x, x.y);
      out[1] = Pack(x.z, x.w);
    }
    return;
  }
  for (int e = threadIdx.x; e < n * HDM; e += blockDim.x) {
    const int r = e / HDM, d = e % HDM, t = t0 + r;
    dst[r * L + d] = Bf16Bits(t < end && d < HD ? src[t * ld + col + d] : 0.0f);
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

// out (rows t0.. of `rows`, 16 of them per warp) += mul · acc, where acc
// holds the warp's 16 x HDM block as C fragments of 8 columns; only rows
// below T and columns below HD.
template <int HDM>
__device__ void AddRows(float* out, int64_t ld, int col, int row, int T, int HD, float mul,
                        const float (&acc)[HDM / 8][4]) {
  const int g = (threadIdx.x & 31) >> 2, q = threadIdx.x & 3;
  LOOM_UNROLL
  for (int i = 0; i < 2; ++i) {
    const int t = row + g + 8 * i;
    if (t >= T) continue;
    LOOM_UNROLL
    for (int n = 0; n < HDM / 8; ++n) {
      const int d = 8 * n + 2 * q;
      if (d < HD) out[t * ld + col + d] += mul * acc[n][2 * i];
      if (d + 1 < HD) out[t * ld + col + d + 1] += mul * acc[n][2 * i + 1];
    }
  }
}

template <int HDM>
struct ForwardShared {
  alignas(16) uint16_t k[kFwdKeys][Ld<HDM>()];  // Q first (kFwdRows == kFwdKeys)
  alignas(16) uint16_t v[kFwdKeys][Ld<HDM>()];
};
static_assert(kFwdRows == kFwdKeys, "the forward stages Q where K goes");

template <int HDM>
__global__ void __launch_bounds__(kTensorThreads)
    FlashForwardBf16(float* out, float* lse, const float* qkv, const int32_t* cu, int S, int T,
                     int NH, int NKV, int HD, bool causal, float scale) {
  __shared__ ForwardShared<HDM> sh;
  constexpr int L = Ld<HDM>(), NC = HDM / 16, ND = HDM / 8, NS = kFwdKeys / 8;
  const int h = blockIdx.y, t0 = blockIdx.x * kFwdRows, warp = threadIdx.x / 32;
  const int g = (threadIdx.x & 31) >> 2, q = threadIdx.x & 3, r0 = 16 * warp;
  const Heads y(NH, NKV, HD, h);
  int lo[2], hi[2];  // the keys of this lane's rows, t0 + r0 + g and 8 below
  for (int i = 0; i < 2; ++i) KeysOf(cu, S, T, t0 + r0 + g + 8 * i, causal, &lo[i], &hi[i]);
  int block_lo, block_hi;
  RowRange(cu, S, T, t0, kFwdRows, causal, &block_lo, &block_hi);
  StageRows<HDM>(&sh.k[0][0], qkv, y.ld, y.q, t0, kFwdRows, T, HD);
  __syncthreads();
  uint32_t qa[NC][4];
  LOOM_UNROLL
  for (int c = 0; c < NC; ++c) LoadA(qa[c], &sh.k[0][0], L, r0, 16 * c);
  float o[ND][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int j0 = block_lo; j0 < block_hi; j0 += kFwdKeys) {
    __syncthreads();  // Q's fragments read, the last tile's K and V used
    StageRows<HDM>(&sh.k[0][0], qkv, y.ld, y.k, j0, kFwdKeys, block_hi, HD);
    StageRows<HDM>(&sh.v[0][0], qkv, y.ld, y.v, j0, kFwdKeys, block_hi, HD);
    __syncthreads();
    float s[NS][4] = {};
    LOOM_UNROLL
    for (int n = 0; n < NS; ++n) {
      LOOM_UNROLL
      for (int c = 0; c < NC; ++c) {
        uint32_t b[2];
        LoadBTransposed(b, &sh.k[0][0], L, 8 * n, 16 * c);
        Mma(s[n], qa[c], b);
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
    LOOM_UNROLL
    for (int n = 0; n < NS; ++n) {
      LOOM_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int i = e >> 1, j = j0 + 8 * n + 2 * q + (e & 1);
        s[n][e] = j >= lo[i] && j < hi[i] ? s[n][e] * scale : -INFINITY;
        mx[i] = fmaxf(mx[i], s[n][e]);
      }
    }
    float corr[2];
    LOOM_UNROLL
    for (int i = 0; i < 2; ++i) {  // the four lanes of a row share its statistics
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float m_new = fmaxf(m[i], mx[i]);
      corr[i] = m_new == -INFINITY ? 1.0f : expf(m[i] - m_new);
      m[i] = m_new;
    }
    uint32_t p[NS][2];  // P in bf16: row g, then row g + 8
    float sum[2] = {0.0f, 0.0f};
    LOOM_UNROLL
    for (int n = 0; n < NS; ++n) {
      LOOM_UNROLL
      for (int i = 0; i < 2; ++i) {
        const float x0 = m[i] == -INFINITY ? 0.0f : expf(s[n][2 * i] - m[i]);  // 0 where masked
        const float x1 = m[i] == -INFINITY ? 0.0f : expf(s[n][2 * i + 1] - m[i]);
        sum[i] += x0 + x1;
        p[n][i] = Pack(x0, x1);
      }
    }
    LOOM_UNROLL
    for (int i = 0; i < 2; ++i) {
      sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], 1);
      sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], 2);
      l[i] = l[i] * corr[i] + sum[i];
    }
    LOOM_UNROLL
    for (int n = 0; n < ND; ++n) {
      o[n][0] *= corr[0];
      o[n][1] *= corr[0];
      o[n][2] *= corr[1];
      o[n][3] *= corr[1];
    }
    LOOM_UNROLL
    for (int kc = 0; kc < kFwdKeys / 16; ++kc) {  // O += P · V
      const uint32_t a[4] = {p[2 * kc][0], p[2 * kc][1], p[2 * kc + 1][0], p[2 * kc + 1][1]};
      LOOM_UNROLL
      for (int n = 0; n < ND; ++n) {
        uint32_t b[2];
        LoadB(b, &sh.v[0][0], L, 16 * kc, 8 * n);
        Mma(o[n], a, b);
      }
    }
  }
  LOOM_UNROLL
  for (int i = 0; i < 2; ++i) {
    const int t = t0 + r0 + g + 8 * i;
    if (t >= T) continue;
    const float inv = 1.0f / l[i];
    LOOM_UNROLL
    for (int n = 0; n < ND; ++n) {
      const int d = 8 * n + 2 * q;
      float* row = out + static_cast<int64_t>(t) * NH * HD + h * HD;
      if (d < HD) row[d] = o[n][2 * i] * inv;
      if (d + 1 < HD) row[d + 1] = o[n][2 * i + 1] * inv;
    }
    if (q == 0) lse[static_cast<int64_t>(t) * NH + h] = m[i] + logf(l[i]);
  }
}

template <int HDM>
union DqShared {
  struct {
    alignas(16) uint16_t q[kDqRows][Ld<HDM>()];
    alignas(16) uint16_t g[kDqRows][Ld<HDM>()];  // dO
  } rows;
  struct {
    alignas(16) uint16_t k[kDqKeys][Ld<HDM>()];
    alignas(16) uint16_t v[kDqKeys][Ld<HDM>()];
  } keys;
};

// dQ: per key tile S = Q · Kᵀ and dP = dO · Vᵀ, P = exp(scale · S − lse)
// where the key is seen (else 0), dS = P ⊙ (dP − D), dQ += dS · K; at the
// end dqkv's Q columns += scale · dQ.
template <int HDM>
__global__ void __launch_bounds__(kTensorThreads)
    FlashBackwardQBf16(float* dqkv, const float* dsum, const float* dout, const float* qkv,
                       const float* lse, const int32_t* cu, int S, int T, int NH, int NKV, int HD,
                       bool causal, float scale) {
  __shared__ DqShared<HDM> sh;
  constexpr int L = Ld<HDM>(), NC = HDM / 16, ND = HDM / 8, NS = kDqKeys / 8;
  const int h = blockIdx.y, t0 = blockIdx.x * kDqRows, warp = threadIdx.x / 32;
  const int g = (threadIdx.x & 31) >> 2, q = threadIdx.x & 3, r0 = 16 * warp;
  const Heads y(NH, NKV, HD, h);
  int lo[2], hi[2];
  float row_lse[2], row_d[2];
  for (int i = 0; i < 2; ++i) {
    const int t = t0 + r0 + g + 8 * i;
    KeysOf(cu, S, T, t, causal, &lo[i], &hi[i]);
    row_lse[i] = t < T ? lse[static_cast<int64_t>(t) * NH + h] : 0.0f;
    row_d[i] = t < T ? dsum[static_cast<int64_t>(t) * NH + h] : 0.0f;
  }
  int block_lo, block_hi;
  RowRange(cu, S, T, t0, kDqRows, causal, &block_lo, &block_hi);
  StageRows<HDM>(&sh.rows.q[0][0], qkv, y.ld, y.q, t0, kDqRows, T, HD);
  StageRows<HDM>(&sh.rows.g[0][0], dout, static_cast<int64_t>(NH) * HD, h * HD, t0, kDqRows, T, HD);
  __syncthreads();
  uint32_t qa[NC][4], ga[NC][4];
  LOOM_UNROLL
  for (int c = 0; c < NC; ++c) {
    LoadA(qa[c], &sh.rows.q[0][0], L, r0, 16 * c);
    LoadA(ga[c], &sh.rows.g[0][0], L, r0, 16 * c);
  }
  float dq[ND][4] = {};
  for (int j0 = block_lo; j0 < block_hi; j0 += kDqKeys) {
    __syncthreads();
    StageRows<HDM>(&sh.keys.k[0][0], qkv, y.ld, y.k, j0, kDqKeys, block_hi, HD);
    StageRows<HDM>(&sh.keys.v[0][0], qkv, y.ld, y.v, j0, kDqKeys, block_hi, HD);
    __syncthreads();
    float s[NS][4] = {}, dp[NS][4] = {};
    LOOM_UNROLL
    for (int n = 0; n < NS; ++n) {
      LOOM_UNROLL
      for (int c = 0; c < NC; ++c) {
        uint32_t b[2];
        LoadBTransposed(b, &sh.keys.k[0][0], L, 8 * n, 16 * c);
        Mma(s[n], qa[c], b);
        LoadBTransposed(b, &sh.keys.v[0][0], L, 8 * n, 16 * c);
        Mma(dp[n], ga[c], b);
      }
    }
    uint32_t ds[NS][2];
    LOOM_UNROLL
    for (int n = 0; n < NS; ++n) {
      LOOM_UNROLL
      for (int i = 0; i < 2; ++i) {
        float x[2];
        LOOM_UNROLL
        for (int e = 0; e < 2; ++e) {
          const int j = j0 + 8 * n + 2 * q + e;
          const float pe =
              j >= lo[i] && j < hi[i] ? expf(s[n][2 * i + e] * scale - row_lse[i]) : 0.0f;
          x[e] = pe * (dp[n][2 * i + e] - row_d[i]);
        }
        ds[n][i] = Pack(x[0], x[1]);
      }
    }
    LOOM_UNROLL
    for (int kc = 0; kc < kDqKeys / 16; ++kc) {  // dQ += dS · K
      const uint32_t a[4] = {ds[2 * kc][0], ds[2 * kc][1], ds[2 * kc + 1][0], ds[2 * kc + 1][1]};
      LOOM_UNROLL
      for (int n = 0; n < ND; ++n) {
        uint32_t b[2];
        LoadB(b, &sh.keys.k[0][0], L, 16 * kc, 8 * n);
        Mma(dq[n], a, b);
      }
    }
  }
  AddRows<HDM>(dqkv, y.ld, y.q, t0 + r0, T, HD, scale, dq);
}

template <int HDM>
struct KvShared {
  alignas(16) uint16_t k[kKvRows][Ld<HDM>()];
  alignas(16) uint16_t v[kKvRows][Ld<HDM>()];
  alignas(16) uint16_t q[kKvQueries][Ld<HDM>()];
  alignas(16) uint16_t g[kKvQueries][Ld<HDM>()];  // dO
};

// dK and dV of a block of keys, transposed: per query tile Sᵀ = K · Qᵀ and
// dPᵀ = V · dOᵀ, Pᵀ and dSᵀ as in dQ, dV += Pᵀ · dO and dK += dSᵀ · Q,
// over every query head of the keys' group; at the end dqkv's K columns +=
// scale · dK and its V columns += dV.
template <int HDM>
__global__ void __launch_bounds__(kTensorThreads)
    FlashBackwardKVBf16(float* dqkv, const float* dsum, const float* dout, const float* qkv,
                        const float* lse, const int32_t* cu, int S, int T, int NH, int NKV, int HD,
                        bool causal, float scale) {
  __shared__ KvShared<HDM> sh;
  constexpr int L = Ld<HDM>(), NC = HDM / 16, ND = HDM / 8, NQ = kKvQueries / 8;
  const int kvh = blockIdx.y, group = NH / NKV, t0 = blockIdx.x * kKvRows, warp = threadIdx.x / 32;
  const int g = (threadIdx.x & 31) >> 2, q = threadIdx.x & 3, r0 = 16 * warp;
  const Heads yk(NH, NKV, HD, kvh * group);
  // The queries any key of the block is seen by.
  const int last = std::min(T, t0 + kKvRows) - 1;
  const int block_lo = causal ? t0 : cu[SequenceOf(cu, S, t0)];
  const int block_hi = cu[SequenceOf(cu, S, last) + 1];
  StageRows<HDM>(&sh.k[0][0], qkv, yk.ld, yk.k, t0, kKvRows, T, HD);
  StageRows<HDM>(&sh.v[0][0], qkv, yk.ld, yk.v, t0, kKvRows, T, HD);
  float dk[ND][4] = {}, dv[ND][4] = {};
  for (int hg = 0; hg < group; ++hg) {
    const int h = kvh * group + hg;
    const Heads y(NH, NKV, HD, h);
    for (int i0 = block_lo; i0 < block_hi; i0 += kKvQueries) {
      __syncthreads();  // K and V staged; the last tile's Q and dO used
      StageRows<HDM>(&sh.q[0][0], qkv, y.ld, y.q, i0, kKvQueries, block_hi, HD);
      StageRows<HDM>(&sh.g[0][0], dout, static_cast<int64_t>(NH) * HD, h * HD, i0, kKvQueries,
                     block_hi, HD);
      __syncthreads();
      float st[NQ][4] = {}, dpt[NQ][4] = {};
      LOOM_UNROLL
      for (int c = 0; c < NC; ++c) {
        uint32_t ka[4], va[4];
        LoadA(ka, &sh.k[0][0], L, r0, 16 * c);
        LoadA(va, &sh.v[0][0], L, r0, 16 * c);
        LOOM_UNROLL
        for (int n = 0; n < NQ; ++n) {
          uint32_t b[2];
          LoadBTransposed(b, &sh.q[0][0], L, 8 * n, 16 * c);
          Mma(st[n], ka, b);
          LoadBTransposed(b, &sh.g[0][0], L, 8 * n, 16 * c);
          Mma(dpt[n], va, b);
        }
      }
      uint32_t pt[NQ][2], dst[NQ][2];  // keys g and g + 8 of the warp, two queries each
      LOOM_UNROLL
      for (int n = 0; n < NQ; ++n) {
        float p[2][2], d[2][2];
        LOOM_UNROLL
        for (int e = 0; e < 2; ++e) {  // query i0 + 8n + 2q + e
          const int i = i0 + 8 * n + 2 * q + e;
          int lo, hi;
          KeysOf(cu, S, block_hi, i, causal, &lo, &hi);
          const float row_lse = i < block_hi ? lse[static_cast<int64_t>(i) * NH + h] : 0.0f;
          const float row_d = i < block_hi ? dsum[static_cast<int64_t>(i) * NH + h] : 0.0f;
          LOOM_UNROLL
          for (int r = 0; r < 2; ++r) {  // key t0 + r0 + g + 8r
            const int j = t0 + r0 + g + 8 * r;
            const float x = st[n][2 * r + e], dx = dpt[n][2 * r + e];
            p[r][e] = j < T && j >= lo && j < hi ? expf(x * scale - row_lse) : 0.0f;
            d[r][e] = p[r][e] * (dx - row_d);
          }
        }
        LOOM_UNROLL
        for (int r = 0; r < 2; ++r) {
          pt[n][r] = Pack(p[r][0], p[r][1]);
          dst[n][r] = Pack(d[r][0], d[r][1]);
        }
      }
      LOOM_UNROLL
      for (int kc = 0; kc < kKvQueries / 16; ++kc) {  // dV += Pᵀ · dO ; dK += dSᵀ · Q
        const uint32_t ap[4] = {pt[2 * kc][0], pt[2 * kc][1], pt[2 * kc + 1][0], pt[2 * kc + 1][1]};
        const uint32_t as[4] = {dst[2 * kc][0], dst[2 * kc][1], dst[2 * kc + 1][0],
                                dst[2 * kc + 1][1]};
        LOOM_UNROLL
        for (int n = 0; n < ND; ++n) {
          uint32_t b[2];
          LoadB(b, &sh.g[0][0], L, 16 * kc, 8 * n);
          Mma(dv[n], ap, b);
          LoadB(b, &sh.q[0][0], L, 16 * kc, 8 * n);
          Mma(dk[n], as, b);
        }
      }
    }
  }
  AddRows<HDM>(dqkv, yk.ld, yk.k, t0 + r0, T, HD, scale, dk);
  AddRows<HDM>(dqkv, yk.ld, yk.v, t0 + r0, T, HD, 1.0f, dv);
}

template <int HDM>
struct ForwardLaunchBf16 {
  static void Run(float* out, float* lse, const float* qkv, const int32_t* cu, int S, int T, int NH,
                  int NKV, int HD, bool causal, float scale) {
    LOOM_LAUNCH(FlashForwardBf16<HDM>, dim3((T + kFwdRows - 1) / kFwdRows, NH), kTensorThreads, out,
                lse, qkv, cu, S, T, NH, NKV, HD, causal, scale);
    LOOM_CUDA_CHECK(cudaGetLastError());
  }
};

template <int HDM>
struct BackwardLaunchBf16 {
  static void Run(float* dqkv, const float* dsum, const float* dout, const float* qkv,
                  const float* lse, const int32_t* cu, int S, int T, int NH, int NKV, int HD,
                  bool causal, float scale) {
    LOOM_LAUNCH(FlashBackwardQBf16<HDM>, dim3((T + kDqRows - 1) / kDqRows, NH), kTensorThreads,
                dqkv, dsum, dout, qkv, lse, cu, S, T, NH, NKV, HD, causal, scale);
    LOOM_CUDA_CHECK(cudaGetLastError());
    LOOM_LAUNCH(FlashBackwardKVBf16<HDM>, dim3((T + kKvRows - 1) / kKvRows, NKV), kTensorThreads,
                dqkv, dsum, dout, qkv, lse, cu, S, T, NH, NKV, HD, causal, scale);
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
