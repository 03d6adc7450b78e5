// The service chassis: what every Loom service binary stands on.
//
// A Chassis owns one gRPC server (with grpc.health.v1 overall and per service,
// and server reflection) and one Prometheus /metrics endpoint. The typical
// main():
//
//   loom::InitService(argc, argv, "loom-scheduler", "usage ...");
//   loom::Chassis chassis(loom::ChassisOptionsFromFlags(
//       "loom-scheduler", loom::common::v1::ROLE_SCHEDULER, /*rank=*/0));
//   SchedulerServiceImpl service(&chassis);
//   chassis.AddService(&service, SchedulerService::service_full_name());
//   return chassis.ServeUntilSignal();
//
// Start() binds both ports (0 picks a free one) and logs the ports actually
// bound in one record with msg "serving" and fields grpc_port, metrics_port:
// launchers and tests read it. Shutdown() marks every service NOT_SERVING,
// then shuts the gRPC server down with --shutdown_deadline (in-flight calls
// that outlive it are cancelled) and stops /metrics.
//
// Thread-safety: AddService() and Start() from one thread before serving;
// Shutdown() may be called from any thread, more than once; the accessors
// are safe once Start() has returned.
#ifndef LOOM_SERVICES_COMMON_CHASSIS_H_
#define LOOM_SERVICES_COMMON_CHASSIS_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "loom/common/v1/common.pb.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "services/common/security.h"

namespace loom {

struct ChassisOptions {
  std::string service_name;  // binary name, e.g. "loom-scheduler"
  common::v1::Role role = common::v1::ROLE_UNSPECIFIED;
  int rank = 0;
  std::string host = "0.0.0.0";  // address both servers bind
  int grpc_port = 0;             // 0: pick a free port
  int metrics_port = 0;          // 0: pick a free port
  absl::Duration shutdown_deadline = absl::Seconds(5);
  TransportSecurity security;  // default: plaintext (in-process tests)
};

// Options from the chassis flags: --host, --grpc_port, --metrics_port,
// --shutdown_deadline, and the transport security ones (security.h), which
// also become the process's client security (SetClientSecurity). Security
// flags that are missing or name bad files: logs the error and exits 1, as
// a malformed flag does.
ChassisOptions ChassisOptionsFromFlags(std::string service_name, common::v1::Role role, int rank);

// The name a role has in metric labels: "preprocess", "scheduler",
// "encoder_worker", "llm_worker".
std::string RoleLabel(common::v1::Role role);

class Chassis {
 public:
  explicit Chassis(ChassisOptions options);
  ~Chassis();  // Shutdown() if still serving.
  Chassis(const Chassis&) = delete;
  Chassis& operator=(const Chassis&) = delete;

  // Registers `service` (not owned; must outlive the chassis) before Start().
  // Its health is reported under `full_name`, e.g. "loom.scheduler.v1.
  // SchedulerService" (the generated Service::service_full_name()).
  void AddService(grpc::Service* service, std::string full_name);

  // The registry served on /metrics. Services add their families to it.
  prometheus::Registry& registry() { return *registry_; }

  // Binds and starts both servers; every added service becomes SERVING.
  // Errors: a port that cannot be bound (UNAVAILABLE), called twice
  // (FAILED_PRECONDITION).
  absl::Status Start();

  // The health answer of the process and of every service (after Start(),
  // before Shutdown(); ignored otherwise): a process that cannot do its
  // work says so. Thread-safe.
  void SetServing(bool serving);

  // NOT_SERVING, then gRPC Shutdown with the deadline, then /metrics stops.
  // Idempotent; returns once both servers have stopped.
  void Shutdown();

  // Start() (unless already started), then block until SIGTERM or SIGINT (blocked by
  // InitService()), then Shutdown(). Returns the process exit code: 0 after a clean shutdown, 1 if
  // Start() failed. `on_signal` (optional) runs first thing after the signal, before Shutdown(): a
  // service's chance to stop its own work.
  int ServeUntilSignal(const std::function<void()>& on_signal = nullptr);

  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_port_; }
  const ChassisOptions& options() const { return options_; }

  // Identity for GetInfo responses.
  void FillServiceInfo(common::v1::ServiceInfo* info) const;

 private:
  ChassisOptions options_;
  std::vector<std::pair<grpc::Service*, std::string>> services_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<grpc::Server> server_;
  int grpc_port_ = 0;
  int metrics_port_ = 0;
  absl::Time start_time_;
  bool started_ = false;
  absl::Mutex shutdown_mu_;
  bool stopped_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace loom

#endif  // LOOM_SERVICES_COMMON_CHASSIS_H_
