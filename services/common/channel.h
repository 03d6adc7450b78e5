// A gRPC channel to a Loom service that may be restarted at the same
// address (a recovery replaces a lost loom-preprocess on its own port): it
// reconnects within a second instead of gRPC's default backoff, which
// grows to minutes.
#ifndef LOOM_SERVICES_COMMON_CHANNEL_H_
#define LOOM_SERVICES_COMMON_CHANNEL_H_

#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "services/common/security.h"

namespace loom {

// With the process's ClientSecurity().
// `own_connection`: not shared with the process's other channels to the
// same address (gRPC shares one by default): a process standing for many
// (a benchmark's simulated ranks).
inline std::shared_ptr<grpc::Channel> ServiceChannel(const std::string& target,
                                                     bool own_connection = false) {
  grpc::ChannelArguments args;
  if (own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::shared_ptr<grpc::ChannelCredentials> creds = MakeChannelCredentials(ClientSecurity(), &args);
  return grpc::CreateCustomChannel(target, creds, args);
}

}  // namespace loom

#endif  // LOOM_SERVICES_COMMON_CHANNEL_H_
