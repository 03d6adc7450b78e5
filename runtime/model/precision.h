// Mixed precision (the job's `precision`): what each tensor is stored and
// computed in.
//
//   fp32  every weight, activation and gradient fp32 (the reference).
//   bf16  Megatron's and torchtitan's bf16 mixed precision: the linear layers'
//         GEMMs read bf16 weights (a copy of the fp32 masters, refreshed
//         after every optimizer step: ParamSet::Place/PushData) and bf16
//         inputs, sum their products in fp32 and write fp32; the activations
//         each layer keeps for its backward are stored in bf16
//         (ActivationStash), so they take half the bytes. Norms, softmax,
//         attention's log-sum-exp, the residual stream inside a layer, the
//         logits and the loss stay fp32; gradients are fp32 (the weight
//         gradients accumulate into fp32 and are all-reduced in fp32), and
//         AdamW steps the fp32 masters with fp32 moments. Checkpoints hold
//         the fp32 masters, so they load under either precision.
//
// On the CPU bf16 is storage only (the arithmetic is fp32 on operands
// widened exactly from bf16: kernels/matmul/matmul.h); on CUDA the GEMMs run
// on tensor cores. Either way the numbers are bf16's.
#ifndef LOOM_RUNTIME_MODEL_PRECISION_H_
#define LOOM_RUNTIME_MODEL_PRECISION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/ops.h"
#include "runtime/tensor/buffer.h"

namespace loom {

enum class Precision : uint8_t { kFp32, kBf16 };

// "fp32" or "bf16"; INVALID_ARGUMENT naming what it wants otherwise.
absl::StatusOr<Precision> ParsePrecision(const std::string& name);
const char* PrecisionName(Precision p);

// How a module's activations reach its backward (the job's `recompute`,
// per module):
//   full       a pipeline stage keeps each in-flight microbatch's input
//              alone and runs its forward again before its backward (unless
//              its activations are the ones still live): the least memory,
//              a third more FLOPs.
//   none       every in-flight microbatch's activations are kept
//              (SavedActivations): no recompute, the most memory.
//   selective  as none, less the element-wise outputs (the norms' outputs
//              and SwiGLU's / GELU's), which the backward computes again
//              from the inputs kept beside them, a memory-bound pass with
//              no GEMM: about 30% fewer activation bytes than none for a
//              few percent of a layer's time. (Attention's L x L
//              probabilities, which Megatron's selective recompute drops,
//              are never kept: the attention kernels recompute them.)
// In fp32 all three compute the same bits; under bf16 selective takes
// the norms' outputs from the kept bf16 input, so it equals itself on any
// layout, and full and none within bf16's rounding.
enum class Recompute : uint8_t { kFull, kNone, kSelective };

// "" or "full", "none", "selective"; INVALID_ARGUMENT naming what it wants
// otherwise.
absl::StatusOr<Recompute> ParseRecompute(const std::string& name);
const char* RecomputeName(Recompute r);

// One layer's saved activations between its forward and its backward under
// bf16. A module computes each layer in one fp32 working set, then Pack()s
// that layer's large tensors here as bf16 (and its small per-row statistics
// as they are, fp32); its backward Unpack()s them into the working set
// again. So a module holds one layer's activations in fp32 and every
// layer's in bf16, instead of every layer's in fp32.
//
// Thread-safety: none.
class ActivationStash;

// The state a module's Forward leaves for its Backward (activations, the
// batch, kept outputs), moved out of the module so that another
// microbatch's Forward can run, and moved back before its Backward (a
// pipeline stage keeping its in-flight microbatches' activations: recompute
// none or selective). Moving is swapping buffers: nothing is copied. A
// module lists the same buffers, in the same order, to Take and Restore.
class SavedActivations {
 public:
  struct Lists {
    std::vector<Buffer<float>*> floats;
    std::vector<Buffer<int32_t>*> ints;
    std::vector<ActivationStash*> stashes;
  };
  // Moves the buffers' contents here, leaving each empty on its backend.
  void Take(const Lists& from);
  // Moves them back (each buffer's present contents are released).
  void Restore(const Lists& to);
  // Bytes held.
  int64_t bytes() const;
  bool empty() const { return floats_.empty() && ints_.empty() && stashes_.empty(); }

  // A module's own scalars and host vectors, saved beside its buffers.
  const void* pointer = nullptr;
  int64_t scalar = 0;
  std::vector<int32_t> host_ints;

 private:
  std::vector<Buffer<float>> floats_;
  std::vector<Buffer<int32_t>> ints_;
  std::vector<ActivationStash> stashes_;
};

class ActivationStash {
 public:
  void Bind(Backend* backend) {
    narrow_.set_backend(backend);
    kept_.set_backend(backend);
  }
  // `narrow` rounded to bf16, `kept` copied: one buffer each, in order.
  void Pack(Ops* ops, const std::vector<Buffer<float>*>& narrow,
            const std::vector<Buffer<float>*>& kept);
  // The same buffers (same order) resized and filled from the last Pack.
  void Unpack(Ops* ops, const std::vector<Buffer<float>*>& narrow,
              const std::vector<Buffer<float>*>& kept) const;
  // Bytes held (bf16 part + fp32 part).
  int64_t bytes() const;
  Backend* backend() const { return narrow_.backend(); }
  void swap(ActivationStash& o) noexcept {
    narrow_.swap(o.narrow_);
    kept_.swap(o.kept_);
    narrow_sizes_.swap(o.narrow_sizes_);
    kept_sizes_.swap(o.kept_sizes_);
  }

 private:
  Buffer<uint16_t> narrow_;
  Buffer<float> kept_;
  std::vector<size_t> narrow_sizes_, kept_sizes_;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_MODEL_PRECISION_H_
