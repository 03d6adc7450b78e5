// CUDA kernels for every op of the model, the same contracts as the CPU
// versions in kernels/<op>/ (shapes, accumulate-in-backward, masks), on
// device pointers, on the default stream. Built with --config=cuda; checked
// against the CPU references by kernels/cuda:ops_cuda_test where a GPU is
// visible (one op table, as ggml's test-backend-ops).
//
// Launch errors are checked (LOOM_CUDA_CHECK); the calls are asynchronous
// otherwise: synchronise before reading results on the host.
#ifndef LOOM_KERNELS_CUDA_OPS_H_
#define LOOM_KERNELS_CUDA_OPS_H_

#include <cstdint>

#include "kernels/activation/activation.h"

namespace loom::kernels::cuda {

// A cuBLAS handle for the calling thread (created on first use).
void* CublasHandle();

// Linear layer (kernels/matmul/matmul.h) with cuBLAS, fp32.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int M,
                    int K, int N);
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int M, int K, int N);

// bf16 inputs (raw uint16 bit patterns), fp32 accumulation and output, on
// tensor cores (sm_80+): out (M,N) = inp (M,K) · weight (N,K)ᵀ + bias (fp32,
// or null). Backward: dinp (M,K) += dout16 · weight, dweight (N,K) +=
// dout16ᵀ · inp16 (fp32 gradients, each may be null), dbias += the column
// sums of the fp32 `dout`. kernels/matmul/matmul.h's _bf16 contract with the
// operands already narrowed (CudaOps narrows them).
void matmul_forward_bf16(float* out, const uint16_t* inp, const uint16_t* weight, const float* bias,
                         int M, int K, int N);
void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout,
                          const uint16_t* dout16, const uint16_t* inp, const uint16_t* weight,
                          int M, int K, int N);
void f32_to_bf16(uint16_t* out, const float* in, int64_t n);  // round to nearest even
void bf16_to_f32(float* out, const uint16_t* in, int64_t n);
void round_to_bf16(float* x, int64_t n);  // in place, to the nearest bf16 value

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);
void rmsnorm_forward(float* out, float* rrms, const float* inp, const float* weight, int N, int C,
                     float eps);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rrms, int N, int C);

void gelu_forward(float* out, const float* inp, int64_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n);
void activation_forward(Activation act, float* out, const float* inp, int64_t n);
void activation_backward(Activation act, float* dinp, const float* inp, const float* dout,
                         int64_t n);
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
void swiglu_backward(float* dgate, float* dup, const float* gate, const float* up,
                     const float* dout, int64_t n);

// inv_freq (HD/2) on the device; rows [q (NH) | k (NKV) | v (NKV)] heads.
void rope_forward(float* qkv, const int32_t* positions, const float* inv_freq, int T, int NH,
                  int NKV, int HD);
void rope_backward(float* dqkv, const int32_t* positions, const float* inv_freq, int T, int NH,
                   int NKV, int HD);

void embedding_forward(float* out, const int32_t* tokens, const float* wte, int T, int C);
void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int T, int C);

// Packed varlen attention (kernels/attention/attention.h). cu_seqlens is on
// the device; S sequences, T = total rows; NKV key/value heads (GQA).
// Backward needs `scratch` of T·NH floats; it sums without atomics, so its
// results are the same bits on every run.
void attention_forward(float* out, float* att, const float* qkv, const int32_t* cu_seqlens, int S,
                       int T, int NH, int NKV, int HD, bool causal);
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, const int32_t* cu_seqlens, int S, int T, int NH, int NKV,
                        int HD, bool causal);

// Memory-efficient attention (kernels/attention/attention.h
// flash_attention_*, FlashAttention-2's algorithm): lse (T, NH); backward
// reads the forward's `out` and needs `scratch` of T·NH floats. Head
// dimension <= 128. No atomics: the same bits on every run. bf16 (the
// CPU kernel's bf16): its products on tensor cores (WMMA, bf16 in, fp32
// sums), blocks of 32 queries by 32 keys; else fp32 on the CUDA cores.
void flash_attention_forward(float* out, float* lse, const float* qkv, const int32_t* cu_seqlens,
                             int S, int T, int NH, int NKV, int HD, bool causal, bool bf16 = false);
void flash_attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                              const float* out, const float* lse, const int32_t* cu_seqlens, int S,
                              int T, int NH, int NKV, int HD, bool causal, bool bf16 = false);

// Fused masked cross-entropy: writes dlogits (null: the losses only) and
// per-row losses (0 where the target is < 0); the caller sums `losses` for
// the loss sum.
void crossentropy_forward_backward(float* dlogits, float* losses, const float* logits,
                                   const int32_t* targets, int T, int V, float grad_scale);

// The vocab-parallel cross-entropy's steps (runtime/model/ops.h): each
// row's max over the shard; the shard's Σ exp and target logit (double);
// the gradient from the group's sums (the loss sum is the host's, from the
// sums).
void crossentropy_shard_max(float* mx, const float* logits, int T, int V);
void crossentropy_shard_sums(double* sums, const float* logits, const float* mx,
                             const int32_t* targets, int T, int V, int vocab_start);
void crossentropy_shard_grad(float* dlogits, const float* logits, const float* mx,
                             const double* sums, const int32_t* targets, int T, int V,
                             int vocab_start, float grad_scale);

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step);

// The ViT's patches and position embeddings, the projector's pixel
// shuffle (kernels/embedding, kernels/pixel_shuffle).
void patchify(float* patches, const float* tiles, int N, int S, int P);
void add_position_forward(float* x, const float* pos, int N, int Np, int C);
void add_position_backward(float* dpos, const float* dx, int N, int Np, int C);
void pixel_shuffle_forward(float* out, const float* inp, int N, int G, int C);
void pixel_shuffle_backward(float* dinp, const float* dout, int N, int G, int C);
// A vocabulary shard's rows [vocab_start, vocab_start + v_shard): out (T, C)
// = each token's row in the shard, 0 elsewhere (runtime/model/ops.h).
void vocab_embedding_forward(float* out, const int32_t* tokens, const float* table, int T, int C,
                             int vocab_start, int v_shard);
// Its backward, deterministic: the tokens grouped into runs (on the host)
// of one table row each; run r adds dout rows order[offsets[r] ..
// offsets[r + 1]), summed in that order, to dtable row rows[r].
void embedding_backward_runs(float* dtable, const float* dout, const int32_t* rows,
                             const int32_t* offsets, const int32_t* order, int runs, int C);
// dst row rows[i] = src row i; dst row i += src row rows[i] (rows: n, on
// the device; rows of C floats).
void scatter_rows(float* dst, const float* src, const int32_t* rows, int n, int C);
void gather_add_rows(float* dst, const float* src, const int32_t* rows, int n, int C);
// x += y; out (M, N) += bias (N) on every row.
void add(float* x, const float* y, int64_t n);
void add_bias(float* out, const float* bias, int M, int N);

// Sum of squares of x, added to *out (device, fp32; zero it first), the
// same bits on every run: each block's partial sum goes to `partials`
// (kSumSquaresPartials floats of device scratch), which one block then adds
// in order.
inline constexpr int kSumSquaresPartials = 1024;
void sum_squares(float* out, float* partials, const float* x, int64_t n);
void scale(float* x, float factor, int64_t n);

}  // namespace loom::kernels::cuda

#endif  // LOOM_KERNELS_CUDA_OPS_H_
