#include "runtime/tensor/tensor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/tensor/backend.h"

namespace loom {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
  }
  return "?";
}

std::string Device::ToString() const {
  return type == DeviceType::kCpu ? "cpu" : absl::StrCat("cuda:", index);
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const Shape& shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

Storage::Storage(Backend* backend, size_t bytes)
    : backend_(backend), data_(backend->Allocate(bytes)), bytes_(bytes) {}

Storage::~Storage() { backend_->Free(data_); }

namespace {
void CheckShape(const Shape& shape) {
  for (int64_t d : shape) LOOM_CHECK(d >= 0) << "negative dimension in " << ShapeString(shape);
}
}  // namespace

Tensor Tensor::Empty(const Shape& shape, DType dtype, Backend* backend) {
  CheckShape(shape);
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = backend->device();
  t.storage_ = std::make_shared<Storage>(backend, t.bytes());
  t.data_ = t.storage_->data();
  return t;
}

Tensor Tensor::Zeros(const Shape& shape, DType dtype, Backend* backend) {
  Tensor t = Empty(shape, dtype, backend);
  backend->Fill(t.data_, 0, t.bytes());
  return t;
}

Tensor Tensor::View(void* data, const Shape& shape, DType dtype, Device device) {
  CheckShape(shape);
  Tensor t;
  t.data_ = data;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

int64_t Tensor::dim(int i) const {
  if (i < 0) i += rank();
  LOOM_CHECK(i >= 0 && i < rank()) << "dim " << i << " of " << ShapeString(shape_);
  return shape_[static_cast<size_t>(i)];
}

float* Tensor::f32() const {
  LOOM_CHECK(dtype_ == DType::kF32) << "f32() on a " << DTypeName(dtype_) << " tensor";
  return static_cast<float*>(data_);
}

int32_t* Tensor::i32() const {
  LOOM_CHECK(dtype_ == DType::kI32) << "i32() on a " << DTypeName(dtype_) << " tensor";
  return static_cast<int32_t*>(data_);
}

Tensor Tensor::Reshape(const Shape& shape) const {
  LOOM_CHECK(NumElements(shape) == numel())
      << "cannot reshape " << ShapeString(shape_) << " to " << ShapeString(shape);
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::Slice0(int64_t begin, int64_t end) const {
  LOOM_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0])
      << "Slice0(" << begin << ", " << end << ") of " << ShapeString(shape_);
  Tensor t = *this;
  t.shape_[0] = end - begin;
  const int64_t row = shape_[0] == 0 ? 0 : numel() / shape_[0];
  t.data_ = static_cast<char*>(data_) + static_cast<size_t>(begin * row) * DTypeSize(dtype_);
  return t;
}

}  // namespace loom
