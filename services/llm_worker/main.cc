// loom-llm-worker: one rank of the LLM.
#include "services/llm_worker/llm_worker_service.h"
#include "services/worker/worker_main.h"

int main(int argc, char** argv) {
  return loom::WorkerMain(
      argc, argv,
      {"loom-llm-worker", "one rank of the LLM.", loom::common::v1::ROLE_LLM_WORKER,
       [](loom::Chassis* c) { return std::make_unique<loom::LlmWorkerServiceImpl>(c); },
       loom::worker::v1::LlmWorkerService::service_full_name()});
}
