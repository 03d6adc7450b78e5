#include "runtime/model/llm.h"

#include <cmath>
#include <cstring>

#include "kernels/activation/activation.h"
#include "kernels/attention/attention.h"
#include "kernels/embedding/embedding.h"
#include "kernels/matmul/matmul.h"
#include "kernels/norm/norm.h"
#include "kernels/rope/rope.h"
#include "runtime/base/log.h"

namespace loom {

using namespace kernels;  // NOLINT

int LlmBatch::image_positions() const {
  int n = 0;
  for (int32_t t : tokens) n += t < 0;
  return n;
}

Llm::Llm(const LlmConfig& c) : config_(c) {
  const int64_t D = c.dim, F = c.ffn_hidden, V = c.vocab;
  const float std = 0.02f, proj_std = 0.02f / std::sqrt(2.0f * std::max(1, c.layers));
  wte_ = params_.Add("wte", {V, D}, Init::kNormal, std);
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    LayerIds id;
    id.rms1 = params_.Add(p + "attn_norm.weight", {D}, Init::kOnes);
    id.qkv = params_.Add(p + "attn.qkv.weight", {3 * D, D}, Init::kNormal, std);
    id.proj = params_.Add(p + "attn.proj.weight", {D, D}, Init::kNormal, proj_std);
    id.rms2 = params_.Add(p + "mlp_norm.weight", {D}, Init::kOnes);
    id.gate = params_.Add(p + "mlp.gate.weight", {F, D}, Init::kNormal, std);
    id.up = params_.Add(p + "mlp.up.weight", {F, D}, Init::kNormal, std);
    id.down = params_.Add(p + "mlp.down.weight", {D, F}, Init::kNormal, proj_std);
    ids_.push_back(id);
  }
  rmsf_ = params_.Add("norm.weight", {D}, Init::kOnes);
  lm_head_ = params_.Add("lm_head.weight", {V, D}, Init::kNormal, std);
  params_.Finalize();
  acts_.resize(c.layers);
}

void Llm::Forward(const LlmBatch& b, const float* image_emb) {
  const LlmConfig& c = config_;
  const int T = b.T(), D = c.dim, F = c.ffn_hidden, V = c.vocab, NH = c.heads, HD = D / NH;
  LOOM_CHECK(b.targets.size() == b.tokens.size() && b.positions.size() == b.tokens.size())
      << "LlmBatch: tokens, targets and positions differ in length";
  LOOM_CHECK(!b.cu_seqlens.empty() && b.cu_seqlens.front() == 0 && b.cu_seqlens.back() == T)
      << "LlmBatch: cu_seqlens must run from 0 to T";
  batch_ = &b;
  const size_t TD = static_cast<size_t>(T) * D;
  std::vector<float> x(TD, 0.0f);
  embedding_forward(x.data(), b.tokens.data(), params_.param(wte_), T, D);
  int img = 0;
  for (int t = 0; t < T; ++t) {
    if (b.tokens[t] >= 0) continue;
    LOOM_CHECK(image_emb != nullptr) << "image positions but no image embeddings";
    std::memcpy(x.data() + static_cast<size_t>(t) * D, image_emb + static_cast<size_t>(img++) * D,
                sizeof(float) * D);
  }
  const int64_t att_size = attention_att_size(b.cu_seqlens.data(), b.S(), NH);
  for (int l = 0; l < c.layers; ++l) {
    const LayerIds& id = ids_[l];
    LayerActs& a = acts_[l];
    a.x = x;
    a.r1.resize(TD);
    a.rr1.resize(T);
    rmsnorm_forward(a.r1.data(), a.rr1.data(), a.x.data(), params_.param(id.rms1), T, D);
    a.qkv.resize(3 * TD);
    matmul_forward(a.qkv.data(), a.r1.data(), params_.param(id.qkv), nullptr, T, D, 3 * D);
    rope_forward(a.qkv.data(), b.positions.data(), T, NH, HD, c.rope_theta);
    a.att.resize(att_size);
    a.atto.resize(TD);
    attention_forward(a.atto.data(), a.att.data(), a.qkv.data(), b.cu_seqlens.data(), b.S(), NH, HD,
                      /*causal=*/true);
    a.x1.resize(TD);
    matmul_forward(a.x1.data(), a.atto.data(), params_.param(id.proj), nullptr, T, D, D);
    for (size_t i = 0; i < TD; ++i) a.x1[i] += a.x[i];
    a.r2.resize(TD);
    a.rr2.resize(T);
    rmsnorm_forward(a.r2.data(), a.rr2.data(), a.x1.data(), params_.param(id.rms2), T, D);
    const size_t TF = static_cast<size_t>(T) * F;
    a.gate.resize(TF);
    a.up.resize(TF);
    a.s.resize(TF);
    matmul_forward(a.gate.data(), a.r2.data(), params_.param(id.gate), nullptr, T, D, F);
    matmul_forward(a.up.data(), a.r2.data(), params_.param(id.up), nullptr, T, D, F);
    swiglu_forward(a.s.data(), a.gate.data(), a.up.data(), static_cast<int64_t>(TF));
    matmul_forward(x.data(), a.s.data(), params_.param(id.down), nullptr, T, F, D);
    for (size_t i = 0; i < TD; ++i) x[i] += a.x1[i];
  }
  xf_ = x;
  rf_.resize(TD);
  rrf_.resize(T);
  rmsnorm_forward(rf_.data(), rrf_.data(), xf_.data(), params_.param(rmsf_), T, D);
  logits_.resize(static_cast<size_t>(T) * V);
  matmul_forward(logits_.data(), rf_.data(), params_.param(lm_head_), nullptr, T, D, V);
}

LossSum Llm::Loss() const {
  return crossentropy_forward(logits_.data(), batch_->targets.data(), batch_->T(), config_.vocab);
}

LossSum Llm::Backward(float grad_scale, float* dimage_emb) {
  const LlmConfig& c = config_;
  const LlmBatch& b = *batch_;
  const int T = b.T(), D = c.dim, F = c.ffn_hidden, V = c.vocab, NH = c.heads, HD = D / NH;
  const size_t TD = static_cast<size_t>(T) * D, TF = static_cast<size_t>(T) * F;

  std::vector<float> dlogits(static_cast<size_t>(T) * V);
  LossSum loss = crossentropy_forward_backward(dlogits.data(), logits_.data(), b.targets.data(), T,
                                               V, grad_scale);
  std::vector<float> dtmp(TD, 0.0f), dx(TD, 0.0f);
  matmul_backward(dtmp.data(), params_.grad(lm_head_), nullptr, dlogits.data(), rf_.data(),
                  params_.param(lm_head_), T, D, V);
  rmsnorm_backward(dx.data(), params_.grad(rmsf_), dtmp.data(), xf_.data(), params_.param(rmsf_),
                   rrf_.data(), T, D);
  std::vector<float> ds, dgate, dup, dqkv;
  for (int l = c.layers - 1; l >= 0; --l) {
    const LayerIds& id = ids_[l];
    const LayerActs& a = acts_[l];
    ds.assign(TF, 0.0f);
    matmul_backward(ds.data(), params_.grad(id.down), nullptr, dx.data(), a.s.data(),
                    params_.param(id.down), T, F, D);
    dgate.assign(TF, 0.0f);
    dup.assign(TF, 0.0f);
    swiglu_backward(dgate.data(), dup.data(), a.gate.data(), a.up.data(), ds.data(),
                    static_cast<int64_t>(TF));
    dtmp.assign(TD, 0.0f);
    matmul_backward(dtmp.data(), params_.grad(id.gate), nullptr, dgate.data(), a.r2.data(),
                    params_.param(id.gate), T, D, F);
    matmul_backward(dtmp.data(), params_.grad(id.up), nullptr, dup.data(), a.r2.data(),
                    params_.param(id.up), T, D, F);
    rmsnorm_backward(dx.data(), params_.grad(id.rms2), dtmp.data(), a.x1.data(),
                     params_.param(id.rms2), a.rr2.data(), T, D);
    dtmp.assign(TD, 0.0f);
    matmul_backward(dtmp.data(), params_.grad(id.proj), nullptr, dx.data(), a.atto.data(),
                    params_.param(id.proj), T, D, D);
    dqkv.assign(3 * TD, 0.0f);
    attention_backward(dqkv.data(), dtmp.data(), a.qkv.data(), a.att.data(), b.cu_seqlens.data(),
                       b.S(), NH, HD, /*causal=*/true);
    rope_backward(dqkv.data(), b.positions.data(), T, NH, HD, c.rope_theta);
    dtmp.assign(TD, 0.0f);
    matmul_backward(dtmp.data(), params_.grad(id.qkv), nullptr, dqkv.data(), a.r1.data(),
                    params_.param(id.qkv), T, D, 3 * D);
    rmsnorm_backward(dx.data(), params_.grad(id.rms1), dtmp.data(), a.x.data(),
                     params_.param(id.rms1), a.rr1.data(), T, D);
  }
  embedding_backward(params_.grad(wte_), dx.data(), b.tokens.data(), T, D);
  if (dimage_emb != nullptr) {
    int img = 0;
    for (int t = 0; t < T; ++t) {
      if (b.tokens[t] >= 0) continue;
      float* d = dimage_emb + static_cast<size_t>(img++) * D;
      const float* g = dx.data() + static_cast<size_t>(t) * D;
      for (int k = 0; k < D; ++k) d[k] += g[k];
    }
  }
  return loss;
}

}  // namespace loom
