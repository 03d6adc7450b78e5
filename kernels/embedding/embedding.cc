#include "kernels/embedding/embedding.h"

#include <cstring>

namespace loom::kernels {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, int T, int C) {
  for (int t = 0; t < T; ++t) {
    if (tokens[t] < 0) continue;
    std::memcpy(out + static_cast<int64_t>(t) * C, wte + static_cast<int64_t>(tokens[t]) * C,
                sizeof(float) * C);
  }
}

void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int T, int C) {
  for (int t = 0; t < T; ++t) {
    if (tokens[t] < 0) continue;
    float* d = dwte + static_cast<int64_t>(tokens[t]) * C;
    const float* g = dout + static_cast<int64_t>(t) * C;
    for (int c = 0; c < C; ++c) d[c] += g[c];
  }
}

void patchify(float* patches, const float* tiles, int N, int S, int P) {
  const int G = S / P;  // patches per side
  const int64_t row = 3LL * P * P;
  for (int n = 0; n < N; ++n) {
    const float* tile = tiles + static_cast<int64_t>(n) * 3 * S * S;
    for (int gy = 0; gy < G; ++gy) {
      for (int gx = 0; gx < G; ++gx) {
        float* out = patches + (static_cast<int64_t>(n) * G * G + gy * G + gx) * row;
        for (int c = 0; c < 3; ++c) {
          for (int y = 0; y < P; ++y) {
            const float* src = tile + (static_cast<int64_t>(c) * S + gy * P + y) * S + gx * P;
            std::memcpy(out + (c * P + y) * P, src, sizeof(float) * P);
          }
        }
      }
    }
  }
}

void add_position_forward(float* x, const float* pos, int N, int Np, int C) {
  for (int n = 0; n < N; ++n) {
    float* xn = x + static_cast<int64_t>(n) * Np * C;
    for (int64_t i = 0; i < static_cast<int64_t>(Np) * C; ++i) xn[i] += pos[i];
  }
}

void add_position_backward(float* dpos, const float* dx, int N, int Np, int C) {
  for (int n = 0; n < N; ++n) {
    const float* dn = dx + static_cast<int64_t>(n) * Np * C;
    for (int64_t i = 0; i < static_cast<int64_t>(Np) * C; ++i) dpos[i] += dn[i];
  }
}

}  // namespace loom::kernels
