// Small file-system helpers shared by the launcher and checkpoints.
#ifndef LOOM_RUNTIME_BASE_FILE_H_
#define LOOM_RUNTIME_BASE_FILE_H_

#include <cstddef>
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

// The same, streamed: Open, any number of Write, then Commit (fsync, rename,
// fsync the folder). Destroyed uncommitted, it removes PATH.tmp.
class AtomicFile {
 public:
  AtomicFile() = default;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  absl::Status Open(const std::string& path);
  // Writes all `n` bytes (retrying short writes and EINTR).
  absl::Status Write(const void* data, size_t n);
  absl::Status Commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};

// The whole file; NOT_FOUND if it does not exist, INTERNAL on a read error.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Moves the log at `path` aside before a new process writes a fresh one,
// keeping every earlier one: PATH.prev is the newest, PATH.prev.1 the one
// before it, up to PATH.prev.`keep` (older ones are dropped). A replaced
// process's log (a crash, a recovery) then survives every later
// replacement. Nothing to do when `path` does not exist.
void KeepEarlierLogs(const std::string& path, int keep = 32);

}  // namespace loom

#endif  // LOOM_RUNTIME_BASE_FILE_H_
