// --exit_on_job_end: a Loom service whose workload should end with its job
// (a Kubernetes Job or JobSet, an srun step) exits 0 once the job is final,
// instead of serving on for the next one:
//   - a worker once loom-scheduler answers it job_ended (and its last
//     checkpoint is written);
//   - loom-preprocess once loom-scheduler calls its EndJob;
//   - loom-scheduler once every worker rank has been told and
//     loom-preprocess has answered EndJob (or --exit_grace has passed
//     since the end); it exits 3 when the job FAILED.
#ifndef LOOM_SERVICES_COMMON_JOB_END_H_
#define LOOM_SERVICES_COMMON_JOB_END_H_

#include "absl/flags/declare.h"
#include "absl/time/time.h"

ABSL_DECLARE_FLAG(bool, exit_on_job_end);

namespace loom {

// Stops this process as SIGTERM does (the chassis drains and its main
// returns), `delay` from now, from a thread of its own: an RPC that asked
// for it is answered first. The job's end, for JobEndExitStatus.
void StopProcessSoon(absl::Duration delay = absl::Milliseconds(200));

// A main's exit status `rc` after its stop: with --exit_on_job_end, a stop
// that was not the job's end (SIGTERM from a drain, an eviction, a
// person) exits 143 instead of 0, so that a Job does not take the pod for
// done and starts it again.
int JobEndExitStatus(int rc);

}  // namespace loom

#endif  // LOOM_SERVICES_COMMON_JOB_END_H_
