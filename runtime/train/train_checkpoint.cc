#include "runtime/train/train_checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/file.h"
#include "runtime/checkpoint/checkpoint.h"

namespace loom {
namespace {

const char* const* kModules = kModuleNames;

}  // namespace

std::string StepDir(const std::string& dir, int64_t step) {
  return absl::StrCat(dir, "/step-", step);
}

absl::Status SaveTrainingCheckpoint(MultimodalModel& model, int64_t step, const std::string& dir) {
  const std::string sd = StepDir(dir, step);
  if (absl::Status s = MakeDirectories(sd); !s.ok()) return s;
  auto sets = model.param_sets();
  for (size_t i = 0; i < sets.size(); ++i) {
    absl::Status s =
        SaveModuleCheckpoint(*sets[i], kModules[i], absl::StrCat(sd, "/", kModules[i], ".ckpt"));
    if (!s.ok()) return s;
  }
  return WriteFileAtomically(sd + "/COMPLETE", absl::StrCat("step ", step, "\n"));
}

absl::StatusOr<int64_t> LatestCompleteCheckpoint(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::NotFoundError(absl::StrCat("no checkpoint folder ", dir));
  int64_t best = -1;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    int64_t step;
    if (name.rfind("step-", 0) != 0 || !absl::SimpleAtoi(name.substr(5), &step)) continue;
    struct stat st;
    if (stat(absl::StrCat(dir, "/", name, "/COMPLETE").c_str(), &st) == 0 && step > best) {
      best = step;
    }
  }
  closedir(d);
  if (best < 0) return absl::NotFoundError(absl::StrCat("no complete checkpoint in ", dir));
  return best;
}

absl::Status LoadTrainingCheckpoint(MultimodalModel& model, int64_t step, const std::string& dir) {
  const std::string sd = StepDir(dir, step);
  auto sets = model.param_sets();
  for (size_t i = 0; i < sets.size(); ++i) {
    absl::Status s =
        LoadModuleCheckpoint(absl::StrCat(sd, "/", kModules[i], ".ckpt"), kModules[i], sets[i]);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace loom
