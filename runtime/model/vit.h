// The vision encoder: a ViT over fixed-size tiles, pre-LN blocks, attention
// full within each tile (tiles are independent sequences of (S/P)² patches,
// after a class token where the family has one).
//
//   tiles (N, 3, S, S) -> patchify -> linear -> [cls, patches] + positions -> [LN_pre]
//     -> L × [x += attn(LN1(x)); x += MLP_act(LN2(x))] -> [LN_f] -> patches' rows (N·Np, D)
//
// Loom's own configs: patch bias, no class token, no LN_pre, LN_f, tanh GELU.
// CLIP as LLaVA runs it: class token (dropped at the end), no patch bias,
// LN_pre, quick GELU, no LN_f (features of the penultimate layer, before
// post_layernorm). SigLIP: patch bias, no class token, no LN_f.
//
// Forward keeps the activations Backward needs; Backward accumulates into the
// parameter gradients. Precision: the parameters' (ParamSet::Place), as in
// the LLM (llm.h, runtime/model/precision.h).
//
// Tensor parallelism over the TP group `tp` (null: one rank), Megatron's:
// QKV and fc1 column-parallel (heads and hidden units split, with their
// biases), attention output and fc2 row-parallel (their biases whole, added
// after the all-reduce); patch embedding, positions and norms replicated.
// Every rank of the group runs the same tiles and holds the whole output.
//
// Pipeline parallelism: a VitEncoder built with a LayerRange is one stage;
// the first patchifies and embeds tiles, the others take the previous
// stage's hidden states; the last ends with the final LayerNorm.
#ifndef LOOM_RUNTIME_MODEL_VIT_H_
#define LOOM_RUNTIME_MODEL_VIT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "runtime/comm/collective.h"
#include "runtime/model/config.h"
#include "runtime/model/ops.h"
#include "runtime/model/params.h"
#include "runtime/model/precision.h"
#include "runtime/tensor/buffer.h"

namespace loom {

class VitEncoder {
 public:
  // `tp` (not owned; null for one rank) must divide the heads and the MLP
  // width (checked; ValidateParallelism names the field).
  // `ops` (not owned): the backend its layers run on.
  explicit VitEncoder(const VitConfig& config, Communicator* tp = nullptr, LayerRange layers = {},
                      Ops* ops = CpuOps());

  ParamSet& params() { return params_; }
  const VitConfig& config() const { return config_; }

  bool first_stage() const { return first_ == 0; }
  bool last_stage() const { return last_ == config_.layers; }

  // In and out, like the layers' buffers, are memory of ops' backend.
  // `in`: tiles (N, 3, S, S) of normalised pixels on the first stage, the
  // previous stage's output (N * seq, D) on the others -> out (N * seq, D)
  // on a stage before the last, (N * Np, D) on the last (seq = Np + the class
  // token: VitConfig::seq()).
  // `prefix` (first stage, config().prefix > 0): (N, prefix, D) rows placed
  // in each tile before its patches (positions added to them too).
  // Errors only from the TP group's collectives.
  absl::Status Forward(const float* in, int N, float* out, const float* prefix = nullptr);
  // dout, shaped as the last Forward's out; accumulates parameter gradients;
  // a stage after the first writes its input gradient to `din` (N * seq, D),
  // the first its prefix rows' gradient to `dprefix` (N, prefix, D) when
  // given (also when its parameters are frozen).
  absl::Status Backward(const float* dout, float* din = nullptr, float* dprefix = nullptr);

  // Recompute::kSelective (precision.h): the layers keep no LayerNorm or
  // GELU outputs; Backward computes them again from the kept inputs and
  // statistics. Set between iterations.
  void set_recompute(Recompute r) { selective_ = r == Recompute::kSelective; }
  // Sequence parallelism at TP > 1, as Llm::set_sequence_parallel: the
  // residual stream and the LayerNorms on 1/TP of the rows between the TP
  // layers. Set between iterations.
  void set_sequence_parallel(bool on) { sequence_parallel_ = on; }
  // The last Forward's state for its Backward, moved out and back (as
  // Llm::Detach).
  SavedActivations Detach();
  void Attach(SavedActivations* saved);

 private:
  struct LayerIds {
    int ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  };
  struct LayerActs {  // in ops_'s backend's memory
    Buffer<float> x, ln1, mean1, rstd1, qkv, lse, atto, x1, ln2, mean2, rstd2, h, g;
    void Bind(Backend* b) {
      for (Buffer<float>* p : All()) p->set_backend(b);
    }
    std::vector<Buffer<float>*> All() {
      return {&x, &ln1, &qkv, &atto, &x1, &ln2, &h, &g, &mean1, &rstd1, &lse, &mean2, &rstd2};
    }
    // Under bf16 (ActivationStash): stored as bf16 (selective: less the
    // element-wise outputs ln1, ln2 and g), and the per-row statistics kept
    // in fp32.
    std::vector<Buffer<float>*> Narrow(bool selective) {
      if (selective) return {&x, &qkv, &atto, &x1, &h};
      return {&x, &ln1, &qkv, &atto, &x1, &ln2, &h, &g};
    }
    std::vector<Buffer<float>*> Kept() { return {&mean1, &rstd1, &lse, &mean2, &rstd2}; }
  };
  SavedActivations::Lists ForwardState();

  VitConfig config_;
  Communicator* tp_;
  Ops* ops_;
  ParamSet params_;
  int heads_, hidden_;  // this rank's part
  int first_, last_;    // this stage's layers
  // -1: another stage's, or not in this family.
  int patch_w_ = -1, patch_b_ = -1, cls_ = -1, pos_ = -1, lnp_w_ = -1, lnp_b_ = -1, lnf_w_ = -1,
      lnf_b_ = -1;
  std::vector<LayerIds> ids_;

  float* Param(int id) { return id < 0 ? nullptr : params_.param(id); }

  int N_ = 0;                // tiles in the last Forward
  std::vector<int32_t> cu_;  // the tiles' boundaries, on the host and (cu_dev_) ops_'s backend
  Buffer<int32_t> cu_dev_;
  Buffer<float> patches_, x0_, mean0_, rstd0_, xf_, meanf_, rstdf_;
  // Every layer's activations (fp32), or under bf16 one layer's (work_)
  // and every layer's packed (stash_).
  std::vector<LayerActs> acts_;
  LayerActs work_;
  std::vector<ActivationStash> stash_;
  bool selective_ = false;
  bool sequence_parallel_ = false;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_MODEL_VIT_H_
