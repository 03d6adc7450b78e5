#include "services/worker/scheduler_client.h"

#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "services/common/chassis.h"
#include "services/common/chassis_testing.h"

namespace loom {
namespace {

// A scheduler whose answers are lost in transit: each report counts once
// (as loom-scheduler's do), but the first `lost` answers of each method -
// whatever they were - come back UNAVAILABLE, as from a connection that
// broke after the call landed. `refuse` answers INVALID_ARGUMENT instead.
class LossyScheduler final : public scheduler::v1::SchedulerService::Service {
 public:
  grpc::Status ReportStep(grpc::ServerContext*, const scheduler::v1::ReportStepRequest* r,
                          scheduler::v1::ReportStepResponse*) override {
    absl::MutexLock lock(&mu_);
    ++step_calls;
    return Lose(&lost_steps, [&] {
      if (refuse) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "step: bad");
      if (!steps.empty() && steps.back() >= r->step().iteration()) {
        return grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "step.iteration: already reported");
      }
      steps.push_back(r->step().iteration());
      return grpc::Status::OK;
    }());
  }
  grpc::Status ReportCheckpoint(grpc::ServerContext*,
                                const scheduler::v1::ReportCheckpointRequest* r,
                                scheduler::v1::ReportCheckpointResponse*) override {
    absl::MutexLock lock(&mu_);
    ++checkpoint_calls;
    return Lose(&lost_checkpoints, [&] {
      if (!parts.empty() && parts.back() == r->step()) {  // the last part: the step completed
        return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                            "step: checkpoint is already complete");
      }
      parts.push_back(r->step());
      return grpc::Status::OK;
    }());
  }

  // The answer, or UNAVAILABLE while answers are being lost.
  static grpc::Status Lose(int* lost, grpc::Status answer) {
    if (*lost == 0) return answer;
    --*lost;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection reset");
  }

  absl::Mutex mu_;
  int lost_steps = 0, lost_checkpoints = 0;
  bool refuse = false;
  int step_calls = 0, checkpoint_calls = 0;
  std::vector<int64_t> steps, parts;
};

class SchedulerClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    chassis_ = std::make_unique<Chassis>(
        testing::LocalOptions("loom-scheduler", common::v1::ROLE_SCHEDULER));
    chassis_->AddService(&service_, scheduler::v1::SchedulerService::service_full_name());
    ASSERT_TRUE(chassis_->Start().ok());
    client_ = std::make_unique<SchedulerClient>(testing::ChannelTo(*chassis_), absl::Seconds(10),
                                                nullptr);
  }
  void TearDown() override { chassis_->Shutdown(); }

  LossyScheduler service_;
  std::unique_ptr<Chassis> chassis_;
  std::unique_ptr<SchedulerClient> client_;
};

TEST_F(SchedulerClientTest, AReportWhoseAnswerWasLostIsRetriedAndCountsOnce) {
  service_.lost_steps = 2;
  scheduler::v1::StepReport step;
  step.set_iteration(7);
  absl::Status s = client_->ReportStep(step);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(service_.steps, std::vector<int64_t>{7});
  EXPECT_EQ(service_.step_calls, 3) << "two answers lost, then ALREADY_EXISTS: the first landed";

  service_.lost_checkpoints = 1;
  s = client_->ReportCheckpoint(common::v1::ROLE_LLM_WORKER, 0, 10);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(service_.parts, std::vector<int64_t>{10});
  EXPECT_EQ(service_.checkpoint_calls, 2);
}

TEST_F(SchedulerClientTest, AReportIsNotRetriedOnAnAnswer) {
  scheduler::v1::StepReport step;
  step.set_iteration(3);
  ASSERT_TRUE(client_->ReportStep(step).ok());
  absl::Status again = client_->ReportStep(step);
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists)
      << "a report the scheduler already had, sent once, is an error: " << again;
  service_.refuse = true;
  const int before = service_.step_calls;
  step.set_iteration(4);
  EXPECT_EQ(client_->ReportStep(step).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(service_.step_calls, before + 1);
}

TEST_F(SchedulerClientTest, AnUnreachableSchedulerFailsTheReportAfterTheDeadline) {
  SchedulerClient gone(grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials()),
                       absl::Milliseconds(600), nullptr);
  scheduler::v1::StepReport step;
  absl::Status s = gone.ReportStep(step);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

}  // namespace
}  // namespace loom
