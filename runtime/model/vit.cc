#include "runtime/model/vit.h"

#include <cmath>

#include "runtime/base/log.h"
#include "runtime/parallel/tensor_parallel.h"

namespace loom {

VitEncoder::VitEncoder(const VitConfig& c, Communicator* tp, LayerRange layers, Ops* ops)
    : config_(c), tp_(tp), ops_(ops), params_(ShardOf(tp)) {
  first_ = layers.first;
  last_ = layers.last < 0 ? c.layers : layers.last;
  LOOM_CHECK(first_ >= 0 && first_ <= last_ && last_ <= c.layers)
      << "ViT layers [" << first_ << ", " << last_ << ") of " << c.layers;
  const int parts = params_.shard().size;
  LOOM_CHECK(c.heads % parts == 0 && c.mlp_hidden % parts == 0)
      << "ViT heads " << c.heads << ", mlp_hidden " << c.mlp_hidden << " in " << parts
      << " TP parts";
  heads_ = c.heads / parts;
  hidden_ = c.mlp_hidden / parts;
  const int64_t D = c.dim, H = c.mlp_hidden;
  const float std = 0.02f, proj_std = 0.02f / std::sqrt(2.0f * std::max(1, c.layers));
  if (first_stage()) {
    patch_w_ = params_.Add("patch_embed.weight", {D, c.patch_dim()}, Init::kNormal, std);
    if (c.patch_bias) patch_b_ = params_.Add("patch_embed.bias", {D}, Init::kZeros);
    if (c.class_token) cls_ = params_.Add("cls_token", {D}, Init::kNormal, std);
    pos_ = params_.Add("pos_embed", {c.seq(), D}, Init::kNormal, std);
    if (c.pre_norm) {
      lnp_w_ = params_.Add("ln_pre.weight", {D}, Init::kOnes);
      lnp_b_ = params_.Add("ln_pre.bias", {D}, Init::kZeros);
    }
  }
  for (int l = first_; l < last_; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    LayerIds id;
    id.ln1_w = params_.Add(p + "ln1.weight", {D}, Init::kOnes);
    id.ln1_b = params_.Add(p + "ln1.bias", {D}, Init::kZeros);
    id.qkv_w = params_.Add(p + "attn.qkv.weight", {3 * D, D}, Init::kNormal, std, Split::kQkvRows);
    id.qkv_b = params_.Add(p + "attn.qkv.bias", {3 * D}, Init::kZeros, 0.0f, Split::kQkvRows);
    id.proj_w = params_.Add(p + "attn.proj.weight", {D, D}, Init::kNormal, proj_std, Split::kCols);
    id.proj_b = params_.Add(p + "attn.proj.bias", {D}, Init::kZeros);
    id.ln2_w = params_.Add(p + "ln2.weight", {D}, Init::kOnes);
    id.ln2_b = params_.Add(p + "ln2.bias", {D}, Init::kZeros);
    id.fc1_w = params_.Add(p + "mlp.fc1.weight", {H, D}, Init::kNormal, std, Split::kRows);
    id.fc1_b = params_.Add(p + "mlp.fc1.bias", {H}, Init::kZeros, 0.0f, Split::kRows);
    id.fc2_w = params_.Add(p + "mlp.fc2.weight", {D, H}, Init::kNormal, proj_std, Split::kCols);
    id.fc2_b = params_.Add(p + "mlp.fc2.bias", {D}, Init::kZeros);
    ids_.push_back(id);
  }
  if (last_stage() && c.final_norm) {
    lnf_w_ = params_.Add("ln_f.weight", {D}, Init::kOnes);
    lnf_b_ = params_.Add("ln_f.bias", {D}, Init::kZeros);
  }
  params_.Finalize();
  acts_.resize(ids_.size());
  for (LayerActs& a : acts_) a.Bind(ops_->backend());
  work_.Bind(ops_->backend());
  stash_.resize(ids_.size());
  for (ActivationStash& st : stash_) st.Bind(ops_->backend());
  for (Buffer<float>* b : {&patches_, &x0_, &mean0_, &rstd0_, &xf_, &meanf_, &rstdf_}) {
    b->set_backend(ops_->backend());
  }
  cu_dev_.set_backend(ops_->backend());
}

absl::Status VitEncoder::Forward(const float* in, int N, float* out, const float* prefix) {
  const VitConfig& c = config_;
  const bool narrow = params_.precision() == Precision::kBf16;  // ActivationStash
  // Per rank: NH heads (A = NH * HD of attention width), H hidden units; the
  // residual stream (T, D) is whole on every rank.
  // L rows per tile (the patches, after the class token if any).
  const int Np = c.patches_per_tile(), L = c.seq(), D = c.dim, HD = c.dim / c.heads, NH = heads_,
            A = NH * HD, H = hidden_;
  const int T = N * L;
  const size_t TD = static_cast<size_t>(T) * D, TA = static_cast<size_t>(T) * A;
  N_ = N;
  cu_.resize(N + 1);
  for (int n = 0; n <= N; ++n) cu_[n] = n * L;
  cu_dev_.CopyFromHost(cu_.data(), cu_.size());

  Buffer<float> x(ops_->backend());
  x.Zeros(TD);
  if (first_stage()) {
    patches_.resize(static_cast<size_t>(N) * Np * c.patch_dim());
    ops_->patchify(patches_.data(), in, N, c.tile_size, c.patch);
    Buffer<float> emb(ops_->backend());
    emb.resize(static_cast<size_t>(N) * Np * D);
    ops_->linear_forward(emb.data(), patches_.data(), params_.weight(patch_w_), Param(patch_b_),
                         N * Np, c.patch_dim(), D);
    LOOM_CHECK(c.prefix == 0 || prefix != nullptr)
        << "the ViT takes " << c.prefix << " prefix rows per tile, none given";
    const int cls = c.class_token ? 1 : 0;
    for (int n = 0; n < N; ++n) {
      float* tile = x.data() + static_cast<size_t>(n) * L * D;
      if (c.class_token) ops_->copy(tile, params_.param(cls_), D);
      if (c.prefix > 0) {
        ops_->copy(tile + static_cast<size_t>(cls) * D,
                   prefix + static_cast<size_t>(n) * c.prefix * D,
                   static_cast<int64_t>(c.prefix) * D);
      }
      ops_->copy(tile + (L - Np) * D, emb.data() + static_cast<size_t>(n) * Np * D,
                 static_cast<int64_t>(Np) * D);
    }
    ops_->add_position_forward(x.data(), params_.param(pos_), N, L, D);
    if (c.pre_norm) {
      x0_.CopyFrom(x);
      mean0_.resize(T);
      rstd0_.resize(T);
      ops_->layernorm_forward(x.data(), mean0_.data(), rstd0_.data(), x0_.data(),
                              params_.param(lnp_w_), params_.param(lnp_b_), T, D, c.norm_eps);
    }
  } else {
    ops_->copy(x.data(), in, static_cast<int64_t>(TD));
  }

  // Sequence parallelism (as the LLM's): R rows of the stream on this rank
  // between the TP layers, Tf rows through them.
  parallel::SequenceStream stream(ops_, tp_, T, D, sequence_parallel_);
  const int R = stream.rows(), Tf = stream.layer_rows();
  const size_t RD = static_cast<size_t>(R) * D, TfA = static_cast<size_t>(Tf) * A,
               TfH = static_cast<size_t>(Tf) * H;
  stream.Shard(&x);
  for (size_t l = 0; l < ids_.size(); ++l) {
    const LayerIds& id = ids_[l];
    LayerActs& a = narrow ? work_ : acts_[l];
    a.x.CopyFrom(x);
    a.ln1.resize(RD);
    a.mean1.resize(R);
    a.rstd1.resize(R);
    ops_->layernorm_forward(a.ln1.data(), a.mean1.data(), a.rstd1.data(), a.x.data(),
                            params_.param(id.ln1_w), params_.param(id.ln1_b), R, D, c.norm_eps);
    absl::StatusOr<const float*> in = stream.Gathered(a.ln1.data());
    if (!in.ok()) return in.status();
    a.qkv.resize(3 * TfA);
    ops_->linear_forward(a.qkv.data(), *in, params_.weight(id.qkv_w), params_.param(id.qkv_b), Tf,
                         D, 3 * A);
    if (selective_ && !narrow) a.ln1.Release();  // Backward computes it again
    // Under bf16 attention takes the q and k its backward will recompute
    // from (the kept ones, bf16), as in the LLM.
    if (narrow) ops_->round_to_bf16(a.qkv.data(), static_cast<int64_t>(3 * TfA));
    a.lse.resize(static_cast<size_t>(T) * NH);  // each row's log-sum-exp
    a.atto.resize(TfA);
    if (Tf > T) {  // the padding rows (sequence parallelism) stay 0
      ops_->zero(a.atto.data() + TA, static_cast<int64_t>(Tf - T) * A);
    }
    ops_->attention_forward(a.atto.data(), a.lse.data(), a.qkv.data(), cu_dev_.data(), N, T, NH, NH,
                            HD, /*causal=*/false, narrow);
    a.x1.resize(RD);
    if (absl::Status s = stream.RowParallel(a.x1.data(), a.atto.data(), params_.weight(id.proj_w),
                                            params_.param(id.proj_b), A);
        !s.ok()) {
      return s;
    }
    ops_->add(a.x1.data(), a.x.data(), static_cast<int64_t>(RD));
    a.ln2.resize(RD);
    a.mean2.resize(R);
    a.rstd2.resize(R);
    ops_->layernorm_forward(a.ln2.data(), a.mean2.data(), a.rstd2.data(), a.x1.data(),
                            params_.param(id.ln2_w), params_.param(id.ln2_b), R, D, c.norm_eps);
    in = stream.Gathered(a.ln2.data());
    if (!in.ok()) return in.status();
    a.h.resize(TfH);
    ops_->linear_forward(a.h.data(), *in, params_.weight(id.fc1_w), params_.param(id.fc1_b), Tf, D,
                         H);
    if (selective_ && !narrow) a.ln2.Release();
    a.g.resize(a.h.size());
    ops_->activation_forward(c.act, a.g.data(), a.h.data(), static_cast<int64_t>(TfH));
    if (absl::Status s = stream.RowParallel(x.data(), a.g.data(), params_.weight(id.fc2_w),
                                            params_.param(id.fc2_b), H);
        !s.ok()) {
      return s;
    }
    if (selective_ && !narrow) a.g.Release();
    ops_->add(x.data(), a.x1.data(), static_cast<int64_t>(RD));
    if (narrow) stash_[l].Pack(ops_, a.Narrow(selective_), a.Kept());
  }
  if (absl::Status s = stream.Unshard(&x); !s.ok()) return s;  // the stage's output whole
  xf_.swap(x);
  if (!last_stage()) {
    ops_->copy(out, xf_.data(), static_cast<int64_t>(TD));
    return absl::OkStatus();
  }
  const float* y = xf_.data();
  Buffer<float> normed(ops_->backend());
  if (c.final_norm) {
    normed.resize(TD);
    meanf_.resize(T);
    rstdf_.resize(T);
    ops_->layernorm_forward(normed.data(), meanf_.data(), rstdf_.data(), xf_.data(),
                            params_.param(lnf_w_), params_.param(lnf_b_), T, D, c.norm_eps);
    y = normed.data();
  }
  for (int n = 0; n < N; ++n) {  // the patches' rows, without the class token
    ops_->copy(out + static_cast<size_t>(n) * Np * D, y + (static_cast<size_t>(n) * L + L - Np) * D,
               static_cast<int64_t>(Np) * D);
  }
  return absl::OkStatus();
}

SavedActivations::Lists VitEncoder::ForwardState() {
  SavedActivations::Lists l;
  l.floats = {&patches_, &x0_, &mean0_, &rstd0_, &xf_, &meanf_, &rstdf_};
  for (LayerActs& a : acts_) {
    for (Buffer<float>* b : a.All()) l.floats.push_back(b);
  }
  l.ints = {&cu_dev_};
  for (ActivationStash& st : stash_) l.stashes.push_back(&st);
  return l;
}

SavedActivations VitEncoder::Detach() {
  SavedActivations saved;
  saved.scalar = N_;
  saved.host_ints.swap(cu_);
  saved.Take(ForwardState());
  N_ = 0;
  return saved;
}

void VitEncoder::Attach(SavedActivations* saved) {
  saved->Restore(ForwardState());
  N_ = static_cast<int>(saved->scalar);
  cu_.swap(saved->host_ints);
}

absl::Status VitEncoder::Backward(const float* dout, float* din, float* dprefix) {
  const VitConfig& c = config_;
  const bool narrow = params_.precision() == Precision::kBf16;  // ActivationStash
  const int Np = c.patches_per_tile(), L = c.seq(), D = c.dim, HD = c.dim / c.heads, NH = heads_,
            A = NH * HD, H = hidden_;
  const int N = N_, T = N * L;
  const size_t TD = static_cast<size_t>(T) * D;

  // A frozen first stage has no weight gradients and no input to hand a
  // gradient to (unless its prefix's is asked for): nothing to compute (the
  // workers do not even call it).
  if (params_.frozen() && first_stage() && dprefix == nullptr) return absl::OkStatus();
  Buffer<float> dx(ops_->backend());  // gradient w.r.t. the residual stream
  dx.Zeros(TD);
  if (last_stage()) {
    Buffer<float> dy(ops_->backend());  // the class token's rows get none
    dy.Zeros(TD);
    for (int n = 0; n < N; ++n) {
      ops_->copy(dy.data() + (static_cast<size_t>(n) * L + L - Np) * D,
                 dout + static_cast<size_t>(n) * Np * D, static_cast<int64_t>(Np) * D);
    }
    if (c.final_norm) {
      ops_->layernorm_backward(dx.data(), params_.grad(lnf_w_), params_.grad(lnf_b_), dy.data(),
                               xf_.data(), params_.param(lnf_w_), meanf_.data(), rstdf_.data(), T,
                               D);
    } else {
      dx.swap(dy);
    }
  } else {
    ops_->copy(dx.data(), dout, static_cast<int64_t>(TD));
  }
  // Sequence parallelism (as Forward): dx holds this rank's R rows between
  // the TP layers; the norms' weight and bias gradients are partial sums
  // over them, summed over the group at the end.
  parallel::SequenceStream stream(ops_, tp_, T, D, sequence_parallel_,
                                  4 * static_cast<int>(ids_.size()));
  const int R = stream.rows(), Tf = stream.layer_rows();
  const size_t RD = static_cast<size_t>(R) * D, TfD = static_cast<size_t>(Tf) * D,
               TfA = static_cast<size_t>(Tf) * A, TfH = static_cast<size_t>(Tf) * H;
  stream.Shard(&dx);
  Buffer<float> dtmp(ops_->backend()), dg(ops_->backend()), dh(ops_->backend()),
      dqkv(ops_->backend()), datto(ops_->backend());
  // Selective recompute: GELU's output, then each norm's, computed again
  // from the kept inputs (the statistics recomputed alongside, unused).
  Buffer<float> again(ops_->backend()), again_mean(ops_->backend()), again_rstd(ops_->backend());
  auto layernorm_again = [&](const float* x, int w, int b) {
    again.resize(RD);
    again_mean.resize(R);
    again_rstd.resize(R);
    ops_->layernorm_forward(again.data(), again_mean.data(), again_rstd.data(), x, params_.param(w),
                            params_.param(b), R, D, c.norm_eps);
    return again.data();
  };
  for (int l = static_cast<int>(ids_.size()) - 1; l >= 0; --l) {
    const LayerIds& id = ids_[l];
    if (narrow) stash_[l].Unpack(ops_, work_.Narrow(selective_), work_.Kept());
    const LayerActs& a = narrow ? work_ : acts_[l];
    const float* act = a.g.data();
    if (selective_) {
      again.resize(TfH);
      ops_->activation_forward(c.act, again.data(), a.h.data(), static_cast<int64_t>(TfH));
      act = again.data();
    }
    // x2 = x1 + fc2(gelu(fc1(ln2(x1))))
    absl::StatusOr<const float*> dxg = stream.Gathered(dx.data());
    if (!dxg.ok()) return dxg.status();
    dg.Zeros(TfH);
    parallel::RowParallelBackward(ops_, dg.data(), params_.grad(id.fc2_w), params_.grad(id.fc2_b),
                                  *dxg, act, params_.weight(id.fc2_w), Tf, H, D);
    dh.Zeros(dg.size());
    ops_->activation_backward(c.act, dh.data(), a.h.data(), dg.data(), static_cast<int64_t>(TfH));
    dtmp.Zeros(TfD);
    absl::StatusOr<const float*> ln2 = stream.Gathered(
        selective_ ? layernorm_again(a.x1.data(), id.ln2_w, id.ln2_b) : a.ln2.data());
    if (!ln2.ok()) return ln2.status();
    ops_->linear_backward(dtmp.data(), params_.grad(id.fc1_w), params_.grad(id.fc1_b), dh.data(),
                          *ln2, params_.weight(id.fc1_w), Tf, D, H);
    absl::StatusOr<const float*> dln2 = stream.Reduced(dtmp.data());
    if (!dln2.ok()) return dln2.status();
    // dx (now d x1) += LN2 backward
    ops_->layernorm_backward(dx.data(), stream.NormGrad(params_.grad(id.ln2_w)),
                             stream.NormGrad(params_.grad(id.ln2_b)), *dln2, a.x1.data(),
                             params_.param(id.ln2_w), a.mean2.data(), a.rstd2.data(), R, D);
    // x1 = x + proj(attn(qkv(ln1(x))))
    dxg = stream.Gathered(dx.data());
    if (!dxg.ok()) return dxg.status();
    datto.Zeros(TfA);
    parallel::RowParallelBackward(ops_, datto.data(), params_.grad(id.proj_w),
                                  params_.grad(id.proj_b), *dxg, a.atto.data(),
                                  params_.weight(id.proj_w), Tf, A, D);
    dqkv.Zeros(3 * TfA);
    ops_->attention_backward(dqkv.data(), datto.data(), a.qkv.data(), a.atto.data(), a.lse.data(),
                             cu_dev_.data(), N, T, NH, NH, HD, /*causal=*/false, narrow);
    dtmp.Zeros(TfD);
    absl::StatusOr<const float*> ln1 = stream.Gathered(
        selective_ ? layernorm_again(a.x.data(), id.ln1_w, id.ln1_b) : a.ln1.data());
    if (!ln1.ok()) return ln1.status();
    ops_->linear_backward(dtmp.data(), params_.grad(id.qkv_w), params_.grad(id.qkv_b), dqkv.data(),
                          *ln1, params_.weight(id.qkv_w), Tf, D, 3 * A);
    absl::StatusOr<const float*> dln1 = stream.Reduced(dtmp.data());
    if (!dln1.ok()) return dln1.status();
    ops_->layernorm_backward(dx.data(), stream.NormGrad(params_.grad(id.ln1_w)),
                             stream.NormGrad(params_.grad(id.ln1_b)), *dln1, a.x.data(),
                             params_.param(id.ln1_w), a.mean1.data(), a.rstd1.data(), R, D);
  }
  // The norms' gradients summed over the group (replicated), and the
  // stream's gradient whole again.
  if (absl::Status s = stream.SumNormGrads(); !s.ok()) return s;
  if (absl::Status s = stream.Unshard(&dx); !s.ok()) return s;
  if (!first_stage()) {
    LOOM_CHECK(din != nullptr) << "a later pipeline stage hands back its input gradient";
    ops_->copy(din, dx.data(), static_cast<int64_t>(TD));
    return absl::OkStatus();
  }
  if (c.pre_norm) {
    Buffer<float> dx0(ops_->backend());
    dx0.Zeros(TD);
    ops_->layernorm_backward(dx0.data(), params_.grad(lnp_w_), params_.grad(lnp_b_), dx.data(),
                             x0_.data(), params_.param(lnp_w_), mean0_.data(), rstd0_.data(), T, D);
    dx.swap(dx0);
  }
  const int cls = c.class_token ? 1 : 0;
  if (dprefix != nullptr && c.prefix > 0) {
    for (int n = 0; n < N; ++n) {
      ops_->copy(dprefix + static_cast<size_t>(n) * c.prefix * D,
                 dx.data() + (static_cast<size_t>(n) * L + cls) * D,
                 static_cast<int64_t>(c.prefix) * D);
    }
  }
  if (params_.frozen()) return absl::OkStatus();
  ops_->add_position_backward(params_.grad(pos_), dx.data(), N, L, D);
  Buffer<float> demb(ops_->backend());
  demb.resize(static_cast<size_t>(N) * Np * D);
  for (int n = 0; n < N; ++n) {
    const float* tile = dx.data() + static_cast<size_t>(n) * L * D;
    if (c.class_token) ops_->add(params_.grad(cls_), tile, D);
    ops_->copy(demb.data() + static_cast<size_t>(n) * Np * D, tile + (L - Np) * D,
               static_cast<int64_t>(Np) * D);
  }
  ops_->linear_backward(nullptr, params_.grad(patch_w_),
                        patch_b_ < 0 ? nullptr : params_.grad(patch_b_), demb.data(),
                        patches_.data(), params_.weight(patch_w_), N * Np, c.patch_dim(), D);
  return absl::OkStatus();
}

}  // namespace loom
