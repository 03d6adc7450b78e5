// Token embedding (the LLM's input), and the ViT's patch embedding pieces:
// patchify (tiles to patch rows, then a matmul) and learned positions.
#ifndef LOOM_KERNELS_EMBEDDING_EMBEDDING_H_
#define LOOM_KERNELS_EMBEDDING_EMBEDDING_H_

#include <cstdint>

namespace loom::kernels {

// out[t] = wte[tokens[t]]. A negative token leaves out[t] untouched: those
// rows are filled by someone else (image embeddings at <image> positions).
void embedding_forward(float* out,             // (T, C)
                       const int32_t* tokens,  // (T)
                       const float* wte,       // (V, C)
                       int T, int C);
// dwte[tokens[t]] += dout[t] for tokens >= 0.
void embedding_backward(float* dwte,            // (V, C) +=
                        const float* dout,      // (T, C)
                        const int32_t* tokens,  // (T)
                        int T, int C);

// Cuts N tiles into non-overlapping P×P patches, one row per patch, patches
// in row-major grid order, each row ordered (channel, y, x): the layout of a
// Conv2d(3, D, kernel=P, stride=P) weight flattened to (D, 3*P*P).
void patchify(float* patches,      // (N * (S/P)², 3*P*P)
              const float* tiles,  // (N, 3, S, S)
              int N, int S, int P);

// x[n, p] += pos[p] for every tile n of N, patch p of Np.
void add_position_forward(float* x,          // (N, Np, C) in place
                          const float* pos,  // (Np, C)
                          int N, int Np, int C);
// dpos[p] += sum over n of dx[n, p].
void add_position_backward(float* dpos,      // (Np, C) +=
                           const float* dx,  // (N, Np, C)
                           int N, int Np, int C);

}  // namespace loom::kernels

#endif  // LOOM_KERNELS_EMBEDDING_EMBEDDING_H_
