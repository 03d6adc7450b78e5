#include "services/common/chassis.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "prometheus/gauge.h"
#include "runtime/base/log.h"
#include "services/common/incarnation.h"
#include "services/common/version.h"

ABSL_FLAG(std::string, host, "0.0.0.0",
          "Address the gRPC and metrics servers bind (0.0.0.0: all).");
ABSL_FLAG(int, grpc_port, 0, "gRPC port; 0 picks a free port (logged).");
ABSL_FLAG(int, metrics_port, 0, "Prometheus /metrics port; 0 picks a free port (logged).");
ABSL_FLAG(absl::Duration, shutdown_deadline, absl::Seconds(5),
          "How long in-flight gRPC calls may run on after SIGTERM.");

namespace loom {
namespace {

// "host:port", with IPv6 literals bracketed.
std::string HostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && host.front() != '[') {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

bool ValidPort(int port) { return port >= 0 && port <= 65535; }

}  // namespace

ChassisOptions ChassisOptionsFromFlags(std::string service_name, common::v1::Role role, int rank) {
  ChassisOptions o;
  o.service_name = std::move(service_name);
  o.role = role;
  o.rank = rank;
  o.host = absl::GetFlag(FLAGS_host);
  o.grpc_port = absl::GetFlag(FLAGS_grpc_port);
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.shutdown_deadline = absl::GetFlag(FLAGS_shutdown_deadline);
  absl::StatusOr<TransportSecurity> security = TransportSecurityFromFlags(/*need_identity=*/true);
  if (!security.ok()) {
    LOOM_LOG(ERROR) << security.status().message();
    std::exit(1);
  }
  o.security = *security;
  SetClientSecurity(o.security);
  return o;
}

std::string RoleLabel(common::v1::Role role) {
  switch (role) {
    case common::v1::ROLE_PREPROCESS:
      return "preprocess";
    case common::v1::ROLE_SCHEDULER:
      return "scheduler";
    case common::v1::ROLE_ENCODER_WORKER:
      return "encoder_worker";
    case common::v1::ROLE_LLM_WORKER:
      return "llm_worker";
    case common::v1::ROLE_GENERATOR_WORKER:
      return "generator_worker";
    default:
      return "unspecified";
  }
}

Chassis::Chassis(ChassisOptions options)
    : options_(std::move(options)), registry_(std::make_shared<prometheus::Registry>()) {}

Chassis::~Chassis() { Shutdown(); }

void Chassis::AddService(grpc::Service* service, std::string full_name) {
  LOOM_CHECK(!started_) << "AddService after Start";
  services_.emplace_back(service, std::move(full_name));
}

absl::Status Chassis::Start() {
  if (started_) return absl::FailedPreconditionError("chassis already started");
  if (!ValidPort(options_.grpc_port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grpc_port=", options_.grpc_port, " is not in [0, 65535]"));
  }
  if (!ValidPort(options_.metrics_port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_port=", options_.metrics_port, " is not in [0, 65535]"));
  }
  if (options_.shutdown_deadline < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--shutdown_deadline must not be negative");
  }
  started_ = true;
  start_time_ = absl::Now();

  // Metrics first: a service that cannot export metrics does not serve.
  const std::string metrics_addr = HostPort(options_.host, options_.metrics_port);
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(metrics_addr, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve /metrics on ", metrics_addr, ": ", e.what()));
  }
  std::vector<int> ports = exposer_->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(
        absl::StrCat("/metrics server on ", metrics_addr, " bound no port"));
  }
  metrics_port_ = ports.front();
  exposer_->RegisterCollectable(registry_);

  const std::string role = RoleLabel(options_.role);
  const std::string rank = absl::StrCat(options_.rank);
  prometheus::BuildGauge()
      .Name("loom_build_info")
      .Help("Loom build and identity of this process; the value is always 1.")
      .Register(*registry_)
      .Add({{"role", role}, {"rank", rank}, {"version", kLoomVersion}})
      .Set(1);
  prometheus::BuildGauge()
      .Name("loom_process_start_time_seconds")
      .Help("Start time of this process since the Unix epoch, in seconds.")
      .Register(*registry_)
      .Add({{"role", role}, {"rank", rank}})
      .Set(absl::ToDoubleSeconds(start_time_ - absl::UnixEpoch()));

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default, which lets a second process bind a
  // port already in use and silently share its traffic. Refuse instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  const std::string grpc_addr = HostPort(options_.host, options_.grpc_port);
  if (absl::Status s = ValidateTransportSecurity(options_.security, /*need_identity=*/true);
      !s.ok()) {
    return s;
  }
  builder.AddListeningPort(grpc_addr, MakeServerCredentials(options_.security), &grpc_port_);
  for (auto& [service, name] : services_) builder.RegisterService(service);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || grpc_port_ == 0) {
    server_.reset();
    exposer_.reset();
    return absl::UnavailableError(absl::StrCat("cannot serve gRPC on ", grpc_addr));
  }
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus(true);  // overall ("")
  for (auto& [service, name] : services_) health->SetServingStatus(name, true);

  LOOM_LOG(INFO)
          .With("grpc_port", grpc_port_)
          .With("metrics_port", metrics_port_)
          .With("host", options_.host)
          .With("role", role)
          .With("rank", options_.rank)
          .With("version", kLoomVersion)
          .With("tls", options_.security.tls())
      << "serving";
  return absl::OkStatus();
}

void Chassis::SetServing(bool serving) {
  absl::MutexLock lock(&shutdown_mu_);  // the server stays until Shutdown()
  if (stopped_ || !started_ || server_ == nullptr) return;
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus(serving);
  for (auto& [service, name] : services_) health->SetServingStatus(name, serving);
}

void Chassis::Shutdown() {
  absl::MutexLock lock(&shutdown_mu_);
  if (stopped_ || !started_) return;
  stopped_ = true;
  // civetweb's listener notices a stop only every 2 s (its poll quantum), so
  // /metrics stops beside the gRPC drain rather than after it.
  std::thread exposer_stopper([this] { exposer_.reset(); });
  if (server_ != nullptr) {
    // NOT_SERVING for "" and every service; later updates are ignored.
    server_->GetHealthCheckService()->Shutdown();
    LOOM_LOG(INFO).With("deadline_s", absl::ToDoubleSeconds(options_.shutdown_deadline))
        << "NOT_SERVING; shutting down";
    server_->Shutdown(std::chrono::system_clock::now() +
                      absl::ToChronoMilliseconds(options_.shutdown_deadline));
    server_->Wait();
  }
  exposer_stopper.join();
  LOOM_LOG(INFO) << "stopped";
}

int Chassis::ServeUntilSignal(const std::function<void()>& on_signal) {
  if (absl::Status s = started_ ? absl::OkStatus() : Start(); !s.ok()) {
    LOOM_LOG(ERROR).With("code", absl::StatusCodeToString(s.code()))
        << "cannot start: " << s.message();
    return 1;
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  LOOM_LOG(INFO).With("signal", sig == SIGTERM ? "SIGTERM" : "SIGINT") << "signal received";
  if (on_signal) on_signal();
  Shutdown();
  return 0;
}

void Chassis::FillServiceInfo(common::v1::ServiceInfo* info) const {
  info->set_service_name(options_.service_name);
  info->set_role(options_.role);
  info->set_rank(options_.rank);
  info->set_version(kLoomVersion);
  const int64_t us = absl::ToUnixMicros(start_time_);
  info->mutable_start_time()->set_seconds(us / 1000000);
  info->mutable_start_time()->set_nanos(static_cast<int32_t>(us % 1000000) * 1000);
  info->set_grpc_port(grpc_port_);
  info->set_metrics_port(metrics_port_);
  info->set_instance(IncarnationInstance(ProcessIncarnation()));
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0) info->set_hostname(host);
  info->set_pid(getpid());
}

}  // namespace loom
