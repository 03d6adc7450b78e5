#include "runtime/tensor/arena.h"

#include <algorithm>

namespace loom {

Arena::Arena(Backend* backend, size_t block_bytes)
    : backend_(backend), block_bytes_(std::max(block_bytes, Backend::kAlignment)) {}

Arena::~Arena() {
  for (Block& b : blocks_) backend_->Free(b.data);
}

void* Arena::AllocBytes(size_t bytes) {
  const size_t a = Backend::kAlignment;
  const size_t need = std::max<size_t>((bytes + a - 1) / a * a, a);
  // Find room in the current block or a later (already reserved) one.
  while (current_ < blocks_.size() && offset_ + need > blocks_[current_].size) {
    ++current_;
    offset_ = 0;
  }
  if (current_ == blocks_.size()) {
    const size_t size = std::max(need, block_bytes_);
    blocks_.push_back({static_cast<char*>(backend_->Allocate(size)), size});
    offset_ = 0;
  }
  void* p = blocks_[current_].data + offset_;
  offset_ += need;
  in_use_ += need;
  high_water_ = std::max(high_water_, in_use_);
  return p;
}

Tensor Arena::Alloc(const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
  return Tensor::View(AllocBytes(bytes), shape, dtype, backend_->device());
}

Tensor Arena::AllocZeros(const Shape& shape, DType dtype) {
  Tensor t = Alloc(shape, dtype);
  backend_->Fill(t.raw(), 0, t.bytes());
  return t;
}

void Arena::Reset() {
  current_ = 0;
  offset_ = 0;
  in_use_ = 0;
}

size_t Arena::bytes_reserved() const {
  size_t n = 0;
  for (const Block& b : blocks_) n += b.size;
  return n;
}

}  // namespace loom
