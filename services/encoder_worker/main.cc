// loom-encoder-worker: one rank of the vision encoder and projector.
#include "services/encoder_worker/encoder_worker_service.h"
#include "services/worker/worker_main.h"

int main(int argc, char** argv) {
  return loom::WorkerMain(
      argc, argv,
      {"loom-encoder-worker", "one rank of the vision encoder and projector.",
       loom::common::v1::ROLE_ENCODER_WORKER,
       [](loom::Chassis* c) { return std::make_unique<loom::EncoderWorkerServiceImpl>(c); },
       loom::worker::v1::EncoderWorkerService::service_full_name()});
}
