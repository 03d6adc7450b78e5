// Fused masked cross-entropy: one block per row.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace loom::kernels::cuda {
namespace {

__global__ void CrossEntropy(float* dlogits, float* losses, const float* logits,
                             const int32_t* targets, int V, float grad_scale) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float* x = logits + row * V;
  float* d = dlogits + row * V;
  const int target = targets[row];
  if (target < 0) {
    for (int v = threadIdx.x; v < V; v += blockDim.x) d[v] = 0.0f;
    if (threadIdx.x == 0) losses[row] = 0.0f;
    return;
  }
  float mx = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, x[v]);
  mx = BlockMax(mx, scratch);
  float sum = 0;
  for (int v = threadIdx.x; v < V; v += blockDim.x) sum += expf(x[v] - mx);
  const float lse = logf(BlockSum(sum, scratch));
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    d[v] = (expf(x[v] - mx - lse) - (v == target ? 1.0f : 0.0f)) * grad_scale;
  }
  if (threadIdx.x == 0) losses[row] = lse - (x[target] - mx);
}

}  // namespace

void crossentropy_forward_backward(float* dlogits, float* losses, const float* logits,
                                   const int32_t* targets, int T, int V, float grad_scale) {
  if (T == 0) return;
  CrossEntropy<<<T, kThreads>>>(dlogits, losses, logits, targets, V, grad_scale);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace loom::kernels::cuda
