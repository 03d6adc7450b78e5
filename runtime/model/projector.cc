#include "runtime/model/projector.h"

namespace loom {

Projector::Projector(const ModelConfig& c, Ops* ops)
    : config_(c), ops_(ops), x_(ops->backend()), h_(ops->backend()), g_(ops->backend()) {
  const int64_t H = c.projector.hidden, D = c.llm.dim;
  fc1_w_ = params_.Add("fc1.weight", {H, in_dim()}, Init::kNormal, 0.02f);
  fc1_b_ = params_.Add("fc1.bias", {H}, Init::kZeros);
  fc2_w_ = params_.Add("fc2.weight", {D, H}, Init::kNormal, 0.02f);
  fc2_b_ = params_.Add("fc2.bias", {D}, Init::kZeros);
  params_.Finalize();
}

int Projector::in_dim() const {
  return config_.projector.pixel_shuffle ? 4 * config_.vit.dim : config_.vit.dim;
}

void Projector::Forward(const float* in, int N, float* out) {
  const ModelConfig& c = config_;
  const int T = N * c.tokens_per_tile(), H = c.projector.hidden, Din = in_dim();
  N_ = N;
  x_.resize(static_cast<size_t>(N) * c.vit.patches_per_tile() * c.vit.dim);
  ops_->copy(x_.data(), in, static_cast<int64_t>(x_.size()));
  if (c.projector.pixel_shuffle) {
    Buffer<float> shuffled(ops_->backend());
    shuffled.resize(x_.size());
    ops_->pixel_shuffle_forward(shuffled.data(), x_.data(), N, c.vit.grid(), c.vit.dim);
    x_.swap(shuffled);
  }
  h_.resize(static_cast<size_t>(T) * H);
  ops_->linear_forward(h_.data(), x_.data(), params_.weight(fc1_w_), params_.param(fc1_b_), T, Din,
                       H);
  g_.resize(h_.size());
  ops_->activation_forward(c.projector.act, g_.data(), h_.data(), static_cast<int64_t>(h_.size()));
  ops_->linear_forward(out, g_.data(), params_.weight(fc2_w_), params_.param(fc2_b_), T, H,
                       c.llm.dim);
}

void Projector::Backward(const float* dout, float* din) {
  const ModelConfig& c = config_;
  const int T = N_ * c.tokens_per_tile(), H = c.projector.hidden, Din = in_dim();
  Buffer<float> dg(ops_->backend()), dh(ops_->backend()), dx(ops_->backend());
  dg.Zeros(g_.size());
  dh.Zeros(g_.size());
  dx.Zeros(x_.size());
  ops_->linear_backward(dg.data(), params_.grad(fc2_w_), params_.grad(fc2_b_), dout, g_.data(),
                        params_.weight(fc2_w_), T, H, c.llm.dim);
  ops_->activation_backward(c.projector.act, dh.data(), h_.data(), dg.data(),
                            static_cast<int64_t>(dh.size()));
  ops_->linear_backward(din == nullptr ? nullptr : dx.data(), params_.grad(fc1_w_),
                        params_.grad(fc1_b_), dh.data(), x_.data(), params_.weight(fc1_w_), T, Din,
                        H);
  if (din == nullptr) return;  // a frozen encoder before it: no input gradient
  if (c.projector.pixel_shuffle) {
    ops_->pixel_shuffle_backward(din, dx.data(), N_, c.vit.grid(), c.vit.dim);
  } else {
    ops_->add(din, dx.data(), static_cast<int64_t>(dx.size()));
  }
}

SavedActivations Projector::Detach() {
  SavedActivations saved;
  saved.scalar = N_;
  saved.Take({{&x_, &h_, &g_}, {}, {}});
  N_ = 0;
  return saved;
}

void Projector::Attach(SavedActivations* saved) {
  saved->Restore({{&x_, &h_, &g_}, {}, {}});
  N_ = static_cast<int>(saved->scalar);
}

}  // namespace loom
