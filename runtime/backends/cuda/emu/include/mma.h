// The CUDA emulation's mma.h: the warp matrix functions (nvcuda::wmma) that
// Loom's kernels use, at the 16 x 16 x 16 shape with bf16 operands and
// fp32 accumulators.
//
// On a GPU a fragment is spread over the warp's 32 lanes in an unspecified
// layout, so a kernel may only fill, load, store and multiply it whole
// (which is all Loom's kernels do). Here every thread holds the whole tile
// and does the whole operation, the same for each lane of the warp: a load
// reads all of the tile, a store writes all of it (the lanes write the same
// values). Each operation first waits for the warp's other lanes
// (__syncwarp), as the GPU's _sync functions need the whole warp there: a
// lane that never arrives ends the process as a missed barrier does.
// Products are summed in fp32, k in order.
#ifndef LOOM_CUDA_EMU_MMA_H_
#define LOOM_CUDA_EMU_MMA_H_

#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_runtime.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulation has the 16 x 16 x 16 shape only");
  static constexpr int kRows = std::is_same<Use, matrix_b>::value ? K : M;
  static constexpr int kCols = std::is_same<Use, matrix_a>::value ? K : N;
  float v[kRows * kCols];  // row-major; bf16 operands held exactly as fp32
};

namespace internal {
inline float Widen(float x) { return x; }
inline float Widen(__nv_bfloat16 x) { return __bfloat162float(x); }
}  // namespace internal

template <typename Use, int M, int N, int K, typename T, typename L>
inline void fill_fragment(fragment<Use, M, N, K, T, L>& f, float value) {
  __syncwarp();
  for (float& x : f.v) x = value;
}

// An operand tile (matrix_a or matrix_b) from `p` with leading dimension
// `ldm` elements, row- or column-major as the fragment's layout says.
template <typename Use, int M, int N, int K, typename T, typename L, typename P>
inline void load_matrix_sync(fragment<Use, M, N, K, T, L>& f, const P* p, unsigned ldm) {
  static_assert(!std::is_same<Use, accumulator>::value, "an accumulator load names its layout");
  __syncwarp();
  using F = fragment<Use, M, N, K, T, L>;
  for (int r = 0; r < F::kRows; ++r) {
    for (int c = 0; c < F::kCols; ++c) {
      const P& x = std::is_same<L, row_major>::value ? p[r * ldm + c] : p[c * ldm + r];
      f.v[r * F::kCols + c] = internal::Widen(x);
    }
  }
}

template <int M, int N, int K>
inline void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm,
                             layout_t layout) {
  __syncwarp();
  for (int r = 0; r < M; ++r) {
    for (int c = 0; c < N; ++c) {
      f.v[r * N + c] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
    }
  }
}

template <int M, int N, int K>
inline void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f,
                              unsigned ldm, layout_t layout) {
  __syncwarp();
  for (int r = 0; r < M; ++r) {
    for (int c = 0; c < N; ++c) {
      (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.v[r * N + c];
    }
  }
}

// d = a · b + c.
template <int M, int N, int K, typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, M, N, K, float>& d,
                     const fragment<matrix_a, M, N, K, T, LA>& a,
                     const fragment<matrix_b, M, N, K, T, LB>& b,
                     const fragment<accumulator, M, N, K, float>& c) {
  __syncwarp();
  float out[M * N];
  for (int r = 0; r < M; ++r) {
    for (int col = 0; col < N; ++col) {
      float s = c.v[r * N + col];
      for (int k = 0; k < K; ++k) s += a.v[r * K + k] * b.v[k * N + col];
      out[r * N + col] = s;
    }
  }
  for (int i = 0; i < M * N; ++i) d.v[i] = out[i];
}

}  // namespace nvcuda::wmma

#endif  // LOOM_CUDA_EMU_MMA_H_
