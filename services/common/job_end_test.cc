#include "services/common/job_end.h"

#include "absl/flags/flag.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

// A stop that is not the job's end (the process never called
// StopProcessSoon) exits 143 under --exit_on_job_end, so that a Job takes
// a drained or evicted pod for failed, not done; without the flag, and for
// a failure's own status, nothing changes.
TEST(JobEndTest, AStopThatIsNotTheJobsEndIsNotASuccess) {
  EXPECT_EQ(JobEndExitStatus(0), 0);
  EXPECT_EQ(JobEndExitStatus(1), 1);
  absl::SetFlag(&FLAGS_exit_on_job_end, true);
  EXPECT_EQ(JobEndExitStatus(0), 143);
  EXPECT_EQ(JobEndExitStatus(1), 1);
  absl::SetFlag(&FLAGS_exit_on_job_end, false);
}

}  // namespace
}  // namespace loom
