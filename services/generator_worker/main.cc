// loom-generator-worker: one rank of the modality generator.
#include "services/generator_worker/generator_worker_service.h"
#include "services/worker/worker_main.h"

int main(int argc, char** argv) {
  return loom::WorkerMain(
      argc, argv,
      {"loom-generator-worker", "one rank of the modality generator.",
       loom::common::v1::ROLE_GENERATOR_WORKER,
       [](loom::Chassis* c) { return std::make_unique<loom::GeneratorWorkerServiceImpl>(c); },
       loom::worker::v1::GeneratorWorkerService::service_full_name()});
}
