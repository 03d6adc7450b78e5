// loom.control.v1.ControlService, served by loom-scheduler: SubmitJob turns
// a JobSpec into the scheduler's job (validated, planned), the other calls
// read and steer that job's lifecycle (SchedulerServiceImpl holds it).
#ifndef LOOM_SERVICES_SCHEDULER_CONTROL_SERVICE_H_
#define LOOM_SERVICES_SCHEDULER_CONTROL_SERVICE_H_

#include <string>

#include "absl/status/statusor.h"
#include "loom/control/v1/control.grpc.pb.h"
#include "services/scheduler/scheduler_service.h"

namespace loom {

// What the deployment fixes for every job it runs (loom-scheduler's flags).
struct SchedulerDeployment {
  std::string plan_file;  // a searched plan (JSON); empty: degrees from the job
  std::string preprocess;
  std::string run_dir = ".loom/run";  // roots the job's default folders
  int retained_iterations = 16;
  int assign_ahead = 2;
  double ilp_seconds = 10;
  double peak_flops = 0;
  std::string trace_dir;  // SchedulerServiceOptions::trace_dir
  // Non-empty: a profile (loom-schedule profile) whose coefficients price
  // every job's work instead of the analytic ones, and stay (fixed_costs).
  std::string profile_file;
  // The plan's shared_devices (the simulator's): > 0 when the workers share
  // one host's cores (loom up on the CPU).
  int shared_devices = 0;
};

// The scheduler options of `spec`: defaults applied, validated (errors name
// the field as "job.config.<field>"), planned, and on resume placed after
// the newest complete checkpoint (FAILED_PRECONDITION when there is none,
// or when the checkpoint folder cannot be read: IsNoCheckpointYet tells
// them apart).
absl::StatusOr<SchedulerServiceOptions> OptionsForJob(const control::v1::JobSpec& spec,
                                                      const SchedulerDeployment& deployment);

// True for OptionsForJob's answer when a resume found no run started in the
// checkpoint folder or no complete step of its run: the one case where a
// job taken back may start from the seed. A checkpoint that exists but
// cannot be read (an I/O error, a run or identity that does not match) is
// never that: starting afresh would orphan it.
bool IsNoCheckpointYet(const absl::Status& status);

// Sets the options the deployment fixes (and the algorithm from o->job).
void ApplyDeployment(const SchedulerDeployment& deployment, SchedulerServiceOptions* o);

class ControlServiceImpl final : public control::v1::ControlService::Service {
 public:
  // `scheduler` is not owned and must outlive this service.
  ControlServiceImpl(SchedulerServiceImpl* scheduler, SchedulerDeployment deployment)
      : scheduler_(scheduler), deployment_(std::move(deployment)) {}

  grpc::Status SubmitJob(grpc::ServerContext* context, const control::v1::SubmitJobRequest* request,
                         control::v1::SubmitJobResponse* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const control::v1::GetJobRequest* request,
                      control::v1::GetJobResponse* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context, const control::v1::WatchJobRequest* request,
                        grpc::ServerWriter<control::v1::JobEvent>* writer) override;
  grpc::Status PauseJob(grpc::ServerContext* context, const control::v1::PauseJobRequest* request,
                        control::v1::PauseJobResponse* response) override;
  grpc::Status ResumeJob(grpc::ServerContext* context, const control::v1::ResumeJobRequest* request,
                         control::v1::ResumeJobResponse* response) override;
  grpc::Status CheckpointJob(grpc::ServerContext* context,
                             const control::v1::CheckpointJobRequest* request,
                             control::v1::CheckpointJobResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const control::v1::CancelJobRequest* request,
                         control::v1::CancelJobResponse* response) override;

 private:
  SchedulerServiceImpl* scheduler_;
  SchedulerDeployment deployment_;
};

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_CONTROL_SERVICE_H_
