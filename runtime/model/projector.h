// The projector: ViT patch embeddings -> LLM-width image tokens.
//
//   (N·Np, Dv) -> [pixel shuffle: (N·Np/4, 4·Dv)] -> fc1 -> act -> fc2 -> (N·tokens, Dl)
//
// LLaVA's multi_modal_projector is fc1 = linear_1, act = exact GELU, fc2 = linear_2.
#ifndef LOOM_RUNTIME_MODEL_PROJECTOR_H_
#define LOOM_RUNTIME_MODEL_PROJECTOR_H_

#include <vector>

#include "runtime/model/config.h"
#include "runtime/model/ops.h"
#include "runtime/model/params.h"
#include "runtime/model/precision.h"
#include "runtime/tensor/buffer.h"

namespace loom {

class Projector {
 public:
  // `ops` (not owned): the backend its layers run on.
  explicit Projector(const ModelConfig& config, Ops* ops = CpuOps());

  ParamSet& params() { return params_; }
  int in_dim() const;

  // in (N * Np, Dv) -> out (N * tokens_per_tile, Dl), N tiles; in, out and
  // every buffer of the layers in the memory of ops' backend.
  void Forward(const float* in, int N, float* out);
  // dout (N * tokens_per_tile, Dl) -> din (N * Np, Dv) += (null: not needed,
  // a frozen ViT); parameter gradients += (none when frozen).
  void Backward(const float* dout, float* din);
  // The last Forward's state for its Backward, moved out and back (as
  // Llm::Detach).
  SavedActivations Detach();
  void Attach(SavedActivations* saved);

 private:
  ModelConfig config_;
  Ops* ops_;
  ParamSet params_;
  int fc1_w_, fc1_b_, fc2_w_, fc2_b_;
  int N_ = 0;
  Buffer<float> x_, h_, g_;  // shuffled input, fc1 output, GELU output (on ops_'s backend)
};

}  // namespace loom

#endif  // LOOM_RUNTIME_MODEL_PROJECTOR_H_
