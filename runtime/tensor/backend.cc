#include "runtime/tensor/backend.h"

#include <cstdlib>
#include <cstring>

namespace loom {

void* CpuBackend::Allocate(size_t bytes) {
  // aligned_alloc wants a multiple of the alignment; 0 still gets a pointer.
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  LOOM_CHECK(p != nullptr) << "out of host memory allocating " << bytes << " bytes";
  return p;
}

void CpuBackend::Free(void* ptr) { std::free(ptr); }

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
