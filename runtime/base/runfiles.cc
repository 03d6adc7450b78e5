#include "runtime/base/runfiles.h"

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

namespace loom {
namespace {
std::string Dir(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string SelfExe() {
  char exe[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  return n > 0 ? std::string(exe, static_cast<size_t>(n)) : "";
}

bool IsDir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
}  // namespace

std::string RunfilesRoot() {
  for (const char* var : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    const char* dir = std::getenv(var);
    if (dir != nullptr && IsDir(dir)) return dir;
  }
  const std::string self = SelfExe();
  if (!self.empty() && IsDir(self + ".runfiles")) return self + ".runfiles";
  return "";
}

std::string ExportRunfilesDir() {
  const std::string root = RunfilesRoot();
  // Overwrites a RUNFILES_DIR that is not a folder (RunfilesRoot passed it
  // over), so children see the same root this program uses.
  if (!root.empty()) ::setenv("RUNFILES_DIR", root.c_str(), /*overwrite=*/1);
  return root;
}

std::vector<std::string> RunfileCandidates(const std::string& rel) {
  std::vector<std::string> out;
  const size_t slash = rel.rfind('/');
  const std::string base = slash == std::string::npos ? rel : rel.substr(slash + 1);
  for (const char* var : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    if (const char* dir = std::getenv(var)) out.push_back(std::string(dir) + "/loom/" + rel);
  }
  const std::string self = SelfExe();
  if (!self.empty()) {
    out.push_back(self + ".runfiles/loom/" + rel);
    out.push_back(Dir(self) + "/" + base);
    out.push_back(Dir(self) + "/../lib/loom/" + base);
  }
  return out;
}

std::string FindRunfile(const std::string& rel, std::string* tried) {
  for (const std::string& path : RunfileCandidates(rel)) {
    if (::access(path.c_str(), R_OK) == 0) return path;
    if (tried != nullptr) *tried += " " + path;
  }
  return "";
}

bool FindLoomUp(std::string* loom_up, std::string* bin_dir, std::string* tried) {
  constexpr char kRel[] = "deploy/launcher/loom-up";
  *loom_up = FindRunfile(kRel, tried);
  if (loom_up->empty()) return false;
  *bin_dir = loom_up->substr(0, loom_up->size() - (sizeof(kRel) - 1) - 1);
  return true;
}

}  // namespace loom
