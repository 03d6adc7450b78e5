#include "kernels/rope/rope.h"

#include <cmath>

namespace loom::kernels {
namespace {

// Rotates the q and k pairs of every row by sign * angle.
void Rotate(float* qkv, const int32_t* positions, int T, int NH, int HD, float theta, float sign) {
  const int C = NH * HD;
  for (int t = 0; t < T; ++t) {
    float* row = qkv + static_cast<int64_t>(t) * 3 * C;
    for (int i = 0; i < HD / 2; ++i) {
      const double freq = std::pow(static_cast<double>(theta), -2.0 * i / HD);
      const double angle = positions[t] * freq;
      const float c = static_cast<float>(std::cos(angle));
      const float s = sign * static_cast<float>(std::sin(angle));
      for (int part = 0; part < 2; ++part) {  // q, k
        for (int h = 0; h < NH; ++h) {
          float* x = row + part * C + h * HD + 2 * i;
          const float x0 = x[0], x1 = x[1];
          x[0] = x0 * c - x1 * s;
          x[1] = x0 * s + x1 * c;
        }
      }
    }
  }
}

}  // namespace

void rope_forward(float* qkv, const int32_t* positions, int T, int NH, int HD, float theta) {
  Rotate(qkv, positions, T, NH, HD, theta, 1.0f);
}

void rope_backward(float* dqkv, const int32_t* positions, int T, int NH, int HD, float theta) {
  Rotate(dqkv, positions, T, NH, HD, theta, -1.0f);
}

}  // namespace loom::kernels
