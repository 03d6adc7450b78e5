#include "kernels/rope/rope.h"

#include <cmath>

namespace loom::kernels {
namespace {

// Rotates the q and k heads of every row by sign * angle: (x_i, x_{i+HD/2})
// -> (x_i c - x_{i+HD/2} s, x_{i+HD/2} c + x_i s).
void Rotate(float* qkv, const int32_t* positions, const float* inv_freq, int T, int NH, int NKV,
            int HD, float sign) {
  const int half = HD / 2, rotated = NH + NKV;  // q heads, then k heads
  const int64_t ld = static_cast<int64_t>(NH + 2 * NKV) * HD;
  for (int t = 0; t < T; ++t) {
    float* row = qkv + t * ld;
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<double>(positions[t]) * inv_freq[i];
      const float c = static_cast<float>(std::cos(angle));
      const float s = sign * static_cast<float>(std::sin(angle));
      for (int h = 0; h < rotated; ++h) {
        float* x = row + h * HD + i;
        const float x0 = x[0], x1 = x[half];
        x[0] = x0 * c - x1 * s;
        x[half] = x1 * c + x0 * s;
      }
    }
  }
}

}  // namespace

void rope_inv_freq(float* inv_freq, int HD, float theta) {
  for (int i = 0; i < HD / 2; ++i) {
    inv_freq[i] = static_cast<float>(1.0 / std::pow(static_cast<double>(theta), 2.0 * i / HD));
  }
}

void rope_forward(float* qkv, const int32_t* positions, const float* inv_freq, int T, int NH,
                  int NKV, int HD) {
  Rotate(qkv, positions, inv_freq, T, NH, NKV, HD, 1.0f);
}

void rope_backward(float* dqkv, const int32_t* positions, const float* inv_freq, int T, int NH,
                   int NKV, int HD) {
  Rotate(dqkv, positions, inv_freq, T, NH, NKV, HD, -1.0f);
}

}  // namespace loom::kernels
