#include "runtime/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "runtime/base/log.h"

namespace loom {
namespace {

std::vector<kernels::GradSpan> Spans(const std::vector<ParamSet*>& sets) {
  std::vector<kernels::GradSpan> grads;
  for (ParamSet* p : sets) {
    if (!p->frozen()) grads.push_back({p->grads().data(), p->size()});
  }
  return grads;
}

}  // namespace

double GradSumOfSquares(const std::vector<ParamSet*>& sets) {
  return kernels::sum_of_squares(Spans(sets));
}

double OptimizerStep(const std::vector<ParamSet*>& sets, const TrainOptions& options, int64_t step,
                     double grad_norm) {
  kernels::clip_to_norm(Spans(sets), grad_norm, options.clip_norm);
  kernels::AdamWConfig adam = options.adam;
  if (options.warmup_steps > 0 && step <= options.warmup_steps) {
    adam.lr *= static_cast<float>(step) / static_cast<float>(options.warmup_steps);
  }
  for (ParamSet* p : sets) {
    if (p->frozen()) continue;  // no gradients, no AdamW state, no step
    ++p->step();
    for (const DecayRun& r : DecayRuns(*p, options.weight_decay_scope)) {
      kernels::AdamWConfig run = adam;
      if (!r.decay) run.weight_decay = 0.0f;
      kernels::adamw_update(p->data().data() + r.offset, p->grads().data() + r.offset,
                            p->adam_m().data() + r.offset, p->adam_v().data() + r.offset, r.numel,
                            run, p->step());
    }
  }
  return adam.lr;
}

LocalTrainer::LocalTrainer(MultimodalModel* model, TrainOptions options)
    : model_(model), options_(options) {
  LOOM_CHECK(options_.microbatches >= 1) << "microbatches must be >= 1";
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
    st.lr = OptimizerStep(model_->param_sets(), options_, step_, st.grad_norm);
    model_->PushData();
  }
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace loom
