// The scheduler's cost model.
//
// FLOPs (analytic, for MFU; a multiply-add is 2 FLOPs; training = forward +
// backward = 3x forward, 4x with full activation recompute, less for frozen
// modules: AnalyticFlops):
//   encoder, per tile: patch embedding, `layers` pre-LN blocks over the
//     tile's (S/P)^2 patches with full attention inside the tile, and the
//     projector over the tile's tokens after pixel shuffle;
//   LLM, per sample of packed length L: 2 L (4 D^2 + 3 D F) per layer, causal
//     attention 2 L^2 D per layer (half of the full QK^T and AV), and the
//     output head 2 L D V. Packing is block-diagonal, so a microbatch's
//     attention is the sum of its samples' L^2, not (sum L)^2.
// Time (seconds, forward + backward on one rank of the module, a TP group,
// all its pipeline stages together):
//   encoder(sample) = per_sample [tiles > 0] + per_tile * tiles
//   llm(sample)     = per_sample + per_token * L + per_token_sq * L^2
// Coefficients start from FLOPs at an assumed efficiency and are refitted by
// least squares from measured microbatch times, with old observations
// decaying and a weak pull toward the prior so that one kind of microbatch
// cannot make the fit singular.
// Memory is not here: the plan (plan.h) prices it with the runtime's memory
// model (runtime/model/memory.h).
#ifndef LOOM_RUNTIME_SCHEDULING_COST_MODEL_H_
#define LOOM_RUNTIME_SCHEDULING_COST_MODEL_H_

#include <array>
#include <vector>

#include "loom/scheduler/v1/scheduler.pb.h"
#include "runtime/model/config.h"
#include "runtime/scheduling/assign.h"

namespace loom::sched {

struct ModelFlops {
  double encoder_per_tile = 0;  // training FLOPs
  double llm_per_token = 0;
  double llm_per_token_sq = 0;
  double embedding_bytes_per_image_token = 0;  // what the encoder sends (bf16)
  // The generator's training FLOPs per output image: the denoiser over the
  // picture's patches and its prefix (timestep token and Q conditions), the
  // conditions' projection and the patch head. 0 without a generator.
  double generator_per_image = 0;
};

// With `frozen` modules (runtime/model/config.h Frozen) the backward is
// cheaper: a frozen layer computes its input gradient only (one matmul pass
// instead of two; attention's backward is unchanged), a frozen module that
// needs no input gradient runs forward only (a frozen vision tower: its
// output is kept, not recomputed), and a trainable projector after a frozen
// tower computes its weight gradients only.
ModelFlops AnalyticFlops(const ModelConfig& config, bool recompute, const Frozen& frozen = {});

// Per-sample features the costs are linear in.
struct SampleShape {
  int tiles = 0;
  int image_tokens = 0;
  int text_tokens = 0;
  int output_images = 0;  // the generator's pictures to draw
  int query_tokens = 0;   // the LLM's query positions for them
  int length() const { return image_tokens + text_tokens + query_tokens; }
};

SampleShape ShapeOf(const scheduler::v1::BatchSample& sample);

// Stage shares of `costs` for pipelines of encoder_pp and llm_pp stages: a
// module's shares stay when they have one entry per stage (refitted ones,
// say), else they start from the layer split the workers use (LlmStages /
// VitStages). Requires 1 <= pp <= the module's layers.
void SetStageShares(const ModelConfig& model, int encoder_pp, int llm_pp,
                    scheduler::v1::CostCoefficients* costs);

class CostModel {
 public:
  explicit CostModel(const scheduler::v1::CostCoefficients& prior);

  double EncoderSeconds(const SampleShape& s) const;
  double LlmSeconds(const SampleShape& s) const;
  // generator_per_image x output images.
  double GeneratorSeconds(const SampleShape& s) const;

  // Costs of a batch; `transfer_seconds_per_image_token` prices the
  // embeddings' trip from encoder to LLM.
  std::vector<SampleLoad> Loads(const std::vector<SampleShape>& shapes,
                                double transfer_seconds_per_image_token) const;

  // One measured microbatch: the samples it held and its forward + backward
  // seconds. Non-finite or negative times are ignored (returns false).
  bool ObserveEncoder(const std::vector<SampleShape>& samples, double seconds);
  bool ObserveLlm(const std::vector<SampleShape>& samples, double seconds);
  // A generator bin's forward + backward: generator_per_image refits from
  // its output images (false, ignored, without any).
  bool ObserveGenerator(const std::vector<SampleShape>& samples, double seconds);
  // One iteration's compute per pipeline stage of a module (one replica):
  // the stage shares move toward its proportions with the fit's decay.
  // False (ignored) for fewer than 2 stages, a count that differs from the
  // shares held, or times that are negative, non-finite or all zero.
  bool ObserveStages(bool encoder, const std::vector<double>& seconds);
  // One iteration's forward seconds out of forward + backward `total`: the
  // forward share moves toward their ratio. False (ignored) when not
  // 0 <= forward <= total, total > 0.
  bool ObserveForward(bool encoder, double forward, double total);
  // Recomputed forwards took `recompute` seconds, their first runs `first`:
  // the recompute ratio moves toward recompute / first. False (ignored) for
  // negative, non-finite or zero `first`.
  bool ObserveRecompute(bool encoder, double recompute, double first);

  const scheduler::v1::CostCoefficients& coefficients() const { return coefficients_; }
  int observations() const { return observations_; }

 private:
  // Normal equations of a decaying least-squares fit in up to 3 features.
  struct Fit {
    std::array<std::array<double, 3>, 3> ata{};
    std::array<double, 3> aty{};
    double weight = 0;
  };
  void Refit();

  scheduler::v1::CostCoefficients prior_, coefficients_;
  Fit encoder_, llm_, generator_;
  int observations_ = 0;
};

// Solves the square system a x = b by Gaussian elimination with partial
// pivoting; false if it is singular.
bool SolveLinear(std::vector<std::vector<double>> a, std::vector<double> b, std::vector<double>* x);

}  // namespace loom::sched

#endif  // LOOM_RUNTIME_SCHEDULING_COST_MODEL_H_
