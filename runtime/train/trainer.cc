#include "runtime/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "runtime/base/log.h"

namespace loom {
namespace {

// The host gradients of `sets` whose optimizer runs on the host.
std::vector<kernels::GradSpan> HostSpans(const std::vector<ParamSet*>& sets) {
  std::vector<kernels::GradSpan> grads;
  for (ParamSet* p : sets) {
    if (!p->frozen() && !p->optimizer_on_device()) grads.push_back({p->grads().data(), p->size()});
  }
  return grads;
}

}  // namespace

double GradSumOfSquares(const std::vector<ParamSet*>& sets, Ops* ops) {
  double ss = kernels::sum_of_squares(HostSpans(sets));
  for (ParamSet* p : sets) {
    if (!p->frozen() && p->optimizer_on_device()) ss += p->OwnedGradSumOfSquares(ops, 0, p->size());
  }
  return ss;
}

LrScheduleOptions TrainOptions::Schedule() const {
  LrScheduleOptions o;
  o.schedule = lr_schedule;
  o.warmup_steps = warmup_steps;
  o.total_steps = total_steps;
  o.min_ratio = adam.lr > 0 ? min_lr / adam.lr : 0;
  return o;
}

double TrainOptions::PeakLr(Module m) const {
  const double own = m == Module::kEncoder     ? encoder_lr
                     : m == Module::kProjector ? projector_lr
                     : m == Module::kLlm       ? llm_lr
                                               : generator_lr;
  return own > 0 ? own : adam.lr;
}

double OptimizerStep(const std::vector<ParamSet*>& sets, const std::vector<Module>& modules,
                     const TrainOptions& options, int64_t step, double grad_norm, Ops* ops) {
  LOOM_CHECK(modules.size() == sets.size()) << "one module per parameter set";
  const float clip = kernels::ClipFactor(grad_norm, options.clip_norm);
  const double factor = LrFactor(options.Schedule(), step);
  for (size_t i = 0; i < sets.size(); ++i) {
    ParamSet* p = sets[i];
    if (p->frozen()) continue;  // no gradients, no AdamW state, no step
    // The device's kernels where the set steps there, the host's otherwise.
    Ops* where = p->optimizer_on_device() ? ops : CpuOps();
    LOOM_CHECK(where != nullptr) << "a set stepping on its device needs that device's ops";
    kernels::AdamWConfig adam = options.adam;
    adam.lr = static_cast<float>(options.PeakLr(modules[i]) * factor);
    ++p->step();
    // The set's optimizer shard (the whole set unless sharded); its moments
    // start there.
    const int64_t ob = p->optimizer_begin(), oe = p->optimizer_end();
    float* data = p->optimizer_data();
    float* grads = p->optimizer_grads();
    if (clip != 1.0f) where->scale(grads + ob, clip, oe - ob);
    for (const DecayRun& r : DecayRuns(*p, options.weight_decay_scope)) {
      const int64_t lo = std::max(r.offset, ob), hi = std::min(r.offset + r.numel, oe);
      if (lo >= hi) continue;
      kernels::AdamWConfig run = adam;
      if (!r.decay) run.weight_decay = 0.0f;
      where->adamw_update(data + lo, grads + lo, p->optimizer_m() + (lo - ob),
                          p->optimizer_v() + (lo - ob), hi - lo, run, p->step());
    }
  }
  return static_cast<float>(options.adam.lr * factor);
}

LocalTrainer::LocalTrainer(MultimodalModel* model, TrainOptions options)
    : model_(model), options_(options) {
  LOOM_CHECK(options_.microbatches >= 1) << "microbatches must be >= 1";
}

LocalTrainer::Evaluation LocalTrainer::Evaluate(const std::vector<Sample>& batch) {
  Evaluation e;
  for (const Sample& s : batch) {
    e.loss_tokens += LossTokens(s);
    e.generation_images += s.num_gen_images;
  }
  LOOM_CHECK(e.loss_tokens > 0) << "validation batch has no loss tokens";
  const float scale = 1.0f / static_cast<float>(e.loss_tokens);
  model_->set_generation_draws(options_.seed, 0);  // the same draws at every evaluation
  model_->ZeroGrad();
  const int M = std::min<int>(options_.microbatches, static_cast<int>(batch.size()));
  for (int m = 0; m < M; ++m) {
    const size_t begin = batch.size() * m / M, end = batch.size() * (m + 1) / M;
    std::vector<const Sample*> mb;
    for (size_t i = begin; i < end; ++i) mb.push_back(&batch[i]);
    e.loss_sum += model_->ForwardBackward(mb, scale).sum;
    e.generation_loss_sum += model_->generation_loss_sum();
  }
  return e;
}

StepStats LocalTrainer::Step(const std::vector<Sample>& batch) {
  const auto t0 = std::chrono::steady_clock::now();
  StepStats st;
  st.step = ++step_;
  st.samples = static_cast<int64_t>(batch.size());
  for (const Sample& s : batch) {
    st.loss_tokens += LossTokens(s);
    st.tokens += static_cast<int64_t>(s.tokens.size());
    st.generation_images += s.num_gen_images;
  }
  LOOM_CHECK(st.loss_tokens > 0) << "global batch has no loss tokens";
  const float scale = 1.0f / static_cast<float>(st.loss_tokens);
  const float gen_scale = st.generation_images > 0
                              ? static_cast<float>(options_.generation_weight /
                                                   static_cast<double>(st.generation_images))
                              : 0.0f;
  model_->set_generation_draws(options_.seed, step_);

  model_->ZeroGrad();
  const int M = std::min<int>(options_.microbatches, static_cast<int>(batch.size()));
  double loss_sum = 0, gen_sum = 0;
  for (int m = 0; m < M; ++m) {
    const size_t begin = batch.size() * m / M, end = batch.size() * (m + 1) / M;
    std::vector<const Sample*> mb;
    for (size_t i = begin; i < end; ++i) mb.push_back(&batch[i]);
    loss_sum += model_->ForwardBackward(mb, scale, gen_scale).sum;
    gen_sum += model_->generation_loss_sum();
  }
  st.loss = loss_sum / static_cast<double>(st.loss_tokens);
  if (st.generation_images > 0) {
    st.generation_loss = gen_sum / static_cast<double>(st.generation_images);
  }

  // The optimizer runs where the parameters live (ParamSet::Place: on a
  // GPU, the norm, clipping and AdamW run there, with no host round trip).
  const std::vector<ParamSet*> sets = model_->param_sets();
  st.grad_norm = std::sqrt(GradSumOfSquares(sets, model_->ops()));
  st.skipped = !StepIsFinite(st.loss + st.generation_loss, st.grad_norm);
  if (!st.skipped) {
    st.lr = OptimizerStep(sets, model_->param_set_modules(), options_, step_, st.grad_norm,
                          model_->ops());
    for (ParamSet* p : sets) {
      if (!p->frozen()) p->WeightsStepped(model_->ops());
    }
  }
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace loom
