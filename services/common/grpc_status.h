// Status conversion at the gRPC boundary. absl::StatusCode and
// grpc::StatusCode share their numbering (both follow google.rpc.Code).
#ifndef LOOM_SERVICES_COMMON_GRPC_STATUS_H_
#define LOOM_SERVICES_COMMON_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"

namespace loom {

// A client's view of a failed call: the code kept, the message prefixed
// with `context` ("GetInfo at host:port").
inline absl::Status FromGrpcStatus(const grpc::Status& s, const std::string& context) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(context, ": ", s.error_message()));
}

// A server's answer from an absl::Status.
inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace loom

#endif  // LOOM_SERVICES_COMMON_GRPC_STATUS_H_
