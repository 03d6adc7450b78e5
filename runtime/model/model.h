// The multimodal model: ViT encoder -> projector -> LLM, and one microbatch's
// forward and backward through all three in one process (the colocated
// baseline, and the reference that disaggregated training must match).
#ifndef LOOM_RUNTIME_MODEL_MODEL_H_
#define LOOM_RUNTIME_MODEL_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/loss/crossentropy.h"
#include "runtime/model/config.h"
#include "runtime/model/generator.h"
#include "runtime/model/llm.h"
#include "runtime/model/projector.h"
#include "runtime/model/vit.h"

namespace loom {

// One training sample after preprocessing.
struct Sample {
  int num_tiles = 0;
  std::vector<float> tiles;     // (num_tiles, 3, S, S), normalised
  std::vector<int32_t> tokens;  // text ids, -1 at each image-token slot
                                // (num_tiles * tokens_per_tile of them, in tile order)
  // Which tokens are trained on: empty, every text token after the first;
  // else one flag per token, 1 where predicting that token carries loss (a
  // conversation's assistant turns, runtime/data/chat_template.h).
  std::vector<uint8_t> loss_mask;
  // Output images, a generator's targets (text → image): num_gen_images of
  // (3, Sg, Sg) normalised pixels (Sg: the generator's image side). Each has
  // the model's generator.queries query positions (kQueryToken) in tokens,
  // in image order.
  int num_gen_images = 0;
  std::vector<float> gen_images;
  // The sample's stable identity (its index in the data set): with the
  // job's seed and the step it draws each output image's timestep and noise
  // (DrawGeneration), the same on any layout.
  uint64_t id = 0;
};

// What a worker checks of every sample it receives from loom-preprocess
// before it touches the model: tiles of the model's tile size (`tile_size` as
// the sender described them), tiles.size() = num_tiles x 3 x S x S (unless
// tokens_only), exactly num_tiles x tokens_per_tile image slots (-1), and
// every text id inside the vocabulary. FAILED_PRECONDITION naming the sample
// `key`, what it holds and what the model needs: a preprocess started with
// another model config than the worker's.
//
// Such an error carries the SampleMisfit mark: a regroup rolls back to the
// same samples, so a worker that meets one ends instead of regrouping.
absl::Status SampleMisfitError(const std::string& message);
bool IsSampleMisfit(const absl::Status& s);
absl::Status CheckSampleFits(const Sample& sample, int tile_size, bool tokens_only,
                             const ModelConfig& config, const std::string& key);

// Loss tokens of a sample: positions whose next token is text and, with a
// loss_mask, marked.
int64_t LossTokens(const Sample& s);

// Packs samples into one LLM microbatch: tokens concatenated, targets = next
// token where it is text and carries loss (else -1), positions restarting
// per sample.
LlmBatch PackSamples(const std::vector<const Sample*>& samples);

// Each module draws its initial weights from its own stream of the job's
// seed, so a process holding one module initialises it exactly as the
// single-process model does.
inline uint64_t ModuleSeed(uint64_t seed, Module m) { return seed * 3 + static_cast<uint64_t>(m); }

// The layers pipeline stage `stage` of `pp` holds (parallel::SplitLayers),
// balancing per-token matmul FLOPs: the LLM's last stage also runs lm_head
// (C·V against a layer's 4C² + 3CF); the ViT's first the patch embedding,
// its last the projector. 1 <= pp <= layers (ValidateModelParallel).
LayerRange LlmStageLayers(const ModelConfig& config, int pp, int stage);
LayerRange VitStageLayers(const ModelConfig& config, int pp, int stage);

// The output images of `samples`, in order, as one generator batch, each
// image's timestep and noise drawn from the seed, the step, its sample's id
// and its index there (DrawGeneration): loom-train-local's and every
// layout's draws alike. INVALID_ARGUMENT: a sample whose pictures do not
// match its count.
absl::StatusOr<GeneratorBatch> GenerationBatch(const std::vector<const Sample*>& samples,
                                               int pixels, uint64_t seed, int64_t step);

class MultimodalModel {
 public:
  // `ops` (not owned): the backend the modules run on.
  explicit MultimodalModel(const ModelConfig& config, Ops* ops = CpuOps());

  const ModelConfig& config() const { return config_; }
  VitEncoder& vit() { return vit_; }
  Projector& projector() { return projector_; }
  Llm& llm() { return llm_; }
  // The generator (null without one).
  Generator* generator() { return gen_.get(); }
  // Every parameter set: the encoder's, the projector's, the LLM's, then
  // with a generator its own and its denoiser's; the module of each, and
  // the name it is checkpointed under.
  std::vector<ParamSet*> param_sets();
  std::vector<Module> param_set_modules() const;
  std::vector<std::string> param_set_names() const;

  // Every module's parameters from `seed` (each module its own stream).
  void Initialize(uint64_t seed);
  // The parameters on the ops' backend (ParamSet::Place), in `precision`
  // (runtime/model/precision.h), once their host values are set, with the
  // optimizer's state beside them (it steps there); PushData after the host
  // values change (a load: weights and AdamW state), PullState before the
  // host reads them (a checkpoint), PullGrads before the host reads
  // gradients. No-ops on the CPU in fp32.
  void Place(Precision precision = Precision::kFp32);
  void PushData();
  void PullState();
  void PullGrads();
  Ops* ops() const { return ops_; }
  void ZeroGrad();
  // Freezes the modules `frozen` names (after their weights are set: a
  // frozen module loads weights but no AdamW state).
  void Freeze(const Frozen& frozen);
  const Frozen& frozen() const { return frozen_; }

  // Forward and backward of one microbatch; gradients accumulate scaled by
  // `grad_scale` (1 / loss tokens of the global batch), the generation
  // loss's by `generation_scale` (λ / output images of the global batch).
  // Returns the LM loss sum.
  kernels::LossSum ForwardBackward(const std::vector<const Sample*>& microbatch, float grad_scale,
                                   float generation_scale = 0.0f);
  // Forward only.
  kernels::LossSum Evaluate(const std::vector<const Sample*>& microbatch);
  // Output images for a prompt (text, maybe with images, and Q query
  // positions per image to draw: no output images of its own), sampled by
  // `euler_steps` Euler steps from the seed's noise (Generator::Sample):
  // (images, 3, S, S) normalised pixels. INVALID_ARGUMENT without a
  // generator or query positions.
  absl::StatusOr<std::vector<float>> GenerateImages(const Sample& prompt, int euler_steps,
                                                    uint64_t seed);
  // The seed and step the output images' timesteps and noise are drawn
  // from (DrawGeneration with each sample's id), until set again.
  void set_generation_draws(uint64_t seed, int64_t step) {
    draw_seed_ = seed;
    draw_step_ = step;
  }
  // The last microbatch's generation loss: Σ over its output images of
  // each image's mean squared error; and how many it had.
  double generation_loss_sum() const { return gen_loss_sum_; }
  int generation_images() const { return gen_batch_.N; }

 private:
  void Forward(const std::vector<const Sample*>& microbatch);
  // The encoder, projector and LLM parts of Forward.
  void ForwardUnderstanding(const std::vector<const Sample*>& microbatch);

  ModelConfig config_;
  Frozen frozen_;
  VitEncoder vit_;
  Projector projector_;
  Llm llm_;
  Ops* ops_;
  std::unique_ptr<Generator> gen_;
  LlmBatch batch_;
  GeneratorBatch gen_batch_;
  uint64_t draw_seed_ = 0;
  int64_t draw_step_ = 0;
  double gen_loss_sum_ = 0;
  std::vector<float> host_tiles_;
  Buffer<float> tiles_, vit_out_, image_emb_;  // on ops_'s backend
  int num_tiles_ = 0;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_MODEL_MODEL_H_
