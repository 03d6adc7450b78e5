#include "services/common/job_end.h"

#include <signal.h>
#include <unistd.h>

#include <thread>

#include "absl/flags/flag.h"

ABSL_FLAG(bool, exit_on_job_end, false,
          "Exit 0 once the job is final (SUCCEEDED, CANCELLED, FAILED) instead of serving on: "
          "a workload that ends with its job (Kubernetes Jobs, srun). loom-scheduler stays until "
          "the others were told, and exits 3 for a FAILED job.");

namespace loom {

void StopProcessSoon(absl::Duration delay) {
  std::thread([delay] {
    absl::SleepFor(delay);
    kill(getpid(), SIGTERM);
  }).detach();
}

}  // namespace loom
