// Names and classes of loom.control.v1.JobState, shared by the scheduler,
// its control service and the control client.
#ifndef LOOM_SERVICES_SCHEDULER_JOB_STATE_H_
#define LOOM_SERVICES_SCHEDULER_JOB_STATE_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "loom/control/v1/control.pb.h"
#include "services/common/chassis.h"

namespace loom {

// "RUNNING" for JOB_STATE_RUNNING.
inline std::string JobStateName(control::v1::JobState state) {
  const std::string name = control::v1::JobState_Name(state);
  const std::string prefix = "JOB_STATE_";
  return name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
}

// SUCCEEDED, CANCELLED and FAILED: nothing moves the job on from there.
inline bool IsFinalJobState(control::v1::JobState s) {
  return s == control::v1::JOB_STATE_SUCCEEDED || s == control::v1::JOB_STATE_CANCELLED ||
         s == control::v1::JOB_STATE_FAILED;
}

// What the job is doing, for Recovery.phase: "checkpoint 12 being written"
// while a checkpoint is pending, else "iteration N" (the next to finish).
inline std::string JobPhase(const control::v1::Job& j) {
  if (j.pending_checkpoint() > 0) {
    return absl::StrCat("checkpoint ", j.pending_checkpoint(), " being written");
  }
  return absl::StrCat("iteration ", j.completed_iterations());
}

// "llm_worker rank 1 lost during iteration 8: exited (signal 9)"; "a service
// lost during ..." when the loss is not one process's.
inline std::string DescribeLoss(const control::v1::Recovery& r) {
  const std::string who = r.role() == common::v1::ROLE_UNSPECIFIED
                              ? "a service"
                              : absl::StrCat(RoleLabel(r.role()), " rank ", r.rank());
  return absl::StrCat(who, " lost during ", r.phase(), ": ", r.cause());
}

// "effective training time 71.2% (8.123456 s of kept iterations in
// 11.406000 s)"; "" before the job first ran.
inline std::string DescribeTrainingTime(const control::v1::TrainingTime& t) {
  if (t.started_seconds() <= 0) return "";
  return absl::StrFormat("effective training time %.1f%% (%.6f s of kept iterations in %.6f s)",
                         100 * t.effective_ratio(), t.productive_seconds(), t.elapsed_seconds());
}

// "1.23M" for 1,234,567: a count as people read it.
inline std::string HumanCount(double n) {
  if (n >= 1e12) return absl::StrFormat("%.2fT", n / 1e12);
  if (n >= 1e9) return absl::StrFormat("%.2fG", n / 1e9);
  if (n >= 1e6) return absl::StrFormat("%.2fM", n / 1e6);
  if (n >= 1e3) return absl::StrFormat("%.1fk", n / 1e3);
  return absl::StrFormat("%.0f", n);
}

// "2h05m", "3m07s", "42s".
inline std::string HumanSeconds(double s) {
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return absl::StrFormat("%dh%02dm", t / 3600, (t % 3600) / 60);
  if (t >= 60) return absl::StrFormat("%dm%02ds", t / 60, t % 60);
  return absl::StrFormat("%ds", t);
}

// "tokens 1.23M  ETA 3m07s" (the ETA when known).
inline std::string DescribeProgress(const control::v1::Job& j) {
  std::string s = absl::StrCat("tokens ", HumanCount(static_cast<double>(j.tokens_seen())));
  if (j.eta_seconds() > 0) absl::StrAppend(&s, "  ETA ", HumanSeconds(j.eta_seconds()));
  return s;
}

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_JOB_STATE_H_
