// The LLM: a decoder-only transformer over packed variable-length samples,
// with image embeddings spliced in at image positions.
//
//   tokens -> embedding (image positions take the projector's rows, in order)
//     -> L × [x += attn_causal_rope(RMS1(x)); x += down(swiglu(gate(RMS2 x), up(RMS2 x)))]
//     -> RMS_f -> lm_head -> logits -> cross-entropy on targets >= 0
//
// The Llama and Qwen2 families (LlmConfig): grouped-query attention (kv_heads
// key/value heads shared by heads / kv_heads query heads each), an explicit
// head_dim, q/k/v biases, Llama 3's RoPE scaling, the RMSNorm eps, and
// lm_head tied to the embedding table. q, k and v are one fused projection
// (rows q | k | v), RoPE in Hugging Face's rotate-half layout.
//
// The loss of a microbatch is returned as a sum with its token count; the
// gradient is scaled by `grad_scale` = 1 / (loss tokens in the whole global
// batch), so any split into microbatches and ranks gives the same gradient.
//
// Tensor parallelism (Megatron's, runtime/parallel/tensor_parallel.h) over
// the TP group `tp` (null: one rank, no communication): the embedding and
// lm_head are vocab-parallel (rows of the vocabulary; the cross-entropy
// all-reduces the max, then the sums), QKV, gate and up column-parallel (the
// heads and the FFN units split), attention output and down row-parallel
// (one all-reduce after each, forward; one before each norm, backward).
// Whole key/value groups: the TP degree divides kv_heads.
// Norms are replicated. Every rank of the group calls Forward and Backward
// with the same batch; each returns the whole loss.
//
// Precision: the parameters' (ParamSet::Place). Under bf16 the linear layers
// read the weights' bf16 copy, attention takes bf16 q/k/v, and each layer's
// saved activations are packed as bf16 between forward and backward
// (runtime/model/precision.h).
//
// Pipeline parallelism: an Llm built with a LayerRange is one stage. The
// first stage embeds tokens (and takes the image embeddings), the others
// take the previous stage's hidden states (T, C); the last stage ends in the
// final norm, lm_head and loss, the others hand their hidden states on.
// Parameter names keep the layer's index in the whole model.
#ifndef LOOM_RUNTIME_MODEL_LLM_H_
#define LOOM_RUNTIME_MODEL_LLM_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/loss/crossentropy.h"
#include "runtime/comm/collective.h"
#include "runtime/model/config.h"
#include "runtime/model/ops.h"
#include "runtime/model/params.h"
#include "runtime/model/precision.h"
#include "runtime/tensor/buffer.h"

namespace loom {

// The token values that are not text: an image-token slot (the projector's
// rows fill it) and a generator query position (LlmConfig::gen_queries).
inline constexpr int32_t kImageToken = -1;
inline constexpr int32_t kQueryToken = -2;

// One packed microbatch for the LLM.
struct LlmBatch {
  std::vector<int32_t> tokens;      // (T) token ids; -1 at image positions, -2 at query positions
  std::vector<int32_t> targets;     // (T) the next token, or -1: no loss here
  std::vector<int32_t> positions;   // (T) RoPE positions, restarting per sample
  std::vector<int32_t> cu_seqlens;  // (S + 1) sample boundaries
  int T() const { return static_cast<int>(tokens.size()); }
  int S() const { return static_cast<int>(cu_seqlens.size()) - 1; }
  int image_positions() const;  // how many tokens are -1
  int query_positions() const;  // how many tokens are -2
};

class Llm {
 public:
  // `tp` (not owned; null for one rank) must divide the heads, the FFN
  // width and the vocabulary (checked; ValidateParallelism names the field).
  // `ops` (not owned): the backend its layers run on.
  explicit Llm(const LlmConfig& config, Communicator* tp = nullptr, LayerRange layers = {},
               Ops* ops = CpuOps());

  ParamSet& params() { return params_; }
  const LlmConfig& config() const { return config_; }

  bool first_stage() const { return first_ == 0; }
  bool last_stage() const { return last_ == config_.layers; }

  // The batch is host memory (uploaded here); image_emb, input, doutput,
  // dinput and dimage_emb are memory of ops' backend.
  // First stage: image_emb (batch.image_positions(), C) fills the -1
  // positions in order (may be null when there are none). Other stages:
  // `input` (T, C), the previous stage's output. Keeps `batch` (which must
  // outlive Backward), the activations and, on the last stage, the logits.
  // Errors only from the TP group's collectives.
  absl::Status Forward(const LlmBatch& batch, const float* image_emb, const float* input = nullptr);
  // (T, V / tp): this rank's columns of the vocabulary (last stage), copied
  // to the host.
  std::vector<float> logits() const { return logits_.ToHost(); }
  // (T, C): the hidden states for the next stage (other stages), in the
  // memory of ops' backend.
  const Buffer<float>& output() const { return xf_; }

  // (query_positions, C): the final norm's output at the query positions,
  // in order (last stage; empty without them), in the memory of ops'
  // backend: the generator's condition.
  const Buffer<float>& query_states() const { return query_states_; }
  // Loss of the last Forward, no gradient (last stage).
  absl::StatusOr<kernels::LossSum> Loss() const;
  // Backward through this stage's layers: parameter gradients +=. The last
  // stage starts from the loss (returned); the others from `doutput` (T, C),
  // the next stage's input gradient (their loss is zero). The first stage
  // ends with dimage_emb (image_positions, C) += (may be null), the others
  // write `dinput` (T, C). `dquery` (last stage; may be null): the
  // gradient of query_states() from the generator, already scaled.
  absl::StatusOr<kernels::LossSum> Backward(float grad_scale, float* dimage_emb,
                                            const float* doutput = nullptr, float* dinput = nullptr,
                                            const float* dquery = nullptr);

  // Recompute::kSelective (precision.h): the layers keep no RMSNorm or
  // SwiGLU outputs; Backward computes them again from the kept inputs. The
  // others keep every activation (what a pipeline stage recomputes is the
  // worker's choice). Set between iterations.
  void set_recompute(Recompute r) { selective_ = r == Recompute::kSelective; }
  // Sequence parallelism (tensor_parallel.h SequenceSplit) at TP > 1: the
  // residual stream and the RMSNorms run on 1/TP of the rows between the
  // TP layers, so a layer keeps x, x1 and the norms' outputs 1/TP as large;
  // f and g become all-gathers and reduce-scatters. The stage's input and
  // output stay whole. Set between iterations.
  void set_sequence_parallel(bool on) { sequence_parallel_ = on; }
  // The last Forward's state for its Backward (activations, the batch,
  // logits), moved out: another microbatch's Forward may run before
  // Attach moves it back for its Backward.
  SavedActivations Detach();
  void Attach(SavedActivations* saved);

 private:
  struct LayerIds {
    int rms1, qkv, qkv_b = -1, proj, rms2, gate, up, down;  // qkv_b -1: no biases
  };
  struct LayerActs {  // in ops_'s backend's memory
    Buffer<float> x, r1, rr1, qkv, lse, atto, x1, r2, rr2, gate, up, s;
    void Bind(Backend* b) {
      for (Buffer<float>* p : All()) p->set_backend(b);
    }
    std::vector<Buffer<float>*> All() {
      return {&x, &r1, &qkv, &atto, &x1, &r2, &gate, &up, &s, &rr1, &lse, &rr2};
    }
    // Under bf16 (ActivationStash): stored as bf16 (selective: less the
    // element-wise outputs r1, r2 and s), and the per-row statistics kept
    // in fp32.
    std::vector<Buffer<float>*> Narrow(bool selective) {
      if (selective) return {&x, &qkv, &atto, &x1, &gate, &up};
      return {&x, &r1, &qkv, &atto, &x1, &r2, &gate, &up, &s};
    }
    std::vector<Buffer<float>*> Kept() { return {&rr1, &lse, &rr2}; }
  };
  SavedActivations::Lists ForwardState();

  LlmConfig config_;
  Communicator* tp_;
  Ops* ops_;
  ParamSet params_;
  int heads_, kv_heads_, ffn_, vocab_, vocab_start_;  // this rank's part
  Buffer<float> inv_freq_;                            // RoPE, hd / 2
  int first_, last_;                                  // this stage's layers
  int wte_ = -1, rmsf_ = -1, lm_head_ = -1;           // -1: not on this stage
  int queries_ = -1;                                  // gen_queries (first stage, gen_queries > 0)
  std::vector<LayerIds> ids_;

  const LlmBatch* batch_ = nullptr;
  Buffer<int32_t> tokens_, targets_, positions_, cu_;  // batch_'s, where the kernels read them
  Buffer<int32_t> image_rows_;  // the batch's image-token rows, in order (first stage)
  Buffer<int32_t> query_rows_;  // its query rows, in order (first and last stage)
  Buffer<float> xf_, rf_, rrf_, logits_, query_states_;
  // Every layer's activations (fp32), or under bf16 one layer's (work_)
  // and every layer's packed (stash_).
  std::vector<LayerActs> acts_;
  LayerActs work_;
  std::vector<ActivationStash> stash_;
  bool selective_ = false;
  bool sequence_parallel_ = false;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_MODEL_LLM_H_
