// loom-encoder-worker: one rank of the vision encoder and projector.
#include <cstdio>

#include "absl/flags/flag.h"
#include "services/common/init.h"
#include "services/encoder_worker/encoder_worker_service.h"

ABSL_FLAG(int, rank, 0, "This process's rank within its module (0-based).");

int main(int argc, char** argv) {
  loom::InitService(argc, argv, "loom-encoder-worker",
                    "loom-encoder-worker: one rank of the vision encoder and projector.\nFlags: "
                    "--host --grpc_port --metrics_port "
                    "--shutdown_deadline --log_level --rank");
  if (absl::GetFlag(FLAGS_rank) < 0) {
    std::fprintf(stderr, "loom-encoder-worker: --rank must be >= 0, got %d\n",
                 absl::GetFlag(FLAGS_rank));
    return 1;
  }
  loom::Chassis chassis(loom::ChassisOptionsFromFlags(
      "loom-encoder-worker", loom::common::v1::ROLE_ENCODER_WORKER, absl::GetFlag(FLAGS_rank)));
  loom::EncoderWorkerServiceImpl service(&chassis);
  chassis.AddService(&service, loom::worker::v1::EncoderWorkerService::service_full_name());
  return chassis.ServeUntilSignal();
}
