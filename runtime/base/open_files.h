// The process's open-file limit.
#ifndef LOOM_RUNTIME_BASE_OPEN_FILES_H_
#define LOOM_RUNTIME_BASE_OPEN_FILES_H_

namespace loom {

// Raises the soft RLIMIT_NOFILE to the hard limit, so a process with many
// peers, channels and files is not held to the usual soft 1,024. Call once at
// process start (InitService does, and loom-train-local's main). Logs a
// warning if it cannot; the process runs on under the old limit. Returns
// the soft limit in effect after the call.
long RaiseOpenFileLimit();

}  // namespace loom

#endif  // LOOM_RUNTIME_BASE_OPEN_FILES_H_
