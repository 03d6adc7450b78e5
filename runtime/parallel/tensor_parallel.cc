#include "runtime/parallel/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>

#include "runtime/base/log.h"

namespace loom::parallel {

absl::Status AllReduceTp(Communicator* tp, float* x, int64_t n) {
  if (tp == nullptr || tp->size() == 1) return absl::OkStatus();
  return tp->AllreduceSum(x, n);
}

std::vector<float> SliceRows(const float* w, int rows, int cols, int parts, int index) {
  LOOM_CHECK(parts >= 1 && rows % parts == 0 && index >= 0 && index < parts)
      << rows << " rows in " << parts << " parts, part " << index;
  const int n = rows / parts;
  return std::vector<float>(w + static_cast<int64_t>(index) * n * cols,
                            w + static_cast<int64_t>(index + 1) * n * cols);
}

std::vector<float> SliceCols(const float* w, int rows, int cols, int parts, int index) {
  LOOM_CHECK(parts >= 1 && cols % parts == 0 && index >= 0 && index < parts)
      << cols << " columns in " << parts << " parts, part " << index;
  const int n = cols / parts;
  std::vector<float> out(static_cast<size_t>(rows) * n);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < n; ++c) {
      out[static_cast<size_t>(r) * n + c] = w[static_cast<int64_t>(r) * cols + index * n + c];
    }
  }
  return out;
}

namespace {

// `tp` null or of one rank: one shard of every row.
SequenceSplit SplitSequence(Communicator* tp, int rows) {
  SequenceSplit s;
  const int parts = tp == nullptr ? 1 : tp->size();
  s.rows = rows;
  s.shard = (rows + parts - 1) / parts;
  s.padded = s.shard * parts;
  s.start = (tp == nullptr ? 0 : tp->rank()) * s.shard;
  if (parts == 1) s.shard = s.padded = rows;
  return s;
}

// shard (shard, C) = this rank's rows of whole (rows, C), zeros past `rows`.
void ShardSequence(Ops* ops, const SequenceSplit& s, float* shard, const float* whole, int C) {
  const int have = std::max(0, std::min(s.shard, s.rows - s.start));
  if (have > 0) {
    ops->copy(shard, whole + static_cast<int64_t>(s.start) * C, static_cast<int64_t>(have) * C);
  }
  if (have < s.shard) {
    ops->zero(shard + static_cast<int64_t>(have) * C, static_cast<int64_t>(s.shard - have) * C);
  }
}

// full (padded, C) = every rank's shard (shard, C), in rank order: the
// all-gather before a column-parallel layer (f), and g's backward.
absl::Status GatherSequence(Ops* ops, Communicator* tp, const SequenceSplit& s, float* full,
                            const float* shard, int C) {
  const int64_t n = static_cast<int64_t>(s.padded) * C, chunk = static_cast<int64_t>(s.shard) * C;
  // The rank's rows are ChunkRange(n, rank, size): shard divides padded.
  ops->copy(full + static_cast<int64_t>(s.start) * C, shard, chunk);
  if (!s.split()) return absl::OkStatus();
  return tp->AllGather(full, n);
}

// shard (shard, C) = this rank's rows of Σ over the group of full (padded,
// C): after a row-parallel layer (g), and f's backward. `full` is
// overwritten.
absl::Status ReduceScatterSequence(Ops* ops, Communicator* tp, const SequenceSplit& s, float* full,
                                   float* shard, int C) {
  const int64_t n = static_cast<int64_t>(s.padded) * C, chunk = static_cast<int64_t>(s.shard) * C;
  if (s.split()) {
    if (absl::Status st = tp->ReduceScatterSum(full, n); !st.ok()) return st;
  }
  ops->copy(shard, full + static_cast<int64_t>(s.start) * C, chunk);
  return absl::OkStatus();
}

// The row-parallel linear ending in a reduce-scatter: out_shard (shard, N)
// = this rank's rows of Σ_tp inp_shard (padded, K/tp) · weight_shardᵀ, +
// bias (whole, or null) on them. `full` (padded, N) is scratch.
absl::Status RowParallelForwardSequence(Ops* ops, Communicator* tp, const SequenceSplit& s,
                                        float* full, float* out_shard, const float* inp_shard,
                                        WeightRef weight_shard, const float* bias, int k_shard,
                                        int N) {
  ops->linear_forward(full, inp_shard, weight_shard, /*bias=*/nullptr, s.padded, k_shard, N);
  if (absl::Status st = ReduceScatterSequence(ops, tp, s, full, out_shard, N); !st.ok()) return st;
  if (bias != nullptr) ops->add_bias(out_shard, bias, s.shard, N);
  return absl::OkStatus();
}

}  // namespace

SequenceStream::SequenceStream(Ops* ops, Communicator* tp, int rows, int C, bool on, int norm_grads)
    : ops_(ops),
      tp_(tp),
      split_(SplitSequence(tp, rows)),
      C_(C),
      on_(on && split_.split()),
      full_(ops->backend()),
      rows_(ops->backend()),
      max_norm_grads_(norm_grads),
      partial_sums_(ops->backend()) {
  if (!on_) return;
  full_.resize(static_cast<size_t>(split_.padded) * C);
  rows_.resize(static_cast<size_t>(split_.shard) * C);
  if (norm_grads > 0) partial_sums_.Zeros(static_cast<size_t>(norm_grads) * C);
}

void SequenceStream::Shard(Buffer<float>* x) {
  if (!on_) return;
  ShardSequence(ops_, split_, rows_.data(), x->data(), C_);
  x->swap(rows_);  // the whole rows freed
  rows_.Release();
  rows_.resize(x->size());
}

absl::Status SequenceStream::Unshard(Buffer<float>* x) {
  if (!on_) return absl::OkStatus();
  if (absl::Status s = GatherSequence(ops_, tp_, split_, full_.data(), x->data(), C_); !s.ok()) {
    return s;
  }
  const int64_t n = static_cast<int64_t>(split_.rows) * C_;
  x->resize(static_cast<size_t>(n));
  ops_->copy(x->data(), full_.data(), n);
  return absl::OkStatus();
}

absl::StatusOr<const float*> SequenceStream::Gathered(const float* shard) {
  if (!on_) return shard;
  if (absl::Status s = GatherSequence(ops_, tp_, split_, full_.data(), shard, C_); !s.ok()) {
    return s;
  }
  return full_.data();
}

absl::Status SequenceStream::RowParallel(float* out, const float* inp, WeightRef weight_shard,
                                         const float* bias, int k_shard) {
  if (!on_) {
    return RowParallelForward(ops_, tp_, out, inp, weight_shard, bias, split_.rows, k_shard, C_);
  }
  return RowParallelForwardSequence(ops_, tp_, split_, full_.data(), out, inp, weight_shard, bias,
                                    k_shard, C_);
}

absl::StatusOr<const float*> SequenceStream::Reduced(float* dtmp) {
  if (!on_) {
    if (absl::Status s = AllReduceTp(tp_, dtmp, static_cast<int64_t>(split_.rows) * C_); !s.ok()) {
      return s;
    }
    return dtmp;
  }
  if (absl::Status s = ReduceScatterSequence(ops_, tp_, split_, dtmp, rows_.data(), C_); !s.ok()) {
    return s;
  }
  return rows_.data();
}

float* SequenceStream::NormGrad(float* grad) {
  if (!on_ || grad == nullptr) return grad;
  const int k = static_cast<int>(norm_grads_.size());
  LOOM_CHECK(k < max_norm_grads_) << "SequenceStream: more than " << max_norm_grads_
                                  << " norm gradients";
  norm_grads_.push_back(grad);
  return partial_sums_.data() + static_cast<size_t>(k) * C_;
}

absl::Status SequenceStream::SumNormGrads() {
  if (norm_grads_.empty()) return absl::OkStatus();
  const int64_t n = static_cast<int64_t>(norm_grads_.size()) * C_;
  if (absl::Status s = AllReduceTp(tp_, partial_sums_.data(), n); !s.ok()) return s;
  for (size_t k = 0; k < norm_grads_.size(); ++k) {
    ops_->add(norm_grads_[k], partial_sums_.data() + k * C_, C_);
  }
  norm_grads_.clear();
  return absl::OkStatus();
}

void ColumnParallelForward(Ops* ops, float* out, const float* inp, WeightRef weight_shard,
                           const float* bias_shard, int M, int K, int n_shard) {
  ops->linear_forward(out, inp, weight_shard, bias_shard, M, K, n_shard);
}

void ColumnParallelBackward(Ops* ops, float* dinp, float* dweight_shard, float* dbias_shard,
                            const float* dout, const float* inp, WeightRef weight_shard, int M,
                            int K, int n_shard) {
  ops->linear_backward(dinp, dweight_shard, dbias_shard, dout, inp, weight_shard, M, K, n_shard);
}

absl::Status RowParallelForward(Ops* ops, Communicator* tp, float* out, const float* inp_shard,
                                WeightRef weight_shard, const float* bias, int M, int k_shard,
                                int N) {
  ops->linear_forward(out, inp_shard, weight_shard, /*bias=*/nullptr, M, k_shard, N);
  if (absl::Status s = AllReduceTp(tp, out, static_cast<int64_t>(M) * N); !s.ok()) return s;
  if (bias != nullptr) ops->add_bias(out, bias, M, N);
  return absl::OkStatus();
}

void RowParallelBackward(Ops* ops, float* dinp_shard, float* dweight_shard, float* dbias,
                         const float* dout, const float* inp_shard, WeightRef weight_shard, int M,
                         int k_shard, int N) {
  ops->linear_backward(dinp_shard, dweight_shard, dbias, dout, inp_shard, weight_shard, M, k_shard,
                       N);
}

absl::Status VocabParallelEmbeddingForward(Ops* ops, Communicator* tp, float* out,
                                           const int32_t* tokens, const float* table_shard, int T,
                                           int C, int vocab_start, int v_shard) {
  ops->vocab_embedding_forward(out, tokens, table_shard, T, C, vocab_start, v_shard);
  return AllReduceTp(tp, out, static_cast<int64_t>(T) * C);
}

void VocabParallelEmbeddingBackward(Ops* ops, float* dtable_shard, const float* dout,
                                    const int32_t* tokens, int T, int C, int vocab_start,
                                    int v_shard) {
  ops->vocab_embedding_backward(dtable_shard, dout, tokens, T, C, vocab_start, v_shard);
}

absl::StatusOr<kernels::LossSum> VocabParallelCrossEntropy(Ops* ops, Communicator* tp,
                                                           const float* logits_shard,
                                                           const int32_t* targets, int T,
                                                           int v_shard, int vocab_start,
                                                           float grad_scale, float* dlogits_shard) {
  if (tp == nullptr || tp->size() == 1) {
    return dlogits_shard == nullptr
               ? ops->crossentropy_forward(logits_shard, targets, T, v_shard)
               : ops->crossentropy_forward_backward(dlogits_shard, logits_shard, targets, T,
                                                    v_shard, grad_scale);
  }
  // The max and the sums live where the logits do.
  Backend* b = ops->backend();
  std::unique_ptr<void, std::function<void(void*)>> mx(
      b->Allocate(sizeof(float) * static_cast<size_t>(T)), [b](void* p) { b->Free(p); });
  std::unique_ptr<void, std::function<void(void*)>> sums(
      b->Allocate(sizeof(double) * 2 * static_cast<size_t>(T)), [b](void* p) { b->Free(p); });
  float* m = static_cast<float*>(mx.get());
  double* s2 = static_cast<double*>(sums.get());
  ops->crossentropy_shard_max(m, logits_shard, T, v_shard);
  if (absl::Status s = tp->AllreduceMax(m, T); !s.ok()) return s;
  // Per row: Σ exp(x - max) over this rank's columns, and the target's
  // logit - max where this rank holds the target (else 0).
  ops->crossentropy_shard_sums(s2, logits_shard, m, targets, T, v_shard, vocab_start);
  if (absl::Status s = tp->AllreduceSum(s2, 2 * static_cast<int64_t>(T)); !s.ok()) return s;
  return ops->crossentropy_shard_finish(dlogits_shard, logits_shard, m, s2, targets, T, v_shard,
                                        vocab_start, grad_scale);
}

}  // namespace loom::parallel
