// Multi-head attention over packed variable-length sequences.
//
// A microbatch packs S sequences into T rows; cu_seqlens (S+1 entries,
// cu_seqlens[0] = 0, cu_seqlens[S] = T) marks where each starts. Attention is
// block-diagonal: a row attends only within its own sequence (full in the
// ViT, where a sequence is one tile; causal in the LLM, where it is one
// sample). Nothing is computed across sequences or on padding: there is none.
//
//   qkv  (T, (NH + 2 NKV) HD): per row [q (NH, HD) | k (NKV, HD) | v (NKV, HD)];
//        grouped-query attention: query head h reads key/value head
//        h / (NH / NKV) (NKV = NH: multi-head attention); NKV divides NH
//   out  (T, C), C = NH * HD
//   att  the softmax probabilities, saved for backward: for each sequence s
//        of length L, (NH, L, L) floats, sequences one after another;
//        attention_att_size() gives the total.
//
// Scale 1/sqrt(HD). Backward accumulates (+=) into dqkv.
// The _reference versions are loops; the others use OpenBLAS per (sequence,
// head) with strided views of qkv, no copies.
#ifndef LOOM_KERNELS_ATTENTION_ATTENTION_H_
#define LOOM_KERNELS_ATTENTION_ATTENTION_H_

#include <cstdint>

namespace loom::kernels {

// Floats needed for `att`: sum over sequences of NH * L².
int64_t attention_att_size(const int32_t* cu_seqlens, int S, int NH);

void attention_forward_reference(float* out, float* att, const float* qkv,
                                 const int32_t* cu_seqlens, int S, int NH, int NKV, int HD,
                                 bool causal);
void attention_backward_reference(float* dqkv, const float* dout, const float* qkv,
                                  const float* att, const int32_t* cu_seqlens, int S, int NH,
                                  int NKV, int HD, bool causal);

void attention_forward(float* out, float* att, const float* qkv, const int32_t* cu_seqlens, int S,
                       int NH, int NKV, int HD, bool causal);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        const int32_t* cu_seqlens, int S, int NH, int NKV, int HD, bool causal);

// Memory-efficient attention (FlashAttention-2's algorithm on the CPU; the
// CUDA kernels are checked against it): the same function as above, but no
// L x L probabilities are kept. The forward runs over blocks of
// kFlashBlock keys with an online softmax and keeps each row's log-sum-exp,
// lse (T, NH) floats (row t, head h at t * NH + h; natural log of the sum of
// exp(scale q·k) over the keys the row sees). The backward recomputes the
// probabilities block by block from qkv and lse, and needs the forward's
// `out` for D = rowsum(dout ⊙ out). Memory beyond its arguments: O(block²)
// per call. Deterministic: every sum in a fixed order.
//
// bf16: the function FlashAttention-2 computes on tensor cores under bf16
// mixed precision (runtime/model/precision.h), which the CUDA kernel's bf16
// path computes too: qkv holds bf16 values already (the caller rounds it),
// the probabilities P are rounded to bf16 before P·V and Pᵀ·dO, dout before
// dO·Vᵀ, Pᵀ·dO and D = rowsum(dO ⊙ O), and dS before dS·K and dSᵀ·Q; every
// product is summed in fp32, and the softmax's max, sum and log-sum-exp,
// and D, stay fp32.
inline constexpr int kFlashBlock = 64;

void flash_attention_forward(float* out, float* lse, const float* qkv, const int32_t* cu_seqlens,
                             int S, int NH, int NKV, int HD, bool causal, bool bf16 = false);
void flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, const int32_t* cu_seqlens, int S, int NH, int NKV,
                              int HD, bool causal, bool bf16 = false);

}  // namespace loom::kernels

#endif  // LOOM_KERNELS_ATTENTION_ATTENTION_H_
