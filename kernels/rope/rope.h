// Rotary position embedding (RoPE), applied in place to the q and k parts of
// a packed qkv buffer. Pairs are interleaved, (2i, 2i+1), as in the original
// LLaMA; pair i of a token at position p turns by p * theta^(-2i/HD).
// Positions come from the caller, so they restart at 0 for each packed
// sequence.
//
// Backward turns the gradient of q and k back by the same angles (the
// rotation is orthogonal); the v part is left alone in both directions.
#ifndef LOOM_KERNELS_ROPE_ROPE_H_
#define LOOM_KERNELS_ROPE_ROPE_H_

#include <cstdint>

namespace loom::kernels {

inline constexpr float kRopeTheta = 10000.0f;

void rope_forward(float* qkv,                // (T, 3*C) in place, q and k parts
                  const int32_t* positions,  // (T)
                  int T, int NH, int HD, float theta);

void rope_backward(float* dqkv,               // (T, 3*C) in place, q and k parts
                   const int32_t* positions,  // (T)
                   int T, int NH, int HD, float theta);

}  // namespace loom::kernels

#endif  // LOOM_KERNELS_ROPE_ROPE_H_
