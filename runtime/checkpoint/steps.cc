#include "runtime/checkpoint/steps.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "runtime/base/file.h"

namespace loom {
namespace {

constexpr char kRunFile[] = "RUN";
constexpr char kCompleteFile[] = "COMPLETE";

// "key value" lines -> map.
std::map<std::string, std::string> Fields(const std::string& text) {
  std::map<std::string, std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits(' ', 1));
    out[std::string(kv.first)] = std::string(kv.second);
  }
  return out;
}

std::string RunText(const CheckpointRun& run) {
  return absl::StrCat("run ", run.id, "\nidentity ", run.identity, "\n");
}

absl::Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return absl::OkStatus();
  const int rc = ::nftw(
      path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); },
      16, FTW_DEPTH | FTW_PHYS);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("cannot remove ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open ", dir, ": ", std::strerror(errno)));
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("cannot fsync ", dir, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

struct CompleteStep {
  int64_t step = 0;
  std::string run, identity;
};

constexpr char kReplacedSuffix[] = ".replaced";

std::atomic<bool> force_rename_aside{false};

// Every complete step under `dir`, by step. A step folder without COMPLETE
// is skipped (it cannot be one: the file is written before the rename); one
// whose COMPLETE cannot be read is an error, not a missing step.
absl::StatusOr<std::map<int64_t, CompleteStep>> CompleteSteps(const std::string& dir) {
  std::map<int64_t, CompleteStep> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return out;
    return absl::InternalError(absl::StrCat("cannot list ", dir, ": ", std::strerror(errno)));
  }
  absl::Status error;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    int64_t step;
    if (!absl::StartsWith(name, "step-") || !absl::SimpleAtoi(name.substr(5), &step)) continue;
    absl::StatusOr<std::string> text = ReadFile(absl::StrCat(dir, "/", name, "/", kCompleteFile));
    if (!text.ok()) {
      if (!absl::IsNotFound(text.status()) && error.ok()) {
        error = absl::Status(
            text.status().code(),
            absl::StrCat("cannot read checkpoint step ", step, ": ", text.status().message()));
      }
      continue;
    }
    std::map<std::string, std::string> f = Fields(*text);
    out[step] = {step, f["run"], f["identity"]};
  }
  ::closedir(d);
  if (!error.ok()) return error;
  return out;
}

// Puts back every step a crash left renamed aside with no step in its
// place, and drops those whose replacement is in place.
absl::Status RestoreReplacedSteps(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return absl::OkStatus();
  std::vector<std::string> aside;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (absl::StartsWith(name, "step-") && absl::EndsWith(name, kReplacedSuffix)) {
      aside.push_back(name);
    }
  }
  ::closedir(d);
  for (const std::string& name : aside) {
    const std::string path = absl::StrCat(dir, "/", name);
    const std::string step_dir = absl::StrCat(dir, "/", absl::StripSuffix(name, kReplacedSuffix));
    struct stat st;
    if (::stat(step_dir.c_str(), &st) == 0) {
      if (absl::Status s = RemoveTree(path); !s.ok()) return s;
      continue;
    }
    if (::rename(path.c_str(), step_dir.c_str()) != 0) {
      return absl::InternalError(
          absl::StrCat("cannot put back ", path, " as ", step_dir, ": ", std::strerror(errno)));
    }
    if (absl::Status s = SyncDir(dir); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Replaces the existing `final_dir` by `partial`: the old one renamed aside,
// the new one into place, the old one removed.
absl::Status ReplaceByRenamingAside(const std::string& dir, const std::string& partial,
                                    const std::string& final_dir) {
  const std::string aside = final_dir + kReplacedSuffix;
  if (absl::Status s = RemoveTree(aside); !s.ok()) return s;  // restored before: a stale one
  if (::rename(final_dir.c_str(), aside.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot rename ", final_dir, " to ", aside, ": ", std::strerror(errno)));
  }
  if (::rename(partial.c_str(), final_dir.c_str()) != 0) {
    const int err = errno;
    ::rename(aside.c_str(), final_dir.c_str());  // the old step back, if it can be
    return absl::InternalError(
        absl::StrCat("cannot rename ", partial, " to ", final_dir, ": ", std::strerror(err)));
  }
  if (absl::Status s = SyncDir(dir); !s.ok()) return s;
  return RemoveTree(aside);
}

}  // namespace

std::string StepDir(const std::string& dir, int64_t step) {
  return absl::StrCat(dir, "/step-", step);
}

std::string PartialStepDir(const std::string& dir, int64_t step) {
  return StepDir(dir, step) + ".partial";
}

void ForceRenameAsideForTesting(bool force) { force_rename_aside = force; }

absl::StatusOr<CheckpointRun> StartCheckpointRun(const std::string& dir,
                                                 const std::string& identity) {
  if (identity.find('\n') != std::string::npos) {
    return absl::InvalidArgumentError("checkpoint identity: must be one line");
  }
  std::random_device rd;
  CheckpointRun run;
  run.id = absl::StrFormat("%08x%08x", rd(), rd());
  run.identity = identity;
  if (absl::Status s = MakeDirectories(dir); !s.ok()) return s;
  return run;
}

absl::StatusOr<CheckpointRun> ReadCheckpointRun(const std::string& dir) {
  absl::StatusOr<std::string> text = ReadFile(absl::StrCat(dir, "/", kRunFile));
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(absl::StrCat("no run in checkpoint folder ", dir, " (no ", kRunFile,
                                            " file: no run was started there)"));
  }
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("cannot read the run of checkpoint folder ", dir, ": ",
                                     text.status().message()));
  }
  std::map<std::string, std::string> f = Fields(*text);
  if (f["run"].empty()) return absl::DataLossError(absl::StrCat(dir, "/", kRunFile, ": no run id"));
  return CheckpointRun{f["run"], f["identity"]};
}

absl::Status BeginCheckpointStep(const std::string& dir, int64_t step) {
  const std::string partial = PartialStepDir(dir, step);
  if (absl::Status s = RemoveTree(partial); !s.ok()) return s;
  return MakeDirectories(partial);
}

absl::Status CommitCheckpointStep(const std::string& dir, int64_t step, const CheckpointRun& run) {
  const std::string partial = PartialStepDir(dir, step), final_dir = StepDir(dir, step);
  if (absl::Status s = RestoreReplacedSteps(dir); !s.ok()) return s;
  struct stat st;
  if (::stat(partial.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint step ", step, ": no partial folder ", partial));
  }
  if (absl::Status s = WriteFileAtomically(absl::StrCat(partial, "/", kCompleteFile),
                                           absl::StrCat("step ", step, "\n", RunText(run)));
      !s.ok()) {
    return s;
  }
  // The folder is this run's from its first complete step on. RUN first: a
  // crash before the step appears leaves a run with no step yet, which a
  // resume refuses by name, rather than an older run silently resumed.
  absl::StatusOr<CheckpointRun> current = ReadCheckpointRun(dir);
  if (!current.ok() || current->id != run.id) {
    if (absl::Status s = WriteFileAtomically(absl::StrCat(dir, "/", kRunFile), RunText(run));
        !s.ok()) {
      return s;
    }
  }
  if (::stat(final_dir.c_str(), &st) != 0) {
    if (::rename(partial.c_str(), final_dir.c_str()) != 0) {
      return absl::InternalError(
          absl::StrCat("cannot rename ", partial, " to ", final_dir, ": ", std::strerror(errno)));
    }
    return SyncDir(dir);
  }
  // An existing step N (an older run's, or this step written again): one
  // atomic exchange, so a step N is visible at every moment; the old one,
  // now under the partial name, is removed after. File systems without the
  // exchange get the old one renamed aside first.
  if (force_rename_aside) return ReplaceByRenamingAside(dir, partial, final_dir);
  if (::renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0) {
    const int err = errno;
    if (err == EINVAL || err == ENOSYS || err == EOPNOTSUPP) {
      return ReplaceByRenamingAside(dir, partial, final_dir);
    }
    return absl::InternalError(
        absl::StrCat("cannot exchange ", partial, " and ", final_dir, ": ", std::strerror(err)));
  }
  if (absl::Status s = SyncDir(dir); !s.ok()) return s;
  return RemoveTree(partial);
}

absl::StatusOr<int64_t> ResumableStep(const std::string& dir, const std::string& identity,
                                      int64_t want) {
  absl::StatusOr<CheckpointRun> run = ReadCheckpointRun(dir);
  if (!run.ok()) return run.status();
  if (absl::Status s = RestoreReplacedSteps(dir); !s.ok()) return s;
  absl::StatusOr<std::map<int64_t, CompleteStep>> complete = CompleteSteps(dir);
  if (!complete.ok()) return complete.status();
  const std::map<int64_t, CompleteStep>& steps = *complete;
  std::vector<std::string> others;
  const CompleteStep* pick = nullptr;
  for (const auto& [step, c] : steps) {
    if (c.run != run->id) {
      others.push_back(absl::StrCat(step, " (run ", c.run.empty() ? "unknown" : c.run, ")"));
    } else if (want > 0 ? step == want : true) {
      pick = &c;
    }
  }
  if (want > 0 && steps.count(want) > 0 && steps.at(want).run != run->id) {
    const std::string& owner = steps.at(want).run;
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", StepDir(dir, want), " ",
                     owner.empty() ? "names no run (written before checkpoints had runs)"
                                   : absl::StrCat("belongs to run ", owner),
                     ", not to run ", run->id, " that ", dir, "/", kRunFile,
                     " names (a later fresh run checkpointed in this folder)"));
  }
  if (pick == nullptr) {
    std::string what = want > 0 ? absl::StrCat("no complete step ", want) : "no complete step";
    return absl::NotFoundError(absl::StrCat(
        what, " of run ", run->id, " in ", dir,
        others.empty()
            ? ""
            : absl::StrCat("; steps of other runs, not resumed: ", absl::StrJoin(others, ", "))));
  }
  if (pick->identity != identity) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", StepDir(dir, pick->step), " was written by a job with another identity: \"",
        pick->identity, "\"; this job is \"", identity, "\""));
  }
  return pick->step;
}

}  // namespace loom
