// The modality generator: a DiT-style denoiser over an output image's
// pixel-space patches, conditioned on the LLM's hidden states at the query
// positions it appends for the image (in-context, as a prefix: DiT's
// "in-context conditioning", MetaQuery's queries), trained by rectified
// flow.
//
//   x_t = (1 - t) x0 + t ε                        (x0 the image, ε ~ N(0, 1))
//   c_t = W2 act(W1 sinusoid(1000 t) + b1) + b2   (one timestep token)
//   c_q = Wc h_q + bc                             (Q tokens from the LLM's h_q)
//   v̂   = head(ViT([c_t, c_q..., patches(x_t)]))  (the patches' rows only)
//   loss = Σ_images mean over pixels (v̂ - (ε - x0))²
//
// The ViT is the encoder's (vit.h: pre-LN blocks, full attention within an
// image, learned positions over every row, final LayerNorm) with
// VitConfig::prefix = 1 + Q. t and ε come from the caller (DrawGeneration
// gives them from the seed, the step and the sample), so a step is exactly
// repeatable on any layout. Sampling integrates dx/dt = v̂ from t = 1 (noise)
// to t = 0 by Euler steps.
//
// Tensor parallelism: the ViT's (its own); the timestep MLP, the condition
// projection and the head are replicated. Pipeline parallelism: a stage
// holds a range of the denoiser's blocks (GeneratorStageLayers), the first
// also the timestep MLP and the conditions' projection (its prefix rows),
// the last the final LayerNorm and the head (the loss); between stages
// travel every row of every image, (N · seq, D). Precision: the parameters'
// (ParamSet::Place), as in the other modules.
#ifndef LOOM_RUNTIME_MODEL_GENERATOR_H_
#define LOOM_RUNTIME_MODEL_GENERATOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/comm/collective.h"
#include "runtime/model/config.h"
#include "runtime/model/ops.h"
#include "runtime/model/params.h"
#include "runtime/model/vit.h"
#include "runtime/tensor/buffer.h"

namespace loom {

// One microbatch's output images, on the host.
struct GeneratorBatch {
  int N = 0;                  // images
  std::vector<float> images;  // (N, 3, S, S) normalised pixels: x0
  std::vector<float> noise;   // (N, 3, S, S): ε
  std::vector<float> t;       // (N) in [0, 1]
};

// The timestep (uniform in (0, 1)) and noise (standard normal, `pixels`
// values) of one output image, from the job's seed, the step and the
// sample's id and image index: the same on every layout and rank.
struct GenerationDraw {
  float t = 0;
  std::vector<float> noise;
};
GenerationDraw DrawGeneration(uint64_t seed, int64_t step, uint64_t sample, int image, int pixels);

// Pipeline stage `stage` of `pp`'s denoiser blocks: an even split.
LayerRange GeneratorStageLayers(const GeneratorConfig& config, int pp, int stage);

class Generator {
 public:
  // `tp` (not owned; null for one rank), `ops` (not owned) as the ViT's;
  // `layers`: this pipeline stage's blocks (all by default).
  explicit Generator(const GeneratorConfig& config, Communicator* tp = nullptr, Ops* ops = CpuOps(),
                     LayerRange layers = {});

  bool first_stage() const { return vit_.first_stage(); }
  bool last_stage() const { return vit_.last_stage(); }
  // Floats one stage hands the next for N images: (N · seq, D).
  int64_t StageFloats(int N) const {
    return static_cast<int64_t>(N) * config_.denoiser.seq() * config_.denoiser.dim;
  }

  const GeneratorConfig& config() const { return config_; }
  // Its own tensors (timestep MLP and condition projection on the first
  // stage, head on the last) and the denoiser's.
  ParamSet& params() { return params_; }
  ParamSet& denoiser_params() { return vit_.params(); }

  // `cond`: (N · Q, cond_dim) hidden states in ops' backend's memory. Keeps
  // what Backward needs. INVALID_ARGUMENT when the batch's sizes do not
  // match the config.
  absl::Status Forward(const GeneratorBatch& batch, const float* cond);
  // The last Forward's Σ over images of the mean squared error over pixels.
  double LossSum() const { return loss_sum_; }
  // Accumulates parameter gradients of loss_sum · grad_scale, and adds the
  // condition's gradient to `dcond` (N · Q, cond_dim) when given.
  absl::Status Backward(float grad_scale, float* dcond);

  // One pipeline stage of Forward: `in` is the conditions on the first
  // stage, the previous stage's rows on the others; a stage before the
  // last writes its rows to `out` (StageFloats); the last computes the loss
  // (LossSum; 0 on the others). Every stage takes the whole batch.
  absl::Status ForwardStage(const GeneratorBatch& batch, const float* in, float* out);
  // One pipeline stage of Backward: `dout` the next stage's gradient of
  // this stage's rows (ignored on the last: the loss's); the first adds the
  // conditions' gradient to `din` when given, the others write their
  // input rows' gradient to `din`.
  absl::Status BackwardStage(float grad_scale, const float* dout, float* din);

  // The velocity v̂ (N, 3, S, S) for images x_t at times t, on the host:
  // one Euler step's evaluation (no state kept for a backward).
  absl::StatusOr<std::vector<float>> Velocity(const std::vector<float>& x_t,
                                              const std::vector<float>& t, const float* cond,
                                              int N);
  // N images (N, 3, S, S) sampled by `euler_steps` Euler steps of
  // dx/dt = v̂ from noise at t = 1 to t = 0, x ← x - v̂ / euler_steps; the
  // noise of image n is DrawGeneration(seed, -1, n, 0)'s.
  absl::StatusOr<std::vector<float>> Sample(const float* cond, int N, int euler_steps,
                                            uint64_t seed);

 private:
  absl::Status Run(const std::vector<float>& x_t, const std::vector<float>& t, const float* in,
                   int N, float* out);
  absl::Status Head(int N);  // the last stage's patch head into err_

  GeneratorConfig config_;
  Ops* ops_;
  VitEncoder vit_;
  ParamSet params_;
  int t1_w_ = -1, t1_b_ = -1, t2_w_ = -1, t2_b_ = -1, c_w_ = -1, c_b_ = -1, head_w_ = -1,
      head_b_ = -1;
  int N_ = 0;
  double loss_sum_ = 0;
  // On ops_'s backend: the timestep features, the MLP's hidden and its
  // activation, the condition, the ViT's output, the prediction's error.
  Buffer<float> freqs_, th_, tg_, cond_, y_, err_;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_MODEL_GENERATOR_H_
