// A running `loom up` job under a stream of random and malformed wire-format
// messages sent to every RPC of every service (each service's own, the
// control API, health, reflection), from two callers at once: one holding
// the job's certificate, one without credentials. Every service keeps
// serving, the job ends by itself, and its losses are the undisturbed
// single-process run's, step by step.
#include <atomic>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/message.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "loom/control/v1/control.grpc.pb.h"
#include "loom/data/v1/data.grpc.pb.h"
#include "loom/scheduler/v1/scheduler.grpc.pb.h"
#include "loom/worker/v1/worker.grpc.pb.h"
#include "runtime/base/file.h"
#include "services/common/health_client.h"
#include "services/common/security.h"
#include "services/common/subprocess.h"
#include "tests/integration/binaries.h"
#include "tests/integration/training_runs.h"

namespace loom {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::MethodDescriptor;
using google::protobuf::Reflection;

using FuzzTest = TrainingRuns;

// One service process of the job: its address and the gRPC services it serves.
struct Target {
  std::string name;
  std::string address;
  std::vector<std::string> services;
};

// Every process of run `run` that logged "serving" (its ports), with the
// services its binary serves.
std::vector<Target> Targets(const std::string& run) {
  std::vector<Target> out;
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(run + "/logs", ec)) {
    const std::string name = f.path().filename().string();
    if (!absl::EndsWith(name, ".log")) continue;
    absl::StatusOr<std::string> text = ReadFile(f.path().string());
    if (!text.ok()) continue;
    absl::StatusOr<ServingPorts> ports = FindServingPorts(*text);
    if (!ports.ok()) continue;
    Target t;
    t.name = name;
    t.address = absl::StrCat("127.0.0.1:", ports->grpc_port);
    t.services = {"grpc.health.v1.Health"};
    if (absl::StartsWith(name, "loom-scheduler")) {
      t.services.push_back(scheduler::v1::SchedulerService::service_full_name());
      t.services.push_back(control::v1::ControlService::service_full_name());
    } else if (absl::StartsWith(name, "loom-preprocess")) {
      t.services.push_back(data::v1::PreprocessService::service_full_name());
    } else if (absl::StartsWith(name, "loom-encoder-worker")) {
      t.services.push_back(worker::v1::EncoderWorkerService::service_full_name());
    } else if (absl::StartsWith(name, "loom-llm-worker")) {
      t.services.push_back(worker::v1::LlmWorkerService::service_full_name());
    }
    out.push_back(std::move(t));
  }
  return out;
}

// Random field values, by type: numbers near the edges as often as small
// ones, strings of any bytes, nested messages a few levels deep.
class MessageFuzzer {
 public:
  explicit MessageFuzzer(uint64_t seed) : rng_(seed) {}

  std::string Payload(const Descriptor* type) {
    switch (Pick(5)) {
      case 0:
        return RandomBytes(Pick(64));
      case 1:
        return Malformed();
      case 2: {  // a well-formed message with one byte flipped
        std::string s = Structured(type);
        if (!s.empty()) s[Pick(s.size())] ^= static_cast<char>(1 + Pick(255));
        return s;
      }
      default:
        return Structured(type);
    }
  }

 private:
  size_t Pick(size_t n) {
    return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng_);
  }

  std::string RandomBytes(size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(Pick(256));
    return s;
  }

  // Wire-format traps: lengths past the end, truncated varints, an
  // over-long varint, groups never closed, a tag of field 0, a huge field
  // number, a wrong wire type for a known field.
  std::string Malformed() {
    static const std::vector<std::string> kTraps = {
        std::string("\x0a\xff\xff\xff\xff\x0f", 6),
        std::string("\x08\x80\x80\x80", 4),
        std::string("\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12),
        std::string("\x0b\x0b\x0b\x0b", 4),
        std::string("\x00\x01", 2),
        std::string("\xf8\xff\xff\xff\x0f\x01", 6),
        std::string("\x0d\x01", 2),
        std::string("\x12\x05\x0a\x03\x0a\x01", 6),
    };
    std::string s = kTraps[Pick(kTraps.size())];
    if (Pick(2)) s = RandomBytes(Pick(16)) + s;
    return s;
  }

  std::string Structured(const Descriptor* type) {
    std::unique_ptr<Message> m(factory_.GetPrototype(type)->New());
    Fill(m.get(), 0);
    return m->SerializePartialAsString();
  }

  int64_t Int() {
    static const int64_t kEdges[] = {0,  1,         -1,        2,         7,
                                     63, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN};
    return Pick(2) ? kEdges[Pick(10)] : static_cast<int64_t>(rng_());
  }

  void Fill(Message* m, int depth) {
    const Descriptor* d = m->GetDescriptor();
    const Reflection* r = m->GetReflection();
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      if (Pick(3) == 0) continue;
      const int n = f->is_repeated() ? static_cast<int>(Pick(4)) : 1;
      for (int k = 0; k < n; ++k) SetOne(m, r, f, depth);
    }
  }

  void SetOne(Message* m, const Reflection* r, const FieldDescriptor* f, int depth) {
    const bool rep = f->is_repeated();
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        rep ? r->AddInt32(m, f, static_cast<int32_t>(Int()))
            : r->SetInt32(m, f, static_cast<int32_t>(Int()));
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        rep ? r->AddInt64(m, f, Int()) : r->SetInt64(m, f, Int());
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        rep ? r->AddUInt32(m, f, static_cast<uint32_t>(Int()))
            : r->SetUInt32(m, f, static_cast<uint32_t>(Int()));
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        rep ? r->AddUInt64(m, f, static_cast<uint64_t>(Int()))
            : r->SetUInt64(m, f, static_cast<uint64_t>(Int()));
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE: {
        static const double kD[] = {0,
                                    -1,
                                    1e308,
                                    -1e308,
                                    std::numeric_limits<double>::quiet_NaN(),
                                    std::numeric_limits<double>::infinity()};
        const double v = kD[Pick(6)];
        rep ? r->AddDouble(m, f, v) : r->SetDouble(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_FLOAT: {
        const float v =
            Pick(2) ? std::numeric_limits<float>::quiet_NaN() : -std::numeric_limits<float>::max();
        rep ? r->AddFloat(m, f, v) : r->SetFloat(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_BOOL:
        rep ? r->AddBool(m, f, Pick(2)) : r->SetBool(m, f, Pick(2));
        break;
      case FieldDescriptor::CPPTYPE_ENUM: {
        const int v = Pick(3) ? f->enum_type()->value(Pick(f->enum_type()->value_count()))->number()
                              : static_cast<int>(Int());
        rep ? r->AddEnumValue(m, f, v) : r->SetEnumValue(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_STRING: {
        // Random bytes (invalid UTF-8 in a string field), or long runs.
        std::string v = Pick(4) ? RandomBytes(Pick(24)) : std::string(Pick(70000), 'x');
        rep ? r->AddString(m, f, std::move(v)) : r->SetString(m, f, std::move(v));
        break;
      }
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (depth < 3) Fill(rep ? r->AddMessage(m, f) : r->MutableMessage(m, f), depth + 1);
        break;
    }
  }

  std::mt19937_64 rng_;
  google::protobuf::DynamicMessageFactory factory_;
};

// One call of `method` at `channel` with `payload` as its request, through
// gRPC's generic stub (any method, unary or streaming): its status code.
grpc::StatusCode Call(grpc::GenericStub& stub, const std::string& method,
                      const std::string& payload) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(&ctx, method, &cq);
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](void* want) { return cq.Next(&tag, &ok) && tag == want && ok; };
  call->StartCall(reinterpret_cast<void*>(1));
  if (step(reinterpret_cast<void*>(1))) {
    grpc::Slice slice(payload);
    grpc::ByteBuffer request(&slice, 1);
    call->Write(request, reinterpret_cast<void*>(2));
    if (step(reinterpret_cast<void*>(2))) {
      call->WritesDone(reinterpret_cast<void*>(3));
      if (step(reinterpret_cast<void*>(3))) {
        grpc::ByteBuffer response;
        for (int i = 0; i < 16; ++i) {  // a stream's first answers
          call->Read(&response, reinterpret_cast<void*>(4));
          if (!step(reinterpret_cast<void*>(4))) break;
        }
      }
    }
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  while (cq.Next(&tag, &ok) && tag != reinterpret_cast<void*>(5)) {
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status.error_code();
}

struct Tally {
  absl::Mutex mu;
  std::map<std::string, std::map<grpc::StatusCode, int>> codes;  // by caller
  int calls = 0;
};

void Fuzz(const std::vector<Target>& targets, const TransportSecurity& security,
          const std::string& caller, uint64_t seed, const std::atomic<bool>& stop, Tally* tally) {
  MessageFuzzer fuzzer(seed);
  std::mt19937_64 rng(seed);
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  for (const Target& t : targets) {
    stubs.push_back(std::make_unique<grpc::GenericStub>(SecureChannel(t.address, security)));
  }
  while (!stop.load()) {
    const size_t i = rng() % targets.size();
    const Target& t = targets[i];
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            t.services[rng() % t.services.size()]);
    if (service == nullptr || service->method_count() == 0) continue;
    const MethodDescriptor* method = service->method(rng() % service->method_count());
    const std::string path = absl::StrCat("/", service->full_name(), "/", method->name());
    const grpc::StatusCode code = Call(*stubs[i], path, fuzzer.Payload(method->input_type()));
    const bool health = service->full_name() == "grpc.health.v1.Health";
    {
      absl::MutexLock lock(&tally->mu);
      ++tally->codes[health ? caller + ", health" : caller][code];
      ++tally->calls;
    }
    // A channel between connections fails calls at once: do not spin.
    if (code == grpc::StatusCode::UNAVAILABLE) absl::SleepFor(absl::Milliseconds(20));
  }
}

TEST_F(FuzzTest, ServicesKeepServingAndLossesStayUndisturbedUnderRandomMessages) {
  const std::string run = TempPath("fuzzed"), config = TempPath("fuzzed.txtpb");
  ASSERT_TRUE(WriteFileAtomically(config, Job("loom", 0)).ok());
  // --noexit_on_job_end: the services stay up after the last step, so their
  // health is checked while the fuzzers still send.
  absl::StatusOr<std::unique_ptr<Subprocess>> up = Subprocess::Start(
      {Runfile("deploy/launcher/loom-up"), "--bin_dir=" + Runfile(""), "--run_dir=" + run,
       "--config=" + config, absl::StrCat("--steps=", kSteps), "--json", "--noexit_on_job_end"},
      TempPath("fuzzed.log"));
  ASSERT_TRUE(up.ok()) << up.status();
  // Every service serving (two of each worker, preprocess, the scheduler).
  std::vector<Target> targets;
  for (absl::Time end = absl::Now() + absl::Minutes(3); absl::Now() < end;) {
    targets = Targets(run);
    if (targets.size() == 6 || !(*up)->running()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_EQ(targets.size(), 6u) << (*up)->ReadLog();

  // Callers: a worker's certificate (what every worker pod holds), the
  // admin token (control API), and one with no credentials.
  const std::string certs = run + "/tls";
  TransportSecurity worker;
  worker.tls_dir = IdentityDir(certs, kWorkerIdentity);
  TransportSecurity nobody;
  nobody.tls_dir = TempPath("fuzz-ca-only");
  std::filesystem::create_directories(nobody.tls_dir);
  std::filesystem::copy_file(certs + "/ca.crt", nobody.ca_path(),
                             std::filesystem::copy_options::overwrite_existing);
  TransportSecurity token = nobody;
  token.token_file = certs + "/admin.token";

  std::atomic<bool> stop{false};
  Tally tally;
  const std::vector<std::pair<const TransportSecurity*, std::string>> callers = {
      {&worker, "with a worker's certificate"},
      {&token, "with the admin token"},
      {&nobody, "without credentials"},
      {&worker, "with a worker's certificate"}};
  std::vector<std::thread> fuzzers;
  for (size_t k = 0; k < callers.size(); ++k) {
    fuzzers.emplace_back(Fuzz, std::cref(targets), std::cref(*callers[k].first), callers[k].second,
                         k + 1, std::cref(stop), &tally);
  }
  // Fuzz while the job trains, until its last step (at most 4 minutes), and
  // on at the finished job's services for 30 s in all at least.
  const absl::Time started = absl::Now();
  std::string out;
  for (absl::Time end = absl::Now() + absl::Minutes(4); absl::Now() < end;) {
    out = (*up)->ReadLog();
    if (StepResults(out).count(kSteps) || !(*up)->running()) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  if ((*up)->running()) absl::SleepFor(started + absl::Seconds(30) - absl::Now());
  // Every service still serving, asked while the fuzzers still send.
  TransportSecurity admin;
  admin.tls_dir = IdentityDir(certs, kAdminIdentity);
  SetClientSecurity(admin);
  for (const Target& t : targets) {
    absl::Status s = WaitUntilServing(t.address, "", absl::Seconds(20));
    EXPECT_TRUE(s.ok()) << t.name << ": " << s;
  }
  stop.store(true);
  for (std::thread& t : fuzzers) t.join();
  (*up)->Signal(SIGINT);  // --noexit_on_job_end: Ctrl-C stops it
  absl::StatusOr<int> st = (*up)->Wait(absl::Minutes(1));
  ASSERT_TRUE(st.ok()) << st.status();
  out = (*up)->ReadLog();
  EXPECT_EQ(DescribeWaitStatus(*st), "exit 0") << out;
  {
    absl::MutexLock lock(&tally.mu);
    std::string summary;
    for (const auto& [caller, codes] : tally.codes) {
      absl::StrAppend(&summary, "\n  ", caller, ":");
      for (const auto& [code, n] : codes) absl::StrAppend(&summary, " code ", code, " x", n);
    }
    std::printf("fuzz: %d calls%s\n", tally.calls, summary.c_str());
    EXPECT_GT(tally.calls, 500) << "too few calls to mean anything";
    // Without credentials nothing but health gets past authentication
    // (a call may also time out in the handshake on this loaded machine).
    for (const auto& [code, n] : tally.codes["without credentials"]) {
      EXPECT_TRUE(code == grpc::StatusCode::UNAUTHENTICATED ||
                  code == grpc::StatusCode::DEADLINE_EXCEEDED ||
                  code == grpc::StatusCode::UNAVAILABLE)
          << "code " << code << " x" << n;
    }
    EXPECT_GT(tally.codes["without credentials"][grpc::StatusCode::UNAUTHENTICATED], 0);
    std::map<grpc::StatusCode, int>& by_worker = tally.codes["with a worker's certificate"];
    EXPECT_GT(by_worker[grpc::StatusCode::INVALID_ARGUMENT] +
                  by_worker[grpc::StatusCode::NOT_FOUND] + by_worker[grpc::StatusCode::INTERNAL],
              0)
        << "with the certificate, calls reach the services (and are refused there)";
  }
  // No service was lost and replaced (a replacement keeps the lost one's log
  // as .prev), and the losses are the undisturbed run's.
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(run + "/logs", ec)) {
    EXPECT_FALSE(absl::EndsWith(f.path().string(), ".prev")) << f.path() << " was replaced";
  }
  ExpectSameSteps(Steps(StepResults(out), 1, kSteps, "fuzzed"), Local(1, kSteps),
                  "fuzzed vs local");
}

}  // namespace
}  // namespace loom
