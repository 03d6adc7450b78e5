// Elementwise activations: GELU (the ViT's MLP, tanh approximation as in
// GPT-2 and llm.c; exact and CLIP's quick GELU below) and SwiGLU (the LLM's MLP). Backward
// accumulates (+=).
#ifndef LOOM_KERNELS_ACTIVATION_ACTIVATION_H_
#define LOOM_KERNELS_ACTIVATION_ACTIVATION_H_

#include <cstdint>

namespace loom::kernels {

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x³)))
void gelu_forward(float* out, const float* inp, int64_t n);  // (n), (n)
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n);

// The MLP activations of the vision families and the projector, by
// config.json's `hidden_act` / `projector_hidden_act`:
//   kGeluTanh   gelu_forward above        "gelu_pytorch_tanh" (SigLIP; Loom's ViT)
//   kGeluErf    0.5 x (1 + erf(x / √2))    "gelu" (LLaVA's projector)
//   kQuickGelu  x sigmoid(1.702 x)         "quick_gelu" (OpenAI CLIP)
enum class Activation : uint8_t { kGeluTanh, kGeluErf, kQuickGelu };
void activation_forward(Activation act, float* out, const float* inp, int64_t n);
void activation_backward(Activation act, float* dinp, const float* inp, const float* dout,
                         int64_t n);

// out = silu(gate) * up, silu(a) = a * sigmoid(a). gate, up, out: (n).
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
void swiglu_backward(float* dgate,  // (n) +=
                     float* dup,    // (n) +=
                     const float* gate, const float* up, const float* dout, int64_t n);

}  // namespace loom::kernels

#endif  // LOOM_KERNELS_ACTIVATION_ACTIVATION_H_
