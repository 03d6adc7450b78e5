// The vision encoder: a ViT over fixed-size tiles, pre-LN blocks, attention
// full within each tile (tiles are independent sequences of (S/P)² patches).
//
//   tiles (N, 3, S, S) -> patchify -> linear -> + positions
//     -> L × [x += attn(LN1(x)); x += MLP_gelu(LN2(x))] -> LN_f -> (N·Np, D)
//
// Forward keeps the activations Backward needs; Backward accumulates into the
// parameter gradients. Model code is single-device; parallelism lives apart.
#ifndef LOOM_RUNTIME_MODEL_VIT_H_
#define LOOM_RUNTIME_MODEL_VIT_H_

#include <cstdint>
#include <vector>

#include "runtime/model/config.h"
#include "runtime/model/params.h"

namespace loom {

class VitEncoder {
 public:
  explicit VitEncoder(const VitConfig& config);

  ParamSet& params() { return params_; }
  const VitConfig& config() const { return config_; }

  // tiles (N, 3, S, S), normalised pixels -> out (N * Np, D).
  void Forward(const float* tiles, int N, float* out);
  // dout (N * Np, D) for the last Forward; accumulates parameter gradients.
  void Backward(const float* dout);

 private:
  struct LayerIds {
    int ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  };
  struct LayerActs {
    std::vector<float> x, ln1, mean1, rstd1, qkv, att, atto, x1, ln2, mean2, rstd2, h, g;
  };

  VitConfig config_;
  ParamSet params_;
  int patch_w_, patch_b_, pos_, lnf_w_, lnf_b_;
  std::vector<LayerIds> ids_;

  int N_ = 0;  // tiles in the last Forward
  std::vector<int32_t> cu_;
  std::vector<float> patches_, xf_, meanf_, rstdf_;
  std::vector<LayerActs> acts_;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_MODEL_VIT_H_
