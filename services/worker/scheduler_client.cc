#include "services/worker/scheduler_client.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/common/channel.h"
#include "services/common/grpc_status.h"
#include "services/common/incarnation.h"

namespace loom {
namespace {

void SetDeadline(grpc::ClientContext* ctx, absl::Duration d) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
}

}  // namespace

SchedulerClient::SchedulerClient(const std::string& target, absl::Duration deadline,
                                 const std::atomic<bool>* cancel)
    : stub_(scheduler::v1::SchedulerService::NewStub(
          ServiceChannel(target))),  // loom-scheduler may come back at its address
      deadline_(deadline),
      cancel_(cancel) {}

SchedulerClient::SchedulerClient(std::shared_ptr<grpc::Channel> channel, absl::Duration deadline,
                                 const std::atomic<bool>* cancel)
    : stub_(scheduler::v1::SchedulerService::NewStub(std::move(channel))),
      deadline_(deadline),
      cancel_(cancel) {}

absl::Status SchedulerClient::Cancelled() const {
  if (cancel_ != nullptr && cancel_->load()) return absl::CancelledError("stopping");
  return absl::OkStatus();
}

absl::StatusOr<scheduler::v1::RegisterWorkerResponse> SchedulerClient::Register(
    const scheduler::v1::Worker& w, absl::Duration wait) {
  const absl::Time until = absl::Now() + wait;
  scheduler::v1::RegisterWorkerRequest request;
  *request.mutable_worker() = w;
  request.set_incarnation(incarnation_);
  for (;;) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(5));
    scheduler::v1::RegisterWorkerResponse response;
    grpc::Status s = stub_->RegisterWorker(&ctx, request, &response);
    if (s.ok()) return response;
    // ALREADY_EXISTS: the rank's previous holder (this worker's predecessor)
    // is not declared lost yet; it will be within a lease.
    // RESOURCE_EXHAUSTED: the scheduler's rate limit.
    const bool retry = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                       s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                       s.error_code() == grpc::StatusCode::ALREADY_EXISTS ||
                       s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    if (!retry || absl::Now() >= until) return FromGrpcStatus(s, "scheduler RegisterWorker");
    if (absl::Status c = Cancelled(); !c.ok()) return c;
    absl::SleepFor(absl::Milliseconds(100));
  }
}

absl::StatusOr<scheduler::v1::GetPlanResponse> SchedulerClient::WaitForAllWorkers(
    absl::Duration wait) {
  const absl::Time until = absl::Now() + wait;
  scheduler::v1::GetPlanRequest request;
  request.set_wait_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(kLongPoll)));
  for (;;) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(5) + kLongPoll);
    scheduler::v1::GetPlanResponse response;
    const absl::Time asked = absl::Now();
    grpc::Status s = stub_->GetPlan(&ctx, request, &response);
    if (!s.ok()) return FromGrpcStatus(s, "scheduler GetPlan");
    if (response.complete()) return response;
    if (absl::Status c = Cancelled(); !c.ok()) return c;
    if (absl::Now() >= until) {
      return absl::DeadlineExceededError(absl::StrCat("only ", response.registered(),
                                                      " workers registered within ",
                                                      absl::FormatDuration(wait)));
    }
    // The scheduler held the call until its wait passed (a scheduler that
    // does not hold it is asked again after a pause).
    if (absl::Now() - asked < kLongPoll / 2) absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::StatusOr<std::vector<scheduler::v1::Worker>> SchedulerClient::GetWorkers(
    const std::vector<scheduler::v1::WorkerRef>& refs) {
  constexpr size_t kPerCall = 4096;  // the scheduler's limit
  std::vector<scheduler::v1::Worker> workers;
  workers.reserve(refs.size());
  for (size_t at = 0; at < refs.size(); at += kPerCall) {
    const size_t end = std::min(refs.size(), at + kPerCall);
    scheduler::v1::GetWorkersRequest request;
    request.mutable_workers()->Add(refs.begin() + at, refs.begin() + end);
    request.set_generation(generation_.load());
    grpc::ClientContext ctx;
    SetDeadline(&ctx, deadline_);
    scheduler::v1::GetWorkersResponse response;
    grpc::Status s = stub_->GetWorkers(&ctx, request, &response);
    if (!s.ok()) return FromGrpcStatus(s, "scheduler GetWorkers");
    if (response.workers_size() != static_cast<int>(end - at)) {
      return absl::InternalError(absl::StrCat("scheduler GetWorkers: ", response.workers_size(),
                                              " workers for ", end - at, " asked"));
    }
    for (scheduler::v1::Worker& w : *response.mutable_workers()) workers.push_back(std::move(w));
  }
  return workers;
}

absl::Status PeerAddresses::Resolve(const std::vector<scheduler::v1::WorkerRef>& peers) {
  std::vector<scheduler::v1::WorkerRef> unknown;
  {
    absl::MutexLock lock(&mu_);
    absl::flat_hash_set<std::pair<int, int>> asked;
    for (const scheduler::v1::WorkerRef& p : peers) {
      const std::pair<int, int> key(p.role(), p.rank());
      if (!known_.contains(key) && asked.insert(key).second) unknown.push_back(p);
    }
  }
  if (unknown.empty()) return absl::OkStatus();
  absl::StatusOr<std::vector<scheduler::v1::Worker>> workers = client_->GetWorkers(unknown);
  if (!workers.ok()) return workers.status();
  absl::MutexLock lock(&mu_);
  for (scheduler::v1::Worker& w : *workers) {
    known_[{w.role(), w.rank()}] = std::move(*w.mutable_ucx_address());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> PeerAddresses::Get(common::v1::Role role, int rank) const {
  absl::MutexLock lock(&mu_);
  auto it = known_.find({role, rank});
  if (it == known_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the address of ", common::v1::Role_Name(role), " rank ", rank, " was not resolved"));
  }
  return it->second;
}

void PeerAddresses::Clear() {
  absl::MutexLock lock(&mu_);
  known_.clear();
}

absl::StatusOr<scheduler::v1::GetAssignmentResponse> SchedulerClient::GetAssignment(
    int64_t iteration, bool validation) {
  scheduler::v1::GetAssignmentRequest request;
  request.set_iteration(iteration);
  request.set_validation(validation);
  request.set_generation(generation_.load());
  absl::Time unreachable_since = absl::InfiniteFuture();
  for (;;) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, deadline_);
    scheduler::v1::GetAssignmentResponse response;
    grpc::Status s = stub_->GetAssignment(&ctx, request, &response);
    if (s.ok()) return response;
    // A paused or recovering job answers UNAVAILABLE "...; retry" after
    // holding the call: wait on. A scheduler that cannot be reached gets
    // `deadline_` to come back.
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE) {
      return FromGrpcStatus(s, "scheduler GetAssignment");
    }
    const std::string& m = s.error_message();
    const bool paused = m.size() >= 7 && m.compare(m.size() - 7, 7, "; retry") == 0;
    if (paused) {
      unreachable_since = absl::InfiniteFuture();
    } else if (unreachable_since == absl::InfiniteFuture()) {
      unreachable_since = absl::Now();
    } else if (absl::Now() - unreachable_since > deadline_) {
      return FromGrpcStatus(s, "scheduler GetAssignment");
    }
    if (absl::Status c = Cancelled(); !c.ok()) return c;
    if (!paused) absl::SleepFor(absl::Milliseconds(200));
  }
}

absl::Status SchedulerClient::SetGeneration(int64_t g, absl::string_view data_key) {
  absl::StatusOr<DataKey> key = DataKey::FromBytes(data_key);
  if (!key.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("generation ", g, " from loom-scheduler: ", key.status().message()));
  }
  absl::MutexLock lock(&key_mu_);
  key_ = *key;
  generation_.store(g);
  return absl::OkStatus();
}

SchedulerClient::Generation SchedulerClient::generation_and_key() const {
  absl::MutexLock lock(&key_mu_);
  return {generation_.load(), key_};
}

absl::StatusOr<scheduler::v1::Regroup> SchedulerClient::GetGeneration(int64_t known_generation,
                                                                      absl::Duration wait) {
  grpc::ClientContext ctx;
  // The scheduler answers a second before the deadline at the latest.
  SetDeadline(&ctx, wait + absl::Seconds(5));
  scheduler::v1::GetGenerationRequest request;
  request.set_known_generation(known_generation);
  request.set_wait_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(wait)));
  scheduler::v1::GetGenerationResponse response;
  grpc::Status s = stub_->GetGeneration(&ctx, request, &response);
  if (!s.ok()) return FromGrpcStatus(s, "scheduler GetGeneration");
  return response.current();
}

absl::Status SchedulerClient::ReportTimings(scheduler::v1::ReportTimingsRequest request) {
  request.set_incarnation(incarnation_);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, deadline_);
  scheduler::v1::ReportTimingsResponse response;
  grpc::Status s = stub_->ReportTimings(&ctx, request, &response);
  return s.ok() ? absl::OkStatus() : FromGrpcStatus(s, "scheduler ReportTimings");
}

absl::Status SchedulerClient::Report(
    const char* what, const std::function<grpc::Status(grpc::ClientContext*)>& call) {
  const absl::Time until = absl::Now() + deadline_;
  bool retried = false;
  for (absl::Duration pause = absl::Milliseconds(50);;
       pause = std::min(pause * 2, absl::Seconds(1))) {
    grpc::ClientContext ctx;
    // A try that hangs must leave time for the next.
    SetDeadline(
        &ctx, std::max(absl::Milliseconds(100), std::min(until - absl::Now(), absl::Seconds(10))));
    const grpc::Status s = call(&ctx);
    if (s.ok()) return absl::OkStatus();
    if (retried && s.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
      return absl::OkStatus();  // an earlier try landed; its answer was lost
    }
    const bool transient = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (!transient || absl::Now() + pause >= until) return FromGrpcStatus(s, what);
    if (absl::Status c = Cancelled(); !c.ok()) return c;
    absl::SleepFor(pause);
    retried = true;
  }
}

absl::Status SchedulerClient::ReportStep(const scheduler::v1::StepReport& step) {
  scheduler::v1::ReportStepRequest request;
  *request.mutable_step() = step;
  request.set_generation(generation_.load());
  request.set_incarnation(incarnation_);
  return Report("scheduler ReportStep", [&](grpc::ClientContext* ctx) {
    scheduler::v1::ReportStepResponse response;
    return stub_->ReportStep(ctx, request, &response);
  });
}

absl::Status SchedulerClient::ReportCheckpoint(common::v1::Role role, int rank, int64_t step) {
  scheduler::v1::ReportCheckpointRequest request;
  request.set_role(role);
  request.set_rank(rank);
  request.set_step(step);
  request.set_generation(generation_.load());
  request.set_incarnation(incarnation_);
  return Report("scheduler ReportCheckpoint", [&](grpc::ClientContext* ctx) {
    scheduler::v1::ReportCheckpointResponse response;
    return stub_->ReportCheckpoint(ctx, request, &response);
  });
}

absl::Status SchedulerClient::ReportDone(common::v1::Role role, int rank) {
  scheduler::v1::ReportDoneRequest request;
  request.set_role(role);
  request.set_rank(rank);
  return Report("scheduler ReportDone", [&](grpc::ClientContext* ctx) {
    scheduler::v1::ReportDoneResponse response;
    return stub_->ReportDone(ctx, request, &response);
  });
}

absl::StatusOr<scheduler::v1::GetProgressResponse> SchedulerClient::GetProgress(
    int64_t after_iteration) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(5));
  scheduler::v1::GetProgressRequest request;
  request.set_after_iteration(after_iteration);
  scheduler::v1::GetProgressResponse response;
  grpc::Status s = stub_->GetProgress(&ctx, request, &response);
  if (!s.ok()) return FromGrpcStatus(s, "scheduler GetProgress");
  return response;
}

absl::Status SchedulerStore::Set(const std::string& key, const std::string& value) {
  const absl::Time until = absl::Now() + client_->deadline();
  scheduler::v1::SetKeyRequest request;
  request.set_key(key);
  request.set_value(value);
  for (absl::Duration pause = absl::Milliseconds(10);;
       pause = std::min(pause * 2, absl::Milliseconds(500))) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, client_->deadline());
    scheduler::v1::SetKeyResponse response;
    grpc::Status s = client_->stub()->SetKey(&ctx, request, &response);
    if (s.ok()) return absl::OkStatus();
    // RESOURCE_EXHAUSTED "...; retry": the scheduler's rate limit (a full
    // store says no "retry").
    const bool limited = s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
                         absl::EndsWith(s.error_message(), "; retry");
    if (!limited || absl::Now() + pause >= until) return FromGrpcStatus(s, "scheduler SetKey");
    absl::SleepFor(pause);
  }
}

absl::StatusOr<std::string> SchedulerStore::Get(const std::string& key, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  scheduler::v1::GetKeyRequest request;
  request.set_key(key);
  request.set_wait_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(kLongPoll)));
  for (absl::Duration pause = absl::Milliseconds(2);;
       pause = std::min(pause * 2, absl::Milliseconds(50))) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, client_->deadline() + kLongPoll);
    scheduler::v1::GetKeyResponse response;
    const absl::Time asked = absl::Now();
    grpc::Status s = client_->stub()->GetKey(&ctx, request, &response);
    if (s.ok()) return std::move(*response.mutable_value());
    if (s.error_code() != grpc::StatusCode::NOT_FOUND) return FromGrpcStatus(s, "scheduler GetKey");
    if (absl::Status c = client_->Cancelled(); !c.ok()) return c;
    if (absl::Now() >= until) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rendezvous key \"", key, "\" not set within ", absl::FormatDuration(timeout)));
    }
    if (absl::Now() - asked < kLongPoll / 2) absl::SleepFor(pause);  // not held: poll
  }
}

absl::StatusOr<std::vector<KeyValueStore::Value>> SchedulerStore::GetMany(
    const std::vector<Read>& reads, absl::Duration timeout) {
  constexpr size_t kPerCall = 4096;  // the scheduler's limit
  const absl::Time until = absl::Now() + timeout;
  std::vector<Value> values(reads.size());
  for (size_t at = 0; at < reads.size(); at += kPerCall) {
    const size_t end = std::min(reads.size(), at + kPerCall);
    scheduler::v1::GetKeysRequest request;
    for (size_t i = at; i < end; ++i) {
      scheduler::v1::KeyRead* r = request.add_reads();
      r->set_key(reads[i].key);
      r->set_part(reads[i].part);
      r->set_parts(reads[i].parts);
    }
    const absl::Duration wait =
        std::max(absl::ZeroDuration(), std::min(until - absl::Now(), kLongPoll));
    request.set_wait_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(wait)));
    grpc::ClientContext ctx;
    SetDeadline(&ctx, client_->deadline() + wait);
    scheduler::v1::GetKeysResponse response;
    grpc::Status s = client_->stub()->GetKeys(&ctx, request, &response);
    if (!s.ok()) return FromGrpcStatus(s, "scheduler GetKeys");
    if (response.values_size() != static_cast<int>(end - at)) {
      return absl::InternalError(absl::StrCat("scheduler GetKeys: ", response.values_size(),
                                              " values for ", end - at, " reads"));
    }
    for (size_t i = at; i < end; ++i) {
      scheduler::v1::KeyValue* v = response.mutable_values(static_cast<int>(i - at));
      values[i] = {v->found(), std::move(*v->mutable_value()), static_cast<size_t>(v->size())};
    }
  }
  return values;
}

absl::Status SchedulerStore::Delete(const std::vector<std::string>& keys) {
  constexpr size_t kPerCall = 4096;  // the scheduler's limit
  for (size_t at = 0; at < keys.size(); at += kPerCall) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, client_->deadline());
    scheduler::v1::DeleteKeysRequest request;
    for (size_t k = at; k < std::min(keys.size(), at + kPerCall); ++k) request.add_keys(keys[k]);
    scheduler::v1::DeleteKeysResponse response;
    grpc::Status s = client_->stub()->DeleteKeys(&ctx, request, &response);
    if (!s.ok()) return FromGrpcStatus(s, "scheduler DeleteKeys");
  }
  return absl::OkStatus();
}

}  // namespace loom
