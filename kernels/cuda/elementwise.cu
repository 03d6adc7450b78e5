// Elementwise and scatter kernels: GELU, SwiGLU, RoPE, token embedding,
// AdamW, and the pieces of global-norm clipping.
#include <algorithm>

#include "kernels/cuda/common.h"
#include "kernels/cuda/ops.h"

namespace loom::kernels::cuda {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;  // 1 / sqrt(2 pi)
constexpr float kQuickGelu = 1.702f;

__global__ void GeluForward(float* out, const float* x, int64_t n) {
  LOOM_GRID_LOOP(i, n) {
    const float v = x[i];
    out[i] = 0.5f * v * (1.0f + tanhf(kGeluScale * (v + kGeluCubic * v * v * v)));
  }
}

__global__ void GeluBackward(float* dx, const float* x, const float* dout, int64_t n) {
  LOOM_GRID_LOOP(i, n) {
    const float v = x[i];
    const float t = tanhf(kGeluScale * (v + kGeluCubic * v * v * v));
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    dx[i] += dout[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}

template <Activation kAct>
__device__ float ActForward(float v) {
  if constexpr (kAct == Activation::kGeluTanh) {
    return 0.5f * v * (1.0f + tanhf(kGeluScale * (v + kGeluCubic * v * v * v)));
  } else if constexpr (kAct == Activation::kGeluErf) {
    return 0.5f * v * (1.0f + erff(v * kInvSqrt2));
  } else {
    return v / (1.0f + expf(-kQuickGelu * v));
  }
}

template <Activation kAct>
__device__ float ActGrad(float v) {
  if constexpr (kAct == Activation::kGeluTanh) {
    const float t = tanhf(kGeluScale * (v + kGeluCubic * v * v * v));
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
  } else if constexpr (kAct == Activation::kGeluErf) {
    return 0.5f * (1.0f + erff(v * kInvSqrt2)) + v * kInvSqrt2Pi * expf(-0.5f * v * v);
  } else {
    const float s = 1.0f / (1.0f + expf(-kQuickGelu * v));
    return s + kQuickGelu * v * s * (1.0f - s);
  }
}

template <Activation kAct>
__global__ void ActivationForward(float* out, const float* x, int64_t n) {
  LOOM_GRID_LOOP(i, n) out[i] = ActForward<kAct>(x[i]);
}

template <Activation kAct>
__global__ void ActivationBackward(float* dx, const float* x, const float* dout, int64_t n) {
  LOOM_GRID_LOOP(i, n) dx[i] += dout[i] * ActGrad<kAct>(x[i]);
}

__global__ void SwigluForward(float* out, const float* gate, const float* up, int64_t n) {
  LOOM_GRID_LOOP(i, n) {
    const float a = gate[i];
    out[i] = a / (1.0f + expf(-a)) * up[i];
  }
}

__global__ void SwigluBackward(float* dgate, float* dup, const float* gate, const float* up,
                               const float* dout, int64_t n) {
  LOOM_GRID_LOOP(i, n) {
    const float a = gate[i], s = 1.0f / (1.0f + expf(-a));
    dup[i] += dout[i] * a * s;
    dgate[i] += dout[i] * up[i] * s * (1.0f + a * (1.0f - s));
  }
}

// One thread per (row, pair i, head, part q/k).
// One thread per (row, rotated head, pair): the NH q heads, then the NKV k
// heads; pair i is (i, i + HD/2), Hugging Face's rotate-half layout.
__global__ void Rope(float* qkv, const int32_t* pos, const float* inv_freq, int T, int NH, int NKV,
                     int HD, float sign) {
  const int half = HD / 2, heads = NH + NKV;
  const int64_t n = static_cast<int64_t>(T) * half * heads;
  LOOM_GRID_LOOP(idx, n) {
    int64_t r = idx;
    const int h = r % heads;
    r /= heads;
    const int i = r % half;
    const int t = static_cast<int>(r / half);
    double sd, cd;
    sincos(static_cast<double>(pos[t]) * inv_freq[i], &sd, &cd);
    const float c = static_cast<float>(cd), s = sign * static_cast<float>(sd);
    float* x = qkv + static_cast<int64_t>(t) * (NH + 2 * NKV) * HD + h * HD + i;
    const float x0 = x[0], x1 = x[half];
    x[0] = x0 * c - x1 * s;
    x[half] = x1 * c + x0 * s;
  }
}

__global__ void EmbeddingForward(float* out, const int32_t* tokens, const float* wte, int T,
                                 int C) {
  LOOM_GRID_LOOP(i, static_cast<int64_t>(T) * C) {
    const int t = static_cast<int>(i / C), c = static_cast<int>(i % C);
    if (tokens[t] >= 0) out[i] = wte[static_cast<int64_t>(tokens[t]) * C + c];
  }
}

__global__ void EmbeddingBackward(float* dwte, const float* dout, const int32_t* tokens, int T,
                                  int C) {
  LOOM_GRID_LOOP(i, static_cast<int64_t>(T) * C) {
    const int t = static_cast<int>(i / C), c = static_cast<int>(i % C);
    if (tokens[t] >= 0) atomicAdd(&dwte[static_cast<int64_t>(tokens[t]) * C + c], dout[i]);
  }
}

__global__ void AdamW(float* p, const float* g, float* m, float* v, int64_t n, float lr, float b1,
                      float b2, float eps, float decay, float bc1, float bc2) {
  LOOM_GRID_LOOP(i, n) {
    m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    p[i] = p[i] * decay - lr * (m[i] / bc1) / (sqrtf(v[i] / bc2) + eps);
  }
}

__global__ void SumSquares(float* partials, const float* x, int64_t n) {
  __shared__ float scratch[32];
  float s = 0;
  LOOM_GRID_LOOP(i, n) s += x[i] * x[i];
  s = BlockSum(s, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// One block of kSumSquaresPartials threads.
__global__ void AddPartials(float* out, const float* partials, int count) {
  __shared__ float scratch[32];
  const float s = BlockSum(threadIdx.x < count ? partials[threadIdx.x] : 0.0f, scratch);
  if (threadIdx.x == 0) *out += s;
}

__global__ void Scale(float* x, float f, int64_t n) { LOOM_GRID_LOOP(i, n) x[i] *= f; }

}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n) {
  LOOM_LAUNCH(GeluForward, GridFor(n), kThreads, out, inp, n);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  LOOM_LAUNCH(GeluBackward, GridFor(n), kThreads, dinp, inp, dout, n);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void activation_forward(Activation act, float* out, const float* inp, int64_t n) {
  switch (act) {
    case Activation::kGeluTanh:
      LOOM_LAUNCH(ActivationForward<Activation::kGeluTanh>, GridFor(n), kThreads, out, inp, n);
      break;
    case Activation::kGeluErf:
      LOOM_LAUNCH(ActivationForward<Activation::kGeluErf>, GridFor(n), kThreads, out, inp, n);
      break;
    case Activation::kQuickGelu:
      LOOM_LAUNCH(ActivationForward<Activation::kQuickGelu>, GridFor(n), kThreads, out, inp, n);
      break;
  }
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void activation_backward(Activation act, float* dinp, const float* inp, const float* dout,
                         int64_t n) {
  switch (act) {
    case Activation::kGeluTanh:
      LOOM_LAUNCH(ActivationBackward<Activation::kGeluTanh>, GridFor(n), kThreads, dinp, inp, dout,
                  n);
      break;
    case Activation::kGeluErf:
      LOOM_LAUNCH(ActivationBackward<Activation::kGeluErf>, GridFor(n), kThreads, dinp, inp, dout,
                  n);
      break;
    case Activation::kQuickGelu:
      LOOM_LAUNCH(ActivationBackward<Activation::kQuickGelu>, GridFor(n), kThreads, dinp, inp, dout,
                  n);
      break;
  }
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  LOOM_LAUNCH(SwigluForward, GridFor(n), kThreads, out, gate, up, n);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void swiglu_backward(float* dgate, float* dup, const float* gate, const float* up,
                     const float* dout, int64_t n) {
  LOOM_LAUNCH(SwigluBackward, GridFor(n), kThreads, dgate, dup, gate, up, dout, n);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void rope_forward(float* qkv, const int32_t* positions, const float* inv_freq, int T, int NH,
                  int NKV, int HD) {
  const int64_t n = static_cast<int64_t>(T) * (HD / 2) * (NH + NKV);
  LOOM_LAUNCH(Rope, GridFor(n), kThreads, qkv, positions, inv_freq, T, NH, NKV, HD, 1.0f);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void rope_backward(float* dqkv, const int32_t* positions, const float* inv_freq, int T, int NH,
                   int NKV, int HD) {
  const int64_t n = static_cast<int64_t>(T) * (HD / 2) * (NH + NKV);
  LOOM_LAUNCH(Rope, GridFor(n), kThreads, dqkv, positions, inv_freq, T, NH, NKV, HD, -1.0f);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void embedding_forward(float* out, const int32_t* tokens, const float* wte, int T, int C) {
  LOOM_LAUNCH(EmbeddingForward, GridFor(static_cast<int64_t>(T) * C), kThreads, out, tokens, wte, T,
              C);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int T, int C) {
  LOOM_LAUNCH(EmbeddingBackward, GridFor(static_cast<int64_t>(T) * C), kThreads, dwte, dout, tokens,
              T, C);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step) {
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), step));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), step));
  LOOM_LAUNCH(AdamW, GridFor(n), kThreads, param, grad, m, v, n, lr, beta1, beta2, eps,
              1.0f - lr * weight_decay, bc1, bc2);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void sum_squares(float* out, float* partials, const float* x, int64_t n) {
  const int blocks = std::min(GridFor(n), kSumSquaresPartials);
  LOOM_LAUNCH(SumSquares, blocks, kThreads, partials, x, n);
  LOOM_CUDA_CHECK(cudaGetLastError());
  LOOM_LAUNCH(AddPartials, 1, kSumSquaresPartials, out, partials, blocks);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void scale(float* x, float factor, int64_t n) {
  LOOM_LAUNCH(Scale, GridFor(n), kThreads, x, factor, n);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace loom::kernels::cuda
