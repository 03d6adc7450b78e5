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
#include "absl/status/statusor.h"
#include "kernels/loss/crossentropy.h"
#include "runtime/comm/collective.h"
#include "runtime/model/ops.h"
#include "runtime/tensor/buffer.h"

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

// Sequence parallelism (Korthikanti et al. 2022, Megatron-LM's
// --sequence-parallel): between a block's TP layers the residual stream and
// the norms run on a slice of its rows, so what they keep from forward to
// backward is 1/TP on each rank. f becomes an all-gather of the rows (and a
// reduce-scatter backward), g a reduce-scatter (and an all-gather
// backward): the same bytes on the wire as the two all-reduces. A norm's
// weight gradient is then a partial sum over the rank's rows, summed over
// the group by the layers (replicated, identical on every rank).
//
// The rows are padded to a multiple of the group's size: a packed batch's
// length is whatever its samples make it. The padding rows carry zeros into
// the column-parallel layers' gradients and are never read out.
struct SequenceSplit {
  int rows = 0;    // the stream's rows (T)
  int padded = 0;  // rows rounded up to a multiple of the group's size
  int shard = 0;   // padded / size: each rank's rows
  int start = 0;   // this rank's first row
  // Whether the stream is split at all (a group of more than one).
  bool split() const { return shard != padded; }
};
// A block stack's residual stream under sequence parallelism or not: the
// layers ask it for their inputs and outputs and it does the collectives
// (on: the SequenceSplit's; off: f's and g's all-reduces on whole rows).
// One per Forward or Backward call.
class SequenceStream {
 public:
  // `rows`: T; `C`: the stream's width. `on` with a group of one is off.
  // `norm_grads`: how many NormGrad calls Backward makes at most.
  SequenceStream(Ops* ops, Communicator* tp, int rows, int C, bool on, int norm_grads = 0);
  bool on() const { return on_; }
  // The stream's rows on this rank (R), and the TP layers' rows (T, or T
  // padded).
  int rows() const { return on_ ? split_.shard : split_.rows; }
  int layer_rows() const { return on_ ? split_.padded : split_.rows; }
  // A whole (T, C) buffer replaced by this rank's rows, and back.
  void Shard(Buffer<float>* x);
  absl::Status Unshard(Buffer<float>* x);
  // The stream's rows `shard` as a column-parallel layer's input: shard
  // itself, or gathered (valid until the next Gathered, RowParallel or
  // Unshard, which reuse its buffer).
  absl::StatusOr<const float*> Gathered(const float* shard);
  // out (rows(), C): the row-parallel layer's output on this rank's rows,
  // inp (layer_rows(), K/tp).
  absl::Status RowParallel(float* out, const float* inp, WeightRef weight_shard, const float* bias,
                           int k_shard);
  // f's backward: dtmp (layer_rows(), C), partial sums over the group,
  // summed onto this rank's rows (dtmp itself when off).
  absl::StatusOr<const float*> Reduced(float* dtmp);
  // A norm's weight (or bias) gradient `grad` (C) in Backward: itself when
  // off (or null: frozen); when on a zeroed partial sum over this rank's
  // rows, added to `grad` summed over the group by SumNormGrads.
  float* NormGrad(float* grad);
  absl::Status SumNormGrads();

 private:
  Ops* ops_;
  Communicator* tp_;
  SequenceSplit split_;
  int C_;
  bool on_;
  Buffer<float> full_, rows_;
  // NormGrad's partial sums, C each, and where each goes.
  std::vector<float*> norm_grads_;
  int max_norm_grads_;
  Buffer<float> partial_sums_;
};

}  // namespace loom::parallel

#endif  // LOOM_RUNTIME_PARALLEL_TENSOR_PARALLEL_H_
