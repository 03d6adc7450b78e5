// Module checkpoints: one module's weights and AdamW state, as the master
// tensors (whole, whatever the TP and PP degrees), streamed into parts that
// the ranks holding the state write side by side, each from its own TP slice
// (no rank gathers a stage), and a manifest naming them.
//
// In a step folder DIR:
//   DIR/<module>.ckpt          the manifest (JSON): format, version, module,
//                              optimizer step, the part files ("parts"), and
//                              what each holds ("contents", optional)
//   DIR/<module>.part-<i>      a part: some elements of some master tensors
//
// The manifest:
//   {"format": "loom-checkpoint", "version": 3, "module": "llm", "step": 5,
//    "parts": ["llm.part-0", "llm.part-1"],
//    "contents": [[{"tensor": "embed.weight", "shape": [8, 4],
//                   "lo": 0, "hi": 32}, ...,      part 0's entries
//                  {"tensor": "blocks.0.proj.weight", "shape": [4, 4],
//                   "lo": 0, "hi": 2, "count": 4, "stride": 4}],
//                 [...]]}                         part 1's
// An entry holds elements [lo, hi) of the flattened master tensor, or with
// "count" (> 1) and "stride" the runs [lo + i * stride, hi + i * stride)
// for i < count, in that order: a TP rank's slice of a row-parallel weight
// (columns of every row) is one entry.
// "contents", one list per part in the order of "parts", repeats each part's
// header entries (below), so a load plans from the manifest alone and opens
// only the parts that hold its slices. A manifest without it (written before
// it existed, or by a writer that knows only the part names) still loads:
// the loader then reads each part's header first, one file at a time.
//
// A part (little-endian):
//   "LOOMPART"                          8-byte magic
//   uint32 version                      2, or 3 where an entry is strided
//   uint32 n, module name (n bytes)     "encoder", "projector", "llm"
//   int64  optimizer step
//   uint32 block bytes                  the payload's checksum blocks
//   uint32 entries
//   entries × { uint32 n, name; uint32 ndim; int64 dims[ndim];
//               int64 lo, hi;           elements [lo, hi) of that master
//                                       tensor (flattened, row-major)
//               version 3: int64 count, stride }   the runs, as above
//   uint64 XXH3-64 of the header above
//   payload: float32 weights, then adam_m, then adam_v, each of the entries'
//            elements in entry order
//   uint64 XXH3-64 of each block of the payload, in order
//   uint64 XXH3-64 of that table
//
// Every entry of a part and manifest without strided entries is written as
// version 2 (what builds before version 3 read), the others as version 3;
// this build reads both.
//
// Writing streams the tensors' own memory through write() in blocks, hashing
// as it goes: no serialized copy, so the extra memory is a few pages. Loading
// reads one verified block at a time into the rank's own slices (any TP
// shard of any pipeline stage), so a checkpoint saved under one layout loads
// under another and no rank holds the whole module. It opens only the parts
// that hold the rank's slices, one at a time (at most one part file is open
// at once, whatever the number of parts). Each file is written atomically
// (PATH.tmp, fsync, rename, fsync the folder). Loading checks the manifest,
// the module, every tensor's name and master shape, that the parts cover
// each tensor exactly once, that every part it opens has the header the
// manifest describes, and every block's checksum it reads, and says which
// failed.
#ifndef LOOM_RUNTIME_CHECKPOINT_CHECKPOINT_H_
#define LOOM_RUNTIME_CHECKPOINT_CHECKPOINT_H_

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "runtime/model/params.h"

namespace loom {

// The newest format version this build writes; it reads 2 and 3.
inline constexpr uint32_t kCheckpointVersion = 3;

// DIR/<module>.ckpt, and the name (within DIR) of the module's part `index`.
std::string ModuleManifestPath(const std::string& dir, const std::string& module);
std::string ModulePartName(const std::string& module, int index);

// Elements [begin, end) of the flat buffers of `set` (the module, one
// pipeline stage of it, or a TP shard of either) as a part. Of a TP shard
// (size > 1) the part holds the set's slices of the split tensors in that
// range, and of the replicated tensors, which every rank of the TP group
// holds alike, the shard's 1 / TP of the range: the TP group's parts for one
// range cover it once, with no gather. Either a view of the set's memory
// (written at once, before the set changes) or a snapshot (a copy of that
// range, written later while the set trains on). Under a sharded optimizer
// the range lies within the set's optimizer shard.
class CheckpointPart {
 public:
  struct Entry {
    std::string name;
    Shape shape;  // the master tensor's
    int64_t lo = 0, hi = 0;
    int64_t count = 1, stride = 0;  // runs [lo + i * stride, hi + i * stride), i < count
    int64_t elements() const { return count * (hi - lo); }
  };

  static CheckpointPart View(const ParamSet& set, int64_t begin, int64_t end);
  static CheckpointPart Snapshot(const ParamSet& set, int64_t begin, int64_t end);

  // Writes the part to `path` atomically (a module name, as its manifest's).
  absl::Status Write(const std::string& module, const std::string& path) const;

  // What the part holds, in payload order (its header's entries).
  const std::vector<Entry>& entries() const { return entries_; }
  int64_t elements() const { return elements_; }
  int64_t step() const { return step_; }
  // Bytes this part holds in memory of its own (a snapshot's copies).
  int64_t owned_bytes() const;

 private:
  std::vector<Entry> entries_;
  int64_t step_ = 0;
  int64_t elements_ = 0;
  // The payload: these ranges of the set's flat buffers, in order; element x
  // of array a is arrays_[a][x - shift_[a]] (the moments of a sharded
  // optimizer start at its shard).
  std::vector<std::pair<int64_t, int64_t>> ranges_;
  std::array<const float*, 3> arrays_{};  // weights, adam_m, adam_v; null: zeros
  std::array<int64_t, 3> shift_{};
  std::array<std::vector<float>, 3> owned_;
};

// The elements a module's parts split into: part `index` of `count` of a
// flat buffer of `total` elements, [first, second): a collective's chunk
// (ChunkRange), so that a sharded optimizer's rank holds its parts' moments.
// A stage's rank at (dp, tp) writes PartRange(its set's size, dp, DP) of its
// set, as part dp * TP + tp of the stage's DP × TP.
std::pair<int64_t, int64_t> PartRange(int64_t total, int index, int count);

// DIR/<module>.ckpt naming `parts` (file names within DIR), written
// atomically; `contents`, if not empty, says what each part holds (its
// entries(), one list per part). A manifest without contents loads, with a
// header read of every part first (DescribeModuleParts adds them).
absl::Status WriteModuleManifest(
    const std::string& dir, const std::string& module, int64_t step,
    const std::vector<std::string>& parts,
    const std::vector<std::vector<CheckpointPart::Entry>>& contents = {});

// Adds the contents to a manifest in DIR that names its parts only, reading
// each part's header once, one file at a time (the part files must all be
// written). Checks each part's module and step. A manifest that has its
// contents is left as it is.
absl::Status DescribeModuleParts(const std::string& dir, const std::string& module);

// One process's whole module (`params` of TP size 1) as one part and its
// manifest in DIR.
absl::Status SaveModuleCheckpoint(const ParamSet& params, const std::string& module,
                                  const std::string& dir);

// Fills `params` (laid out by its module: any TP shard of the whole module
// or of one pipeline stage) and its step from the module's checkpoint in
// DIR. `whole_module`: `params` holds every tensor of the module, so the
// checkpoint must hold no others. On an error `params` may be partly
// overwritten; the caller should not use it then. A frozen set
// (ParamSet::Freeze) loads the weights only; a frozen module is saved with
// zeros for its AdamW state.
absl::Status LoadModuleCheckpoint(const std::string& dir, const std::string& module,
                                  ParamSet* params, bool whole_module = true);

// The weights alone (a new run starting from another's, LLaVA's stage 2
// from stage 1): LoadModuleCheckpoint, then the AdamW state zeroed and the
// step reset to 0.
absl::Status LoadModuleWeights(const std::string& dir, const std::string& module, ParamSet* params,
                               bool whole_module = true);

}  // namespace loom

#endif  // LOOM_RUNTIME_CHECKPOINT_CHECKPOINT_H_
