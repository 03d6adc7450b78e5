#include "services/common/health_prober.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "services/common/grpc_status.h"
#include "services/common/security.h"

namespace loom {

HealthProber::HealthProber(int max_in_flight) : max_in_flight_(std::max(1, max_in_flight)) {}

grpc::health::v1::Health::Stub* HealthProber::StubFor(const std::string& endpoint) {
  std::unique_ptr<grpc::health::v1::Health::Stub>& stub = stubs_[endpoint];
  if (stub == nullptr) {
    stub = grpc::health::v1::Health::NewStub(SecureChannel(endpoint, ClientSecurity()));
  }
  return stub.get();
}

void HealthProber::Keep(const std::vector<std::string>& endpoints) {
  const std::set<std::string> keep(endpoints.begin(), endpoints.end());
  for (auto it = stubs_.begin(); it != stubs_.end();) {
    it = keep.count(it->first) > 0 ? std::next(it) : stubs_.erase(it);
  }
}

std::vector<HealthProber::Answer> HealthProber::ProbeAll(const std::vector<std::string>& endpoints,
                                                         absl::Duration deadline) {
  struct Call {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckResponse response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<grpc::health::v1::HealthCheckResponse>> reader;
  };
  std::vector<Answer> answers(endpoints.size());
  std::vector<std::unique_ptr<Call>> calls(endpoints.size());
  const grpc::health::v1::HealthCheckRequest request;  // "": the server as a whole
  grpc::CompletionQueue cq;
  size_t next = 0;
  int in_flight = 0;
  auto start = [&](size_t i) {
    auto call = std::make_unique<Call>();
    answers[i].sent = absl::Now();
    call->ctx.set_deadline(absl::ToChronoTime(answers[i].sent + deadline));
    call->reader = StubFor(endpoints[i])->PrepareAsyncCheck(&call->ctx, request, &cq);
    call->reader->StartCall();
    // Tags are index + 1 (never null).
    call->reader->Finish(&call->response, &call->status, reinterpret_cast<void*>(i + 1));
    calls[i] = std::move(call);
    ++in_flight;
  };
  while (next < endpoints.size() && in_flight < max_in_flight_) start(next++);
  void* tag = nullptr;
  bool ok = false;
  while (in_flight > 0 && cq.Next(&tag, &ok)) {
    const size_t i = reinterpret_cast<size_t>(tag) - 1;
    --in_flight;
    Answer& a = answers[i];
    a.answered = absl::Now();
    const Call& c = *calls[i];
    if (c.status.ok()) {
      a.status = c.response.status();
    } else {
      a.status = FromGrpcStatus(c.status, absl::StrCat("health check of '' at ", endpoints[i]));
    }
    calls[i].reset();
    if (next < endpoints.size()) start(next++);
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return answers;
}

}  // namespace loom
