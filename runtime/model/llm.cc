#include "runtime/model/llm.h"

#include <cmath>

#include "runtime/base/log.h"
#include "runtime/parallel/tensor_parallel.h"

namespace loom {

using kernels::LossSum;
using parallel::AllReduceTp;

int LlmBatch::image_positions() const {
  int n = 0;
  for (int32_t t : tokens) n += t == kImageToken;
  return n;
}

int LlmBatch::query_positions() const {
  int n = 0;
  for (int32_t t : tokens) n += t == kQueryToken;
  return n;
}

Llm::Llm(const LlmConfig& c, Communicator* tp, LayerRange layers, Ops* ops)
    : config_(c), tp_(tp), ops_(ops), params_(ShardOf(tp)) {
  first_ = layers.first;
  last_ = layers.last < 0 ? c.layers : layers.last;
  LOOM_CHECK(first_ >= 0 && first_ <= last_ && last_ <= c.layers)
      << "LLM layers [" << first_ << ", " << last_ << ") of " << c.layers;
  const TpShard shard = params_.shard();
  LOOM_CHECK(c.heads % shard.size == 0 && c.kv() % shard.size == 0 &&
             c.ffn_hidden % shard.size == 0 && c.vocab % shard.size == 0)
      << "LLM heads " << c.heads << ", kv_heads " << c.kv() << ", ffn_hidden " << c.ffn_hidden
      << ", vocab " << c.vocab << " in " << shard.size << " TP parts";
  LOOM_CHECK(!c.tie_embeddings || first_ == 0 || last_ < c.layers)
      << "tied embeddings need the first and last layers in one stage";
  heads_ = c.heads / shard.size;
  kv_heads_ = c.kv() / shard.size;
  ffn_ = c.ffn_hidden / shard.size;
  vocab_ = c.vocab / shard.size;
  vocab_start_ = shard.rank * vocab_;
  const std::vector<float> inv_freq = RopeInvFreq(c);
  inv_freq_.set_backend(ops_->backend());
  inv_freq_.CopyFromHost(inv_freq.data(), inv_freq.size());
  const int64_t D = c.dim, F = c.ffn_hidden, V = c.vocab, A = int64_t{c.heads} * c.hd(),
                QKV = c.qkv_rows();
  const float std = 0.02f, proj_std = 0.02f / std::sqrt(2.0f * std::max(1, c.layers));
  if (first_stage()) wte_ = params_.Add("wte", {V, D}, Init::kNormal, std, Split::kRows);
  if (first_stage() && c.gen_queries > 0) {
    queries_ = params_.Add("gen_queries", {c.gen_queries, D}, Init::kNormal, std);
  }
  for (int l = first_; l < last_; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    LayerIds id;
    id.rms1 = params_.Add(p + "attn_norm.weight", {D}, Init::kOnes);
    id.qkv = params_.Add(p + "attn.qkv.weight", {QKV, D}, Init::kNormal, std, Split::kQkvRows, A);
    if (c.qkv_bias) {
      id.qkv_b = params_.Add(p + "attn.qkv.bias", {QKV}, Init::kZeros, 0.0f, Split::kQkvRows, A);
    }
    id.proj = params_.Add(p + "attn.proj.weight", {D, A}, Init::kNormal, proj_std, Split::kCols);
    id.rms2 = params_.Add(p + "mlp_norm.weight", {D}, Init::kOnes);
    id.gate = params_.Add(p + "mlp.gate.weight", {F, D}, Init::kNormal, std, Split::kRows);
    id.up = params_.Add(p + "mlp.up.weight", {F, D}, Init::kNormal, std, Split::kRows);
    id.down = params_.Add(p + "mlp.down.weight", {D, F}, Init::kNormal, proj_std, Split::kCols);
    ids_.push_back(id);
  }
  if (last_stage()) {
    rmsf_ = params_.Add("norm.weight", {D}, Init::kOnes);
    lm_head_ = c.tie_embeddings
                   ? wte_
                   : params_.Add("lm_head.weight", {V, D}, Init::kNormal, std, Split::kRows);
  }
  params_.Finalize();
  acts_.resize(ids_.size());
  for (LayerActs& a : acts_) a.Bind(ops_->backend());
  work_.Bind(ops_->backend());
  stash_.resize(ids_.size());
  for (ActivationStash& st : stash_) st.Bind(ops_->backend());
  for (Buffer<float>* b : {&xf_, &rf_, &rrf_, &logits_, &query_states_}) {
    b->set_backend(ops_->backend());
  }
  for (Buffer<int32_t>* b : {&tokens_, &targets_, &positions_, &cu_, &image_rows_, &query_rows_}) {
    b->set_backend(ops_->backend());
  }
}

absl::Status Llm::Forward(const LlmBatch& b, const float* image_emb, const float* input) {
  const LlmConfig& c = config_;
  const bool narrow = params_.precision() == Precision::kBf16;  // ActivationStash
  // Per rank: NH heads (D = NH * HD of attention width), F FFN units, V
  // vocabulary rows; the residual stream (T, C) is whole on every rank.
  const int T = b.T(), C = c.dim, HD = c.hd(), NH = heads_, NKV = kv_heads_, D = NH * HD,
            W = (NH + 2 * NKV) * HD, F = ffn_, V = vocab_;
  const float eps = c.rms_norm_eps;
  LOOM_CHECK(b.targets.size() == b.tokens.size() && b.positions.size() == b.tokens.size())
      << "LlmBatch: tokens, targets and positions differ in length";
  LOOM_CHECK(!b.cu_seqlens.empty() && b.cu_seqlens.front() == 0 && b.cu_seqlens.back() == T)
      << "LlmBatch: cu_seqlens must run from 0 to T";
  batch_ = &b;
  // The batch where the kernels read it.
  tokens_.CopyFromHost(b.tokens.data(), b.tokens.size());
  targets_.CopyFromHost(b.targets.data(), b.targets.size());
  positions_.CopyFromHost(b.positions.data(), b.positions.size());
  cu_.CopyFromHost(b.cu_seqlens.data(), b.cu_seqlens.size());
  const size_t TC = static_cast<size_t>(T) * C, TD = static_cast<size_t>(T) * D;
  // The query positions: Q per output image, in order.
  std::vector<int32_t> qrows;
  for (int t = 0; t < T; ++t) {
    if (b.tokens[t] == kQueryToken) qrows.push_back(t);
  }
  const int Q = c.gen_queries, nq = static_cast<int>(qrows.size());
  LOOM_CHECK(nq == 0 || (Q > 0 && nq % Q == 0))
      << nq << " query positions; the LLM has " << Q << " per output image";
  query_rows_.CopyFromHost(qrows.data(), qrows.size());
  Buffer<float> x(ops_->backend());
  x.Zeros(TC);
  if (!first_stage()) {
    LOOM_CHECK(input != nullptr) << "a later pipeline stage needs the previous stage's output";
    ops_->copy(x.data(), input, static_cast<int64_t>(TC));
  } else {
    if (absl::Status s = parallel::VocabParallelEmbeddingForward(
            ops_, tp_, x.data(), tokens_.data(), params_.param(wte_), T, C, vocab_start_, V);
        !s.ok()) {
      return s;
    }
    // The image embeddings into their rows, in one launch.
    std::vector<int32_t> rows;
    for (int t = 0; t < T; ++t) {
      if (b.tokens[t] == kImageToken) rows.push_back(t);
    }
    image_rows_.resize(0);
    if (!rows.empty()) {
      LOOM_CHECK(image_emb != nullptr) << "image positions but no image embeddings";
      image_rows_.CopyFromHost(rows.data(), rows.size());
      ops_->scatter_rows(x.data(), image_emb, image_rows_.data(), static_cast<int>(rows.size()), C);
    }
    // Each output image's query rows take the learned queries.
    if (nq > 0) {
      Buffer<float> q(ops_->backend());
      q.resize(static_cast<size_t>(nq) * C);
      for (int k = 0; k < nq / Q; ++k) {
        ops_->copy(q.data() + static_cast<size_t>(k) * Q * C, params_.param(queries_),
                   static_cast<int64_t>(Q) * C);
      }
      ops_->scatter_rows(x.data(), q.data(), query_rows_.data(), nq, C);
    }
  }
  // Sequence parallelism: R rows of the stream on this rank between the TP
  // layers, Tf rows through them (T, or T padded to the group's multiple).
  parallel::SequenceStream stream(ops_, tp_, T, C, sequence_parallel_);
  const int R = stream.rows(), Tf = stream.layer_rows();
  const size_t RC = static_cast<size_t>(R) * C;
  stream.Shard(&x);
  for (size_t l = 0; l < ids_.size(); ++l) {
    const LayerIds& id = ids_[l];
    LayerActs& a = narrow ? work_ : acts_[l];
    a.x.CopyFrom(x);
    a.r1.resize(RC);
    a.rr1.resize(R);
    ops_->rmsnorm_forward(a.r1.data(), a.rr1.data(), a.x.data(), params_.param(id.rms1), R, C, eps);
    absl::StatusOr<const float*> in = stream.Gathered(a.r1.data());
    if (!in.ok()) return in.status();
    const size_t TfW = static_cast<size_t>(Tf) * W;
    a.qkv.resize(TfW);
    ops_->linear_forward(a.qkv.data(), *in, params_.weight(id.qkv),
                         id.qkv_b >= 0 ? params_.param(id.qkv_b) : nullptr, Tf, C, W);
    if (selective_ && !narrow) a.r1.Release();  // Backward computes it again
    ops_->rope_forward(a.qkv.data(), positions_.data(), inv_freq_.data(), T, NH, NKV, HD);
    // Attention's backward recomputes the scores from the q and k it keeps:
    // under bf16 those are bf16, so the forward takes them so too (else
    // the kept log-sum-exp would not be the recomputed scores').
    if (narrow) ops_->round_to_bf16(a.qkv.data(), static_cast<int64_t>(TfW));
    a.lse.resize(static_cast<size_t>(T) * NH);  // each row's log-sum-exp
    a.atto.resize(static_cast<size_t>(Tf) * D);
    if (Tf > T) {  // the padding rows (sequence parallelism) stay 0
      ops_->zero(a.atto.data() + TD, static_cast<int64_t>(Tf - T) * D);
    }
    ops_->attention_forward(a.atto.data(), a.lse.data(), a.qkv.data(), cu_.data(), b.S(), T, NH,
                            NKV, HD, /*causal=*/true, narrow);
    a.x1.resize(RC);
    if (absl::Status s =
            stream.RowParallel(a.x1.data(), a.atto.data(), params_.weight(id.proj), nullptr, D);
        !s.ok()) {
      return s;
    }
    ops_->add(a.x1.data(), a.x.data(), static_cast<int64_t>(RC));
    a.r2.resize(RC);
    a.rr2.resize(R);
    ops_->rmsnorm_forward(a.r2.data(), a.rr2.data(), a.x1.data(), params_.param(id.rms2), R, C,
                          eps);
    in = stream.Gathered(a.r2.data());
    if (!in.ok()) return in.status();
    const size_t TF = static_cast<size_t>(Tf) * F;
    a.gate.resize(TF);
    a.up.resize(TF);
    a.s.resize(TF);
    ops_->linear_forward(a.gate.data(), *in, params_.weight(id.gate), nullptr, Tf, C, F);
    ops_->linear_forward(a.up.data(), *in, params_.weight(id.up), nullptr, Tf, C, F);
    if (selective_ && !narrow) a.r2.Release();
    ops_->swiglu_forward(a.s.data(), a.gate.data(), a.up.data(), static_cast<int64_t>(TF));
    if (absl::Status s =
            stream.RowParallel(x.data(), a.s.data(), params_.weight(id.down), nullptr, F);
        !s.ok()) {
      return s;
    }
    if (selective_ && !narrow) a.s.Release();
    ops_->add(x.data(), a.x1.data(), static_cast<int64_t>(RC));
    if (narrow) stash_[l].Pack(ops_, a.Narrow(selective_), a.Kept());
  }
  if (absl::Status s = stream.Unshard(&x); !s.ok()) return s;  // the stage's output whole
  xf_.swap(x);
  if (!last_stage()) return absl::OkStatus();
  rf_.resize(TC);
  rrf_.resize(T);
  ops_->rmsnorm_forward(rf_.data(), rrf_.data(), xf_.data(), params_.param(rmsf_), T, C, eps);
  query_states_.Zeros(static_cast<size_t>(nq) * C);
  if (nq > 0) ops_->gather_add_rows(query_states_.data(), rf_.data(), query_rows_.data(), nq, C);
  logits_.resize(static_cast<size_t>(T) * V);
  ops_->linear_forward(logits_.data(), rf_.data(), params_.weight(lm_head_), nullptr, T, C, V);
  return absl::OkStatus();
}

SavedActivations::Lists Llm::ForwardState() {
  SavedActivations::Lists l;
  l.floats = {&xf_, &rf_, &rrf_, &logits_, &query_states_};
  for (LayerActs& a : acts_) {
    for (Buffer<float>* b : a.All()) l.floats.push_back(b);
  }
  l.ints = {&tokens_, &targets_, &positions_, &cu_, &image_rows_, &query_rows_};
  for (ActivationStash& st : stash_) l.stashes.push_back(&st);
  return l;
}

SavedActivations Llm::Detach() {
  SavedActivations saved;
  saved.pointer = batch_;
  saved.Take(ForwardState());
  batch_ = nullptr;
  return saved;
}

void Llm::Attach(SavedActivations* saved) {
  saved->Restore(ForwardState());
  batch_ = static_cast<const LlmBatch*>(saved->pointer);
}

absl::StatusOr<LossSum> Llm::Loss() const {
  LOOM_CHECK(last_stage()) << "the loss is on the last pipeline stage";
  return parallel::VocabParallelCrossEntropy(ops_, tp_, logits_.data(), targets_.data(),
                                             batch_->T(), vocab_, vocab_start_, 0.0f, nullptr);
}

absl::StatusOr<LossSum> Llm::Backward(float grad_scale, float* dimage_emb, const float* doutput,
                                      float* dinput, const float* dquery) {
  const LlmConfig& c = config_;
  const bool narrow = params_.precision() == Precision::kBf16;  // ActivationStash
  const LlmBatch& b = *batch_;
  const int T = b.T(), C = c.dim, HD = c.hd(), NH = heads_, NKV = kv_heads_, D = NH * HD,
            W = (NH + 2 * NKV) * HD, F = ffn_, V = vocab_;
  const size_t TC = static_cast<size_t>(T) * C;

  // Each column-parallel layer's input gradient is a partial sum over the
  // TP group: f's all-reduce completes it before the norm below it.
  Buffer<float> dtmp(ops_->backend()), dx(ops_->backend());
  dtmp.Zeros(TC);
  dx.Zeros(TC);
  absl::StatusOr<LossSum> loss = LossSum{};
  if (last_stage()) {
    Buffer<float> dlogits(ops_->backend());
    dlogits.resize(static_cast<size_t>(T) * V);
    loss = parallel::VocabParallelCrossEntropy(ops_, tp_, logits_.data(), targets_.data(), T, V,
                                               vocab_start_, grad_scale, dlogits.data());
    if (!loss.ok()) return loss.status();
    ops_->linear_backward(dtmp.data(), params_.grad(lm_head_), nullptr, dlogits.data(), rf_.data(),
                          params_.weight(lm_head_), T, C, V);
    if (absl::Status s = AllReduceTp(tp_, dtmp.data(), TC); !s.ok()) return s;
    // The generator's gradient at the query rows (whole on every TP rank).
    const int nq = static_cast<int>(query_rows_.size());
    if (dquery != nullptr && nq > 0) {
      Buffer<float> rows(ops_->backend());
      rows.Zeros(TC);
      ops_->scatter_rows(rows.data(), dquery, query_rows_.data(), nq, C);
      ops_->add(dtmp.data(), rows.data(), static_cast<int64_t>(TC));
    }
    ops_->rmsnorm_backward(dx.data(), params_.grad(rmsf_), dtmp.data(), xf_.data(),
                           params_.param(rmsf_), rrf_.data(), T, C);
  } else {
    LOOM_CHECK(doutput != nullptr) << "an earlier pipeline stage needs the next stage's gradient";
    ops_->copy(dx.data(), doutput, static_cast<int64_t>(TC));
  }
  // Sequence parallelism (as Forward): dx holds this rank's R rows of the
  // stream's gradient between the TP layers; the norms' weight gradients
  // are partial sums over those rows, summed over the group at the end.
  parallel::SequenceStream stream(ops_, tp_, T, C, sequence_parallel_,
                                  2 * static_cast<int>(ids_.size()));
  const int R = stream.rows(), Tf = stream.layer_rows();
  const size_t RC = static_cast<size_t>(R) * C, TfC = static_cast<size_t>(Tf) * C,
               TfF = static_cast<size_t>(Tf) * F;
  stream.Shard(&dx);
  Buffer<float> ds(ops_->backend()), dgate(ops_->backend()), dup(ops_->backend()),
      dqkv(ops_->backend()), datto(ops_->backend());
  // Selective recompute: SwiGLU's output, then each norm's, computed again
  // from the kept inputs (their statistics recomputed alongside, unused).
  Buffer<float> again(ops_->backend()), again_rows(ops_->backend());
  auto rmsnorm_again = [&](const float* x, int weight) {
    again.resize(RC);
    again_rows.resize(R);
    ops_->rmsnorm_forward(again.data(), again_rows.data(), x, params_.param(weight), R, C,
                          c.rms_norm_eps);
    return again.data();
  };
  for (int l = static_cast<int>(ids_.size()) - 1; l >= 0; --l) {
    const LayerIds& id = ids_[l];
    if (narrow) stash_[l].Unpack(ops_, work_.Narrow(selective_), work_.Kept());
    const LayerActs& a = narrow ? work_ : acts_[l];
    const float* act = a.s.data();
    if (selective_) {
      again.resize(TfF);
      ops_->swiglu_forward(again.data(), a.gate.data(), a.up.data(), static_cast<int64_t>(TfF));
      act = again.data();
    }
    absl::StatusOr<const float*> dxg = stream.Gathered(dx.data());
    if (!dxg.ok()) return dxg.status();
    ds.Zeros(TfF);
    parallel::RowParallelBackward(ops_, ds.data(), params_.grad(id.down), nullptr, *dxg, act,
                                  params_.weight(id.down), Tf, F, C);
    dgate.Zeros(TfF);
    dup.Zeros(TfF);
    ops_->swiglu_backward(dgate.data(), dup.data(), a.gate.data(), a.up.data(), ds.data(),
                          static_cast<int64_t>(TfF));
    dtmp.Zeros(TfC);
    absl::StatusOr<const float*> r2 =
        stream.Gathered(selective_ ? rmsnorm_again(a.x1.data(), id.rms2) : a.r2.data());
    if (!r2.ok()) return r2.status();
    ops_->linear_backward(dtmp.data(), params_.grad(id.gate), nullptr, dgate.data(), *r2,
                          params_.weight(id.gate), Tf, C, F);
    ops_->linear_backward(dtmp.data(), params_.grad(id.up), nullptr, dup.data(), *r2,
                          params_.weight(id.up), Tf, C, F);
    absl::StatusOr<const float*> dr2 = stream.Reduced(dtmp.data());
    if (!dr2.ok()) return dr2.status();
    ops_->rmsnorm_backward(dx.data(), stream.NormGrad(params_.grad(id.rms2)), *dr2, a.x1.data(),
                           params_.param(id.rms2), a.rr2.data(), R, C);
    dxg = stream.Gathered(dx.data());
    if (!dxg.ok()) return dxg.status();
    datto.Zeros(static_cast<size_t>(Tf) * D);
    parallel::RowParallelBackward(ops_, datto.data(), params_.grad(id.proj), nullptr, *dxg,
                                  a.atto.data(), params_.weight(id.proj), Tf, D, C);
    dqkv.Zeros(static_cast<size_t>(Tf) * W);
    ops_->attention_backward(dqkv.data(), datto.data(), a.qkv.data(), a.atto.data(), a.lse.data(),
                             cu_.data(), b.S(), T, NH, NKV, HD, /*causal=*/true, narrow);
    ops_->rope_backward(dqkv.data(), positions_.data(), inv_freq_.data(), T, NH, NKV, HD);
    dtmp.Zeros(TfC);
    absl::StatusOr<const float*> r1 =
        stream.Gathered(selective_ ? rmsnorm_again(a.x.data(), id.rms1) : a.r1.data());
    if (!r1.ok()) return r1.status();
    ops_->linear_backward(dtmp.data(), params_.grad(id.qkv),
                          id.qkv_b >= 0 ? params_.grad(id.qkv_b) : nullptr, dqkv.data(), *r1,
                          params_.weight(id.qkv), Tf, C, W);
    absl::StatusOr<const float*> dr1 = stream.Reduced(dtmp.data());
    if (!dr1.ok()) return dr1.status();
    ops_->rmsnorm_backward(dx.data(), stream.NormGrad(params_.grad(id.rms1)), *dr1, a.x.data(),
                           params_.param(id.rms1), a.rr1.data(), R, C);
  }
  // The norms' weight gradients summed over the group (the same bits on
  // every rank: replicated), and the stream's gradient whole again.
  if (absl::Status st = stream.SumNormGrads(); !st.ok()) return st;
  if (absl::Status st = stream.Unshard(&dx); !st.ok()) return st;
  if (!first_stage()) {
    LOOM_CHECK(dinput != nullptr) << "a later pipeline stage hands back its input gradient";
    ops_->copy(dinput, dx.data(), static_cast<int64_t>(TC));
    return loss;
  }
  if (!params_.frozen()) {
    parallel::VocabParallelEmbeddingBackward(ops_, params_.grad(wte_), dx.data(), tokens_.data(), T,
                                             C, vocab_start_, V);
    const int nq = static_cast<int>(query_rows_.size()), Q = c.gen_queries;
    if (nq > 0) {  // every output image's queries are the same rows
      Buffer<float> dq(ops_->backend());
      dq.Zeros(static_cast<size_t>(nq) * C);
      ops_->gather_add_rows(dq.data(), dx.data(), query_rows_.data(), nq, C);
      for (int k = 0; k < nq / Q; ++k) {
        ops_->add(params_.grad(queries_), dq.data() + static_cast<size_t>(k) * Q * C,
                  static_cast<int64_t>(Q) * C);
      }
    }
  }
  if (dimage_emb != nullptr && !image_rows_.empty()) {
    ops_->gather_add_rows(dimage_emb, dx.data(), image_rows_.data(),
                          static_cast<int>(image_rows_.size()), C);
  }
  return loss;
}

}  // namespace loom
