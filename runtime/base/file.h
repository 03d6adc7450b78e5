// Small file-system helpers shared by the launcher and checkpoints.
#ifndef LOOM_RUNTIME_BASE_FILE_H_
#define LOOM_RUNTIME_BASE_FILE_H_

#include <string>

#include "absl/status/status.h"

namespace loom {

// Creates `dir` and its parents if missing.
absl::Status MakeDirectories(const std::string& dir);

// Writes `contents` to `path` atomically: PATH.tmp, fsync, rename over PATH,
// fsync the folder. A crash leaves the old file or the new one, never a torn
// one.
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents);

}  // namespace loom

#endif  // LOOM_RUNTIME_BASE_FILE_H_
