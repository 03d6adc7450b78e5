// Tensor parallelism inside one module, Megatron-style, over the module's TP
// group (grid.h's TpGroup) passed explicitly. The two communication
// operators live here and nowhere else (Megatron's tensor_parallel/
// mappings.py), so every collective of a layer is visible in one place:
//
//   f  identity forward,  all-reduce of the input gradient backward
//      (before a column-parallel layer: every rank holds the whole input)
//   g  all-reduce of the partial outputs forward, identity backward
//      (after a row-parallel layer: each rank holds a partial sum)
//
// An MLP block is  f -> column-parallel fc1 -> activation -> row-parallel
// fc2 -> g : one all-reduce forward (g), one backward (f). Worked example,
// tp = 2, fc1 (H, D), fc2 (D, H): rank r holds fc1 rows [r·H/2, (r+1)·H/2)
// and fc2 columns of the same range; its activation (M, H/2) is complete
// for its half of the hidden units, so no communication is needed between
// fc1 and fc2.
//
// Weights are always created whole (the master, from the seed) and sliced,
// so every TP degree starts from the same model.
//
// The compute goes through `ops` (runtime/model/ops.h): the pointers are
// its backend's memory, and `tp` must reduce that memory (Gloo: host; NCCL:
// device).
#ifndef LOOM_RUNTIME_PARALLEL_TENSOR_PARALLEL_H_
#define LOOM_RUNTIME_PARALLEL_TENSOR_PARALLEL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/loss/crossentropy.h"
#include "runtime/comm/collective.h"
#include "runtime/model/ops.h"

namespace loom::parallel {

// g forward: x (n) = Σ over the TP group of x. Also f backward (the input
// gradient's partial sums). `tp` may be null for a group of one.
absl::Status AllReduceTp(Communicator* tp, float* x, int64_t n);

// Rows [index·rows/parts, (index+1)·rows/parts) of a (rows, cols) matrix;
// rows must divide by parts (checked).
std::vector<float> SliceRows(const float* w, int rows, int cols, int parts, int index);
// Columns [index·cols/parts, (index+1)·cols/parts) of a (rows, cols) matrix.
std::vector<float> SliceCols(const float* w, int rows, int cols, int parts, int index);

// out (M, N/tp) = inp (M, K) · weight_shardᵀ + bias_shard: the column-
// parallel linear; weight_shard = SliceRows(master (N, K)), bias_shard the
// matching part of the bias (or null). No communication.
void ColumnParallelForward(Ops* ops, float* out, const float* inp, WeightRef weight_shard,
                           const float* bias_shard, int M, int K, int n_shard);
// Backward of the above: dinp (M, K) += this rank's partial input gradient
// (complete only after f's all-reduce), dweight_shard/dbias_shard +=.
void ColumnParallelBackward(Ops* ops, float* dinp, float* dweight_shard, float* dbias_shard,
                            const float* dout, const float* inp, WeightRef weight_shard, int M,
                            int K, int n_shard);

// out (M, N) = Σ_tp inp_shard (M, K/tp) · weight_shardᵀ, + bias once: the
// row-parallel linear; weight_shard = SliceCols(master (N, K)). Ends with g's
// all-reduce; the bias (whole, or null) is added after it, on every rank.
absl::Status RowParallelForward(Ops* ops, Communicator* tp, float* out, const float* inp_shard,
                                WeightRef weight_shard, const float* bias, int M, int k_shard,
                                int N);
// Backward: dinp_shard (M, K/tp) +=, dweight_shard +=, dbias += (every rank
// the whole gradient; g's backward is the identity).
void RowParallelBackward(Ops* ops, float* dinp_shard, float* dweight_shard, float* dbias,
                         const float* dout, const float* inp_shard, WeightRef weight_shard, int M,
                         int k_shard, int N);

// The vocab-parallel embedding: rank r holds rows [vocab_start, vocab_start +
// v_shard) of the table. out (T, C) = each token's row, from the rank that
// holds it (the others add zeros; g's all-reduce). Negative tokens (image
// positions) stay zero, for the caller to fill.
absl::Status VocabParallelEmbeddingForward(Ops* ops, Communicator* tp, float* out,
                                           const int32_t* tokens, const float* table_shard, int T,
                                           int C, int vocab_start, int v_shard);
// dtable_shard += dout rows of the tokens this rank holds (identity backward).
void VocabParallelEmbeddingBackward(Ops* ops, float* dtable_shard, const float* dout,
                                    const int32_t* tokens, int T, int C, int vocab_start,
                                    int v_shard);

// Cross-entropy over logits split by vocabulary: logits_shard (T, v_shard)
// holds columns [vocab_start, vocab_start + v_shard). Megatron's
// vocab-parallel cross-entropy: the row max all-reduced (max), then Σ exp and
// the target's logit (sums), so no rank ever holds whole logits. With
// `dlogits_shard` non-null it is set to (softmax - onehot) · grad_scale on
// rows with a target (>= 0), 0 elsewhere. A group of one is the kernel's
// crossentropy_forward(_backward) itself.
absl::StatusOr<kernels::LossSum> VocabParallelCrossEntropy(Ops* ops, Communicator* tp,
                                                           const float* logits_shard,
                                                           const int32_t* targets, int T,
                                                           int v_shard, int vocab_start,
                                                           float grad_scale, float* dlogits_shard);

}  // namespace loom::parallel

#endif  // LOOM_RUNTIME_PARALLEL_TENSOR_PARALLEL_H_
