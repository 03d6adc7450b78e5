#include "tests/integration/binaries.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "loom/data/v1/data.grpc.pb.h"
#include "loom/scheduler/v1/scheduler.grpc.pb.h"
#include "loom/worker/v1/worker.grpc.pb.h"
#include "services/common/grpc_status.h"

namespace loom {
namespace {

// One GetInfo call against any of the services (each package has its own
// request and response types, all holding a ServiceInfo).
template <typename Service, typename Request, typename Response>
absl::StatusOr<common::v1::ServiceInfo> CallGetInfo(const std::string& target,
                                                    const TransportSecurity& security) {
  auto stub = Service::NewStub(SecureChannel(target, security));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  Response response;
  grpc::Status s = stub->GetInfo(&ctx, Request(), &response);
  if (!s.ok()) return FromGrpcStatus(s, absl::StrCat("GetInfo at ", target));
  return response.info();
}

}  // namespace

std::string TestName(const ServiceBinary& b) {
  std::string out;
  bool upper = true;
  for (char c : b.name.substr(std::string("loom-").size())) {
    if (c == '-') {
      upper = true;
      continue;
    }
    out.push_back(upper ? static_cast<char>(std::toupper(c)) : c);
    upper = false;
  }
  return out;
}

std::string BinaryPath(const ServiceBinary& b) {
  return testing::RunfilePath(absl::StrCat(b.package, "/", b.name));
}

const std::string& JobCertificates() {
  static const std::string* dir = [] {
    auto* d = new std::string(TempPath("tls"));
    absl::Status made = MakeJobCertificates(*d);
    if (!made.ok()) {
      std::fprintf(stderr, "cannot make the test's certificates: %s\n",
                   std::string(made.message()).c_str());
      std::abort();
    }
    TransportSecurity admin;
    admin.tls_dir = IdentityDir(*d, kAdminIdentity);
    SetClientSecurity(admin);
    return d;
  }();
  return *dir;
}

TransportSecurity Identity(const std::string& identity) {
  TransportSecurity s;
  s.tls_dir = IdentityDir(JobCertificates(), identity);
  return s;
}

std::vector<std::string> SecurityFlags(common::v1::Role role) {
  switch (role) {
    case common::v1::ROLE_SCHEDULER:
      return {"--tls_dir=" + Identity(kSchedulerIdentity).tls_dir,
              "--control_tokens=" + JobCertificates() + "/tokens"};
    case common::v1::ROLE_PREPROCESS:
      return {"--tls_dir=" + Identity(kPreprocessIdentity).tls_dir};
    default:
      return {"--tls_dir=" + Identity(kWorkerIdentity).tls_dir};
  }
}

absl::StatusOr<common::v1::ServiceInfo> GetInfo(const ServiceBinary& b, const std::string& target) {
  return GetInfo(b, target, ClientSecurity());
}

absl::StatusOr<common::v1::ServiceInfo> GetInfo(const ServiceBinary& b, const std::string& target,
                                                const TransportSecurity& security) {
  switch (b.role) {
    case common::v1::ROLE_PREPROCESS:
      return CallGetInfo<data::v1::PreprocessService, data::v1::GetInfoRequest,
                         data::v1::GetInfoResponse>(target, security);
    case common::v1::ROLE_SCHEDULER:
      return CallGetInfo<scheduler::v1::SchedulerService, scheduler::v1::GetInfoRequest,
                         scheduler::v1::GetInfoResponse>(target, security);
    case common::v1::ROLE_ENCODER_WORKER:
      return CallGetInfo<worker::v1::EncoderWorkerService, worker::v1::GetInfoRequest,
                         worker::v1::GetInfoResponse>(target, security);
    case common::v1::ROLE_LLM_WORKER:
      return CallGetInfo<worker::v1::LlmWorkerService, worker::v1::GetInfoRequest,
                         worker::v1::GetInfoResponse>(target, security);
    case common::v1::ROLE_GENERATOR_WORKER:
      return CallGetInfo<worker::v1::GeneratorWorkerService, worker::v1::GetInfoRequest,
                         worker::v1::GetInfoResponse>(target, security);
    default:
      return absl::InvalidArgumentError("unknown role");
  }
}

}  // namespace loom
