// Elementwise activations: GELU (the ViT's MLP, tanh approximation as in
// GPT-2 and llm.c) and SwiGLU (the LLM's MLP). Backward accumulates (+=).
#ifndef LOOM_KERNELS_ACTIVATION_ACTIVATION_H_
#define LOOM_KERNELS_ACTIVATION_ACTIVATION_H_

#include <cstdint>

namespace loom::kernels {

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x³)))
void gelu_forward(float* out, const float* inp, int64_t n);  // (n), (n)
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n);

// out = silu(gate) * up, silu(a) = a * sigmoid(a). gate, up, out: (n).
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
void swiglu_backward(float* dgate,  // (n) +=
                     float* dup,    // (n) +=
                     const float* gate, const float* up, const float* dout, int64_t n);

}  // namespace loom::kernels

#endif  // LOOM_KERNELS_ACTIVATION_ACTIVATION_H_
