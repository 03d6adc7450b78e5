// `loom up --profile auto`: the job's modules profiled before it starts
// (runtime/scheduling/profile.h), so that loom-scheduler prices it by
// measurements of its own model on its own device.
#ifndef LOOM_DEPLOY_LAUNCHER_PROFILE_JOB_H_
#define LOOM_DEPLOY_LAUNCHER_PROFILE_JOB_H_

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loom/job/v1/job.pb.h"

namespace loom {

// The job's modules timed on its LLM's device, in its precision, over
// loom-schedule profile's default grid (at least two token counts up to the
// model's context), the profile written to `path`. On the CPU at each TP
// the job runs a module at that the profile can measure (it divides both
// modules' heads); on a GPU at TP 1, which loom-scheduler scales to the
// job's TPs (and says so). Run in the child loom-up of ProfileJob.
absl::Status ProfileJobTo(const job::v1::JobConfig& job, const std::string& path);

// ProfileJobTo in a child loom-up (`/proc/self/exe --profile_only`: its
// CUDA context ends with it, so the launcher keeps none on a GPU the
// workers use), its log in <run_dir>/logs/loom-up-profile.log; a line on
// `info` before and one with the fit after. The profile's path,
// <run_dir>/profile.json.
absl::StatusOr<std::string> ProfileJob(const job::v1::JobConfig& job, const std::string& run_dir,
                                       FILE* info);

}  // namespace loom

#endif  // LOOM_DEPLOY_LAUNCHER_PROFILE_JOB_H_
