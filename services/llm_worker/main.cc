// loom-llm-worker: one rank of the LLM.
#include <cstdio>

#include "absl/flags/flag.h"
#include "services/common/init.h"
#include "services/llm_worker/llm_worker_service.h"

ABSL_FLAG(int, rank, 0, "This process's rank within its module (0-based).");

int main(int argc, char** argv) {
  loom::InitService(
      argc, argv, "loom-llm-worker",
      "loom-llm-worker: one rank of the LLM.\nFlags: --host --grpc_port --metrics_port "
      "--shutdown_deadline --log_level --rank");
  if (absl::GetFlag(FLAGS_rank) < 0) {
    std::fprintf(stderr, "loom-llm-worker: --rank must be >= 0, got %d\n",
                 absl::GetFlag(FLAGS_rank));
    return 1;
  }
  loom::Chassis chassis(loom::ChassisOptionsFromFlags(
      "loom-llm-worker", loom::common::v1::ROLE_LLM_WORKER, absl::GetFlag(FLAGS_rank)));
  loom::LlmWorkerServiceImpl service(&chassis);
  chassis.AddService(&service, loom::worker::v1::LlmWorkerService::service_full_name());
  return chassis.ServeUntilSignal();
}
