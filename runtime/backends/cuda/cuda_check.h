// Check macros for CUDA, cuBLAS and NCCL calls: a failure is a programming or
// environment error, reported with the call, file and line, then abort.
#ifndef LOOM_RUNTIME_BACKENDS_CUDA_CUDA_CHECK_H_
#define LOOM_RUNTIME_BACKENDS_CUDA_CUDA_CHECK_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>

#define LOOM_CUDA_CHECK(call)                                                   \
  do {                                                                          \
    cudaError_t _e = (call);                                                    \
    if (_e != cudaSuccess) {                                                    \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(_e));                                     \
      std::abort();                                                             \
    }                                                                           \
  } while (0)

#define LOOM_CUBLAS_CHECK(call)                                                               \
  do {                                                                                        \
    cublasStatus_t _s = (call);                                                               \
    if (_s != CUBLAS_STATUS_SUCCESS) {                                                        \
      std::fprintf(stderr, "%s:%d: %s failed: cuBLAS status %d\n", __FILE__, __LINE__, #call, \
                   static_cast<int>(_s));                                                     \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)

#define LOOM_NCCL_CHECK(call)                                                   \
  do {                                                                          \
    ncclResult_t _r = (call);                                                   \
    if (_r != ncclSuccess) {                                                    \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
                   ncclGetErrorString(_r));                                     \
      std::abort();                                                             \
    }                                                                           \
  } while (0)

#endif  // LOOM_RUNTIME_BACKENDS_CUDA_CUDA_CHECK_H_
