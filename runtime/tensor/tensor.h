// Tensors: a typed, shaped view of memory owned by a Backend.
//
// A Tensor is cheap to copy: copies share the same storage (like a
// shared_ptr). Storage is freed through the backend that allocated it when the
// last tensor using it goes away. A tensor may also view memory it does not
// own (an Arena's, or a caller's buffer): then the owner keeps it alive.
//
// Shapes are row-major and contiguous; the shape comment convention of the
// kernels, e.g. `// (B, T, C)`, reads the same way.
//
// Thread-safety: a Tensor's metadata is immutable after construction except by
// assignment; concurrent reads are safe, concurrent writes to the same data
// are the caller's business.
#ifndef LOOM_RUNTIME_TENSOR_TENSOR_H_
#define LOOM_RUNTIME_TENSOR_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "runtime/base/log.h"

namespace loom {

enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kI32 = 2 };

size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);

enum class DeviceType : uint8_t { kCpu = 0, kCuda = 1 };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  std::string ToString() const;  // "cpu", "cuda:0"
};

using Shape = std::vector<int64_t>;

int64_t NumElements(const Shape& shape);
std::string ShapeString(const Shape& shape);  // "(2, 3, 4)"

class Backend;

// Memory allocated by a backend; frees itself through it.
class Storage {
 public:
  Storage(Backend* backend, size_t bytes);  // allocates
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Backend* backend() const { return backend_; }

 private:
  Backend* backend_;
  void* data_;
  size_t bytes_;
};

class Tensor {
 public:
  Tensor() = default;

  // New storage from `backend` (not owned; must outlive the tensor),
  // uninitialised.
  static Tensor Empty(const Shape& shape, DType dtype, Backend* backend);
  // New storage from `backend`, zero-filled.
  static Tensor Zeros(const Shape& shape, DType dtype, Backend* backend);
  // A view of memory the caller owns and keeps alive.
  static Tensor View(void* data, const Shape& shape, DType dtype, Device device);

  bool defined() const { return data_ != nullptr || NumElements(shape_) == 0; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const { return NumElements(shape_); }
  size_t bytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  void* raw() const { return data_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }
  // Typed CPU access that checks the dtype (float for kF32, int32_t for kI32).
  float* f32() const;
  int32_t* i32() const;

  // The same storage under another shape with as many elements.
  Tensor Reshape(const Shape& shape) const;
  // Rows [begin, end) of dimension 0, sharing storage.
  Tensor Slice0(int64_t begin, int64_t end) const;

 private:
  std::shared_ptr<Storage> storage_;  // null for views
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::kF32;
  Device device_;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_TENSOR_TENSOR_H_
