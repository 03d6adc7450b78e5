// The backend interface: where tensors live and how bytes get there.
//
// Small on purpose (after ggml's backend interface): allocate, free, copy in
// and out, synchronise, and say which ops it runs. The CPU backend needs no
// hardware, so scheduling and services are testable anywhere; the CUDA
// backend arrives with the CUDA kernels.
//
// Thread-safety: implementations are safe to call from several threads.
#ifndef LOOM_RUNTIME_TENSOR_BACKEND_H_
#define LOOM_RUNTIME_TENSOR_BACKEND_H_

#include <cstddef>
#include <string_view>

#include "runtime/tensor/tensor.h"

namespace loom {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual const char* name() const = 0;

  // `bytes` of memory aligned to kAlignment; never null (out of memory is
  // fatal). Allocate(0) returns a unique non-null pointer.
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;

  // Copies between host memory and this backend's memory.
  virtual void CopyFromHost(void* dst, const void* src, size_t bytes) = 0;
  virtual void CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  virtual void Fill(void* dst, int byte, size_t bytes) = 0;
  // Between two places of this backend's memory.
  virtual void Copy(void* dst, const void* src, size_t bytes) = 0;

  // Optional: waits for queued work. Synchronous backends need not override.
  virtual void Synchronize() {}

  // Whether this backend runs `op` (a kernel name such as "matmul").
  virtual bool SupportsOp(std::string_view op) const = 0;

  static constexpr size_t kAlignment = 64;
};

// Host memory. Runs every CPU kernel.
class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device{DeviceType::kCpu, 0}; }
  const char* name() const override { return "cpu"; }
  void* Allocate(size_t bytes) override;
  void Free(void* ptr) override;
  void CopyFromHost(void* dst, const void* src, size_t bytes) override;
  void CopyToHost(void* dst, const void* src, size_t bytes) override;
  void Fill(void* dst, int byte, size_t bytes) override;
  void Copy(void* dst, const void* src, size_t bytes) override;
  bool SupportsOp(std::string_view op) const override;

  // The process-wide instance.
  static CpuBackend* Get();
};

}  // namespace loom

#endif  // LOOM_RUNTIME_TENSOR_BACKEND_H_
