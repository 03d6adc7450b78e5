// One module's parameters, their gradients and the AdamW state, each one flat
// fp32 buffer with named slices. Flat buffers make the optimizer step, the
// gradient allreduce and checkpoints one contiguous operation each.
//
// Under tensor parallelism a ParamSet holds one TP rank's part of the
// module: each tensor is declared whole (its master shape) with how it is
// split (Split), and the set keeps this rank's slice. The master tensors are
// what the seed and a checkpoint describe, so every TP degree starts from, and
// saves, the same model (MasterLayout, AddToMaster, SliceFromMaster).
//
// Usage: Add() every tensor, then Finalize() to allocate; pointers are stable
// from then on. Thread-safety: none.
#ifndef LOOM_RUNTIME_MODEL_PARAMS_H_
#define LOOM_RUNTIME_MODEL_PARAMS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/comm/collective.h"
#include "runtime/model/ops.h"
#include "runtime/model/precision.h"
#include "runtime/tensor/backend.h"
#include "runtime/tensor/buffer.h"
#include "runtime/tensor/tensor.h"

namespace loom {

// How a tensor is divided over the module's TP group (Megatron's layers).
enum class Split : uint8_t {
  kReplicated,  // every rank holds it whole: norms, row-parallel biases, positions
  kRows,        // dim 0 in tp parts: column-parallel weights/biases, vocab-parallel tables
  kCols,        // dim 1 in tp parts: row-parallel weights
  kQkvRows,     // dim 0 as three blocks (q, k, v), each in tp parts: the heads split
                // (q_rows: the q block; k and v share the rest, grouped-query attention)
};

// The layers one pipeline stage of a module holds: [first, last); last -1:
// to the end. The first stage also holds the module's input layers
// (embeddings), the last its output layers (final norm, head).
struct LayerRange {
  int first = 0;
  int last = -1;
};

// This ParamSet's place in its TP group.
struct TpShard {
  int rank = 0;
  int size = 1;
};

enum class Init : uint8_t {
  kZeros,
  kOnes,
  kNormal,  // N(0, std) with the std given to Add()
};

struct ParamSpec {
  std::string name;  // "blocks.0.attn.qkv.weight"
  Shape shape;       // this rank's slice
  Shape master_shape;
  Split split = Split::kReplicated;
  int64_t offset = 0;  // into the flat buffers
  int64_t numel = 0;   // of the slice
  Init init = Init::kZeros;
  float std = 0.0f;
  int64_t q_rows = 0;  // kQkvRows: master rows of the q block (k and v halve the rest)
};

// A contiguous run of a slice inside its master tensor.
struct SliceRun {
  int64_t master_offset = 0;  // elements into the master tensor
  int64_t offset = 0;         // elements into the slice
  int64_t length = 0;
};
// The runs that make up `spec`'s slice on `shard`, in slice order.
std::vector<SliceRun> SliceRuns(const ParamSpec& spec, TpShard shard);

class ParamSet {
 public:
  explicit ParamSet(TpShard shard = {});

  // `master_shape` is the whole tensor; the set holds `shard`'s part of it
  // (the split dimension must divide by the TP size: checked, model configs
  // are validated before). Returns the index of the new parameter.
  // kQkvRows: `q_rows` master rows of q, then k and v of (rows - q_rows) / 2
  // each; 0: three equal blocks.
  int Add(std::string name, Shape master_shape, Init init, float std = 0.0f,
          Split split = Split::kReplicated, int64_t q_rows = 0);
  void Finalize();

  // Deterministic initialisation: each master tensor from its own stream of
  // (`seed`, its name), then sliced; the same values on every machine, for
  // every TP degree and whatever else the set holds.
  void Initialize(uint64_t seed);
  void ZeroGrad();
  // A frozen module (LLaVA's stage 1 freezes the vision tower and the LLM)
  // keeps its weights only: its gradients and AdamW state are released,
  // grad(i) is null (the layers then compute no weight gradients, the
  // kernels skip a null dweight), and its part of the gradient norm is 0.
  // The optimizer, the gradient allreduce and checkpoints skip or zero what
  // it no longer holds. Irreversible; call after Finalize.
  void Freeze();
  bool frozen() const { return frozen_; }

  TpShard shard() const { return shard_; }
  // A set of the master tensors (TP size 1), allocated, all zeros.
  ParamSet MasterLayout() const;
  // master.{data, adam_m, adam_v} += this slice's values at their place;
  // replicated tensors only from TP rank 0, AdamW moments only from this
  // rank's optimizer shard. Summing every rank's contribution (an all-reduce
  // over the TP group of zeroed buffers, and of the moments over the DP group
  // when sharded) gathers the master.
  // `master` holds these tensors whole, matched by name, and may hold more
  // (the whole module, of which this set is one pipeline stage).
  void AddToMaster(ParamSet* master) const;
  // This slice's {data, adam_m, adam_v} and step from the master's (matched
  // by name, as above; the moments of this rank's optimizer shard).
  void SliceFromMaster(const ParamSet& master);
  // The index of the tensor named `name`, or -1.
  int Find(const std::string& name) const;
  // Σ g² over what this rank owns: its slices, and the replicated tensors
  // on TP rank 0 (the others hold the same gradient). Summed over the TP
  // group it is the module's Σ g². Only elements [begin, end) of the flat
  // buffer (end -1: to the end), so that DP ranks each summing their
  // optimizer shard together give it once.
  double OwnedGradSumOfSquares(int64_t begin = 0, int64_t end = -1) const;
  // The same over the gradients where the optimizer reads them (the
  // device's through `ops` when optimizer_on_device()).
  double OwnedGradSumOfSquares(Ops* ops, int64_t begin, int64_t end);

  // A distributed optimizer (ZeRO-1, job.optimizer.shard): this rank of a
  // data-parallel group of `ranks` steps elements [optimizer_begin(),
  // optimizer_end()) of the flat buffers (ChunkRange, the chunk its gradient
  // reduce-scatter leaves summed there) and holds the AdamW moments of those
  // alone: adam_m()[k] and adam_v()[k] are element optimizer_begin() + k's,
  // zeros until set. The weights stay whole (the layers read them). Call
  // after Finalize; a load then fills the shard only. (0, 1): the whole set,
  // as without it.
  void ShardOptimizer(int rank, int ranks);
  int64_t optimizer_begin() const { return opt_begin_; }
  int64_t optimizer_end() const { return opt_end_ < 0 ? total_ : opt_end_; }
  bool optimizer_sharded() const { return opt_ranks_ > 1; }
  // Bytes of AdamW state this rank holds (both moments).
  int64_t optimizer_state_bytes() const {
    return static_cast<int64_t>((m_.size() + v_.size()) * sizeof(float));
  }

  // Where the layers read the weights and add the gradients: the host
  // vectors below, or, once placed on a device backend (Place), a copy of
  // them there. The host vectors stay the master: PushData() after they
  // change (initialisation, a load, an optimizer step), PullGrads() before
  // the host reads the gradients (their all-reduce, clipping, the step).
  // ZeroGrad() zeroes both. On the CPU backend Place() changes nothing.
  //
  // Under bf16 (runtime/model/precision.h) Place also makes a bf16 copy of
  // the weights on `backend`, which PushData refreshes from the fp32
  // masters: the linear layers' GEMMs read it (weight()); everything else
  // reads param(). Gradients stay fp32.
  //
  // `optimizer_on_device` (issue 42 item 4): once placed on a device, the
  // AdamW moments live there too and OptimizerStep steps the device copies
  // (runtime/train/trainer.h); the host vectors are then the checkpoint's
  // copy: PullState() before reading them, PushState() after setting them.
  void Place(Backend* backend, Precision precision = Precision::kFp32,
             bool optimizer_on_device = false);
  Precision precision() const { return device_.precision; }
  void PushData();
  void PullGrads();
  bool placed() const { return device_.placed; }
  bool optimizer_on_device() const { return device_.optimizer; }
  // Weights and moments to the device (after a load), or back (before a
  // checkpoint); PushState is PushData where the optimizer runs on the host,
  // PullState nothing.
  void PushState();
  void PullState();
  // After an optimizer step (and a sharded optimizer's all-gather): the
  // layers' copies follow the stepped weights: on the device that stepped
  // them, its bf16 copy narrowed there (`ops`: the device's); else
  // PushData().
  void WeightsStepped(Ops* ops);
  // Where the optimizer reads and writes: the device copies when
  // optimizer_on_device(), else the host vectors. The moments are the
  // optimizer shard's (moments()[k] is element optimizer_begin() + k's).
  float* optimizer_data() { return device_.optimizer ? device_.data.data() : data_.data(); }
  float* optimizer_grads() { return device_.optimizer ? device_.grad.data() : grad_.data(); }
  float* optimizer_m() { return device_.optimizer ? device_.m.data() : m_.data(); }
  float* optimizer_v() { return device_.optimizer ? device_.v.data() : v_.data(); }
  // The whole gradient where the layers add it (the device copy once
  // placed, else the host's): a device collective reduces it in place
  // before PullGrads. Null when frozen.
  float* placed_grads() {
    if (frozen_) return nullptr;
    return device_.placed ? device_.grad.data() : grad_.data();
  }
  float* param(int i) {
    return (device_.placed ? device_.data.data() : data_.data()) + specs_[i].offset;
  }
  // Tensor i as a linear layer's weight: param(i), with its bf16 copy
  // under bf16.
  WeightRef weight(int i) {
    return WeightRef(param(i), device_.precision == Precision::kBf16
                                   ? device_.bf16.data() + specs_[i].offset
                                   : nullptr);
  }
  float* grad(int i) {
    if (frozen_) return nullptr;
    return (device_.placed ? device_.grad.data() : grad_.data()) + specs_[i].offset;
  }
  const ParamSpec& spec(int i) const { return specs_[i]; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  int64_t size() const { return total_; }

  const std::vector<float>& data() const { return data_; }
  std::vector<float>& data() { return data_; }
  std::vector<float>& grads() { return grad_; }
  std::vector<float>& adam_m() { return m_; }
  std::vector<float>& adam_v() { return v_; }
  const std::vector<float>& adam_m() const { return m_; }
  const std::vector<float>& adam_v() const { return v_; }
  int64_t& step() { return step_; }
  int64_t step() const { return step_; }

 private:
  static int64_t MasterOffset(const ParamSet& master, const ParamSpec& s);

  TpShard shard_;
  std::vector<ParamSpec> specs_;
  int64_t total_ = 0;
  bool finalized_ = false;
  bool frozen_ = false;
  std::vector<float> data_, grad_, m_, v_;
  int64_t step_ = 0;  // optimizer steps taken
  // ShardOptimizer's range (opt_end_ -1: to the end) and group size.
  int64_t opt_begin_ = 0, opt_end_ = -1;
  int opt_ranks_ = 1;
  // Place()'s copies of data and grads, and under bf16 the weights' bf16
  // copy; a copy of the set is not placed (and fp32).
  struct DeviceCopy {
    DeviceCopy() = default;
    DeviceCopy(const DeviceCopy&) {}
    DeviceCopy& operator=(const DeviceCopy&) {
      placed = false;
      optimizer = false;
      precision = Precision::kFp32;
      for (Buffer<float>* b : {&data, &grad, &m, &v}) b->set_backend(nullptr);
      bf16.set_backend(nullptr);
      return *this;
    }
    DeviceCopy(DeviceCopy&&) = default;
    DeviceCopy& operator=(DeviceCopy&&) = default;
    bool placed = false;
    bool optimizer = false;  // the moments (m, v) live here, and the step runs here
    Precision precision = Precision::kFp32;
    Buffer<float> data, grad, m, v;
    Buffer<uint16_t> bf16;
  };
  DeviceCopy device_;
};

// The master tensors of a module split over the TP group `tp` (null: one
// rank): every rank calls it; each gets the whole module (data, AdamW state,
// step) in `master`. One all-reduce of the master size per buffer: what
// tests compare a TP run with the whole module by (checkpoints are written
// from each rank's slices, with no gather: runtime/checkpoint).
absl::Status GatherMaster(const ParamSet& local, Communicator* tp, ParamSet* master);
// The same of the gradients (host copies, PullGrads first where placed):
// the whole module's gradient, in the master layout.
absl::StatusOr<std::vector<float>> GatherGradients(const ParamSet& local, Communicator* tp);
// The step under it: `master` (zeros, holding `part`'s tensors whole, and
// maybe more) gets `part` added at its place, then is summed over `group`
// (null: alone), so every member's part is gathered; its step is `part`'s.
// Also gathers a module's pipeline stages into the whole module. A frozen
// part (every member frozen alike) gathers the weights alone.
absl::Status GatherInto(const ParamSet& part, Communicator* group, ParamSet* master);

// This rank's place in its TP group `tp` (null: a group of one).
inline TpShard ShardOf(const Communicator* tp) {
  return tp == nullptr ? TpShard{} : TpShard{tp->rank(), tp->size()};
}

}  // namespace loom

#endif  // LOOM_RUNTIME_MODEL_PARAMS_H_
