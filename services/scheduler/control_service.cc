#include "services/scheduler/control_service.h"

#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/log.h"
#include "runtime/checkpoint/steps.h"
#include "runtime/model/config.h"
#include "runtime/scheduling/plan.h"
#include "runtime/scheduling/profile.h"
#include "runtime/scheduling/profile_comm.h"
#include "runtime/scheduling/schedule.h"
#include "services/common/grpc_status.h"
#include "services/common/job.h"
#include "services/scheduler/job_state.h"

namespace loom {
namespace {

// A job id is a DNS label (it names Kubernetes objects and folders).
absl::Status ValidateJobId(const std::string& id) {
  bool ok = !id.empty() && id.size() <= 63 && id.front() != '-' && id.back() != '-';
  for (char c : id) ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-');
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("job.config.name: \"", id,
                   "\" is not a job id (1-63 of a-z, 0-9, '-', not starting or ending in '-')"));
}

}  // namespace

namespace {
constexpr char kNoCheckpointYet[] = "loom.dev/no-checkpoint-yet";
}  // namespace

bool IsNoCheckpointYet(const absl::Status& status) {
  return status.GetPayload(kNoCheckpointYet).has_value();
}

absl::StatusOr<SchedulerServiceOptions> OptionsForJob(const control::v1::JobSpec& spec,
                                                      const SchedulerDeployment& deployment) {
  SchedulerServiceOptions o;
  o.job = spec.config();
  ApplyJobDefaults(deployment.run_dir, &o.job);
  if (absl::Status s = ValidateJobId(o.job.name()); !s.ok()) return s;
  if (absl::Status s = ValidateJob(o.job); !s.ok()) {
    // A job that does not fit its devices (CheckJobMemory) says so in its
    // code; everything else is a bad field.
    return absl::Status(
        absl::IsResourceExhausted(s) ? s.code() : absl::StatusCode::kInvalidArgument,
        absl::StrCat("job.config.", s.message()));
  }
  const job::v1::ParallelConfig& p = o.job.parallel();
  sched::Degrees degrees;
  degrees.llm_dp = p.llm_dp();
  degrees.microbatches = p.microbatches();
  degrees.encoder_dp = p.encoder_dp();
  degrees.llm_tp = p.llm_tp();
  degrees.encoder_tp = p.encoder_tp();
  degrees.llm_pp = p.llm_pp();
  degrees.encoder_pp = p.encoder_pp();
  degrees.colocate = p.colocate();
  degrees.generator_dp = p.generator_dp();
  degrees.generator_tp = p.generator_tp();
  degrees.generator_pp = p.generator_pp();
  absl::StatusOr<scheduler::v1::Plan> plan =
      sched::PlanFromFileOrDegrees(deployment.plan_file, degrees);
  if (!plan.ok()) return plan.status();
  plan->set_model(o.job.model());
  if (!plan->has_costs()) {
    absl::StatusOr<hf::PretrainedModel> model = JobModel(o.job);
    if (!model.ok()) return model.status();
    *plan->mutable_costs() =
        sched::CoefficientsOnOneGpu(model->config, sched::ClusterSpec(), JobFrozen(o.job));
  }
  if (!deployment.profile_file.empty()) {
    absl::StatusOr<scheduler::v1::Profile> profile = sched::ReadProfile(deployment.profile_file);
    if (!profile.ok()) return profile.status();
    std::string scaled;
    if (absl::Status s = sched::ApplyProfile(*profile, &*plan, &scaled, JobFrozen(o.job));
        !s.ok()) {
      return s;
    }
    // A job whose processes reduce and send through host memory (Gloo,
    // UCX) runs on the links the profile measured (loom up's host); NCCL's
    // between GPUs are not measured.
    const bool nccl = o.job.device().collectives() == "nccl" &&
                      (JobModuleOnGpu(o.job, true) || JobModuleOnGpu(o.job, false));
    const bool comm = !nccl && sched::ApplyProfileCommunication(*profile, JobFrozen(o.job), &*plan);
    LOOM_LOG(INFO)
            .With("profile", deployment.profile_file)
            .With("tp_scaled", scaled)
            .With("communication", comm)
        << "costs from the profile, fixed";
    o.fixed_costs = true;
  }
  o.plan = std::move(*plan);
  const std::string& ckpt = o.job.checkpoint().dir();
  if (spec.resume_step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("job.resume_step: must be >= 0, got ", spec.resume_step()));
  }
  if (spec.resume() || spec.resume_step() > 0) {
    absl::StatusOr<int64_t> step =
        ResumableStep(ckpt, JobCheckpointIdentity(o.job), spec.resume_step());
    absl::StatusOr<CheckpointRun> run = ReadCheckpointRun(ckpt);
    if (!step.ok() || !run.ok()) {
      const absl::Status& why = step.ok() ? run.status() : step.status();
      absl::Status s = absl::FailedPreconditionError(absl::StrCat("job.resume: ", why.message()));
      if (absl::IsNotFound(why)) s.SetPayload(kNoCheckpointYet, absl::Cord("1"));
      return s;
    }
    o.start_iteration = *step;
    o.run = *run;
  }
  if (spec.restarts() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("job.restarts: must be >= 0, got ", spec.restarts()));
  }
  o.restarts = spec.restarts();
  o.recovered_from = spec.recovered_from();
  if (spec.generation() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("job.generation: must be >= 0, got ", spec.generation()));
  }
  o.generation = spec.generation();
  o.spec = spec;
  o.state_file = SchedulerJobFile(deployment.run_dir);
  ApplyDeployment(deployment, &o);
  return o;
}

void ApplyDeployment(const SchedulerDeployment& deployment, SchedulerServiceOptions* o) {
  o->algorithm = o->job.algorithm();
  o->preprocess = deployment.preprocess;
  o->retained_iterations = deployment.retained_iterations;
  o->assign_ahead = deployment.assign_ahead;
  o->ilp_seconds = deployment.ilp_seconds;
  o->peak_flops = deployment.peak_flops;
  o->trace_dir = deployment.trace_dir;
  o->metrics_dir = deployment.run_dir;
  o->plan.set_shared_devices(deployment.shared_devices);
}

grpc::Status ControlServiceImpl::SubmitJob(grpc::ServerContext*,
                                           const control::v1::SubmitJobRequest* request,
                                           control::v1::SubmitJobResponse* response) {
  if (!request->has_job()) {
    return ToGrpcStatus(absl::InvalidArgumentError("job: missing"));
  }
  absl::StatusOr<SchedulerServiceOptions> o = OptionsForJob(request->job(), deployment_);
  if (!o.ok()) return ToGrpcStatus(o.status());
  if (absl::Status s = scheduler_->Configure(*o); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<control::v1::Job> job = scheduler_->GetJob(o->job.name());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response->mutable_job() = std::move(*job);
  return grpc::Status::OK;
}

grpc::Status ControlServiceImpl::GetJob(grpc::ServerContext*,
                                        const control::v1::GetJobRequest* request,
                                        control::v1::GetJobResponse* response) {
  absl::StatusOr<control::v1::Job> job = scheduler_->GetJob(request->job_id());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response->mutable_job() = std::move(*job);
  return grpc::Status::OK;
}

grpc::Status ControlServiceImpl::WatchJob(grpc::ServerContext* context,
                                          const control::v1::WatchJobRequest* request,
                                          grpc::ServerWriter<control::v1::JobEvent>* writer) {
  absl::StatusOr<std::pair<int64_t, control::v1::Job>> snapshot =
      scheduler_->Snapshot(request->job_id());
  if (!snapshot.ok()) return ToGrpcStatus(snapshot.status());
  auto [seq, job] = std::move(*snapshot);
  control::v1::JobEvent first;
  first.set_kind(control::v1::JobEvent::KIND_SNAPSHOT);
  *first.mutable_job() = job;
  if (!writer->Write(first)) return grpc::Status::CANCELLED;
  // Steps finished before the snapshot that the caller has not seen.
  int64_t after_iteration = request->after_iteration();
  if (request->generation() < job.generation()) {
    after_iteration = std::min(after_iteration, job.start_iteration() - 1);
  }
  for (const auto& [s, e] : scheduler_->EventsAfter(-1, absl::ZeroDuration())) {
    if (s > seq || e.kind() != control::v1::JobEvent::KIND_STEP) continue;
    if (e.step().iteration() <= after_iteration) continue;
    after_iteration = e.step().iteration();
    if (!writer->Write(e)) return grpc::Status::CANCELLED;
  }
  bool final = IsFinalJobState(job.state());
  int64_t generation = job.generation();
  while (!final) {
    if (context->IsCancelled()) return grpc::Status::CANCELLED;
    for (auto& [s, e] : scheduler_->EventsAfter(seq, absl::Milliseconds(250))) {
      seq = s;
      if (e.job().generation() > generation) {
        // A recovery in place: the steps from its start are trained again.
        generation = e.job().generation();
        after_iteration = std::min(after_iteration, e.job().start_iteration() - 1);
      }
      if (e.kind() == control::v1::JobEvent::KIND_STEP) {
        if (e.step().iteration() <= after_iteration) continue;
        after_iteration = e.step().iteration();
      }
      if (!writer->Write(e)) return grpc::Status::CANCELLED;
      final = final ||
              (e.kind() == control::v1::JobEvent::KIND_STATE && IsFinalJobState(e.job().state()));
    }
  }
  return grpc::Status::OK;
}

grpc::Status ControlServiceImpl::PauseJob(grpc::ServerContext*,
                                          const control::v1::PauseJobRequest* request,
                                          control::v1::PauseJobResponse* response) {
  absl::StatusOr<control::v1::Job> job = scheduler_->PauseJob(request->job_id());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response->mutable_job() = std::move(*job);
  return grpc::Status::OK;
}

grpc::Status ControlServiceImpl::ResumeJob(grpc::ServerContext*,
                                           const control::v1::ResumeJobRequest* request,
                                           control::v1::ResumeJobResponse* response) {
  absl::StatusOr<control::v1::Job> job = scheduler_->ResumeJob(request->job_id());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response->mutable_job() = std::move(*job);
  return grpc::Status::OK;
}

grpc::Status ControlServiceImpl::CheckpointJob(grpc::ServerContext*,
                                               const control::v1::CheckpointJobRequest* request,
                                               control::v1::CheckpointJobResponse* response) {
  int64_t step = 0;
  absl::StatusOr<control::v1::Job> job = scheduler_->CheckpointJob(request->job_id(), &step);
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response->mutable_job() = std::move(*job);
  response->set_step(step);
  return grpc::Status::OK;
}

grpc::Status ControlServiceImpl::CancelJob(grpc::ServerContext*,
                                           const control::v1::CancelJobRequest* request,
                                           control::v1::CancelJobResponse* response) {
  if (request->reason().size() > 1024) {
    return ToGrpcStatus(absl::InvalidArgumentError("reason: over 1024 bytes"));
  }
  absl::StatusOr<control::v1::Job> job =
      scheduler_->CancelJob(request->job_id(), request->reason());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response->mutable_job() = std::move(*job);
  return grpc::Status::OK;
}

}  // namespace loom
