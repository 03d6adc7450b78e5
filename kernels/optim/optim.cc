#include "kernels/optim/optim.h"

#include <cmath>

namespace loom::kernels {

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWConfig& c, int64_t step) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), static_cast<double>(step));
  const float decay = 1.0f - c.lr * c.weight_decay;
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    m[i] = c.beta1 * m[i] + (1.0f - c.beta1) * g;
    v[i] = c.beta2 * v[i] + (1.0f - c.beta2) * g * g;
    const double mhat = m[i] / bc1;
    const double vhat = v[i] / bc2;
    param[i] = param[i] * decay - static_cast<float>(c.lr * mhat / (std::sqrt(vhat) + c.eps));
  }
}

double sum_of_squares(const std::vector<GradSpan>& grads) {
  double ss = 0;
  for (const GradSpan& g : grads) {
    for (int64_t i = 0; i < g.n; ++i) ss += static_cast<double>(g.data[i]) * g.data[i];
  }
  return ss;
}

double global_norm(const std::vector<GradSpan>& grads) { return std::sqrt(sum_of_squares(grads)); }

float ClipFactor(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0f;
  const double coef = max_norm / (norm + 1e-6);
  return coef >= 1.0 ? 1.0f : static_cast<float>(coef);
}

void clip_to_norm(const std::vector<GradSpan>& grads, double norm, double max_norm) {
  const float f = ClipFactor(norm, max_norm);
  if (f == 1.0f) return;
  for (const GradSpan& g : grads) {
    for (int64_t i = 0; i < g.n; ++i) g.data[i] *= f;
  }
}

double clip_global_norm(const std::vector<GradSpan>& grads, double max_norm) {
  const double norm = global_norm(grads);
  clip_to_norm(grads, norm, max_norm);
  return norm;
}

}  // namespace loom::kernels
