#include "services/scheduler/control_client.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "services/common/grpc_status.h"
#include "services/common/security.h"

namespace loom {
namespace {

void SetDeadline(grpc::ClientContext* ctx, absl::Duration d) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
}

// One unary call: deadline, call, status conversion, the response's job.
template <typename Request, typename Response, typename Method>
absl::StatusOr<control::v1::Job> Call(control::v1::ControlService::Stub* stub, Method method,
                                      const Request& request, absl::Duration deadline,
                                      const char* name, Response* response) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, deadline);
  grpc::Status s = (stub->*method)(&ctx, request, response);
  if (!s.ok()) return FromGrpcStatus(s, name);
  return response->job();
}

}  // namespace

ControlClient::ControlClient(const std::string& target, absl::Duration deadline)
    : stub_(control::v1::ControlService::NewStub(SecureChannel(target, ClientSecurity()))),
      deadline_(deadline) {}

absl::StatusOr<control::v1::Job> ControlClient::Submit(const control::v1::JobSpec& spec) {
  control::v1::SubmitJobRequest request;
  *request.mutable_job() = spec;
  control::v1::SubmitJobResponse response;
  return Call(stub_.get(), &control::v1::ControlService::Stub::SubmitJob, request, deadline_,
              "SubmitJob", &response);
}

absl::StatusOr<control::v1::Job> ControlClient::Get(const std::string& job_id) {
  control::v1::GetJobRequest request;
  request.set_job_id(job_id);
  control::v1::GetJobResponse response;
  return Call(stub_.get(), &control::v1::ControlService::Stub::GetJob, request, deadline_, "GetJob",
              &response);
}

absl::StatusOr<control::v1::Job> ControlClient::Pause(const std::string& job_id) {
  control::v1::PauseJobRequest request;
  request.set_job_id(job_id);
  control::v1::PauseJobResponse response;
  return Call(stub_.get(), &control::v1::ControlService::Stub::PauseJob, request, deadline_,
              "PauseJob", &response);
}

absl::StatusOr<control::v1::Job> ControlClient::Resume(const std::string& job_id) {
  control::v1::ResumeJobRequest request;
  request.set_job_id(job_id);
  control::v1::ResumeJobResponse response;
  return Call(stub_.get(), &control::v1::ControlService::Stub::ResumeJob, request, deadline_,
              "ResumeJob", &response);
}

absl::StatusOr<control::v1::Job> ControlClient::Checkpoint(const std::string& job_id,
                                                           int64_t* step) {
  control::v1::CheckpointJobRequest request;
  request.set_job_id(job_id);
  control::v1::CheckpointJobResponse response;
  absl::StatusOr<control::v1::Job> job =
      Call(stub_.get(), &control::v1::ControlService::Stub::CheckpointJob, request, deadline_,
           "CheckpointJob", &response);
  if (job.ok() && step != nullptr) *step = response.step();
  return job;
}

absl::StatusOr<control::v1::Job> ControlClient::Cancel(const std::string& job_id,
                                                       const std::string& reason) {
  control::v1::CancelJobRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  control::v1::CancelJobResponse response;
  return Call(stub_.get(), &control::v1::ControlService::Stub::CancelJob, request, deadline_,
              "CancelJob", &response);
}

absl::Status ControlClient::Watch(const std::string& job_id, int64_t after_iteration,
                                  const std::function<bool(const control::v1::JobEvent&)>& on_event,
                                  absl::Duration wait, const std::atomic<bool>* stop,
                                  absl::Duration stream_deadline) {
  const absl::Time until = absl::Now() + wait;
  bool first = true;
  control::v1::JobState state = control::v1::JOB_STATE_UNSPECIFIED;
  int64_t checkpoint = -1;
  int64_t generation = 0;
  for (;;) {
    if (stop != nullptr && stop->load()) return absl::CancelledError("watch stopped");
    if (absl::Now() >= until) {
      return absl::DeadlineExceededError(
          absl::StrCat("job \"", job_id, "\" did not finish within ", absl::FormatDuration(wait)));
    }
    grpc::ClientContext ctx;
    SetDeadline(&ctx, std::min(stream_deadline, until - absl::Now()));
    control::v1::WatchJobRequest request;
    request.set_job_id(job_id);
    request.set_after_iteration(after_iteration);
    request.set_generation(generation);
    std::unique_ptr<grpc::ClientReader<control::v1::JobEvent>> reader =
        stub_->WatchJob(&ctx, request);
    // `stop` cancels the stream from beside the blocking Read.
    std::atomic<bool> done{false};
    std::thread canceller;
    if (stop != nullptr) {
      canceller = std::thread([&] {
        while (!done.load() && !stop->load()) absl::SleepFor(absl::Milliseconds(50));
        if (stop->load()) ctx.TryCancel();
      });
    }
    control::v1::JobEvent e;
    bool finished = false, quit = false;
    while (!finished && !quit && reader->Read(&e)) {
      std::vector<control::v1::JobEvent> deliver;
      if (e.kind() == control::v1::JobEvent::KIND_SNAPSHOT && !first) {
        // A reopened stream: what changed while none was open.
        if (e.job().last_checkpoint() > checkpoint && e.job().last_checkpoint() > 0) {
          control::v1::JobEvent c = e;
          c.set_kind(control::v1::JobEvent::KIND_CHECKPOINT);
          c.set_checkpoint_step(e.job().last_checkpoint());
          deliver.push_back(c);
        }
        if (e.job().state() != state) {
          control::v1::JobEvent c = e;
          c.set_kind(control::v1::JobEvent::KIND_STATE);
          deliver.push_back(c);
        }
      } else {
        deliver.push_back(e);
      }
      first = false;
      state = e.job().state();
      generation = std::max(generation, e.job().generation());
      checkpoint = std::max(checkpoint, e.job().last_checkpoint());
      if (e.kind() == control::v1::JobEvent::KIND_STEP) after_iteration = e.step().iteration();
      for (const control::v1::JobEvent& d : deliver) {
        if (!on_event(d)) quit = true;
      }
      finished = IsFinalJobState(state);
    }
    // Finish() waits for the server's status, which follows any message
    // still in flight: a final state is the stream's last word, but drain
    // whatever came with it.
    if (finished && !quit) {
      while (reader->Read(&e)) {
      }
    }
    done.store(true);
    if (canceller.joinable()) canceller.join();
    grpc::Status s = reader->Finish();
    if (quit || finished) return absl::OkStatus();
    if (stop != nullptr && stop->load()) return absl::CancelledError("watch stopped");
    if (!s.ok() && s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED &&
        s.error_code() != grpc::StatusCode::UNAVAILABLE) {
      return FromGrpcStatus(s, "WatchJob");
    }
    if (!s.ok() && s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      absl::SleepFor(absl::Milliseconds(200));
    }
  }
}

}  // namespace loom
