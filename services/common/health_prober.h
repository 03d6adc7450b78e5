// Many grpc.health.v1 probes at once over kept channels: the scheduler's
// lease thread asks thousands of processes for their health every round
// (services/scheduler/scheduler_leases.cc).
#ifndef LOOM_SERVICES_COMMON_HEALTH_PROBER_H_
#define LOOM_SERVICES_COMMON_HEALTH_PROBER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "services/common/health_client.h"

namespace loom {

// Keeps one channel (one connection, TLS handshake done once) per endpoint
// and asks endpoints concurrently through a completion queue, at most
// `max_in_flight` probes at a time. Not thread-safe: one thread uses it.
class HealthProber {
 public:
  explicit HealthProber(int max_in_flight);

  struct Answer {
    // The server's status, or the RPC's error as CheckHealth reports it
    // ("health check of '' at HOST:PORT: ...", the connection's error
    // included).
    absl::StatusOr<ServingStatus> status;
    absl::Time sent;      // the probe's deadline counts from here
    absl::Time answered;  // or failed
  };

  // Asks each of `endpoints` ("host:port") for the health of the server as
  // a whole, each probe within `deadline` of its own start: a probe queued
  // behind max_in_flight others does not lose its time. Answers in the
  // order of `endpoints` (an endpoint named twice is asked twice).
  std::vector<Answer> ProbeAll(const std::vector<std::string>& endpoints, absl::Duration deadline);

  // Drops the channels of endpoints not in `endpoints` (a holder gone away
  // or registered elsewhere).
  void Keep(const std::vector<std::string>& endpoints);

  // Channels held now.
  size_t channels() const { return stubs_.size(); }

 private:
  grpc::health::v1::Health::Stub* StubFor(const std::string& endpoint);

  const int max_in_flight_;
  std::map<std::string, std::unique_ptr<grpc::health::v1::Health::Stub>> stubs_;
};

}  // namespace loom

#endif  // LOOM_SERVICES_COMMON_HEALTH_PROBER_H_
