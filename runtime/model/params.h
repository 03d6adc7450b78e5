// One module's parameters, their gradients and the AdamW state, each one flat
// fp32 buffer with named slices. Flat buffers make the optimizer step, the
// gradient allreduce and checkpoints one contiguous operation each.
//
// Usage: Add() every tensor, then Finalize() to allocate; pointers are stable
// from then on. Thread-safety: none.
#ifndef LOOM_RUNTIME_MODEL_PARAMS_H_
#define LOOM_RUNTIME_MODEL_PARAMS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/tensor/tensor.h"

namespace loom {

enum class Init : uint8_t {
  kZeros,
  kOnes,
  kNormal,  // N(0, std) with the std given to Add()
};

struct ParamSpec {
  std::string name;  // "blocks.0.attn.qkv.weight"
  Shape shape;
  int64_t offset = 0;  // into the flat buffers
  int64_t numel = 0;
  Init init = Init::kZeros;
  float std = 0.0f;
};

class ParamSet {
 public:
  // Returns the index of the new parameter.
  int Add(std::string name, Shape shape, Init init, float std = 0.0f);
  void Finalize();

  // Deterministic initialisation from `seed` (same values on every machine).
  void Initialize(uint64_t seed);
  void ZeroGrad();

  float* param(int i) { return data_.data() + specs_[i].offset; }
  float* grad(int i) { return grad_.data() + specs_[i].offset; }
  const ParamSpec& spec(int i) const { return specs_[i]; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  int64_t size() const { return total_; }

  std::vector<float>& data() { return data_; }
  std::vector<float>& grads() { return grad_; }
  std::vector<float>& adam_m() { return m_; }
  std::vector<float>& adam_v() { return v_; }
  int64_t& step() { return step_; }

 private:
  std::vector<ParamSpec> specs_;
  int64_t total_ = 0;
  bool finalized_ = false;
  std::vector<float> data_, grad_, m_, v_;
  int64_t step_ = 0;  // optimizer steps taken
};

}  // namespace loom

#endif  // LOOM_RUNTIME_MODEL_PARAMS_H_
