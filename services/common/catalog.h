// The Loom service binaries: where Bazel puts each, and what it serves.
// The launcher and the integration tests read this one table.
#ifndef LOOM_SERVICES_COMMON_CATALOG_H_
#define LOOM_SERVICES_COMMON_CATALOG_H_

#include <string>
#include <vector>

#include "loom/common/v1/common.pb.h"

namespace loom {

struct ServiceBinary {
  std::string name;          // binary name, e.g. "loom-scheduler"
  std::string package;       // Bazel package: "services/scheduler"
  std::string grpc_service;  // full proto service name
  common::v1::Role role;
  bool worker;  // one process per rank; takes --rank
};

// Preprocess, scheduler, encoder worker, LLM worker, generator worker (a
// model with a generator), in start-up order.
inline const std::vector<ServiceBinary>& ServiceCatalog() {
  static const auto* catalog = new std::vector<ServiceBinary>{
      {"loom-preprocess", "services/preprocess", "loom.data.v1.PreprocessService",
       common::v1::ROLE_PREPROCESS, false},
      {"loom-scheduler", "services/scheduler", "loom.scheduler.v1.SchedulerService",
       common::v1::ROLE_SCHEDULER, false},
      {"loom-encoder-worker", "services/encoder_worker", "loom.worker.v1.EncoderWorkerService",
       common::v1::ROLE_ENCODER_WORKER, true},
      {"loom-llm-worker", "services/llm_worker", "loom.worker.v1.LlmWorkerService",
       common::v1::ROLE_LLM_WORKER, true},
      {"loom-generator-worker", "services/generator_worker",
       "loom.worker.v1.GeneratorWorkerService", common::v1::ROLE_GENERATOR_WORKER, true},
  };
  return *catalog;
}

// The catalog entry of `role` (which must be one of the five).
inline const ServiceBinary& CatalogEntry(common::v1::Role role) {
  for (const ServiceBinary& b : ServiceCatalog()) {
    if (b.role == role) return b;
  }
  return ServiceCatalog().front();
}

}  // namespace loom

#endif  // LOOM_SERVICES_COMMON_CATALOG_H_
