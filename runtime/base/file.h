// Small file-system helpers shared by the launcher and checkpoints.
#ifndef LOOM_RUNTIME_BASE_FILE_H_
#define LOOM_RUNTIME_BASE_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom {

// Creates `dir` and its parents if missing.
absl::Status MakeDirectories(const std::string& dir);

// Writes `contents` to `path` atomically: PATH.tmp, fsync, rename over PATH,
// fsync the folder. A crash leaves the old file or the new one, never a torn
// one.
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents);

// The whole file; NOT_FOUND if it does not exist, INTERNAL on a read error.
absl::StatusOr<std::string> ReadFile(const std::string& path);

}  // namespace loom

#endif  // LOOM_RUNTIME_BASE_FILE_H_
