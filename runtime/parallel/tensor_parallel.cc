#include "runtime/parallel/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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

void ColumnParallelForward(Ops* ops, float* out, const float* inp, const float* weight_shard,
                           const float* bias_shard, int M, int K, int n_shard) {
  ops->matmul_forward(out, inp, weight_shard, bias_shard, M, K, n_shard);
}

void ColumnParallelBackward(Ops* ops, float* dinp, float* dweight_shard, float* dbias_shard,
                            const float* dout, const float* inp, const float* weight_shard, int M,
                            int K, int n_shard) {
  ops->matmul_backward(dinp, dweight_shard, dbias_shard, dout, inp, weight_shard, M, K, n_shard);
}

absl::Status RowParallelForward(Ops* ops, Communicator* tp, float* out, const float* inp_shard,
                                const float* weight_shard, const float* bias, int M, int k_shard,
                                int N) {
  ops->matmul_forward(out, inp_shard, weight_shard, /*bias=*/nullptr, M, k_shard, N);
  if (absl::Status s = AllReduceTp(tp, out, static_cast<int64_t>(M) * N); !s.ok()) return s;
  if (bias != nullptr) ops->add_bias(out, bias, M, N);
  return absl::OkStatus();
}

void RowParallelBackward(Ops* ops, float* dinp_shard, float* dweight_shard, float* dbias,
                         const float* dout, const float* inp_shard, const float* weight_shard,
                         int M, int k_shard, int N) {
  ops->matmul_backward(dinp_shard, dweight_shard, dbias, dout, inp_shard, weight_shard, M, k_shard,
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
  LOOM_CHECK(ops->backend()->device().type == DeviceType::kCpu)
      << "the vocab-parallel cross-entropy over " << tp->size()
      << " ranks runs on the host only (its device kernels are still to come)";
  auto row = [&](int t) { return logits_shard + static_cast<int64_t>(t) * v_shard; };
  std::vector<float> mx(T);
  for (int t = 0; t < T; ++t) mx[t] = *std::max_element(row(t), row(t) + v_shard);
  if (absl::Status s = tp->AllreduceMax(mx.data(), T); !s.ok()) return s;
  // Per row: Σ exp(x - max) over this rank's columns, and the target's
  // logit - max where this rank holds the target (else 0).
  std::vector<double> sums(2 * static_cast<size_t>(T), 0.0);
  for (int t = 0; t < T; ++t) {
    if (targets[t] < 0) continue;
    const float* x = row(t);
    double s = 0;
    for (int v = 0; v < v_shard; ++v) s += std::exp(static_cast<double>(x[v] - mx[t]));
    sums[2 * t] = s;
    const int v = targets[t] - vocab_start;
    if (v >= 0 && v < v_shard) sums[2 * t + 1] = x[v] - mx[t];
  }
  if (absl::Status s = tp->AllreduceSum(sums.data(), 2 * static_cast<int64_t>(T)); !s.ok())
    return s;
  kernels::LossSum out;
  for (int t = 0; t < T; ++t) {
    float* d =
        dlogits_shard == nullptr ? nullptr : dlogits_shard + static_cast<int64_t>(t) * v_shard;
    if (targets[t] < 0) {
      if (d != nullptr) std::fill(d, d + v_shard, 0.0f);
      continue;
    }
    const double lse = std::log(sums[2 * t]);
    out.sum += lse - sums[2 * t + 1];
    ++out.count;
    if (d == nullptr) continue;
    const float* x = row(t);
    for (int v = 0; v < v_shard; ++v) {
      d[v] = static_cast<float>(std::exp(static_cast<double>(x[v] - mx[t]) - lse)) * grad_scale;
    }
    const int v = targets[t] - vocab_start;
    if (v >= 0 && v < v_shard) d[v] -= grad_scale;
  }
  return out;
}

}  // namespace loom::parallel
