// Module checkpoints: one module's weights and AdamW state in one file.
//
// Format, version 1 (little-endian):
//
//   "LOOMCKPT"                         8-byte magic
//   uint32 version                      1
//   uint32 n, module name (n bytes)     "encoder", "projector", "llm"
//   int64  optimizer step
//   uint32 tensors
//   tensors × { uint32 n, name; uint32 ndim; int64 dims[ndim] }
//   float32 weights[total]              in table order
//   float32 adam_m[total], adam_v[total]
//   uint64 FNV-1a 64 of every byte above
//
// Saving is atomic: the file is written to PATH.tmp, fsync'd, renamed over
// PATH, and the folder fsync'd; a crash leaves the old file or the new one,
// never a torn one. Loading checks magic, version, module, every name and
// shape against the ParamSet it fills, and the checksum, and says which
// failed.
#ifndef LOOM_RUNTIME_CHECKPOINT_CHECKPOINT_H_
#define LOOM_RUNTIME_CHECKPOINT_CHECKPOINT_H_

#include <string>

#include "absl/status/status.h"
#include "runtime/model/params.h"

namespace loom {

inline constexpr uint32_t kCheckpointVersion = 1;

absl::Status SaveModuleCheckpoint(ParamSet& params, const std::string& module,
                                  const std::string& path);

// Fills `params` (already laid out by its module) from `path`. On error
// `params` may be partly overwritten only if the checksum failed after the
// table matched; the caller should not use it then.
// A frozen set (ParamSet::Freeze) is saved with zeros for its AdamW state and
// loads the weights only.
absl::Status LoadModuleCheckpoint(const std::string& path, const std::string& module,
                                  ParamSet* params);

// The weights alone (a new run starting from another's, LLaVA's stage 2
// from stage 1): LoadModuleCheckpoint, then the AdamW state zeroed and the
// step reset to 0.
absl::Status LoadModuleWeights(const std::string& path, const std::string& module,
                               ParamSet* params);

}  // namespace loom

#endif  // LOOM_RUNTIME_CHECKPOINT_CHECKPOINT_H_
