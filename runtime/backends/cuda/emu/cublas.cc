// cuBLAS for the CUDA emulation (emu.h): the GEMMs Loom calls, computed by
// OpenBLAS (column-major, as cuBLAS) on the emulated device's memory, with
// cuBLAS's argument checks. A matrix that does not lie inside one device
// allocation is an execution failure, named on stderr.
#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "emu.h"
#include "stream.h"

struct cublasContext {
  int device = 0;
};

namespace {

using loom::cuda_emu::DeviceAccess;
using loom::cuda_emu::InDeviceMemory;

size_t ElementBytes(cudaDataType t) {
  switch (t) {
    case CUDA_R_32F:
      return 4;
    case CUDA_R_64F:
      return 8;
    default:
      return 2;
  }
}

// A column-major (rows, cols) matrix with leading dimension ld spans
// ld·(cols−1) + rows elements.
bool Inside(const void* p, int rows, int cols, int ld, size_t elem, const char* name) {
  if (rows == 0 || cols == 0) return true;
  const size_t n = static_cast<size_t>(ld) * (cols - 1) + rows;
  if (InDeviceMemory(p, n * elem)) return true;
  std::fprintf(stderr,
               "CUDA emulation: cuBLAS GEMM: matrix %s at %p (%d x %d, ld %d) is not inside one "
               "device allocation\n",
               name, p, rows, cols, ld);
  return false;
}

cublasStatus_t CheckGemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m,
                         int n, int k, const void* A, int lda, const void* B, int ldb, void* C,
                         int ldc, size_t a_elem, size_t b_elem, size_t c_elem) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const int a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
  const int b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
  if (lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (!Inside(C, m, n, ldc, c_elem, "C")) return CUBLAS_STATUS_EXECUTION_FAILED;
  if (m == 0 || n == 0 || k == 0) return CUBLAS_STATUS_SUCCESS;
  if (!Inside(A, a_rows, a_cols, lda, a_elem, "A") ||
      !Inside(B, b_rows, b_cols, ldb, b_elem, "B")) {
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

CBLAS_TRANSPOSE Op(cublasOperation_t t) { return t == CUBLAS_OP_N ? CblasNoTrans : CblasTrans; }

// C = alpha·op(A)·op(B) + beta·C in fp32 (k = 0: C = beta·C, as cuBLAS).
void Sgemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
           const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int j = 0; j < n; ++j) {
      for (int i = 0; i < m; ++i) {
        float& c = C[static_cast<size_t>(j) * ldc + i];
        c = beta == 0.0f ? 0.0f : beta * c;
      }
    }
    return;
  }
  cblas_sgemm(CblasColMajor, Op(ta), Op(tb), m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

// A bf16 matrix as fp32 (exact).
std::vector<float> Widen(const void* p, int rows, int cols, int ld) {
  const size_t n = static_cast<size_t>(ld) * (cols - 1) + rows;
  const __nv_bfloat16* h = static_cast<const __nv_bfloat16*>(p);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = __bfloat162float(h[i]);
  return out;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (loom::cuda_emu::Devices() == 0) return CUBLAS_STATUS_NOT_INITIALIZED;
  *handle = new cublasContext;
  (*handle)->device = loom::cuda_emu::CurrentDevice();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  return loom::cuda_emu::ValidStream(stream) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value) {
  if (value == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *value = type == MAJOR_VERSION ? CUBLAS_VER_MAJOR : 0;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const float* alpha,
                              const float* A, int lda, const float* B, int ldb, const float* beta,
                              float* C, int ldc) {
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const cublasStatus_t s =
      CheckGemm(handle, transa, transb, m, n, k, A, lda, B, ldb, C, ldc, 4, 4, 4);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  loom::cuda_emu::CountLaunch();
  DeviceAccess access(handle->device);
  Sgemm(transa, transb, m, n, k, *alpha, A, lda, B, ldb, *beta, C, ldc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t) {
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const bool supported = (Atype == CUDA_R_32F || Atype == CUDA_R_16BF) && Btype == Atype &&
                         Ctype == CUDA_R_32F && computeType == CUBLAS_COMPUTE_32F;
  if (!supported) return CUBLAS_STATUS_NOT_SUPPORTED;
  const cublasStatus_t s = CheckGemm(handle, transa, transb, m, n, k, A, lda, B, ldb, C, ldc,
                                     ElementBytes(Atype), ElementBytes(Btype), 4);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  loom::cuda_emu::CountLaunch();
  DeviceAccess access(handle->device);
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  if (Atype == CUDA_R_32F || m == 0 || n == 0 || k == 0) {
    Sgemm(transa, transb, m, n, k, a, static_cast<const float*>(A), lda,
          static_cast<const float*>(B), ldb, b, static_cast<float*>(C), ldc);
    return CUBLAS_STATUS_SUCCESS;
  }
  const std::vector<float> wa =
      Widen(A, transa == CUBLAS_OP_N ? m : k, transa == CUBLAS_OP_N ? k : m, lda);
  const std::vector<float> wb =
      Widen(B, transb == CUBLAS_OP_N ? k : n, transb == CUBLAS_OP_N ? n : k, ldb);
  Sgemm(transa, transb, m, n, k, a, wa.data(), lda, wb.data(), ldb, b, static_cast<float*>(C), ldc);
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
