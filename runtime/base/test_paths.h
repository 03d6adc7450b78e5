// Paths a C++ test uses, from the test framework: one place instead of a
// helper per test file.
#ifndef LOOM_RUNTIME_BASE_TEST_PATHS_H_
#define LOOM_RUNTIME_BASE_TEST_PATHS_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/base/runfiles.h"

namespace loom::testing {

// $TEST_TMPDIR/NAME: the test's own temporary folder, which Bazel creates
// for each test and removes after it. Outside Bazel (no TEST_TMPDIR) the
// test aborts instead of writing into a shared /tmp.
inline std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  if (dir == nullptr || *dir == 0) {
    std::fprintf(stderr, "TEST_TMPDIR is not set: run the test with bazel test\n");
    std::abort();
  }
  return std::string(dir) + "/" + name;
}

// The path of workspace file REL (e.g. "deploy/launcher/loom-up"; "" for the
// workspace root) in the test's runfiles, as RunfilesRoot finds them.
inline std::string RunfilePath(const std::string& rel) {
  return RunfilesRoot() + "/loom" + (rel.empty() ? "" : "/" + rel);
}

}  // namespace loom::testing

#endif  // LOOM_RUNTIME_BASE_TEST_PATHS_H_
