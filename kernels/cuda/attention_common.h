// What attention.cu (fp32) and attention_bf16.cu (tensor cores) share:
// the sequence of a packed row, a row's heads, the rows a block of rows may
// attend to, the dispatch over head dimensions, and the bf16 launchers.
#ifndef LOOM_KERNELS_CUDA_ATTENTION_COMMON_H_
#define LOOM_KERNELS_CUDA_ATTENTION_COMMON_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace loom::kernels::cuda {

// The sequence a row belongs to: binary search over cu_seqlens.
inline __device__ int SequenceOf(const int32_t* cu, int S, int t) {
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

// The packed rows [lo, hi) that rows [t0, min(T, t0 + n)) may attend to.
inline __device__ void RowRange(const int32_t* cu, int S, int T, int t0, int n, bool causal,
                                int* lo, int* hi) {
  const int last = std::min(T, t0 + n) - 1;
  *lo = cu[SequenceOf(cu, S, t0)];
  *hi = causal ? last + 1 : cu[SequenceOf(cu, S, last) + 1];
}

// Calls F<HDM> for the smallest supported HDM >= HD.
template <template <int> class F, typename... Args>
inline void ForHeadDim(int HD, Args... args) {
  if (HD <= 16) return F<16>::Run(args...);
  if (HD <= 32) return F<32>::Run(args...);
  if (HD <= 64) return F<64>::Run(args...);
  if (HD <= 128) return F<128>::Run(args...);
  std::fprintf(stderr, "flash attention: head dimension %d > 128 is not supported\n", HD);
  std::abort();
}

// attention_bf16.cu: the memory-efficient attention's bf16 forward and
// backward (the contracts of flash_attention_forward/backward; dsum from
// FlashRowDots).
void FlashForwardBf16Launch(float* out, float* lse, const float* qkv, const int32_t* cu, int S,
                            int T, int NH, int NKV, int HD, bool causal, float scale);
void FlashBackwardBf16Launch(float* dqkv, const float* dsum, const float* dout, const float* qkv,
                             const float* lse, const int32_t* cu, int S, int T, int NH, int NKV,
                             int HD, bool causal, float scale);

}  // namespace loom::kernels::cuda

#endif  // LOOM_KERNELS_CUDA_ATTENTION_COMMON_H_
