// Rotary position embedding (RoPE), applied in place to the q and k heads of
// a packed qkv buffer, in Hugging Face's layout ("rotate half"): element i of
// a head pairs with element i + HD/2, so Llama and Qwen weights load as they
// are stored (Meta's original checkpoints pair (2i, 2i+1) instead; their HF
// conversion permutes the q and k rows). Pair i of a token at position p
// turns by p * inv_freq[i]; rope_inv_freq gives the plain frequencies
// theta^(-2i/HD), and a model's scaling (Llama 3's) adjusts them before.
// Positions come from the caller, so they restart at 0 for each packed
// sequence.
//
// Row layout (grouped-query attention): [q (NH, HD) | k (NKV, HD) | v (NKV, HD)].
//
// Backward turns the gradient of q and k back by the same angles (the
// rotation is orthogonal); the v part is left alone in both directions.
#ifndef LOOM_KERNELS_ROPE_ROPE_H_
#define LOOM_KERNELS_ROPE_ROPE_H_

#include <cstdint>

namespace loom::kernels {

inline constexpr float kRopeTheta = 10000.0f;

// inv_freq (HD/2) = theta^(-2i/HD), rounded to fp32 as Hugging Face holds it.
void rope_inv_freq(float* inv_freq, int HD, float theta);

void rope_forward(float* qkv,                // (T, (NH + 2 NKV) HD) in place, q and k
                  const int32_t* positions,  // (T)
                  const float* inv_freq,     // (HD/2)
                  int T, int NH, int NKV, int HD);

void rope_backward(float* dqkv,               // (T, (NH + 2 NKV) HD) in place, q and k
                   const int32_t* positions,  // (T)
                   const float* inv_freq,     // (HD/2)
                   int T, int NH, int NKV, int HD);

}  // namespace loom::kernels

#endif  // LOOM_KERNELS_ROPE_ROPE_H_
