// An arena: bump allocation of tensors from blocks of one backend's memory,
// all released at once by Reset(). Activations of one training step live in
// an arena; Reset() between steps reuses the same memory without a single
// malloc in steady state.
//
// Tensors from Alloc() are views: they must not be used after Reset() or the
// arena's destruction.
//
// Thread-safety: none; one arena per thread.
#ifndef LOOM_RUNTIME_TENSOR_ARENA_H_
#define LOOM_RUNTIME_TENSOR_ARENA_H_

#include <cstddef>
#include <vector>

#include "runtime/tensor/backend.h"
#include "runtime/tensor/tensor.h"

namespace loom {

class Arena {
 public:
  // `block_bytes`: size of each block; larger requests get a block of their own.
  Arena(Backend* backend, size_t block_bytes = size_t{64} << 20);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Uninitialised, Backend::kAlignment-aligned.
  Tensor Alloc(const Shape& shape, DType dtype);
  Tensor AllocZeros(const Shape& shape, DType dtype);

  // Releases every allocation; keeps the blocks for reuse.
  void Reset();

  size_t bytes_in_use() const { return in_use_; }
  size_t bytes_reserved() const;
  size_t high_water() const { return high_water_; }

 private:
  struct Block {
    char* data;
    size_t size;
  };
  void* AllocBytes(size_t bytes);

  Backend* backend_;
  size_t block_bytes_;
  std::vector<Block> blocks_;
  size_t current_ = 0;  // index of the block being filled
  size_t offset_ = 0;   // bytes used in blocks_[current_]
  size_t in_use_ = 0;
  size_t high_water_ = 0;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_TENSOR_ARENA_H_
