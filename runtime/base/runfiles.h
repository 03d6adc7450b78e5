// Finding files Bazel ships with a binary (its runfiles), also when the
// binary is started by a test, by a genrule, by another binary from that
// binary's runfiles, or from an installed layout.
#ifndef LOOM_RUNTIME_BASE_RUNFILES_H_
#define LOOM_RUNTIME_BASE_RUNFILES_H_

#include <string>
#include <vector>

namespace loom {

// This program's runfiles root (the folder holding loom/), in order:
// $RUNFILES_DIR, $TEST_SRCDIR, EXE.runfiles; "" when none exists.
std::string RunfilesRoot();

// Sets RUNFILES_DIR to RunfilesRoot() unless it is set already, so that the
// programs this one starts from its runfiles find their own data there (a
// binary started through a runfiles symlink resolves /proc/self/exe to the
// real file, whose own runfiles tree exists only if it was built as a
// top-level target). Returns the root ("" when none). Call it from main()
// before starting threads: it changes the environment.
std::string ExportRunfilesDir();

// Where `rel` (a path under the workspace, e.g. "runtime/data/tokenizer.model")
// may be, in order: $RUNFILES_DIR/loom/REL, $TEST_SRCDIR/loom/REL,
// EXE.runfiles/loom/REL, EXE_DIR/BASENAME, EXE_DIR/../lib/loom/BASENAME.
std::vector<std::string> RunfileCandidates(const std::string& rel);

// The first candidate that exists, else "" with `tried` listing them.
std::string FindRunfile(const std::string& rel, std::string* tried);

// The launcher `loom up` among the runfiles (deploy/launcher/loom-up) and
// the folder it takes as --bin_dir (the runfiles' workspace root), for the
// benchmarks that run jobs; false with `tried` listing the candidates.
bool FindLoomUp(std::string* loom_up, std::string* bin_dir, std::string* tried);

}  // namespace loom

#endif  // LOOM_RUNTIME_BASE_RUNFILES_H_
