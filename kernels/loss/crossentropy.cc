#include "kernels/loss/crossentropy.h"

#include <cmath>

namespace loom::kernels {
namespace {

// max and log(sum(exp(x - max))) of one row.
void LogSumExp(const float* x, int V, float* mx, double* lse) {
  float m = x[0];
  for (int v = 1; v < V; ++v) m = x[v] > m ? x[v] : m;
  double s = 0;
  for (int v = 0; v < V; ++v) s += std::exp(static_cast<double>(x[v] - m));
  *mx = m;
  *lse = std::log(s);
}

}  // namespace

LossSum crossentropy_forward(const float* logits, const int32_t* targets, int T, int V) {
  LossSum out;
  for (int t = 0; t < T; ++t) {
    if (targets[t] < 0) continue;
    const float* x = logits + static_cast<int64_t>(t) * V;
    float m;
    double lse;
    LogSumExp(x, V, &m, &lse);
    out.sum += lse - (x[targets[t]] - m);
    ++out.count;
  }
  return out;
}

LossSum crossentropy_forward_backward(float* dlogits, const float* logits, const int32_t* targets,
                                      int T, int V, float grad_scale) {
  LossSum out;
  for (int t = 0; t < T; ++t) {
    float* d = dlogits + static_cast<int64_t>(t) * V;
    if (targets[t] < 0) {
      for (int v = 0; v < V; ++v) d[v] = 0.0f;
      continue;
    }
    const float* x = logits + static_cast<int64_t>(t) * V;
    float m;
    double lse;
    LogSumExp(x, V, &m, &lse);
    out.sum += lse - (x[targets[t]] - m);
    ++out.count;
    for (int v = 0; v < V; ++v) {
      d[v] = static_cast<float>(std::exp(static_cast<double>(x[v] - m) - lse)) * grad_scale;
    }
    d[targets[t]] -= grad_scale;
  }
  return out;
}

}  // namespace loom::kernels
