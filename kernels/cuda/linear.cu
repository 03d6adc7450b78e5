// Linear layers on cuBLAS (fp32 and bf16 with fp32 accumulation).
//
// cuBLAS is column-major; a row-major (R, C) matrix is a column-major (C, R)
// one. So out (M,N) = inp (M,K) · Wᵀ becomes, column-major,
// outᵀ (N,M) = W' (N,K) · inp' (K,M), with W' = op_T of W stored (K,N).
#include <cuda_bf16.h>

#include "kernels/cuda/common.h"
#include "kernels/cuda/ops.h"

namespace loom::kernels::cuda {
namespace {

__global__ void BroadcastRows(float* out, const float* bias, int M, int N) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < static_cast<int64_t>(M) * N) out[i] = bias[i % N];
}

// dbias[n] += sum_m dout[m, n]; one thread per column.
__global__ void ColumnSums(float* dbias, const float* dout, int M, int N) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  float s = 0;
  for (int m = 0; m < M; ++m) s += dout[static_cast<int64_t>(m) * N + n];
  dbias[n] += s;
}

__global__ void ToBf16(__nv_bfloat16* out, const float* in, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void FromBf16(float* out, const __nv_bfloat16* in, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __bfloat162float(in[i]);
}

__global__ void RoundBf16(float* x, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = __bfloat162float(__float2bfloat16_rn(x[i]));
}

cublasHandle_t Handle() { return static_cast<cublasHandle_t>(CublasHandle()); }

// out's rows = bias, for a GEMM to add to (its beta: 1); without one
// nothing (beta 0).
float BiasInto(float* out, const float* bias, int M, int N) {
  if (bias == nullptr) return 0.0f;
  LOOM_LAUNCH(BroadcastRows, Blocks(static_cast<int64_t>(M) * N), kThreads, out, bias, M, N);
  LOOM_CUDA_CHECK(cudaGetLastError());
  return 1.0f;
}

}  // namespace

void* CublasHandle() {
  // Destroyed when its thread ends (a worker's training thread is replaced at
  // every recovery: each would leak a handle).
  struct Handle {
    Handle() { LOOM_CUBLAS_CHECK(cublasCreate(&h)); }
    ~Handle() { (void)cublasDestroy(h); }
    cublasHandle_t h = nullptr;
  };
  thread_local Handle handle;
  return handle.h;
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int M,
                    int K, int N) {
  const float beta = BiasInto(out, bias, M, N), alpha = 1.0f;
  LOOM_CUBLAS_CHECK(cublasSgemm(Handle(), CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, weight, K, inp,
                                K, &beta, out, N));
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int M, int K, int N) {
  const float one = 1.0f;
  if (dinp != nullptr) {  // dinpᵀ (K,M) += W' (K,N) · doutᵀ (N,M)
    LOOM_CUBLAS_CHECK(cublasSgemm(Handle(), CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, &one, weight, K,
                                  dout, N, &one, dinp, K));
  }
  if (dweight != nullptr) {  // null: frozen (LLaVA's stage 1)
    // dWᵀ (K,N) += inpᵀ (K,M) · dout (M,N)
    LOOM_CUBLAS_CHECK(cublasSgemm(Handle(), CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, &one, inp, K, dout,
                                  N, &one, dweight, K));
  }
  if (dbias != nullptr) {
    LOOM_LAUNCH(ColumnSums, Blocks(N), kThreads, dbias, dout, M, N);
    LOOM_CUDA_CHECK(cudaGetLastError());
  }
}

void matmul_forward_bf16(float* out, const uint16_t* inp, const uint16_t* weight, const float* bias,
                         int M, int K, int N) {
  const float beta = BiasInto(out, bias, M, N), alpha = 1.0f;
  LOOM_CUBLAS_CHECK(cublasGemmEx(Handle(), CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, weight,
                                 CUDA_R_16BF, K, inp, CUDA_R_16BF, K, &beta, out, CUDA_R_32F, N,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout,
                          const uint16_t* dout16, const uint16_t* inp, const uint16_t* weight,
                          int M, int K, int N) {
  const float one = 1.0f;
  if (dinp != nullptr) {  // dinpᵀ (K,M) += W' (K,N) · doutᵀ (N,M)
    LOOM_CUBLAS_CHECK(cublasGemmEx(Handle(), CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, &one, weight,
                                   CUDA_R_16BF, K, dout16, CUDA_R_16BF, N, &one, dinp, CUDA_R_32F,
                                   K, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  if (dweight != nullptr) {  // dWᵀ (K,N) += inpᵀ (K,M) · dout (M,N)
    LOOM_CUBLAS_CHECK(cublasGemmEx(Handle(), CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, &one, inp,
                                   CUDA_R_16BF, K, dout16, CUDA_R_16BF, N, &one, dweight,
                                   CUDA_R_32F, K, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  if (dbias != nullptr) {
    LOOM_LAUNCH(ColumnSums, Blocks(N), kThreads, dbias, dout, M, N);
    LOOM_CUDA_CHECK(cudaGetLastError());
  }
}

void f32_to_bf16(uint16_t* out, const float* in, int64_t n) {
  if (n <= 0) return;
  LOOM_LAUNCH(ToBf16, Blocks(n), kThreads, reinterpret_cast<__nv_bfloat16*>(out), in, n);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void bf16_to_f32(float* out, const uint16_t* in, int64_t n) {
  if (n <= 0) return;
  LOOM_LAUNCH(FromBf16, Blocks(n), kThreads, out, reinterpret_cast<const __nv_bfloat16*>(in), n);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void round_to_bf16(float* x, int64_t n) {
  if (n <= 0) return;
  LOOM_LAUNCH(RoundBf16, Blocks(n), kThreads, x, n);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace loom::kernels::cuda
