// Who gets into a Loom service started the way deployments start it (mutual
// TLS with the job's certificates, control tokens): each binary as a real
// process, each kind of caller.
#include "services/common/security.h"

#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "loom/control/v1/control.grpc.pb.h"
#include "loom/data/v1/data.grpc.pb.h"
#include "loom/scheduler/v1/scheduler.grpc.pb.h"
#include "runtime/base/file.h"
#include "services/common/subprocess.h"
#include "tests/integration/binaries.h"

namespace loom {
namespace {

using control::v1::ControlService;

// A channel of its own (no connection shared with other channels: each
// caller below handshakes anew).
std::shared_ptr<grpc::Channel> OwnChannel(const std::string& target, const TransportSecurity& s) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::shared_ptr<grpc::ChannelCredentials> creds = MakeChannelCredentials(s, &args);
  return grpc::CreateCustomChannel(target, creds, args);
}

std::unique_ptr<grpc::ClientContext> Deadline() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return ctx;
}

// Callers the tests use, each a folder of credentials.
struct Callers {
  TransportSecurity job;        // the admin's certificate (any of the job's does for GetInfo)
  TransportSecurity ca_only;    // trusts the job's CA, presents nothing
  TransportSecurity read;       // ca_only + the read token
  TransportSecurity admin;      // ca_only + the admin token
  TransportSecurity stranger;   // trusts the job's CA, presents another CA's certificate
  TransportSecurity plaintext;  // no TLS at all
};

void CopyFile(const std::string& from, const std::string& to) {
  std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing);
}

const Callers& TheCallers() {
  static const Callers* callers = [] {
    auto* c = new Callers;
    c->job = Identity(kAdminIdentity);
    const std::string ca_only = TempPath("ca-only");
    std::filesystem::create_directories(ca_only);
    CopyFile(c->job.ca_path(), ca_only + "/ca.crt");
    c->ca_only.tls_dir = ca_only;
    c->read = c->ca_only;
    c->read.token_file = JobCertificates() + "/read.token";
    c->admin = c->ca_only;
    c->admin.token_file = JobCertificates() + "/admin.token";
    const std::string other = TempPath("other-ca");
    EXPECT_TRUE(MakeJobCertificates(other).ok());
    const std::string stranger = TempPath("stranger");
    std::filesystem::create_directories(stranger);
    CopyFile(c->job.ca_path(), stranger + "/ca.crt");
    CopyFile(IdentityDir(other, kWorkerIdentity) + "/tls.crt", stranger + "/tls.crt");
    CopyFile(IdentityDir(other, kWorkerIdentity) + "/tls.key", stranger + "/tls.key");
    c->stranger.tls_dir = stranger;
    return c;
  }();
  return *callers;
}

struct Running {
  std::unique_ptr<Subprocess> process;
  std::string target;
};

Running Start(const ServiceBinary& b, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {BinaryPath(b), "--host=127.0.0.1", "--shutdown_deadline=2s"};
  for (const std::string& flag : SecurityFlags(b.role)) argv.push_back(flag);
  if (b.worker) argv.push_back("--rank=0");
  argv.insert(argv.end(), extra.begin(), extra.end());
  // A log of its own: a log file's earlier "serving" record names old ports.
  static int started = 0;
  auto child = Subprocess::Start(argv, TempPath(absl::StrCat(b.name, ".", ++started, ".log")));
  EXPECT_TRUE(child.ok()) << child.status();
  Running r;
  if (!child.ok()) return r;
  absl::StatusOr<ServingPorts> ports = WaitForServing(**child, absl::Seconds(30));
  EXPECT_TRUE(ports.ok()) << ports.status() << "\n" << (*child)->ReadLog();
  if (ports.ok()) r.target = absl::StrCat("127.0.0.1:", ports->grpc_port);
  r.process = std::move(*child);
  return r;
}

grpc::StatusCode HealthCode(const std::string& target, const TransportSecurity& s) {
  auto stub = grpc::health::v1::Health::NewStub(OwnChannel(target, s));
  grpc::health::v1::HealthCheckResponse resp;
  return stub->Check(Deadline().get(), {}, &resp).error_code();
}

grpc::StatusCode InfoCode(const ServiceBinary& b, const std::string& target,
                          const TransportSecurity& s) {
  absl::StatusOr<common::v1::ServiceInfo> info = GetInfo(b, target, s);
  return static_cast<grpc::StatusCode>(info.status().code());
}

class SecurityTest : public ::testing::TestWithParam<ServiceBinary> {};

TEST_P(SecurityTest, OnlyTheJobsCertificateReachesTheServicesRpcs) {
  const ServiceBinary& b = GetParam();
  const Callers& c = TheCallers();
  Running r = Start(b);
  ASSERT_FALSE(r.target.empty());
  // Health: anyone who completes the handshake (Kubernetes' probes).
  EXPECT_EQ(HealthCode(r.target, c.ca_only), grpc::StatusCode::OK);
  // The service's own RPCs: a certificate of the job only (GetInfo: any).
  for (const char* identity :
       {kSchedulerIdentity, kPreprocessIdentity, kWorkerIdentity, kAdminIdentity}) {
    EXPECT_EQ(InfoCode(b, r.target, Identity(identity)), grpc::StatusCode::OK) << identity;
  }
  EXPECT_EQ(InfoCode(b, r.target, c.ca_only), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(InfoCode(b, r.target, c.admin), grpc::StatusCode::UNAUTHENTICATED)
      << "a control token opens only the control API";
  // Another CA's certificate, or no TLS: no connection at all.
  EXPECT_EQ(InfoCode(b, r.target, c.stranger), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(HealthCode(r.target, c.stranger), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(InfoCode(b, r.target, c.plaintext), grpc::StatusCode::UNAVAILABLE);
  r.process->Signal(SIGTERM);
  EXPECT_TRUE(r.process->Wait(absl::Seconds(15)).ok());
}

TEST_P(SecurityTest, RefusesToStartWithoutChoosingTlsOrInsecure) {
  const ServiceBinary& b = GetParam();
  auto child =
      Subprocess::Start({BinaryPath(b), "--host=127.0.0.1"}, TempPath(b.name + ".nosecurity.log"));
  ASSERT_TRUE(child.ok());
  absl::StatusOr<int> st = (*child)->Wait(absl::Seconds(15));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(DescribeWaitStatus(*st), "exit 1");
  EXPECT_TRUE(absl::StrContains((*child)->ReadLog(), "--tls_dir")) << (*child)->ReadLog();

  auto bad = Subprocess::Start({BinaryPath(b), "--host=127.0.0.1", "--tls_dir=" + TempPath("nope")},
                               TempPath(b.name + ".badtls.log"));
  ASSERT_TRUE(bad.ok());
  st = (*bad)->Wait(absl::Seconds(15));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(DescribeWaitStatus(*st), "exit 1");
  EXPECT_TRUE(absl::StrContains((*bad)->ReadLog(), "ca.crt")) << (*bad)->ReadLog();
}

INSTANTIATE_TEST_SUITE_P(AllServices, SecurityTest, ::testing::ValuesIn(ServiceCatalog()),
                         [](const auto& info) { return TestName(info.param); });

const ServiceBinary& Scheduler() {
  for (const ServiceBinary& b : ServiceCatalog()) {
    if (b.role == common::v1::ROLE_SCHEDULER) return b;
  }
  std::abort();
}

// One unary control call about job "nope": its status code.
template <typename Request, typename Response, typename Method>
grpc::StatusCode AboutNope(ControlService::Stub* stub, Method method) {
  Request request;
  request.set_job_id("nope");
  Response response;
  return (stub->*method)(Deadline().get(), request, &response).error_code();
}

// Every control method, called with `s`; its status code.
std::vector<std::pair<std::string, grpc::StatusCode>> ControlCodes(const std::string& target,
                                                                   const TransportSecurity& s) {
  using namespace control::v1;  // NOLINT: the requests and responses of one service
  auto stub = ControlService::NewStub(OwnChannel(target, s));
  std::vector<std::pair<std::string, grpc::StatusCode>> codes;
  SubmitJobResponse submit;
  codes.emplace_back("SubmitJob", stub->SubmitJob(Deadline().get(), {}, &submit).error_code());
  codes.emplace_back("GetJob", AboutNope<GetJobRequest, GetJobResponse>(
                                   stub.get(), &ControlService::Stub::GetJob));
  {
    auto ctx = Deadline();
    WatchJobRequest w;
    w.set_job_id("nope");
    auto reader = stub->WatchJob(ctx.get(), w);
    JobEvent e;
    while (reader->Read(&e)) {
    }
    codes.emplace_back("WatchJob", reader->Finish().error_code());
  }
  codes.emplace_back("PauseJob", AboutNope<PauseJobRequest, PauseJobResponse>(
                                     stub.get(), &ControlService::Stub::PauseJob));
  codes.emplace_back("ResumeJob", AboutNope<ResumeJobRequest, ResumeJobResponse>(
                                      stub.get(), &ControlService::Stub::ResumeJob));
  codes.emplace_back("CheckpointJob", AboutNope<CheckpointJobRequest, CheckpointJobResponse>(
                                          stub.get(), &ControlService::Stub::CheckpointJob));
  codes.emplace_back("CancelJob", AboutNope<CancelJobRequest, CancelJobResponse>(
                                      stub.get(), &ControlService::Stub::CancelJob));
  return codes;
}

bool IsAuthError(grpc::StatusCode c) {
  return c == grpc::StatusCode::UNAUTHENTICATED || c == grpc::StatusCode::PERMISSION_DENIED ||
         c == grpc::StatusCode::UNAVAILABLE;
}

TEST(ControlApiSecurityTest, EveryCallNeedsCredentialsAndReadOnlyCannotWrite) {
  const Callers& c = TheCallers();
  Running r = Start(Scheduler());
  ASSERT_FALSE(r.target.empty());
  // No credentials: UNAUTHENTICATED from every call.
  for (const auto& [name, code] : ControlCodes(r.target, c.ca_only)) {
    EXPECT_EQ(code, grpc::StatusCode::UNAUTHENTICATED) << name;
  }
  // A token nobody issued: the same.
  TransportSecurity forged = c.ca_only;
  forged.token_file = TempPath("forged.token");
  ASSERT_TRUE(WriteFileAtomically(forged.token_file, "0123456789abcdef0123456789abcdef\n").ok());
  for (const auto& [name, code] : ControlCodes(r.target, forged)) {
    EXPECT_EQ(code, grpc::StatusCode::UNAUTHENTICATED) << name;
  }
  // Read-only: GetJob and WatchJob get through (NOT_FOUND: no such job);
  // everything else PERMISSION_DENIED.
  for (const auto& [name, code] : ControlCodes(r.target, c.read)) {
    if (name == "GetJob" || name == "WatchJob") {
      EXPECT_EQ(code, grpc::StatusCode::NOT_FOUND) << name;
    } else {
      EXPECT_EQ(code, grpc::StatusCode::PERMISSION_DENIED) << name;
    }
  }
  // Admin, by token or by the job's certificate: every call gets through
  // to the service (which answers about the request itself).
  for (const TransportSecurity* s : {&c.admin, &c.job}) {
    for (const auto& [name, code] : ControlCodes(r.target, *s)) {
      EXPECT_FALSE(IsAuthError(code)) << name << " " << code;
    }
  }
  r.process->Signal(SIGTERM);
  EXPECT_TRUE(r.process->Wait(absl::Seconds(15)).ok());
}

// Polls `f` until it returns true or 30 s pass.
bool Eventually(const std::function<bool()>& f) {
  for (absl::Time end = absl::Now() + absl::Seconds(30); absl::Now() < end;) {
    if (f()) return true;
    absl::SleepFor(absl::Milliseconds(200));
  }
  return false;
}

TEST(ControlApiSecurityTest, RotatedCertificatesAndTokensTakeEffectWithoutARestart) {
  const Callers& c = TheCallers();
  // The server's folder starts as a copy of the job's and is then replaced
  // by a new CA's files, as a renewed Kubernetes Secret would be.
  const std::string served = TempPath("rotating");
  std::filesystem::create_directories(served);
  const std::string scheduler_dir = Identity(kSchedulerIdentity).tls_dir;
  for (const char* f : {"ca.crt", "tls.crt", "tls.key"}) {
    CopyFile(scheduler_dir + "/" + f, served + "/" + f);
  }
  CopyFile(JobCertificates() + "/tokens", served + "/tokens");
  Running r = Start(Scheduler(), {"--tls_dir=" + served, "--control_tokens=" + served + "/tokens",
                                  "--tls_refresh=1s"});
  ASSERT_FALSE(r.target.empty());
  const ServiceBinary& b = Scheduler();
  EXPECT_EQ(InfoCode(b, r.target, c.job), grpc::StatusCode::OK);

  const std::string renewed = TempPath("renewed");
  ASSERT_TRUE(MakeJobCertificates(renewed).ok());
  for (const char* f : {"ca.crt", "tls.crt", "tls.key"}) {
    CopyFile(IdentityDir(renewed, kSchedulerIdentity) + "/" + f, served + "/" + f);
  }
  CopyFile(renewed + "/tokens", served + "/tokens");
  TransportSecurity renewed_job;
  renewed_job.tls_dir = IdentityDir(renewed, kWorkerIdentity);
  renewed_job.refresh = absl::Seconds(1);
  EXPECT_TRUE(Eventually([&] {
    return InfoCode(b, r.target, renewed_job) == grpc::StatusCode::OK;
  })) << "the renewed certificate is never accepted";
  EXPECT_TRUE(Eventually([&] {
    return InfoCode(b, r.target, c.job) == grpc::StatusCode::UNAVAILABLE;
  })) << "the old CA's certificate is still accepted";
  // The old admin token is gone, the new one works.
  // Callers by token only: the renewed CA, no certificate.
  const std::string renewed_ca = TempPath("renewed-ca-only");
  std::filesystem::create_directories(renewed_ca);
  CopyFile(renewed + "/ca.crt", renewed_ca + "/ca.crt");
  TransportSecurity new_admin;
  new_admin.tls_dir = renewed_ca;
  new_admin.token_file = renewed + "/admin.token";
  TransportSecurity old_admin = new_admin;
  old_admin.token_file = JobCertificates() + "/admin.token";
  EXPECT_TRUE(Eventually([&] {
    for (const auto& [name, code] : ControlCodes(r.target, old_admin)) {
      if (code != grpc::StatusCode::UNAUTHENTICATED) return false;
    }
    return true;
  }));
  for (const auto& [name, code] : ControlCodes(r.target, new_admin)) {
    EXPECT_FALSE(IsAuthError(code)) << name << " " << code;
  }
  EXPECT_NE(r.process->ReadLog().find("control tokens reloaded"), std::string::npos)
      << r.process->ReadLog();
  r.process->Signal(SIGTERM);
  EXPECT_TRUE(r.process->Wait(absl::Seconds(15)).ok());
}

// Each identity may call what its role needs and no more: a worker's
// certificate cannot rewind the data or drive the job, loom-preprocess's
// cannot write rendezvous keys as a worker would.
TEST(ControlApiSecurityTest, EachIdentityCallsOnlyWhatItsRoleNeeds) {
  Running pre;
  Running sched = Start(Scheduler());
  for (const ServiceBinary& b : ServiceCatalog()) {
    if (b.role == common::v1::ROLE_PREPROCESS) pre = Start(b);
  }
  ASSERT_FALSE(pre.target.empty());
  ASSERT_FALSE(sched.target.empty());
  auto rewind = [&](const std::string& identity) {
    auto stub = data::v1::PreprocessService::NewStub(OwnChannel(pre.target, Identity(identity)));
    data::v1::RewindRequest r;
    r.set_start_iteration(-1);  // refused by the service itself, after authorization
    data::v1::RewindResponse response;
    return stub->Rewind(Deadline().get(), r, &response).error_code();
  };
  auto fetch = [&](const std::string& identity) {
    auto stub = data::v1::PreprocessService::NewStub(OwnChannel(pre.target, Identity(identity)));
    data::v1::FetchSamplesResponse response;
    return stub->FetchSamples(Deadline().get(), {}, &response).error_code();
  };
  // A rendezvous key write: FAILED_PRECONDITION from the service (no job
  // yet) once authorized.
  auto set_key = [&](const std::string& identity) {
    auto stub =
        scheduler::v1::SchedulerService::NewStub(OwnChannel(sched.target, Identity(identity)));
    scheduler::v1::SetKeyRequest r;
    r.set_key("k");
    scheduler::v1::SetKeyResponse response;
    return stub->SetKey(Deadline().get(), r, &response).error_code();
  };
  EXPECT_EQ(rewind(kWorkerIdentity), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(rewind(kAdminIdentity), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_FALSE(IsAuthError(rewind(kSchedulerIdentity)));
  EXPECT_EQ(fetch(kSchedulerIdentity), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_FALSE(IsAuthError(fetch(kWorkerIdentity)));
  EXPECT_EQ(set_key(kPreprocessIdentity), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(set_key(kAdminIdentity), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(set_key(kWorkerIdentity), grpc::StatusCode::FAILED_PRECONDITION);
  for (const auto& [name, code] : ControlCodes(sched.target, Identity(kWorkerIdentity))) {
    EXPECT_EQ(code, grpc::StatusCode::PERMISSION_DENIED) << name;
  }
  for (Running* r : {&pre, &sched}) {
    r->process->Signal(SIGTERM);
    EXPECT_TRUE(r->process->Wait(absl::Seconds(15)).ok());
  }
}

}  // namespace
}  // namespace loom
