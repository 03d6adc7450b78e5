#include "runtime/backends/cuda/cuda_backend.h"

#include "absl/strings/str_cat.h"

#ifdef LOOM_WITH_CUDA
#include "runtime/backends/cuda/cuda_check.h"
#endif

namespace loom {

#ifdef LOOM_WITH_CUDA
namespace {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {}
  Device device() const override { return Device{DeviceType::kCuda, device_}; }
  const char* name() const override { return "cuda"; }
  void* Allocate(size_t bytes) override {
    LOOM_CUDA_CHECK(cudaSetDevice(device_));
    void* p = nullptr;
    LOOM_CUDA_CHECK(cudaMalloc(&p, bytes == 0 ? kAlignment : bytes));  // 256-byte aligned
    return p;
  }
  void Free(void* ptr) override { LOOM_CUDA_CHECK(cudaFree(ptr)); }
  void CopyFromHost(void* dst, const void* src, size_t bytes) override {
    LOOM_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    LOOM_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }
  void Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) LOOM_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
  }
  void Fill(void* dst, int byte, size_t bytes) override {
    LOOM_CUDA_CHECK(cudaMemset(dst, byte, bytes));
  }
  void Synchronize() override { LOOM_CUDA_CHECK(cudaDeviceSynchronize()); }
  bool SupportsOp(std::string_view op) const override {
    // The ops of kernels/cuda/ops.h.
    for (std::string_view k : {"matmul", "layernorm", "rmsnorm", "gelu", "swiglu", "rope",
                               "embedding", "attention", "crossentropy", "adamw"}) {
      if (op == k) return true;
    }
    return false;
  }

 private:
  int device_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  if (device < 0 || device >= n) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device, " not visible (", n, " devices)"));
  }
  return std::unique_ptr<Backend>(new CudaBackend(device));
}

#else

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int) {
  return absl::UnimplementedError("built without CUDA (build with --config=cuda)");
}

#endif  // LOOM_WITH_CUDA

}  // namespace loom
