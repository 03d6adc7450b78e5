#include "runtime/backends/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>

#include "absl/strings/str_cat.h"

#ifdef LOOM_WITH_CUDA
#include "runtime/backends/cuda/cuda_check.h"
#endif

namespace loom {

#ifdef LOOM_WITH_CUDA
namespace {

// Device memory is kept for reuse, as PyTorch's caching allocator does: a
// freed block goes back to a pool by size, and an allocation takes the
// smallest cached block that fits and is at most twice its size, so that a
// training step after the first calls neither cudaMalloc nor cudaFree. When
// cudaMalloc runs out of memory, the cache is released and it is tried
// again. Sizes are rounded up (512 B; 2 MiB from 1 MiB on) to help reuse,
// except on the CUDA emulation, where every block keeps its exact size and is
// reused only for that size, so that AddressSanitizer still sees each
// buffer's end. Both what the buffers asked for and the blocks they hold are
// counted (CudaMemoryStats): on a GPU the blocks can hold up to twice it.
class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {}
  ~CudaBackend() override {
    ReleaseCache();
    // Blocks still in use belong to buffers that outlive the backend (a
    // bug of theirs); they are left to the process's end.
  }
  Device device() const override { return Device{DeviceType::kCuda, device_}; }
  const char* name() const override { return "cuda"; }
  void* Allocate(size_t bytes) override {
    const size_t n = Round(bytes);
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = cached_.lower_bound(n);
      if (it != cached_.end() && it->first <= MaxReuse(n)) {
        void* p = it->second;
        stats_.cached_bytes -= it->first;
        stats_.in_use_bytes += it->first;
        stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
        cached_.erase(it);
        Requested(p, bytes);
        return p;
      }
    }
    LOOM_CUDA_CHECK(cudaSetDevice(device_));
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, n);  // 256-byte aligned
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      ReleaseCache();
      e = cudaMalloc(&p, n);
    }
    LOOM_CUDA_CHECK(e);
    std::lock_guard<std::mutex> l(mu_);
    sizes_[p] = n;
    stats_.in_use_bytes += n;
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
    ++stats_.device_allocations;
    Requested(p, bytes);
    return p;
  }
  void Free(void* ptr) override {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> l(mu_);
    auto it = sizes_.find(ptr);
    if (it == sizes_.end()) {
      std::fprintf(stderr, "CudaBackend::Free(%p): not a block of this backend\n", ptr);
      std::abort();
    }
    cached_.emplace(it->second, ptr);
    stats_.in_use_bytes -= it->second;
    stats_.cached_bytes += it->second;
    auto r = requested_.find(ptr);
    stats_.requested_bytes -= r->second;
    requested_.erase(r);
  }
  size_t in_use_bytes() const override { return stats().requested_bytes; }
  size_t peak_bytes() const override { return stats().peak_requested_bytes; }
  void ResetPeak() override {
    std::lock_guard<std::mutex> l(mu_);
    stats_.peak_in_use_bytes = stats_.in_use_bytes;
    stats_.peak_requested_bytes = stats_.requested_bytes;
  }
  CudaMemoryStats stats() const {
    std::lock_guard<std::mutex> l(mu_);
    return stats_;
  }
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
#ifdef LOOM_CUDA_EMU
  static size_t Round(size_t bytes) { return bytes == 0 ? kAlignment : bytes; }
  static size_t MaxReuse(size_t n) { return n; }
#else
  static size_t Round(size_t bytes) {
    const size_t unit = bytes < (size_t{1} << 20) ? 512 : size_t{2} << 20;
    return bytes == 0 ? unit : (bytes + unit - 1) / unit * unit;
  }
  static size_t MaxReuse(size_t n) { return 2 * n; }
#endif

  // Under mu_: block p now holds a buffer of `bytes`.
  void Requested(void* p, size_t bytes) {
    requested_[p] = bytes;
    stats_.requested_bytes += bytes;
    stats_.peak_requested_bytes = std::max(stats_.peak_requested_bytes, stats_.requested_bytes);
  }
  // Gives every cached block back to the device.
  void ReleaseCache() {
    std::lock_guard<std::mutex> l(mu_);
    if (cached_.empty()) return;
    LOOM_CUDA_CHECK(cudaSetDevice(device_));
    for (const auto& [size, p] : cached_) {
      LOOM_CUDA_CHECK(cudaFree(p));
      sizes_.erase(p);
      ++stats_.device_frees;
    }
    cached_.clear();
    stats_.cached_bytes = 0;
  }

  int device_;
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;      // every block from cudaMalloc
  std::multimap<size_t, void*> cached_;          // freed blocks by size
  std::unordered_map<void*, size_t> requested_;  // what each live block was asked for
  CudaMemoryStats stats_;
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

CudaMemoryStats GetCudaMemoryStats(const Backend* backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(backend);
  return cuda == nullptr ? CudaMemoryStats{} : cuda->stats();
}

#else

CudaMemoryStats GetCudaMemoryStats(const Backend*) { return {}; }

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int) {
  return absl::UnimplementedError("built without CUDA (build with --config=cuda)");
}

#endif  // LOOM_WITH_CUDA

}  // namespace loom
