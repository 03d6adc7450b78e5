// Names and classes of loom.control.v1.JobState, shared by the scheduler,
// its control service and the control client.
#ifndef LOOM_SERVICES_SCHEDULER_JOB_STATE_H_
#define LOOM_SERVICES_SCHEDULER_JOB_STATE_H_

#include <string>

#include "loom/control/v1/control.pb.h"

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

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_JOB_STATE_H_
