#include "services/common/health_client.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "services/common/grpc_status.h"
#include "services/common/security.h"

namespace loom {

absl::StatusOr<ServingStatus> CheckHealth(const std::string& target, const std::string& service,
                                          absl::Duration deadline) {
  auto channel = SecureChannel(target, ClientSecurity());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(deadline));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = stub->Check(&ctx, req, &resp);
  if (!s.ok())
    return FromGrpcStatus(s, absl::StrCat("health check of '", service, "' at ", target));
  return resp.status();
}

absl::Status WaitUntilServing(const std::string& target, const std::string& service,
                              absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  absl::Status last = absl::DeadlineExceededError("no health check attempted");
  while (absl::Now() < end) {
    absl::StatusOr<ServingStatus> st = CheckHealth(target, service, absl::Seconds(2));
    if (st.ok() && *st == grpc::health::v1::HealthCheckResponse::SERVING) {
      return absl::OkStatus();
    }
    last = st.ok() ? absl::UnavailableError(absl::StrCat(
                         "'", service, "' at ", target, " is ",
                         grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*st)))
                   : st.status();
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("not SERVING within ", absl::FormatDuration(timeout), ": ", last.message()));
}

}  // namespace loom
