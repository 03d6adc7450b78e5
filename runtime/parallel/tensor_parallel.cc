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
