// A grpc.health.v1 client, for launchers, probes and tests.
#ifndef LOOM_SERVICES_COMMON_HEALTH_CLIENT_H_
#define LOOM_SERVICES_COMMON_HEALTH_CLIENT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.pb.h"

namespace loom {

using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

// Asks `target` ("host:port") for the health of `service` ("" is the server
// as a whole), within `deadline`. An RPC error (unreachable, unknown service
// = NOT_FOUND, deadline) is returned as the status, message included.
absl::StatusOr<ServingStatus> CheckHealth(const std::string& target, const std::string& service,
                                          absl::Duration deadline);

// Polls CheckHealth until it reports SERVING or `timeout` has passed;
// returns the last error or status seen on timeout.
absl::Status WaitUntilServing(const std::string& target, const std::string& service,
                              absl::Duration timeout);

}  // namespace loom

#endif  // LOOM_SERVICES_COMMON_HEALTH_CLIENT_H_
