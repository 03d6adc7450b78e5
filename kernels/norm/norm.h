// LayerNorm (the ViT's pre-LN blocks) and RMSNorm (the LLM's), over the last
// dimension C of N rows.
//
// Forward also saves what backward needs: LayerNorm the per-row mean and
// reciprocal standard deviation, RMSNorm the per-row reciprocal RMS.
// Backward accumulates (+=) into dinp, dweight and dbias; dweight and dbias
// may be null (a frozen module's norms: no weight gradients).
#ifndef LOOM_KERNELS_NORM_NORM_H_
#define LOOM_KERNELS_NORM_NORM_H_

namespace loom::kernels {

// The eps of Loom's own configs; a Hugging Face model brings its own
// (layer_norm_eps, rms_norm_eps).
inline constexpr float kLayerNormEps = 1e-5f;
inline constexpr float kRmsNormEps = 1e-6f;

// out = (inp - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps)
void layernorm_forward(float* out,           // (N, C)
                       float* mean,          // (N) saved for backward
                       float* rstd,          // (N) saved for backward
                       const float* inp,     // (N, C)
                       const float* weight,  // (C)
                       const float* bias,    // (C)
                       int N, int C, float eps);

void layernorm_backward(float* dinp,          // (N, C) +=
                        float* dweight,       // (C) +=
                        float* dbias,         // (C) +=
                        const float* dout,    // (N, C)
                        const float* inp,     // (N, C)
                        const float* weight,  // (C)
                        const float* mean,    // (N)
                        const float* rstd,    // (N)
                        int N, int C);

// out = inp * rrms * weight, rrms = 1 / sqrt(mean(inp²) + eps)
void rmsnorm_forward(float* out,           // (N, C)
                     float* rrms,          // (N) saved for backward
                     const float* inp,     // (N, C)
                     const float* weight,  // (C)
                     int N, int C, float eps);

void rmsnorm_backward(float* dinp,          // (N, C) +=
                      float* dweight,       // (C) +=
                      const float* dout,    // (N, C)
                      const float* inp,     // (N, C)
                      const float* weight,  // (C)
                      const float* rrms,    // (N)
                      int N, int C);

}  // namespace loom::kernels

#endif  // LOOM_KERNELS_NORM_NORM_H_
