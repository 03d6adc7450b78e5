#include "services/common/job_end.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/flags/flag.h"

ABSL_FLAG(bool, exit_on_job_end, false,
          "Exit 0 once the job is final (SUCCEEDED, CANCELLED, FAILED) instead of serving on: "
          "a workload that ends with its job (Kubernetes Jobs, srun). loom-scheduler stays until "
          "the others were told, and exits 3 for a FAILED job.");

namespace loom {
namespace {
std::atomic<bool> ended_by_job{false};
}  // namespace

int JobEndExitStatus(int rc) {
  if (!absl::GetFlag(FLAGS_exit_on_job_end) || ended_by_job.load() || rc != 0) return rc;
  return 128 + SIGTERM;
}

void StopProcessSoon(absl::Duration delay) {
  ended_by_job.store(true);
  std::thread([delay] {
    absl::SleepFor(delay);
    kill(getpid(), SIGTERM);
  }).detach();
}

}  // namespace loom
