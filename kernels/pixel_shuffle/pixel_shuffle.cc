#include "kernels/pixel_shuffle/pixel_shuffle.h"

#include <cstdint>

namespace loom::kernels {
namespace {

// Offset of in[n, y, x, 0] and of the matching channel block in out.
inline int64_t InOffset(int n, int y, int x, int G, int C) {
  return ((static_cast<int64_t>(n) * G + y) * G + x) * C;
}
inline int64_t OutOffset(int n, int y, int x, int G, int C) {
  const int H = G / 2;
  return ((static_cast<int64_t>(n) * H + y / 2) * H + x / 2) * 4 * C + ((y % 2) * 2 + x % 2) * C;
}

}  // namespace

void pixel_shuffle_forward(float* out, const float* inp, int N, int G, int C) {
  for (int n = 0; n < N; ++n)
    for (int y = 0; y < G; ++y)
      for (int x = 0; x < G; ++x) {
        const float* s = inp + InOffset(n, y, x, G, C);
        float* d = out + OutOffset(n, y, x, G, C);
        for (int c = 0; c < C; ++c) d[c] = s[c];
      }
}

void pixel_shuffle_backward(float* dinp, const float* dout, int N, int G, int C) {
  for (int n = 0; n < N; ++n)
    for (int y = 0; y < G; ++y)
      for (int x = 0; x < G; ++x) {
        float* d = dinp + InOffset(n, y, x, G, C);
        const float* s = dout + OutOffset(n, y, x, G, C);
        for (int c = 0; c < C; ++c) d[c] += s[c];
      }
}

}  // namespace loom::kernels
