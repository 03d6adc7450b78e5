#include "runtime/parallel/tensor_parallel.h"

#include "kernels/matmul/matmul.h"
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

void ColumnParallelForward(float* out, const float* inp, const float* weight_shard,
                           const float* bias_shard, int M, int K, int n_shard) {
  kernels::matmul_forward(out, inp, weight_shard, bias_shard, M, K, n_shard);
}

void ColumnParallelBackward(float* dinp, float* dweight_shard, float* dbias_shard,
                            const float* dout, const float* inp, const float* weight_shard, int M,
                            int K, int n_shard) {
  kernels::matmul_backward(dinp, dweight_shard, dbias_shard, dout, inp, weight_shard, M, K,
                           n_shard);
}

absl::Status RowParallelForward(Communicator* tp, float* out, const float* inp_shard,
                                const float* weight_shard, const float* bias, int M, int k_shard,
                                int N) {
  kernels::matmul_forward(out, inp_shard, weight_shard, /*bias=*/nullptr, M, k_shard, N);
  if (absl::Status s = AllReduceTp(tp, out, static_cast<int64_t>(M) * N); !s.ok()) return s;
  if (bias != nullptr) {
    for (int m = 0; m < M; ++m) {
      for (int n = 0; n < N; ++n) out[static_cast<int64_t>(m) * N + n] += bias[n];
    }
  }
  return absl::OkStatus();
}

void RowParallelBackward(float* dinp_shard, float* dweight_shard, float* dbias, const float* dout,
                         const float* inp_shard, const float* weight_shard, int M, int k_shard,
                         int N) {
  kernels::matmul_backward(dinp_shard, dweight_shard, dbias, dout, inp_shard, weight_shard, M,
                           k_shard, N);
}

}  // namespace loom::parallel
