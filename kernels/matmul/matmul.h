// Matrix multiply with bias, the linear layer of every block (llm.c layout:
// weights are stored (out_features, in_features)).
//
//   out = inp · weightᵀ + bias
//
// Forward writes `out`; backward accumulates (+=) into dinp, dweight and
// dbias, so gradients from several microbatches sum in place. `bias` and
// `dbias` may be null; `dinp` may be null when the input needs no gradient,
// `dweight` (and then `dbias`) when the weight does not train (a frozen
// module: the backward is then one GEMM, not two).
//
// The _reference versions are plain loops: the specification the fast
// versions (OpenBLAS sgemm) and the CUDA kernels are tested against.
#ifndef LOOM_KERNELS_MATMUL_MATMUL_H_
#define LOOM_KERNELS_MATMUL_MATMUL_H_

#include <cstdint>

namespace loom::kernels {

void matmul_forward_reference(float* out,           // (M, N)
                              const float* inp,     // (M, K)
                              const float* weight,  // (N, K)
                              const float* bias,    // (N) or null
                              int M, int K, int N);

void matmul_backward_reference(float* dinp,          // (M, K) or null, +=
                               float* dweight,       // (N, K), +=
                               float* dbias,         // (N) or null, +=
                               const float* dout,    // (M, N)
                               const float* inp,     // (M, K)
                               const float* weight,  // (N, K)
                               int M, int K, int N);

// OpenBLAS (cblas_sgemm); same contract as the reference.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int M,
                    int K, int N);
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int M, int K, int N);

// bf16 mixed precision's linear layer (runtime/model/precision.h): the
// weight is bf16 (raw bits, kernels/matmul/bf16.h), `inp` and `dout` are
// rounded to bf16 here, their products are summed in fp32, and out, dinp,
// dweight and dbias are fp32 (dweight, dbias += into fp32 gradients; dbias
// from the unrounded dout). On the CPU the operands are widened to fp32
// (exact: a bf16 product fits fp32's mantissa) and go through sgemm, so
// this equals the fp32 kernel on the rounded operands; CUDA runs the same
// contract on tensor cores (kernels/cuda/linear.cu).
void matmul_forward_bf16(float* out, const float* inp, const uint16_t* weight, const float* bias,
                         int M, int K, int N);
void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const uint16_t* weight, int M, int K, int N);

}  // namespace loom::kernels

#endif  // LOOM_KERNELS_MATMUL_MATMUL_H_
