// CUDA implementation of device.h, compiled by nvcc under --config=cuda.
#include <string>

#include "runtime/backends/cuda/cuda_check.h"
#include "runtime/backends/cuda/device.h"
#include "runtime/backends/cuda/launch.h"

namespace loom::cuda {
namespace {

__global__ void AxpyKernel(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

}  // namespace

bool CompiledWithCuda() { return true; }

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver/device" error
    return 0;
  }
  return n;
}

absl::StatusOr<std::string> LibraryVersions() {
  int rt = 0;
  LOOM_CUDA_CHECK(cudaRuntimeGetVersion(&rt));
  int major = 0, minor = 0, patch = 0;
  LOOM_CUBLAS_CHECK(cublasGetProperty(MAJOR_VERSION, &major));
  LOOM_CUBLAS_CHECK(cublasGetProperty(MINOR_VERSION, &minor));
  LOOM_CUBLAS_CHECK(cublasGetProperty(PATCH_LEVEL, &patch));
  int nccl = 0;
  LOOM_NCCL_CHECK(ncclGetVersion(&nccl));
#ifdef LOOM_CUDA_EMU
  return "the CUDA emulation (runtime/backends/cuda/emu): cudart API " + std::to_string(rt) +
         ", cuBLAS on OpenBLAS, NCCL between threads";
#endif
  return "cudart " + std::to_string(rt) + ", cuBLAS " + std::to_string(major) + "." +
         std::to_string(minor) + "." + std::to_string(patch) + ", NCCL " + std::to_string(nccl);
}

absl::Status Axpy(float a, const std::vector<float>& x, std::vector<float>* y) {
  if (x.size() != y->size()) return absl::InvalidArgumentError("Axpy: x and y differ in size");
  if (DeviceCount() == 0) return absl::FailedPreconditionError("Axpy: no CUDA device visible");
  const int n = static_cast<int>(x.size());
  float* dx = nullptr;
  float* dy = nullptr;
  LOOM_CUDA_CHECK(cudaMalloc(&dx, n * sizeof(float)));
  LOOM_CUDA_CHECK(cudaMalloc(&dy, n * sizeof(float)));
  LOOM_CUDA_CHECK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  LOOM_CUDA_CHECK(cudaMemcpy(dy, y->data(), n * sizeof(float), cudaMemcpyHostToDevice));
  LOOM_LAUNCH(AxpyKernel, (n + 255) / 256, 256, n, a, dx, dy);
  LOOM_CUDA_CHECK(cudaGetLastError());
  LOOM_CUDA_CHECK(cudaMemcpy(y->data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
  LOOM_CUDA_CHECK(cudaFree(dx));
  LOOM_CUDA_CHECK(cudaFree(dy));
  return absl::OkStatus();
}

}  // namespace loom::cuda
