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
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>

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

  // Bytes handed out by Allocate and not yet freed, and the most at any
  // moment since the last ResetPeak(): what the memory model
  // (runtime/model/memory.h) predicts of a module's buffers, measured.
  // Zeros from a backend that does not count.
  virtual size_t in_use_bytes() const { return 0; }
  virtual size_t peak_bytes() const { return 0; }
  virtual void ResetPeak() {}

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
  size_t in_use_bytes() const override;
  size_t peak_bytes() const override;
  void ResetPeak() override;
  // The same counted for the calling thread alone (the blocks it
  // allocated, until freed), since its last ResetThreadPeak or since it
  // last held none: one rank's peak where a test runs a TP group's ranks
  // as threads.
  size_t thread_peak_bytes() const;
  void ResetThreadPeak();

  // The process-wide instance.
  static CpuBackend* Get();

 private:
  struct Block {
    size_t bytes;
    std::thread::id owner;
  };
  struct Usage {
    size_t in_use = 0, peak = 0;
  };
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> blocks_;  // each live block
  std::unordered_map<std::thread::id, Usage> threads_;
  size_t in_use_ = 0, peak_ = 0;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_TENSOR_BACKEND_H_
