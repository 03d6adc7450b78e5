// Single-process training: the colocated baseline, and the numerical
// reference that disaggregated training must match step by step.
//
// One Step() is one optimizer step over a global batch: the batch is split
// into `microbatches` contiguous microbatches, each runs forward and backward
// through encoder, projector and LLM with gradients scaled by 1 / (loss
// tokens of the whole global batch); then the global gradient norm is
// clipped over all three modules together and AdamW steps each.
#ifndef LOOM_RUNTIME_TRAIN_TRAINER_H_
#define LOOM_RUNTIME_TRAIN_TRAINER_H_

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/optim/optim.h"
#include "runtime/model/model.h"
#include "runtime/train/lr_schedule.h"
#include "runtime/train/weight_decay.h"

namespace loom {

struct TrainOptions {
  int microbatches = 2;
  kernels::AdamWConfig adam = {/*lr=*/1e-3f, /*beta1=*/0.9f, /*beta2=*/0.95f, /*eps=*/1e-8f,
                               /*weight_decay=*/0.0f};
  // Which tensors adam.weight_decay shrinks (weight_decay.h: by default the
  // weight matrices, never norms, biases or embeddings).
  WeightDecayScope weight_decay_scope = WeightDecayScope::kMatrices;
  int warmup_steps = 10;   // linear learning-rate warm-up
  double clip_norm = 1.0;  // <= 0: no clipping
  // After the warm-up (lr_schedule.h): constant, or a decay to min_lr at
  // step total_steps.
  LrSchedule lr_schedule = LrSchedule::kConstant;
  int64_t total_steps = 0;
  double min_lr = 0;
  // Each module's peak learning rate; <= 0: adam.lr's.
  double encoder_lr = 0, projector_lr = 0, llm_lr = 0, generator_lr = 0;
  // A model with a generator: the generation loss's weight λ (total loss =
  // LM loss + λ · generation loss, each a mean over the global batch's loss
  // tokens and output images), and the seed its timesteps and noise are
  // drawn from (with the step and each sample's id).
  double generation_weight = 1.0;
  uint64_t seed = 1;
  // The schedule's options (warm-up, decay, floor as a share of adam.lr).
  LrScheduleOptions Schedule() const;
  // Module `m`'s peak.
  double PeakLr(Module m) const;
};

// A step whose loss or gradient norm is not finite is skipped: no optimizer
// step on any rank (weights, AdamW moments and the AdamW step count stay as
// they were), so one diverging batch cannot poison the model. Every trainer
// decides from the same global sums, so every rank skips alike.
inline bool StepIsFinite(double loss, double grad_norm) {
  return std::isfinite(loss) && std::isfinite(grad_norm);
}

struct StepStats {
  int64_t step = 0;  // 1-based
  double loss = 0;   // mean over the global batch's loss tokens
  int64_t samples = 0;
  int64_t tokens = 0;  // packed LLM tokens (text + image)
  int64_t loss_tokens = 0;
  // A model with a generator: the mean over the global batch's output
  // images of each image's mean squared error (0 without any), and their
  // count.
  double generation_loss = 0;
  int64_t generation_images = 0;
  double grad_norm = 0;  // before clipping
  double lr = 0;         // 0 when skipped
  bool skipped = false;  // !StepIsFinite(loss, grad_norm): no optimizer step
  double seconds = 0;
};

// The optimizer step shared by every trainer, local or distributed: clips
// `sets`' gradients to `clip_norm` given the global norm `grad_norm` (over
// every module of the model, wherever they live), then one AdamW step on each
// set at its module's (`modules`, one per set) learning rate for `step`
// (1-based; lr_schedule.h), decaying the tensors `options.weight_decay_scope`
// names (one AdamW call per run of tensors that decay alike). A set whose
// optimizer is sharded (ParamSet::ShardOptimizer) clips and steps its shard
// alone; its other weights come from their owners (an all-gather). Returns
// the scheduled adam.lr (train.lr's schedule: what a step reports).
// Each set steps where its optimizer runs (ParamSet::optimizer_on_device:
// the device's `ops`, else the host's); the caller then calls
// WeightsStepped.
double OptimizerStep(const std::vector<ParamSet*>& sets, const std::vector<Module>& modules,
                     const TrainOptions& options, int64_t step, double grad_norm,
                     Ops* ops = CpuOps());

// Σ g² over the gradients of `sets` (a module's part of the global norm),
// each where its optimizer reads them (`ops`: the device's).
double GradSumOfSquares(const std::vector<ParamSet*>& sets, Ops* ops = CpuOps());

class LocalTrainer {
 public:
  // `model` is not owned and must outlive the trainer.
  LocalTrainer(MultimodalModel* model, TrainOptions options);

  StepStats Step(const std::vector<Sample>& global_batch);

  // A held-out batch's loss: the sum over its loss tokens and their count,
  // through the same forward and backward as Step (the distributed workers'
  // path) but with no optimizer step; the gradients it leaves are dropped by
  // the next Step. The mean over a validation set is the sums' ratio.
  struct Evaluation {
    double loss_sum = 0;
    int64_t loss_tokens = 0;
    double generation_loss_sum = 0;  // over output images (drawn at step 0)
    int64_t generation_images = 0;
  };
  Evaluation Evaluate(const std::vector<Sample>& batch);

  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t step) { step_ = step; }

 private:
  MultimodalModel* model_;
  TrainOptions options_;
  int64_t step_ = 0;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_TRAIN_TRAINER_H_
