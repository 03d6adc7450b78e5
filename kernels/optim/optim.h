// AdamW (decoupled weight decay, PyTorch torch.optim.AdamW semantics) and
// global-norm gradient clipping (torch.nn.utils.clip_grad_norm_).
#ifndef LOOM_KERNELS_OPTIM_OPTIM_H_
#define LOOM_KERNELS_OPTIM_OPTIM_H_

#include <cstdint>
#include <vector>

namespace loom::kernels {

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// One AdamW step on n parameters; `step` counts from 1 (bias correction).
//   param *= 1 - lr * wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g²;
//   param -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps)
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWConfig& config, int64_t step);

struct GradSpan {
  float* data;
  int64_t n;
};

// Σ g² over all gradients together (in double); the norm is its square
// root. Ranks that hold different modules add their sums before the root.
double sum_of_squares(const std::vector<GradSpan>& grads);

// The L2 norm of all gradients together.
double global_norm(const std::vector<GradSpan>& grads);

// The factor clip_to_norm scales by: min(1, max_norm / (norm + 1e-6)) as a
// float; 1 when max_norm <= 0.
float ClipFactor(double norm, double max_norm);

// Scales every gradient by min(1, max_norm / (norm + 1e-6)), `norm` being
// the global norm computed elsewhere (possibly over more gradients than
// these). max_norm <= 0 disables clipping.
void clip_to_norm(const std::vector<GradSpan>& grads, double norm, double max_norm);

// Scales every gradient by min(1, max_norm / (norm + 1e-6)) and returns the
// norm before clipping. max_norm <= 0 disables clipping.
double clip_global_norm(const std::vector<GradSpan>& grads, double max_norm);

}  // namespace loom::kernels

#endif  // LOOM_KERNELS_OPTIM_OPTIM_H_
