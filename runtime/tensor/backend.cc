#include "runtime/tensor/backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace loom {

void* CpuBackend::Allocate(size_t bytes) {
  // aligned_alloc wants a multiple of the alignment; 0 still gets a pointer.
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  LOOM_CHECK(p != nullptr) << "out of host memory allocating " << bytes << " bytes";
  const std::thread::id owner = std::this_thread::get_id();
  std::lock_guard<std::mutex> l(mu_);
  blocks_[p] = Block{rounded, owner};
  in_use_ += rounded;
  peak_ = std::max(peak_, in_use_);
  Usage& u = threads_[owner];
  u.in_use += rounded;
  u.peak = std::max(u.peak, u.in_use);
  return p;
}

void CpuBackend::Free(void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = blocks_.find(ptr);
    if (it != blocks_.end()) {
      in_use_ -= it->second.bytes;
      auto owner = threads_.find(it->second.owner);
      if (owner != threads_.end()) {
        owner->second.in_use -= it->second.bytes;
        if (owner->second.in_use == 0) threads_.erase(owner);  // a thread's last block
      }
      blocks_.erase(it);
    }
  }
  std::free(ptr);
}

size_t CpuBackend::in_use_bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  return in_use_;
}

size_t CpuBackend::peak_bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  return peak_;
}

void CpuBackend::ResetPeak() {
  std::lock_guard<std::mutex> l(mu_);
  peak_ = in_use_;
}

size_t CpuBackend::thread_peak_bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = threads_.find(std::this_thread::get_id());
  return it == threads_.end() ? 0 : it->second.peak;
}

void CpuBackend::ResetThreadPeak() {
  std::lock_guard<std::mutex> l(mu_);
  auto it = threads_.find(std::this_thread::get_id());
  if (it != threads_.end()) it->second.peak = it->second.in_use;
}

void CpuBackend::CopyFromHost(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void CpuBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void CpuBackend::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}

void CpuBackend::Fill(void* dst, int byte, size_t bytes) {
  if (bytes) std::memset(dst, byte, bytes);
}

bool CpuBackend::SupportsOp(std::string_view op) const {
  // Every kernel in kernels/ has a CPU implementation.
  return !op.empty();
}

CpuBackend* CpuBackend::Get() {
  static CpuBackend* backend = new CpuBackend();
  return backend;
}

}  // namespace loom
