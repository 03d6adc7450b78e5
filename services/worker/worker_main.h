// main() of loom-encoder-worker, loom-llm-worker and loom-generator-worker:
// the chassis with the
// role's gRPC service and, given --scheduler, one training rank
// (training_worker.h) until SIGTERM or the end of the job.
#ifndef LOOM_SERVICES_WORKER_WORKER_MAIN_H_
#define LOOM_SERVICES_WORKER_WORKER_MAIN_H_

#include <functional>
#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/service_type.h"
#include "loom/common/v1/common.pb.h"
#include "services/common/chassis.h"

namespace loom {

struct WorkerBinary {
  const char* name;     // "loom-encoder-worker"
  const char* summary;  // one line for --help
  common::v1::Role role;
  // The role's gRPC service for `chassis`, and its full name.
  std::function<std::unique_ptr<grpc::Service>(Chassis*)> make_service;
  std::string service_full_name;
};

int WorkerMain(int argc, char** argv, const WorkerBinary& binary);

}  // namespace loom

#endif  // LOOM_SERVICES_WORKER_WORKER_MAIN_H_
