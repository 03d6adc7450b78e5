#include "kernels/activation/activation.h"

#include <cmath>

namespace loom::kernels {
namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;  // 1 / sqrt(2 pi)
constexpr float kQuickGelu = 1.702f;

inline float Sigmoid(float a) { return 1.0f / (1.0f + std::exp(-a)); }
}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + kGeluCubic * x * x * x)));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    const float t = std::tanh(u);
    const float sech2 = 1.0f - t * t;
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] += dout[i] * (0.5f * (1.0f + t) + 0.5f * x * sech2 * du);
  }
}

void activation_forward(Activation act, float* out, const float* inp, int64_t n) {
  switch (act) {
    case Activation::kGeluTanh:
      gelu_forward(out, inp, n);
      return;
    case Activation::kGeluErf:
      for (int64_t i = 0; i < n; ++i)
        out[i] = 0.5f * inp[i] * (1.0f + std::erf(inp[i] * kInvSqrt2));
      return;
    case Activation::kQuickGelu:
      for (int64_t i = 0; i < n; ++i) out[i] = inp[i] * Sigmoid(kQuickGelu * inp[i]);
      return;
  }
}

void activation_backward(Activation act, float* dinp, const float* inp, const float* dout,
                         int64_t n) {
  switch (act) {
    case Activation::kGeluTanh:
      gelu_backward(dinp, inp, dout, n);
      return;
    case Activation::kGeluErf:
      for (int64_t i = 0; i < n; ++i) {
        const float x = inp[i];  // Φ(x) + x φ(x)
        dinp[i] += dout[i] * (0.5f * (1.0f + std::erf(x * kInvSqrt2)) +
                              x * kInvSqrt2Pi * std::exp(-0.5f * x * x));
      }
      return;
    case Activation::kQuickGelu:
      for (int64_t i = 0; i < n; ++i) {
        const float s = Sigmoid(kQuickGelu * inp[i]);
        dinp[i] += dout[i] * (s + kQuickGelu * inp[i] * s * (1.0f - s));
      }
      return;
  }
}

void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] * Sigmoid(gate[i]) * up[i];
}

void swiglu_backward(float* dgate, float* dup, const float* gate, const float* up,
                     const float* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float a = gate[i];
    const float s = Sigmoid(a);
    const float silu = a * s;
    dup[i] += dout[i] * silu;
    dgate[i] += dout[i] * up[i] * s * (1.0f + a * (1.0f - s));  // d silu / da
  }
}

}  // namespace loom::kernels
