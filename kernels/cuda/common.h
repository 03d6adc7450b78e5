// Shared pieces of the CUDA kernels: launch geometry and block reductions.
#ifndef LOOM_KERNELS_CUDA_COMMON_H_
#define LOOM_KERNELS_CUDA_COMMON_H_

#include <cstdint>

#include "runtime/backends/cuda/cuda_check.h"
#include "runtime/backends/cuda/launch.h"

// `#pragma unroll` under nvcc (loops over register arrays must unroll for the
// arrays to stay in registers); nothing for the host compiler (the
// emulation).
#if defined(__CUDACC__)
#define LOOM_UNROLL _Pragma("unroll")
#else
#define LOOM_UNROLL
#endif

namespace loom::kernels::cuda {

inline constexpr int kThreads = 256;

inline int Blocks(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

// A grid-stride loop's grid: 1 to 65,535 blocks (one for n <= 0: a launch of
// none is an error, and the loop then does nothing).
inline int GridFor(int64_t n) {
  const int64_t b = n <= 0 ? 1 : Blocks(n);
  return static_cast<int>(b < 65535 ? b : 65535);
}

#define LOOM_GRID_LOOP(i, n)                                                             \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// Sum of `v` over the block; every thread gets the result. blockDim.x must be
// a multiple of 32 and at most 1024. `scratch` holds 32 values.
template <typename T>
__device__ inline T BlockSum(T v, T* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? scratch[lane] : T(0);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}

__device__ inline float BlockMax(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? scratch[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
  return v;
}

}  // namespace loom::kernels::cuda

#endif  // LOOM_KERNELS_CUDA_COMMON_H_
