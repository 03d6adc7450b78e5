#include "kernels/norm/norm.h"

#include <cmath>

namespace loom::kernels {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<long>(n) * C;
    float* y = out + static_cast<long>(n) * C;
    double m = 0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    double v = 0;
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= C;
    const float s = static_cast<float>(1.0 / std::sqrt(v + eps));
    const float mf = static_cast<float>(m);
    for (int c = 0; c < C; ++c) y[c] = (x[c] - mf) * s * weight[c] + bias[c];
    mean[n] = mf;
    rstd[n] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<long>(n) * C;
    const float* g = dout + static_cast<long>(n) * C;
    float* dx = dinp + static_cast<long>(n) * C;
    const float m = mean[n], s = rstd[n];
    // dnorm = g * weight; dx = s * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
    double mean_d = 0, mean_dx = 0;
    for (int c = 0; c < C; ++c) {
      const float xhat = (x[c] - m) * s;
      const float d = g[c] * weight[c];
      mean_d += d;
      mean_dx += d * xhat;
      if (dweight) dweight[c] += g[c] * xhat;
      if (dbias) dbias[c] += g[c];
    }
    mean_d /= C;
    mean_dx /= C;
    for (int c = 0; c < C; ++c) {
      const float xhat = (x[c] - m) * s;
      const float d = g[c] * weight[c];
      dx[c] += s * (d - static_cast<float>(mean_d) - xhat * static_cast<float>(mean_dx));
    }
  }
}

void rmsnorm_forward(float* out, float* rrms, const float* inp, const float* weight, int N, int C,
                     float eps) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<long>(n) * C;
    float* y = out + static_cast<long>(n) * C;
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += static_cast<double>(x[c]) * x[c];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / C + eps));
    for (int c = 0; c < C; ++c) y[c] = x[c] * r * weight[c];
    rrms[n] = r;
  }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rrms, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<long>(n) * C;
    const float* g = dout + static_cast<long>(n) * C;
    float* dx = dinp + static_cast<long>(n) * C;
    const float r = rrms[n];
    // y = x * r * w, r = (mean(x²)+eps)^-1/2 ; dx = r * (d - x * r² * mean(d * x)), d = g * w
    double mean_dx = 0;
    for (int c = 0; c < C; ++c) {
      mean_dx += static_cast<double>(g[c]) * weight[c] * x[c];
      if (dweight) dweight[c] += g[c] * x[c] * r;
    }
    mean_dx /= C;
    const float k = static_cast<float>(mean_dx) * r * r;
    for (int c = 0; c < C; ++c) dx[c] += r * (g[c] * weight[c] - x[c] * k);
  }
}

}  // namespace loom::kernels
