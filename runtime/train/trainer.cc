#include "runtime/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "runtime/base/log.h"

namespace loom {
namespace {

// The gradients each set steps: its optimizer shard (the whole set unless
// sharded).
std::vector<kernels::GradSpan> Spans(const std::vector<ParamSet*>& sets) {
  std::vector<kernels::GradSpan> grads;
  for (ParamSet* p : sets) {
    if (p->frozen()) continue;
    grads.push_back(
        {p->grads().data() + p->optimizer_begin(), p->optimizer_end() - p->optimizer_begin()});
  }
  return grads;
}

}  // namespace

double GradSumOfSquares(const std::vector<ParamSet*>& sets) {
  return kernels::sum_of_squares(Spans(sets));
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
                                               : llm_lr;
  return own > 0 ? own : adam.lr;
}

double OptimizerStep(const std::vector<ParamSet*>& sets, const std::vector<Module>& modules,
                     const TrainOptions& options, int64_t step, double grad_norm) {
  LOOM_CHECK(modules.size() == sets.size()) << "one module per parameter set";
  kernels::clip_to_norm(Spans(sets), grad_norm, options.clip_norm);
  const double factor = LrFactor(options.Schedule(), step);
  for (size_t i = 0; i < sets.size(); ++i) {
    ParamSet* p = sets[i];
    if (p->frozen()) continue;  // no gradients, no AdamW state, no step
    kernels::AdamWConfig adam = options.adam;
    adam.lr = static_cast<float>(options.PeakLr(modules[i]) * factor);
    ++p->step();
    // The runs within the set's optimizer shard; its moments start there.
    const int64_t ob = p->optimizer_begin(), oe = p->optimizer_end();
    for (const DecayRun& r : DecayRuns(*p, options.weight_decay_scope)) {
      const int64_t lo = std::max(r.offset, ob), hi = std::min(r.offset + r.numel, oe);
      if (lo >= hi) continue;
      kernels::AdamWConfig run = adam;
      if (!r.decay) run.weight_decay = 0.0f;
      kernels::adamw_update(p->data().data() + lo, p->grads().data() + lo,
                            p->adam_m().data() + (lo - ob), p->adam_v().data() + (lo - ob), hi - lo,
                            run, p->step());
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
  for (const Sample& s : batch) e.loss_tokens += LossTokens(s);
  LOOM_CHECK(e.loss_tokens > 0) << "validation batch has no loss tokens";
  const float scale = 1.0f / static_cast<float>(e.loss_tokens);
  model_->ZeroGrad();
  const int M = std::min<int>(options_.microbatches, static_cast<int>(batch.size()));
  for (int m = 0; m < M; ++m) {
    const size_t begin = batch.size() * m / M, end = batch.size() * (m + 1) / M;
    std::vector<const Sample*> mb;
    for (size_t i = begin; i < end; ++i) mb.push_back(&batch[i]);
    e.loss_sum += model_->ForwardBackward(mb, scale).sum;
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
  }
  LOOM_CHECK(st.loss_tokens > 0) << "global batch has no loss tokens";
  const float scale = 1.0f / static_cast<float>(st.loss_tokens);

  model_->ZeroGrad();
  const int M = std::min<int>(options_.microbatches, static_cast<int>(batch.size()));
  double loss_sum = 0;
  for (int m = 0; m < M; ++m) {
    const size_t begin = batch.size() * m / M, end = batch.size() * (m + 1) / M;
    std::vector<const Sample*> mb;
    for (size_t i = begin; i < end; ++i) mb.push_back(&batch[i]);
    loss_sum += model_->ForwardBackward(mb, scale).sum;
  }
  st.loss = loss_sum / static_cast<double>(st.loss_tokens);

  // The optimizer runs on the host copies (a model on a GPU: its gradients
  // come back, its new weights go out).
  model_->PullGrads();
  st.grad_norm = std::sqrt(GradSumOfSquares(model_->param_sets()));
  st.skipped = !StepIsFinite(st.loss, st.grad_norm);
  if (!st.skipped) {
    st.lr =
        OptimizerStep(model_->param_sets(), {Module::kEncoder, Module::kProjector, Module::kLlm},
                      options_, step_, st.grad_norm);
    model_->PushData();
  }
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace loom
