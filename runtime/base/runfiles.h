// Finding files Bazel ships with a binary (its runfiles), also when the
// binary is started by a test, by a genrule, or from an installed layout.
#ifndef LOOM_RUNTIME_BASE_RUNFILES_H_
#define LOOM_RUNTIME_BASE_RUNFILES_H_

#include <string>
#include <vector>

namespace loom {

// Where `rel` (a path under the workspace, e.g. "runtime/data/tokenizer.model")
// may be, in order: $RUNFILES_DIR/loom/REL, $TEST_SRCDIR/loom/REL,
// EXE.runfiles/loom/REL, EXE_DIR/BASENAME, EXE_DIR/../lib/loom/BASENAME.
std::vector<std::string> RunfileCandidates(const std::string& rel);

// The first candidate that exists, else "" with `tried` listing them.
std::string FindRunfile(const std::string& rel, std::string* tried);

}  // namespace loom

#endif  // LOOM_RUNTIME_BASE_RUNFILES_H_
