// Fused masked cross-entropy: one block per row.
#include "kernels/cuda/common.h"
#include "kernels/cuda/ops.h"

namespace loom::kernels::cuda {
namespace {

__global__ void CrossEntropy(float* dlogits, float* losses, const float* logits,
                             const int32_t* targets, int V, float grad_scale) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float* x = logits + row * V;
  float* d = dlogits == nullptr ? nullptr : dlogits + row * V;  // null: the loss only
  const int target = targets[row];
  if (target < 0) {
    if (d != nullptr) {
      for (int v = threadIdx.x; v < V; v += blockDim.x) d[v] = 0.0f;
    }
    if (threadIdx.x == 0) losses[row] = 0.0f;
    return;
  }
  float mx = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, x[v]);
  mx = BlockMax(mx, scratch);
  float sum = 0;
  for (int v = threadIdx.x; v < V; v += blockDim.x) sum += expf(x[v] - mx);
  const float lse = logf(BlockSum(sum, scratch));
  if (d != nullptr) {
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
      d[v] = (expf(x[v] - mx - lse) - (v == target ? 1.0f : 0.0f)) * grad_scale;
    }
  }
  if (threadIdx.x == 0) losses[row] = lse - (x[target] - mx);
}

// The vocab-parallel pieces: one block per row of the shard.
__global__ void ShardMax(float* mx, const float* logits, int V) {
  __shared__ float scratch[32];
  const float* x = logits + static_cast<int64_t>(blockIdx.x) * V;
  float m = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, x[v]);
  m = BlockMax(m, scratch);
  if (threadIdx.x == 0) mx[blockIdx.x] = m;
}

__global__ void ShardSums(double* sums, const float* logits, const float* mx,
                          const int32_t* targets, int V, int vocab_start) {
  __shared__ double scratch[32];
  const int64_t row = blockIdx.x;
  const float* x = logits + row * V;
  const int target = targets[row];
  if (target < 0) {
    if (threadIdx.x == 0) sums[2 * row] = sums[2 * row + 1] = 0.0;
    return;
  }
  double s = 0;
  for (int v = threadIdx.x; v < V; v += blockDim.x) s += exp(static_cast<double>(x[v] - mx[row]));
  s = BlockSum(s, scratch);
  if (threadIdx.x == 0) {
    const int v = target - vocab_start;
    sums[2 * row] = s;
    sums[2 * row + 1] = v >= 0 && v < V ? static_cast<double>(x[v] - mx[row]) : 0.0;
  }
}

__global__ void ShardGrad(float* dlogits, const float* logits, const float* mx, const double* sums,
                          const int32_t* targets, int V, int vocab_start, float grad_scale) {
  const int64_t row = blockIdx.x;
  const float* x = logits + row * V;
  float* d = dlogits + row * V;
  const int target = targets[row];
  if (target < 0) {
    for (int v = threadIdx.x; v < V; v += blockDim.x) d[v] = 0.0f;
    return;
  }
  const double lse = log(sums[2 * row]);
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    d[v] = static_cast<float>(exp(static_cast<double>(x[v] - mx[row]) - lse)) * grad_scale -
           (v == target - vocab_start ? grad_scale : 0.0f);
  }
}

}  // namespace

void crossentropy_shard_max(float* mx, const float* logits, int T, int V) {
  if (T == 0) return;
  LOOM_LAUNCH(ShardMax, T, kThreads, mx, logits, V);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void crossentropy_shard_sums(double* sums, const float* logits, const float* mx,
                             const int32_t* targets, int T, int V, int vocab_start) {
  if (T == 0) return;
  LOOM_LAUNCH(ShardSums, T, kThreads, sums, logits, mx, targets, V, vocab_start);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void crossentropy_shard_grad(float* dlogits, const float* logits, const float* mx,
                             const double* sums, const int32_t* targets, int T, int V,
                             int vocab_start, float grad_scale) {
  if (T == 0) return;
  LOOM_LAUNCH(ShardGrad, T, kThreads, dlogits, logits, mx, sums, targets, V, vocab_start,
              grad_scale);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void crossentropy_forward_backward(float* dlogits, float* losses, const float* logits,
                                   const int32_t* targets, int T, int V, float grad_scale) {
  if (T == 0) return;
  LOOM_LAUNCH(CrossEntropy, T, kThreads, dlogits, losses, logits, targets, V, grad_scale);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace loom::kernels::cuda
