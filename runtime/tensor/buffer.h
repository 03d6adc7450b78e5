// A growable array in one backend's memory: what a layer keeps its
// activations and scratch in, so that the same layer code holds them in host
// memory (CpuBackend) or on a GPU. Like a std::vector without element
// access on the host: resize() keeps no contents (the layers overwrite what
// they size), Zeros() fills with zeros, memory is reused while it fits.
//
// Thread-safety: none.
#ifndef LOOM_RUNTIME_TENSOR_BUFFER_H_
#define LOOM_RUNTIME_TENSOR_BUFFER_H_

#include <cstddef>
#include <utility>
#include <vector>

#include "runtime/tensor/backend.h"

namespace loom {

template <typename T>
class Buffer {
 public:
  Buffer() = default;
  // `backend` (not owned) must outlive the buffer.
  explicit Buffer(Backend* backend) : backend_(backend) {}
  ~Buffer() { Release(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      Release();
      backend_ = o.backend_;
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      capacity_ = std::exchange(o.capacity_, 0);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void set_backend(Backend* backend) {
    Release();
    backend_ = backend;
  }
  Backend* backend() const { return backend_; }

  // `n` elements, contents unspecified.
  void resize(size_t n) {
    if (n > capacity_) {
      Release();
      data_ = static_cast<T*>(backend_->Allocate(sizeof(T) * n));
      capacity_ = n;
    }
    size_ = n;
  }
  // `n` zeros.
  void Zeros(size_t n) {
    resize(n);
    backend_->Fill(data_, 0, sizeof(T) * n);
  }
  // A copy of `other` (on this buffer's backend), or of `n` host elements
  // at `host`.
  void CopyFrom(const Buffer& other) {
    resize(other.size_);
    backend_->Copy(data_, other.data_, sizeof(T) * other.size_);
  }
  void CopyFromHost(const T* host, size_t n) {
    resize(n);
    backend_->CopyFromHost(data_, host, sizeof(T) * n);
  }
  std::vector<T> ToHost() const {
    std::vector<T> out(size_);
    backend_->Synchronize();
    backend_->CopyToHost(out.data(), data_, sizeof(T) * size_);
    return out;
  }
  void swap(Buffer& o) noexcept {
    std::swap(backend_, o.backend_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(capacity_, o.capacity_);
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Frees the memory: size and capacity 0.
  void Release() {
    if (data_ != nullptr) backend_->Free(data_);
    data_ = nullptr;
    size_ = capacity_ = 0;
  }

 private:
  Backend* backend_ = nullptr;
  T* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_TENSOR_BUFFER_H_
