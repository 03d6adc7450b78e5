#include "services/scheduler/scheduler_service.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kernels/testing/tolerances.h"
#include "loom/worker/v1/worker.grpc.pb.h"
#include "runtime/base/file.h"
#include "runtime/base/test_paths.h"
#include "runtime/data/datagen.h"
#include "runtime/scheduling/plan.h"
#include "runtime/scheduling/schedule.h"
#include "services/common/chassis_testing.h"
#include "services/common/incarnation.h"
#include "services/preprocess/preprocess_service.h"
#include "services/scheduler/control_service.h"

namespace loom {
namespace {

TEST(SchedulerServiceImplTest, GetInfoReportsRoleAndBoundPorts) {
  Chassis chassis(testing::LocalOptions("loom-scheduler", common::v1::ROLE_SCHEDULER, /*rank=*/0));
  SchedulerServiceImpl service(&chassis);
  chassis.AddService(&service, scheduler::v1::SchedulerService::service_full_name());
  ASSERT_TRUE(chassis.Start().ok());

  auto stub = scheduler::v1::SchedulerService::NewStub(testing::ChannelTo(chassis));
  auto ctx = testing::ContextWithDeadline();
  scheduler::v1::GetInfoResponse response;
  grpc::Status s = stub->GetInfo(ctx.get(), scheduler::v1::GetInfoRequest(), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.info().service_name(), "loom-scheduler");
  EXPECT_EQ(response.info().role(), common::v1::ROLE_SCHEDULER);
  EXPECT_EQ(response.info().rank(), 0);
  EXPECT_EQ(response.info().grpc_port(), chassis.grpc_port());
  EXPECT_EQ(response.info().metrics_port(), chassis.metrics_port());

  // Without a plan the job RPCs say so.
  auto ctx2 = testing::ContextWithDeadline();
  scheduler::v1::GetPlanResponse plan;
  EXPECT_EQ(stub->GetPlan(ctx2.get(), scheduler::v1::GetPlanRequest(), &plan).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

// A plan the workers cannot run as it says is refused before anything
// registers: more pipeline stages than layers, a TP degree that does not
// divide the model's heads.
TEST(SchedulerServiceImplTest, RefusesPlansTheWorkersCannotRun) {
  Chassis chassis(testing::LocalOptions("loom-scheduler", common::v1::ROLE_SCHEDULER, /*rank=*/0));
  SchedulerServiceImpl service(&chassis);
  SchedulerServiceOptions so;
  so.job.set_name("t");
  so.job.set_model("tiny");
  so.plan = sched::PlanOfDegrees({/*llm_dp=*/1, /*microbatches=*/2, /*encoder_dp=*/1});
  so.plan.mutable_llm()->set_pp(3);
  so.plan.mutable_llm()->set_gpus(3);
  absl::Status s = service.Configure(so);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("llm_pp: 3 stages for the LLM's 2 layers"), std::string::npos) << s;
  so.plan = sched::PlanOfDegrees({1, 2, 1, /*llm_tp=*/3});
  s = service.Configure(so);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("llm_tp: 3 does not divide the LLM heads"), std::string::npos) << s;
  so.plan = sched::PlanOfDegrees({1, 2, 1, /*llm_tp=*/2, /*encoder_tp=*/2, /*llm_pp=*/2});
  EXPECT_TRUE(service.Configure(so).ok());
}

// A TCP port that accepts connections and never answers: a hung process.
class SilentPort {
 public:
  SilentPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&a), len) == 0 && listen(fd_, 16) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port_ = ntohs(a.sin_port);
    }
  }
  ~SilentPort() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// An LLM worker's GetInfo answering as the process `instance` names
// (ServiceInfo.instance): what loom-scheduler asks a rank's endpoint when
// another process registers from it.
class InstanceAnswer final : public worker::v1::LlmWorkerService::Service {
 public:
  void Set(const std::string& instance) {
    absl::MutexLock lock(&mu_);
    instance_ = instance;
  }
  grpc::Status GetInfo(grpc::ServerContext*, const worker::v1::GetInfoRequest*,
                       worker::v1::GetInfoResponse* response) override {
    absl::MutexLock lock(&mu_);
    response->mutable_info()->set_instance(instance_);
    return grpc::Status::OK;
  }

 private:
  absl::Mutex mu_;
  std::string instance_;
};

// Leases and recovery in place: the scheduler asks every registered
// worker's health; one that stops answering for a lease (or whose port is
// closed: at once) is declared lost, the job turns RECOVERING with the
// process and the phase named, its generation rises, the old generation's
// calls are told where the new one starts or refused, and the lost rank is
// free for a replacement, whose registration puts the job back to RUNNING.
TEST(SchedulerServiceImplTest, ALostWorkerIsDeclaredAndItsRankTakenByAReplacement) {
  std::vector<std::unique_ptr<Chassis>> workers;
  InstanceAnswer llm0_info;  // LLM rank 0 (workers[2]) says which process it is
  std::vector<std::string> incarnations;
  for (int i = 0; i < 3; ++i) {
    workers.push_back(std::make_unique<Chassis>(testing::LocalOptions(
        i < 2 ? "loom-encoder-worker" : "loom-llm-worker",
        i < 2 ? common::v1::ROLE_ENCODER_WORKER : common::v1::ROLE_LLM_WORKER, i % 2)));
    if (i == 2)
      workers.back()->AddService(&llm0_info, worker::v1::LlmWorkerService::service_full_name());
    ASSERT_TRUE(workers.back()->Start().ok());
  }
  for (int i = 0; i < 4; ++i) incarnations.push_back(NewIncarnation());
  llm0_info.Set(IncarnationInstance(incarnations[2]));
  SilentPort hung;  // LLM rank 1
  ASSERT_GT(hung.port(), 0);
  Chassis chassis(testing::LocalOptions("loom-scheduler", common::v1::ROLE_SCHEDULER));
  SchedulerServiceOptions so;
  so.plan = sched::PlanOfDegrees({/*llm_dp=*/2, /*microbatches=*/2, /*encoder_dp=*/2});
  so.job.set_name("t");
  so.job.set_model("tiny");
  so.job.mutable_checkpoint()->set_dir(testing::TempPath("lease_ckpt"));
  so.job.mutable_recovery()->set_lease_seconds(0.6);
  so.job.mutable_recovery()->set_max_restarts(3);
  so.pause_hold = absl::Milliseconds(200);
  absl::StatusOr<std::unique_ptr<SchedulerServiceImpl>> service =
      SchedulerServiceImpl::Create(&chassis, so);
  ASSERT_TRUE(service.ok()) << service.status();
  chassis.AddService(service->get(), scheduler::v1::SchedulerService::service_full_name());
  ASSERT_TRUE(chassis.Start().ok());
  auto stub = scheduler::v1::SchedulerService::NewStub(testing::ChannelTo(chassis));
  // As the process `incarnation` (the first one of slot i if empty).
  auto register_worker = [&](int i, const std::string& ucx, int port,
                             scheduler::v1::RegisterWorkerResponse* response,
                             const std::string& incarnation = "") {
    scheduler::v1::RegisterWorkerRequest r;
    r.set_incarnation(incarnation.empty() ? incarnations[i] : incarnation);
    r.mutable_worker()->set_role(i < 2 ? common::v1::ROLE_ENCODER_WORKER
                                       : common::v1::ROLE_LLM_WORKER);
    r.mutable_worker()->set_rank(i % 2);
    r.mutable_worker()->set_ucx_address(ucx);
    r.mutable_worker()->set_endpoint(absl::StrCat("127.0.0.1:", port));
    auto ctx = testing::ContextWithDeadline();
    return stub->RegisterWorker(ctx.get(), r, response);
  };
  scheduler::v1::RegisterWorkerResponse registered;
  std::string key0;  // generation 0's data-plane key: one for all its workers
  for (int i = 0; i < 4; ++i) {
    const int port = i < 3 ? workers[i]->grpc_port() : hung.port();
    ASSERT_TRUE(register_worker(i, "ucx" + std::to_string(i), port, &registered).ok());
    EXPECT_EQ(registered.generation(), 0);
    EXPECT_EQ(registered.data_key().size(), 16u);
    if (i == 0) key0 = registered.data_key();
    EXPECT_EQ(registered.data_key(), key0);
  }
  auto job = [&] { return *(*service)->GetJob("t"); };
  ASSERT_EQ(job().state(), control::v1::JOB_STATE_RUNNING);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (job().state() == control::v1::JOB_STATE_RUNNING && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  control::v1::Job j = job();
  ASSERT_EQ(j.state(), control::v1::JOB_STATE_RECOVERING) << j.message();
  EXPECT_EQ(j.recovery().role(), common::v1::ROLE_LLM_WORKER);
  EXPECT_EQ(j.recovery().rank(), 1);
  EXPECT_EQ(j.recovery().endpoint(), absl::StrCat("127.0.0.1:", hung.port()));
  EXPECT_EQ(j.recovery().phase(), "iteration 0");
  EXPECT_NE(j.recovery().cause().find("no SERVING health answer for"), std::string::npos)
      << j.recovery().cause();
  EXPECT_EQ(j.message().rfind("llm_worker rank 1 lost during iteration 0: ", 0), 0u) << j.message();
  EXPECT_GE(j.recovery().declared_seconds() - j.recovery().last_seen_seconds(), 0.6);
  EXPECT_EQ(j.generation(), 1);
  EXPECT_EQ(j.restarts(), 1);
  EXPECT_EQ(j.workers_registered(), 3);

  // The old generation's calls: told where the new one starts, or refused.
  scheduler::v1::GetAssignmentRequest r;
  r.set_iteration(0);
  r.set_generation(0);
  scheduler::v1::GetAssignmentResponse response;
  auto ctx = testing::ContextWithDeadline(30);
  grpc::Status s = stub->GetAssignment(ctx.get(), r, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(response.has_regroup());
  EXPECT_FALSE(response.has_assignment());
  EXPECT_EQ(response.regroup().generation(), 1);
  EXPECT_EQ(response.regroup().start_iteration(), 0);
  EXPECT_EQ(response.regroup().checkpoint_step_dir(), "");  // no checkpoint: from the seed
  // A new key: a worker of generation 0 cannot address generation 1's receives.
  const std::string key1 = response.regroup().data_key();
  EXPECT_EQ(key1.size(), 16u);
  EXPECT_NE(key1, key0);
  scheduler::v1::ReportStepRequest step;
  step.set_generation(0);
  step.set_incarnation(incarnations[2]);
  scheduler::v1::ReportStepResponse step_response;
  auto ctx2 = testing::ContextWithDeadline();
  s = stub->ReportStep(ctx2.get(), step, &step_response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message().rfind("generation 0 is over", 0), 0u) << s.error_message();
  // The new generation waits for the replacement.
  r.set_generation(1);
  auto ctx3 = testing::ContextWithDeadline(30);
  s = stub->GetAssignment(ctx3.get(), r, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(s.error_message().rfind("the job is recovering (llm_worker rank 1 lost", 0), 0u)
      << s.error_message();
  auto ctx4 = testing::ContextWithDeadline();
  scheduler::v1::GetGenerationResponse current;
  ASSERT_TRUE(stub->GetGeneration(ctx4.get(), {}, &current).ok());
  EXPECT_EQ(current.current().generation(), 1);
  EXPECT_EQ(current.current().data_key(), key1);

  // The lost process, late (it was hung, not gone): refused, it must exit.
  s = register_worker(3, "ucx3", hung.port(), &registered);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("this process was declared lost as ROLE_LLM_WORKER rank 1"),
            std::string::npos)
      << s.error_message();
  // Another rank is still held by its worker; the lost one is free.
  EXPECT_EQ(register_worker(2, "elsewhere", workers[2]->grpc_port(), &registered, NewIncarnation())
                .error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  Chassis replacement(
      testing::LocalOptions("loom-llm-worker", common::v1::ROLE_LLM_WORKER, /*rank=*/1));
  ASSERT_TRUE(replacement.Start().ok());
  s = register_worker(3, "ucx3-new", replacement.grpc_port(), &registered, NewIncarnation());
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(registered.generation(), 1);
  EXPECT_EQ(registered.data_key(), key1);
  EXPECT_EQ(job().state(), control::v1::JOB_STATE_RUNNING);

  // Any process holds the workers' certificate: one naming the holder's
  // endpoint while the holder still answers there is refused, and the
  // holder keeps its rank and its reports.
  const std::string restarted = NewIncarnation();
  s = register_worker(2, "ucx2-impostor", workers[2]->grpc_port(), &registered, restarted);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << s.error_message();
  EXPECT_NE(s.error_message().find("still answers at its endpoint"), std::string::npos)
      << s.error_message();
  EXPECT_EQ(job().generation(), 1);
  // A new process registering from a holder's own endpoint (its container
  // restarted in the pod: another process answers there) replaces it at once.
  llm0_info.Set(IncarnationInstance(restarted));
  s = register_worker(2, "ucx2-restarted", workers[2]->grpc_port(), &registered, restarted);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(registered.generation(), 2);
  j = job();
  EXPECT_EQ(j.state(), control::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(j.recovery().role(), common::v1::ROLE_LLM_WORKER);
  EXPECT_EQ(j.recovery().rank(), 0);
  EXPECT_EQ(j.recovery().cause(), "restarted: a new process registered from its endpoint");

  // A closed port is a loss at once, not after a lease.
  workers[0]->Shutdown();  // encoder rank 0
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (job().generation() < 3 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(20));
  j = job();
  EXPECT_EQ(j.generation(), 3);
  EXPECT_EQ(j.recovery().role(), common::v1::ROLE_ENCODER_WORKER);
  EXPECT_EQ(j.recovery().cause().rfind("its port refuses connections", 0), 0u)
      << j.recovery().cause();
  EXPECT_LT(j.recovery().declared_seconds() - j.recovery().last_seen_seconds(), 0.6);
  EXPECT_EQ(j.restarts(), 3);

  // recovery.max_restarts 3: the next loss ends the job, naming it.
  Chassis encoder(
      testing::LocalOptions("loom-encoder-worker", common::v1::ROLE_ENCODER_WORKER, /*rank=*/0));
  ASSERT_TRUE(encoder.Start().ok());
  ASSERT_TRUE(
      register_worker(0, "ucx0-new", encoder.grpc_port(), &registered, NewIncarnation()).ok());
  ASSERT_EQ(job().state(), control::v1::JOB_STATE_RUNNING);
  replacement.Shutdown();  // LLM rank 1 again
  const absl::Time failed_by = absl::Now() + absl::Seconds(20);
  while (job().state() == control::v1::JOB_STATE_RUNNING && absl::Now() < failed_by) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  j = job();
  EXPECT_EQ(j.state(), control::v1::JOB_STATE_FAILED);
  EXPECT_EQ(j.generation(), 3);
  EXPECT_EQ(j.message().rfind("llm_worker rank 1 lost during iteration 0: its port refuses", 0), 0u)
      << j.message();
  EXPECT_TRUE(absl::EndsWith(j.message(), "; no restart left (recovery.max_restarts 3)"))
      << j.message();
  encoder.Shutdown();
  chassis.Shutdown();
}

// A grpc.health.v1 server whose answers (SERVING) each take `delay`: a
// busy but healthy process.
class SlowHealthServer final : public grpc::health::v1::Health::Service {
 public:
  explicit SlowHealthServer(absl::Duration delay) : delay_(delay) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~SlowHealthServer() override { Shutdown(); }
  void Shutdown() {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
    server_.reset();
  }
  grpc::Status Check(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest*,
                     grpc::health::v1::HealthCheckResponse* response) override {
    absl::SleepFor(delay_);
    response->set_status(grpc::health::v1::HealthCheckResponse::SERVING);
    return grpc::Status::OK;
  }
  std::string endpoint() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  const absl::Duration delay_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// Leases at scale: 256 holders whose health answers each take 250 ms
// (within the 0.4 s probe deadline of a 1.2 s lease; probed one after
// another, a round would take over a minute) keep their leases round after
// round, and the one whose port closes is declared lost within a few rounds.
TEST(SchedulerServiceImplTest, LeasesHoldAtScaleAndALostHolderIsFound) {
  constexpr int kPerModule = 128;
  constexpr absl::Duration kDelay = absl::Milliseconds(250);
  std::vector<std::unique_ptr<SlowHealthServer>> servers;  // 16 holders each
  for (int i = 0; i < 16; ++i) servers.push_back(std::make_unique<SlowHealthServer>(kDelay));
  SlowHealthServer victim(kDelay);  // LLM rank 100's own
  Chassis chassis(testing::LocalOptions("loom-scheduler", common::v1::ROLE_SCHEDULER));
  SchedulerServiceOptions so;
  so.plan = sched::PlanOfDegrees({/*llm_dp=*/kPerModule, /*microbatches=*/1,
                                  /*encoder_dp=*/kPerModule});
  so.job.set_name("t");
  so.job.set_model("tiny");
  so.job.mutable_checkpoint()->set_dir(testing::TempPath("lease_scale_ckpt"));
  so.job.mutable_recovery()->set_lease_seconds(1.2);
  absl::StatusOr<std::unique_ptr<SchedulerServiceImpl>> service =
      SchedulerServiceImpl::Create(&chassis, so);
  ASSERT_TRUE(service.ok()) << service.status();
  chassis.AddService(service->get(), scheduler::v1::SchedulerService::service_full_name());
  ASSERT_TRUE(chassis.Start().ok());
  auto stub = scheduler::v1::SchedulerService::NewStub(testing::ChannelTo(chassis));
  for (int i = 0; i < 2 * kPerModule; ++i) {
    const bool llm = i >= kPerModule;
    const int rank = i % kPerModule;
    scheduler::v1::RegisterWorkerRequest r;
    r.mutable_worker()->set_role(llm ? common::v1::ROLE_LLM_WORKER
                                     : common::v1::ROLE_ENCODER_WORKER);
    r.mutable_worker()->set_rank(rank);
    r.mutable_worker()->set_ucx_address(absl::StrCat("ucx", i));
    r.mutable_worker()->set_endpoint(llm && rank == 100 ? victim.endpoint()
                                                        : servers[i % 16]->endpoint());
    r.set_incarnation(NewIncarnation());
    scheduler::v1::RegisterWorkerResponse response;
    auto ctx = testing::ContextWithDeadline();
    ASSERT_TRUE(stub->RegisterWorker(ctx.get(), r, &response).ok()) << i;
  }
  auto job = [&] { return *(*service)->GetJob("t"); };
  ASSERT_EQ(job().state(), control::v1::JOB_STATE_RUNNING);
  // Several leases of slow answers: nobody is lost.
  const absl::Time healthy_until = absl::Now() + absl::Seconds(5);
  while (absl::Now() < healthy_until && job().state() == control::v1::JOB_STATE_RUNNING) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  control::v1::Job j = job();
  ASSERT_EQ(j.state(), control::v1::JOB_STATE_RUNNING) << j.message();
  EXPECT_EQ(j.restarts(), 0);

  victim.Shutdown();  // its port now refuses connections
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  while (job().state() == control::v1::JOB_STATE_RUNNING && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  j = job();
  ASSERT_EQ(j.state(), control::v1::JOB_STATE_RECOVERING) << "the closed port was not noticed";
  EXPECT_EQ(j.recovery().role(), common::v1::ROLE_LLM_WORKER);
  EXPECT_EQ(j.recovery().rank(), 100);
  EXPECT_EQ(j.recovery().endpoint(), victim.endpoint());
  EXPECT_EQ(j.recovery().cause().rfind("its port refuses connections", 0), 0u)
      << j.recovery().cause();
  EXPECT_EQ(j.restarts(), 1);
  chassis.Shutdown();
}

// A preprocess service over generated shards and a scheduler reading from it,
// with a plan of LLM DP 2 x 2 microbatches and encoder DP 2.
class ServedScheduleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = testing::TempPath("ov");
    data::DatagenOptions g;
    g.preset = "onevision";
    g.samples = 32;
    g.seed = 4;
    g.out_dir = dir;
    g.samples_per_shard = 16;
    ASSERT_TRUE(data::WriteDataset(g).ok());
    PreprocessServiceOptions po;
    po.shards = dir + "/*.tar";
    po.global_batch = 8;
    po.seed = 3;
    data_chassis_ = std::make_unique<Chassis>(
        testing::LocalOptions("loom-preprocess", common::v1::ROLE_PREPROCESS));
    auto data = PreprocessServiceImpl::Create(data_chassis_.get(), po);
    ASSERT_TRUE(data.ok()) << data.status();
    data_ = std::move(*data);
    data_chassis_->AddService(data_.get(), data::v1::PreprocessService::service_full_name());
    ASSERT_TRUE(data_chassis_->Start().ok());

    SchedulerServiceOptions so;
    so.plan = sched::PlanOfDegrees({/*llm_dp=*/2, /*microbatches=*/2, /*encoder_dp=*/2});
    *so.plan.mutable_costs() =
        sched::CoefficientsOnOneGpu(*ModelConfigByName("tiny"), sched::ClusterSpec());
    so.preprocess = absl::StrCat("127.0.0.1:", data_chassis_->grpc_port());
    so.retained_iterations = 3;
    so.pause_hold = absl::Milliseconds(200);  // answers "paused" long before any deadline
    so.job.set_name("t");
    so.job.mutable_data()->set_global_batch(8);
    if (epochs_ > 0) {
      so.job.mutable_train()->set_epochs(epochs_);
    } else {
      so.job.mutable_train()->set_steps(steps_);
    }
    so.job.mutable_checkpoint()->set_every(every_);
    so.fixed_costs = fixed_costs_;
    so.job.mutable_checkpoint()->set_dir(testing::TempPath("ckpt"));
    chassis_ = std::make_unique<Chassis>(
        testing::LocalOptions("loom-scheduler", common::v1::ROLE_SCHEDULER));
    auto service = SchedulerServiceImpl::Create(chassis_.get(), so);
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = std::move(*service);
    chassis_->AddService(service_.get(), scheduler::v1::SchedulerService::service_full_name());
    ASSERT_TRUE(chassis_->Start().ok());
    stub_ = scheduler::v1::SchedulerService::NewStub(testing::ChannelTo(*chassis_));
    data_stub_ = data::v1::PreprocessService::NewStub(testing::ChannelTo(*data_chassis_));
  }

  // The scheduler first (its assignment thread may be asking loom-preprocess
  // for a batch), then loom-preprocess's server, then the service it served.
  void TearDown() override {
    chassis_->Shutdown();
    service_.reset();
    data_chassis_->Shutdown();
  }

  // As the process named by `address` (its incarnation follows from it: a
  // retry from the same address is the same process).
  grpc::Status Register(common::v1::Role role, int rank, const std::string& address) {
    scheduler::v1::RegisterWorkerRequest r;
    r.mutable_worker()->set_role(role);
    r.mutable_worker()->set_rank(rank);
    r.mutable_worker()->set_ucx_address(address);
    r.set_incarnation(IncarnationOf(address));
    scheduler::v1::RegisterWorkerResponse response;
    auto ctx = testing::ContextWithDeadline();
    grpc::Status s = stub_->RegisterWorker(ctx.get(), r, &response);
    if (s.ok()) holders_[{role, rank}] = r.incarnation();
    return s;
  }
  static std::string IncarnationOf(const std::string& address) {
    return IncarnationInstance(address);  // 16 bytes that follow from the name
  }
  // Registers encoder and LLM ranks 0 and 1 ("e0", "l1", ...): the job runs.
  void RegisterAll() {
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(Register(common::v1::ROLE_ENCODER_WORKER, r, "e" + std::to_string(r)).ok());
      ASSERT_TRUE(Register(common::v1::ROLE_LLM_WORKER, r, "l" + std::to_string(r)).ok());
    }
  }
  // The incarnation that registered (role, rank) here ("" if none).
  std::string Holder(common::v1::Role role, int rank) { return holders_[{role, rank}]; }

  // `ended` (optional): GetAssignmentResponse.job_ended.
  grpc::Status Assignment(int64_t iteration, scheduler::v1::Assignment* out,
                          std::string* ended = nullptr) {
    scheduler::v1::GetAssignmentRequest r;
    r.set_iteration(iteration);
    scheduler::v1::GetAssignmentResponse response;
    auto ctx = testing::ContextWithDeadline(30);
    grpc::Status s = stub_->GetAssignment(ctx.get(), r, &response);
    *out = response.assignment();
    if (ended != nullptr) *ended = response.job_ended();
    return s;
  }

  // As the holder of (role, rank) unless `r` names an incarnation (the plan
  // has TP = PP = 1: the DP rank is the worker's).
  grpc::Status Report(scheduler::v1::ReportTimingsRequest r,
                      scheduler::v1::ReportTimingsResponse* response) {
    if (r.incarnation().empty()) r.set_incarnation(Holder(r.role(), r.rank()));
    auto ctx = testing::ContextWithDeadline();
    return stub_->ReportTimings(ctx.get(), r, response);
  }

  // LLM rank 1's report of iteration 0 (assignment `a`): its two
  // microbatches ran 10x as long as the cost model priced them.
  static scheduler::v1::ReportTimingsRequest SlowLlmReport(const scheduler::v1::Assignment& a) {
    scheduler::v1::ReportTimingsRequest r;
    r.set_role(common::v1::ROLE_LLM_WORKER);
    r.set_rank(1);
    r.set_iteration(0);
    for (int j = 0; j < 2; ++j) {
      auto* t = r.add_timings();
      t->set_microbatch(j);
      t->set_seconds(10 * a.bins(2 + j).llm_cost());
    }
    return r;
  }

  int64_t steps_ = 8;
  double epochs_ = 0;  // > 0: the job is given in epochs instead of steps_
  int every_ = 2;
  bool fixed_costs_ = false;
  std::map<std::pair<int, int>, std::string> holders_;
  std::unique_ptr<Chassis> data_chassis_, chassis_;
  std::unique_ptr<PreprocessServiceImpl> data_;
  std::unique_ptr<SchedulerServiceImpl> service_;
  std::unique_ptr<scheduler::v1::SchedulerService::Stub> stub_;
  std::unique_ptr<data::v1::PreprocessService::Stub> data_stub_;
};

// Forwards GetBatch to a preprocess service after `delay(iteration)`: a
// global batch that takes long to prepare. Counts the batches served.
class DelayedBatches final : public data::v1::PreprocessService::Service {
 public:
  DelayedBatches(std::shared_ptr<grpc::Channel> to, std::function<absl::Duration(int64_t)> delay)
      : stub_(data::v1::PreprocessService::NewStub(std::move(to))), delay_(std::move(delay)) {}
  grpc::Status GetBatch(grpc::ServerContext*, const data::v1::GetBatchRequest* request,
                        data::v1::GetBatchResponse* response) override {
    absl::SleepFor(delay_(request->iteration()));
    grpc::ClientContext ctx;
    grpc::Status s = stub_->GetBatch(&ctx, *request, response);
    absl::MutexLock lock(&mu_);
    served_.insert(request->iteration());
    return s;
  }
  std::set<int64_t> served() {
    absl::MutexLock lock(&mu_);
    return served_;
  }

 private:
  std::unique_ptr<data::v1::PreprocessService::Stub> stub_;
  std::function<absl::Duration(int64_t)> delay_;
  absl::Mutex mu_;
  std::set<int64_t> served_ ABSL_GUARDED_BY(mu_);
};

// A scheduler (LLM DP 2 x 2 microbatches, encoder DP 2) reading its batches
// through a DelayedBatches in front of a preprocess service.
struct DelayedScheduler {
  DelayedScheduler(const Chassis& preprocess, std::function<absl::Duration(int64_t)> delay,
                   const std::string& name, int assign_ahead)
      : batches(testing::ChannelTo(preprocess), std::move(delay)),
        batches_chassis(testing::LocalOptions("loom-preprocess", common::v1::ROLE_PREPROCESS)),
        chassis(testing::LocalOptions("loom-scheduler", common::v1::ROLE_SCHEDULER)) {
    batches_chassis.AddService(&batches, data::v1::PreprocessService::service_full_name());
    EXPECT_TRUE(batches_chassis.Start().ok());
    SchedulerServiceOptions so;
    so.plan = sched::PlanOfDegrees({/*llm_dp=*/2, /*microbatches=*/2, /*encoder_dp=*/2});
    so.preprocess = absl::StrCat("127.0.0.1:", batches_chassis.grpc_port());
    so.assign_ahead = assign_ahead;
    so.job.set_name(name);
    so.job.mutable_checkpoint()->set_dir(testing::TempPath(name + "_ckpt"));
    auto created = SchedulerServiceImpl::Create(&chassis, so);
    EXPECT_TRUE(created.ok()) << created.status();
    if (!created.ok()) return;
    service = std::move(*created);
    chassis.AddService(service.get(), scheduler::v1::SchedulerService::service_full_name());
    EXPECT_TRUE(chassis.Start().ok());
    stub = scheduler::v1::SchedulerService::NewStub(testing::ChannelTo(chassis));
  }
  ~DelayedScheduler() {  // the scheduler first: its thread may be asking for a batch
    chassis.Shutdown();
    service.reset();
    batches_chassis.Shutdown();
  }

  DelayedBatches batches;
  Chassis batches_chassis, chassis;
  std::unique_ptr<SchedulerServiceImpl> service;
  std::unique_ptr<scheduler::v1::SchedulerService::Stub> stub;
};

// A batch that takes longer to prepare than a caller's deadline: every call
// is answered within its deadline with UNAVAILABLE "...; retry" (the one
// waiting for the batch and the one waiting for its turn alike), and asking
// again gets the assignment once the batch is there.
TEST_F(ServedScheduleTest, ABatchSlowerThanTheCallersDeadlinesIsWaitedFor) {
  const absl::Time ready = absl::Now() + absl::Seconds(6);
  DelayedScheduler late(
      *data_chassis_, [ready](int64_t) { return ready - absl::Now(); }, "late", 2);
  ASSERT_NE(late.stub, nullptr);
  auto* stub = late.stub.get();
  auto ask = [&](scheduler::v1::GetAssignmentResponse* response) {
    scheduler::v1::GetAssignmentRequest r;
    r.set_iteration(0);
    auto ctx = testing::ContextWithDeadline(3);
    return stub->GetAssignment(ctx.get(), r, response);
  };
  grpc::Status first, second;
  scheduler::v1::GetAssignmentResponse r1, r2;
  std::thread other([&] { first = ask(&r1); });
  absl::SleepFor(absl::Milliseconds(300));
  second = ask(&r2);
  other.join();
  for (const grpc::Status& s : {first, second}) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
    EXPECT_TRUE(absl::EndsWith(s.error_message(), "; retry")) << s.error_message();
  }
  scheduler::v1::GetAssignmentResponse response;
  grpc::Status s;
  for (int tries = 0; tries < 20; ++tries) {  // about 2 s each: the batch comes at 6 s
    s = ask(&response);
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    EXPECT_TRUE(absl::EndsWith(s.error_message(), "; retry")) << s.error_message();
  }
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.assignment().iteration(), 0);
  EXPECT_EQ(response.assignment().bins_size(), 4);
}

// Assignments are computed ahead on the scheduler's own thread, at most
// assign_ahead past the newest handed out: a batch that takes longer to
// prepare than a caller waits (2 s against 0.5 s) is ready when asked for.
TEST_F(ServedScheduleTest, AssignmentsAreComputedAhead) {
  DelayedScheduler ahead(
      *data_chassis_,
      [](int64_t iteration) { return iteration > 0 ? absl::Seconds(2) : absl::ZeroDuration(); },
      "ahead", /*assign_ahead=*/2);
  ASSERT_NE(ahead.stub, nullptr);
  auto* stub = ahead.stub.get();
  DelayedBatches& slow = ahead.batches;
  auto ask = [&](int64_t iteration, double seconds) {
    scheduler::v1::GetAssignmentRequest r;
    r.set_iteration(iteration);
    scheduler::v1::GetAssignmentResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(seconds)));
    grpc::Status s = stub->GetAssignment(&ctx, r, &response);
    if (s.ok()) {
      EXPECT_EQ(response.assignment().iteration(), iteration);
    }
    return s;
  };
  EXPECT_EQ(ask(1, 1.5).error_code(), grpc::StatusCode::UNAVAILABLE)
      << "nobody asked for it before: its batch takes 2 s, the caller waits 0.5 s";
  ASSERT_TRUE(ask(0, 30).ok());
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (slow.served().size() < 3 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(50));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(slow.served(), (std::set<int64_t>{0, 1, 2})) << "2 ahead of the newest handed out, 0";
  for (int64_t it : {1, 2}) {
    grpc::Status s = ask(it, 1.5);
    EXPECT_TRUE(s.ok()) << "iteration " << it << ": " << s.error_message();
  }
}

// The control API's requests act on the assignments workers get: a pause
// holds new iterations (those handed out are still served), a checkpoint
// request marks the next iteration handed out, a cancel ends the job there.
TEST_F(ServedScheduleTest, ControlRequestsGateAssignments) {
  using control::v1::JobEvent;
  scheduler::v1::Assignment a;
  ASSERT_TRUE(Assignment(0, &a).ok());
  EXPECT_FALSE(a.checkpoint());
  ASSERT_TRUE(Assignment(1, &a).ok());
  EXPECT_TRUE(a.checkpoint()) << "checkpoint.every = 2: after iteration 1";

  EXPECT_EQ(service_->GetJob("t")->state(), control::v1::JOB_STATE_PENDING) << "no workers yet";
  EXPECT_EQ(service_->GetJob("x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(service_->GetJob("").status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(service_->PauseJob("t")->state(), control::v1::JOB_STATE_PAUSED);
  EXPECT_TRUE(Assignment(1, &a).ok()) << "handed out before the pause: still served";
  {
    scheduler::v1::GetAssignmentRequest r;
    r.set_iteration(2);
    scheduler::v1::GetAssignmentResponse response;
    auto ctx = testing::ContextWithDeadline(30);
    grpc::Status s = stub_->GetAssignment(ctx.get(), r, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
    EXPECT_NE(s.error_message().find("paused"), std::string::npos) << s.error_message();
  }
  EXPECT_EQ(service_->PauseJob("t").status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(service_->ResumeJob("t")->state(), control::v1::JOB_STATE_PENDING);
  EXPECT_EQ(service_->ResumeJob("t").status().code(), absl::StatusCode::kFailedPrecondition);
  int64_t step = -1;
  EXPECT_EQ(service_->CheckpointJob("t", &step).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "only a RUNNING job checkpoints";

  RegisterAll();
  EXPECT_EQ(service_->GetJob("t")->state(), control::v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(service_->CheckpointJob("t", &step).ok());
  EXPECT_EQ(step, 3) << "iterations 0 and 1 are handed out: the mark goes on 2, step 3 follows it";
  ASSERT_TRUE(Assignment(2, &a).ok());
  EXPECT_TRUE(a.checkpoint()) << "requested: after the next iteration handed out";
  EXPECT_EQ(service_->GetJob("t")->pending_checkpoint(), 2) << "step 2 is still being written";

  absl::StatusOr<control::v1::Job> cancelled = service_->CancelJob("t", "enough");
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), control::v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled->message(), "enough");
  std::string ended;
  EXPECT_TRUE(Assignment(2, &a, &ended).ok())
      << "handed out before the cancel: every worker gets it";
  EXPECT_EQ(ended, "");
  ASSERT_TRUE(Assignment(3, &a, &ended).ok()) << "the end is an answer, not an error";
  EXPECT_EQ(ended, "the job stopped before iteration 3: enough");
  EXPECT_EQ(a.bins_size(), 0);
  EXPECT_EQ(service_->CancelJob("t", "").status().code(), absl::StatusCode::kFailedPrecondition);

  std::vector<control::v1::JobState> states;
  for (const auto& [seq, e] : service_->EventsAfter(0, absl::ZeroDuration())) {
    if (e.kind() == JobEvent::KIND_STATE) states.push_back(e.job().state());
  }
  EXPECT_EQ(states, (std::vector<control::v1::JobState>{
                        control::v1::JOB_STATE_PENDING,  // accepted
                        control::v1::JOB_STATE_PAUSED, control::v1::JOB_STATE_PENDING,
                        control::v1::JOB_STATE_RUNNING, control::v1::JOB_STATE_CANCELLED}));
}

TEST_F(ServedScheduleTest, RegistrationIsTheRendezvous) {
  using common::v1::ROLE_ENCODER_WORKER;
  using common::v1::ROLE_LLM_WORKER;
  EXPECT_TRUE(Register(ROLE_LLM_WORKER, 0, "llm0").ok());
  EXPECT_TRUE(Register(ROLE_LLM_WORKER, 0, "llm0").ok());  // a retry
  EXPECT_EQ(Register(ROLE_LLM_WORKER, 0, "other").error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(Register(ROLE_LLM_WORKER, 2, "x").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Register(ROLE_LLM_WORKER, -1, "x").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Register(common::v1::ROLE_PREPROCESS, 0, "x").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Register(ROLE_ENCODER_WORKER, 0, "").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  auto plan = [&] {
    scheduler::v1::GetPlanResponse r;
    auto ctx = testing::ContextWithDeadline();
    EXPECT_TRUE(stub_->GetPlan(ctx.get(), scheduler::v1::GetPlanRequest(), &r).ok());
    return r;
  };
  EXPECT_FALSE(plan().complete());
  ASSERT_TRUE(Register(ROLE_LLM_WORKER, 1, "llm1").ok());
  ASSERT_TRUE(Register(ROLE_ENCODER_WORKER, 1, "enc1").ok());
  ASSERT_TRUE(Register(ROLE_ENCODER_WORKER, 0, "enc0").ok());
  scheduler::v1::GetPlanResponse done = plan();
  EXPECT_TRUE(done.complete());
  ASSERT_EQ(done.workers_size(), 4);
  EXPECT_EQ(done.workers(0).ucx_address(), "enc0");  // by role, then rank
  EXPECT_EQ(done.workers(3).ucx_address(), "llm1");
  EXPECT_EQ(done.plan().llm().dp(), 2);
}

// A flood of registrations or key writes is held to the plan-sized rate
// (RESOURCE_EXHAUSTED "...; retry", which clients retry); what was accepted
// before stays.
TEST_F(ServedScheduleTest, RegistrationsAndKeyWritesAreRateLimited) {
  ASSERT_TRUE(Register(common::v1::ROLE_LLM_WORKER, 0, "llm0").ok());
  int limited = 0;
  for (int i = 0; i < 2000 && limited == 0; ++i) {
    grpc::Status s = Register(common::v1::ROLE_LLM_WORKER, 0, "llm0");
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++limited;
      EXPECT_TRUE(absl::EndsWith(s.error_message(), "; retry")) << s.error_message();
    } else {
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
  }
  EXPECT_EQ(limited, 1) << "2,000 registrations of a 4-rank plan in a row all passed";
  limited = 0;
  for (int i = 0; i < 20000 && limited == 0; ++i) {
    scheduler::v1::SetKeyRequest r;
    r.set_key(absl::StrCat("k", i % 64));
    r.set_value("v");
    scheduler::v1::SetKeyResponse response;
    auto ctx = testing::ContextWithDeadline();
    grpc::Status s = stub_->SetKey(ctx.get(), r, &response);
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++limited;
      EXPECT_TRUE(absl::StrContains(s.error_message(), "rate limit")) << s.error_message();
    } else {
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
  }
  EXPECT_EQ(limited, 1) << "20,000 key writes in a row all passed";
  // The worker registered before the flood is still there.
  scheduler::v1::GetPlanResponse plan;
  auto ctx = testing::ContextWithDeadline();
  ASSERT_TRUE(stub_->GetPlan(ctx.get(), scheduler::v1::GetPlanRequest(), &plan).ok());
  ASSERT_EQ(plan.workers_size(), 1);
  EXPECT_EQ(plan.workers(0).ucx_address(), "llm0");
}

// A worker asks for the addresses of the peers it sends to, not every
// worker's; a bad or unregistered rank is named.
TEST_F(ServedScheduleTest, GetWorkersAnswersTheRanksAsked) {
  using common::v1::ROLE_ENCODER_WORKER;
  using common::v1::ROLE_LLM_WORKER;
  ASSERT_TRUE(Register(ROLE_LLM_WORKER, 0, "llm0").ok());
  ASSERT_TRUE(Register(ROLE_LLM_WORKER, 1, "llm1").ok());
  ASSERT_TRUE(Register(ROLE_ENCODER_WORKER, 1, "enc1").ok());
  auto get = [&](std::vector<std::pair<common::v1::Role, int>> refs,
                 scheduler::v1::GetWorkersResponse* response) {
    scheduler::v1::GetWorkersRequest request;
    for (auto [role, rank] : refs) {
      request.add_workers()->set_role(role);
      request.mutable_workers()->rbegin()->set_rank(rank);
    }
    auto ctx = testing::ContextWithDeadline();
    return stub_->GetWorkers(ctx.get(), request, response);
  };
  scheduler::v1::GetWorkersResponse r;
  ASSERT_TRUE(get({{ROLE_LLM_WORKER, 1}, {ROLE_ENCODER_WORKER, 1}, {ROLE_LLM_WORKER, 1}}, &r).ok());
  ASSERT_EQ(r.workers_size(), 3);
  EXPECT_EQ(r.workers(0).ucx_address(), "llm1");  // in the request's order
  EXPECT_EQ(r.workers(1).ucx_address(), "enc1");
  EXPECT_EQ(r.workers(2).ucx_address(), "llm1");
  grpc::Status s = get({{ROLE_ENCODER_WORKER, 0}}, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "ROLE_ENCODER_WORKER rank 0 is not registered"))
      << s.error_message();
  s = get({{ROLE_LLM_WORKER, 2}}, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "workers[0]")) << s.error_message();
  EXPECT_EQ(get({{common::v1::ROLE_PREPROCESS, 0}}, &r).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(get(std::vector<std::pair<common::v1::Role, int>>(4097, {ROLE_LLM_WORKER, 0}), &r)
                .error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// GetPlan and GetKey are long polls: held until the plan is complete or
// the key set (not answered at once, then asked again by thousands).
TEST_F(ServedScheduleTest, PlanAndKeysAreLongPolls) {
  using common::v1::ROLE_ENCODER_WORKER;
  using common::v1::ROLE_LLM_WORKER;
  ASSERT_TRUE(Register(ROLE_LLM_WORKER, 0, "llm0").ok());
  ASSERT_TRUE(Register(ROLE_LLM_WORKER, 1, "llm1").ok());
  ASSERT_TRUE(Register(ROLE_ENCODER_WORKER, 0, "enc0").ok());
  {
    scheduler::v1::GetPlanRequest r;
    r.set_wait_ms(200);
    scheduler::v1::GetPlanResponse incomplete;
    auto c = testing::ContextWithDeadline(30);
    ASSERT_TRUE(stub_->GetPlan(c.get(), r, &incomplete).ok());
    EXPECT_FALSE(incomplete.complete());
    EXPECT_EQ(incomplete.registered(), 3);
    EXPECT_EQ(incomplete.workers_size(), 0) << "a long poll lists the workers once complete";
  }
  std::thread last([&] {
    absl::SleepFor(absl::Milliseconds(500));
    EXPECT_TRUE(Register(ROLE_ENCODER_WORKER, 1, "enc1").ok());
  });
  scheduler::v1::GetPlanRequest pr;
  pr.set_wait_ms(4000);
  scheduler::v1::GetPlanResponse plan;
  auto ctx = testing::ContextWithDeadline(30);
  ASSERT_TRUE(stub_->GetPlan(ctx.get(), pr, &plan).ok());
  last.join();
  EXPECT_TRUE(plan.complete()) << "held until the last worker registered";
  EXPECT_EQ(plan.workers_size(), 0) << "a long poll never lists the workers (GetWorkers does)";
  EXPECT_EQ(plan.registered(), 4);

  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(500));
    scheduler::v1::SetKeyRequest r;
    r.set_key("g0-x/1");
    r.set_value("address");
    scheduler::v1::SetKeyResponse response;
    auto c = testing::ContextWithDeadline();
    EXPECT_TRUE(stub_->SetKey(c.get(), r, &response).ok());
  });
  scheduler::v1::GetKeyRequest kr;
  kr.set_key("g0-x/1");
  kr.set_wait_ms(4000);
  scheduler::v1::GetKeyResponse key;
  auto kctx = testing::ContextWithDeadline(30);
  grpc::Status s = stub_->GetKey(kctx.get(), kr, &key);
  setter.join();
  ASSERT_TRUE(s.ok()) << "held until the key was set: " << s.error_message();
  EXPECT_EQ(key.value(), "address");
  kr.set_key("never");
  kr.set_wait_ms(300);
  auto nctx = testing::ContextWithDeadline(30);
  EXPECT_EQ(stub_->GetKey(nctx.get(), kr, &key).error_code(), grpc::StatusCode::NOT_FOUND)
      << "after the wait it asked for";

  // Several keys in one call, whole or a part of each.
  scheduler::v1::GetKeysRequest many;
  many.add_reads()->set_key("g0-x/1");  // "address": 7 bytes
  scheduler::v1::KeyRead* part = many.add_reads();
  part->set_key("g0-x/1");
  part->set_part(6);
  part->set_parts(7);
  many.add_reads()->set_key("never");
  many.set_wait_ms(200);
  scheduler::v1::GetKeysResponse values;
  auto mctx = testing::ContextWithDeadline(30);
  ASSERT_TRUE(stub_->GetKeys(mctx.get(), many, &values).ok());
  ASSERT_EQ(values.values_size(), 3);
  EXPECT_TRUE(values.values(0).found());
  EXPECT_EQ(values.values(0).value(), "address");
  EXPECT_EQ(values.values(1).value(), "s");
  EXPECT_EQ(values.values(1).size(), 7);
  EXPECT_FALSE(values.values(2).found()) << "not set within the wait: the others still come";
  part->set_parts(3);
  part->set_part(0);
  auto uctx = testing::ContextWithDeadline(30);
  EXPECT_EQ(stub_->GetKeys(uctx.get(), many, &values).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION)
      << "7 bytes do not cut into 3 parts";
  part->set_part(3);
  auto bctx = testing::ContextWithDeadline(30);
  EXPECT_EQ(stub_->GetKeys(bctx.get(), many, &values).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT)
      << "part 3 of 3";

  // A response is bounded: five reads of a 1 MiB value are refused, named;
  // one part of each is not.
  scheduler::v1::SetKeyRequest big;
  big.set_key("g0-big");
  big.set_value(std::string(1 << 20, 'v'));
  scheduler::v1::SetKeyResponse set;
  auto sctx = testing::ContextWithDeadline(30);
  ASSERT_TRUE(stub_->SetKey(sctx.get(), big, &set).ok());
  scheduler::v1::GetKeysRequest five;
  for (int i = 0; i < 5; ++i) five.add_reads()->set_key("g0-big");
  auto fctx = testing::ContextWithDeadline(30);
  grpc::Status f = stub_->GetKeys(fctx.get(), five, &values);
  EXPECT_EQ(f.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(f.error_message().find("the values asked come to 5242910 bytes"), std::string::npos)
      << f.error_message();
  for (scheduler::v1::KeyRead& r : *five.mutable_reads()) r.set_parts(16);
  auto pctx = testing::ContextWithDeadline(30);
  EXPECT_TRUE(stub_->GetKeys(pctx.get(), five, &values).ok());
}

// GetGeneration is a long poll: held while the caller's known generation
// is the current one, answered as soon as a recovery raises it, at once for
// a generation the caller is behind on (or an empty request, as old clients
// send), and with the same generation once the hold is over.
TEST_F(ServedScheduleTest, GenerationIsALongPoll) {
  using common::v1::ROLE_ENCODER_WORKER;
  using common::v1::ROLE_LLM_WORKER;
  // LLM rank 1's endpoint answers GetInfo: a process restarted there is
  // told from the holder by it.
  InstanceAnswer l1_info;
  Chassis l1(testing::LocalOptions("loom-llm-worker", ROLE_LLM_WORKER, 1));
  l1.AddService(&l1_info, worker::v1::LlmWorkerService::service_full_name());
  ASSERT_TRUE(l1.Start().ok());
  auto register_at = [&](common::v1::Role role, int rank, const std::string& ucx) {
    scheduler::v1::RegisterWorkerRequest r;
    r.mutable_worker()->set_role(role);
    r.mutable_worker()->set_rank(rank);
    r.mutable_worker()->set_ucx_address(ucx);
    r.mutable_worker()->set_endpoint(role == ROLE_LLM_WORKER && rank == 1
                                         ? absl::StrCat("127.0.0.1:", l1.grpc_port())
                                         : absl::StrCat("host", role, "-", rank, ":1"));
    r.set_incarnation(IncarnationOf(ucx));
    scheduler::v1::RegisterWorkerResponse response;
    auto ctx = testing::ContextWithDeadline();
    return stub_->RegisterWorker(ctx.get(), r, &response);
  };
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(register_at(ROLE_ENCODER_WORKER, r, "e" + std::to_string(r)).ok());
    ASSERT_TRUE(register_at(ROLE_LLM_WORKER, r, "l" + std::to_string(r)).ok());
  }
  ASSERT_EQ(service_->GetJob("t")->state(), control::v1::JOB_STATE_RUNNING);
  struct Answer {
    grpc::Status status;
    int64_t generation = -1;
    std::string data_key;
    absl::Duration took;
  };
  auto get = [&](int64_t known, int wait_ms) {
    scheduler::v1::GetGenerationRequest request;
    request.set_known_generation(known);
    request.set_wait_ms(wait_ms);
    scheduler::v1::GetGenerationResponse response;
    auto ctx = testing::ContextWithDeadline(30);
    const absl::Time t0 = absl::Now();
    Answer a;
    a.status = stub_->GetGeneration(ctx.get(), request, &response);
    a.took = absl::Now() - t0;
    a.generation = response.current().generation();
    a.data_key = response.current().data_key();
    return a;
  };
  {  // an empty request (an old client): at once
    scheduler::v1::GetGenerationResponse response;
    auto ctx = testing::ContextWithDeadline();
    ASSERT_TRUE(stub_->GetGeneration(ctx.get(), {}, &response).ok());
    EXPECT_EQ(response.current().generation(), 0);
    EXPECT_EQ(response.current().data_key().size(), 16u);
  }
  // Nothing changes: the same generation, after the hold.
  Answer same = get(0, 300);
  ASSERT_TRUE(same.status.ok()) << same.status.error_message();
  EXPECT_EQ(same.generation, 0);
  EXPECT_GE(same.took, absl::Milliseconds(250)) << "held for the wait asked";

  // A recovery (LLM rank 1 restarted in place) raises the generation while
  // a call is held for up to 5 s: it answers then, not after the hold.
  l1_info.Set(IncarnationInstance(IncarnationOf("l1-restarted")));
  std::thread restart([&] {
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_TRUE(register_at(ROLE_LLM_WORKER, 1, "l1-restarted").ok());
  });
  Answer raised = get(0, 5000);
  restart.join();
  ASSERT_TRUE(raised.status.ok()) << raised.status.error_message();
  EXPECT_EQ(raised.generation, 1);
  EXPECT_EQ(raised.data_key.size(), 16u);
  EXPECT_LT(raised.took, absl::Seconds(4)) << "answered when the generation rose";
  EXPECT_EQ(service_->GetJob("t")->generation(), 1);

  // A caller behind (it knows generation 0): at once, with the current one.
  Answer behind = get(0, 5000);
  ASSERT_TRUE(behind.status.ok());
  EXPECT_EQ(behind.generation, 1);
  EXPECT_EQ(behind.data_key, raised.data_key);
  EXPECT_LT(behind.took, absl::Seconds(4)) << "not held";
  Answer current = get(1, 300);
  ASSERT_TRUE(current.status.ok());
  EXPECT_EQ(current.generation, 1);
  EXPECT_GE(current.took, absl::Milliseconds(250));
}

TEST_F(ServedScheduleTest, AssignmentCoversTheBatchOnce) {
  for (int64_t it = 0; it < 3; ++it) {
    scheduler::v1::Assignment a, again;
    ASSERT_TRUE(Assignment(it, &a).ok());
    ASSERT_TRUE(Assignment(it, &again).ok());
    EXPECT_EQ(a.SerializeAsString(), again.SerializeAsString());
    EXPECT_EQ(a.iteration(), it);
    ASSERT_EQ(a.bins_size(), 4);
    // The keys of the preprocess service's batch, each exactly once.
    data::v1::GetBatchRequest br;
    br.set_iteration(it);
    data::v1::GetBatchResponse batch;
    auto ctx = testing::ContextWithDeadline();
    ASSERT_TRUE(data_stub_->GetBatch(ctx.get(), br, &batch).ok());
    std::multiset<std::string> expected, got;
    for (const auto& s : batch.samples()) expected.insert(s.record().key());
    for (const auto& b : a.bins()) {
      EXPECT_FALSE(b.samples().empty());
      ASSERT_EQ(b.samples_size(), b.indices_size());
      for (int k = 0; k < b.samples_size(); ++k) {
        got.insert(b.samples(k));
        EXPECT_EQ(batch.samples(b.indices(k)).record().key(), b.samples(k));
      }
    }
    EXPECT_EQ(got, expected);
    EXPECT_EQ(a.summary().algorithm(), "loom");
    EXPECT_GE(a.summary().llm().max_over_lower_bound(), 1.0 - testing::ClosedFormF64(1.0));
  }
  scheduler::v1::Assignment a;
  EXPECT_EQ(Assignment(-1, &a).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Assignment(6, &a).error_code(), grpc::StatusCode::OUT_OF_RANGE)
      << "more than the window (3) ahead of the newest (2): a stray request, refused";
  ASSERT_TRUE(Assignment(5, &a).ok());
  EXPECT_EQ(Assignment(0, &a).error_code(), grpc::StatusCode::OUT_OF_RANGE);  // window of 3
}

// With a profile's costs (loom-scheduler --profile) the same report refits
// nothing: the plan's coefficients stand.
class FixedCostsTest : public ServedScheduleTest {
 protected:
  void SetUp() override {
    fixed_costs_ = true;
    ServedScheduleTest::SetUp();
  }
};

TEST_F(FixedCostsTest, TimingReportsLeaveAProfilesCostsAsTheyAre) {
  RegisterAll();
  scheduler::v1::Assignment a;
  ASSERT_TRUE(Assignment(0, &a).ok());
  scheduler::v1::ReportTimingsRequest r = SlowLlmReport(a);
  // A forward share far from the prior's.
  r.set_forward_seconds(0.9 * (r.timings(0).seconds() + r.timings(1).seconds()));
  scheduler::v1::ReportTimingsResponse response;
  ASSERT_TRUE(Report(r, &response).ok());
  const scheduler::v1::CostCoefficients want =
      sched::CoefficientsOnOneGpu(*ModelConfigByName("tiny"), sched::ClusterSpec());
  EXPECT_EQ(response.costs().llm_per_token(), want.llm_per_token());
  EXPECT_EQ(response.costs().llm_per_sample(), want.llm_per_sample());
  EXPECT_EQ(response.costs().llm_forward_share(), want.llm_forward_share());
}

TEST_F(ServedScheduleTest, TimingReportsRefitTheCostModel) {
  RegisterAll();
  scheduler::v1::Assignment a;
  ASSERT_TRUE(Assignment(0, &a).ok());
  // The LLM really runs 10x slower than the FLOPs prior says.
  scheduler::v1::ReportTimingsRequest r = SlowLlmReport(a);
  scheduler::v1::ReportTimingsResponse response;
  ASSERT_TRUE(Report(r, &response).ok());
  // The refitted coefficients reproduce the measured times of those bins.
  data::v1::GetBatchRequest br;
  br.set_iteration(0);
  data::v1::GetBatchResponse batch;
  auto ctx = testing::ContextWithDeadline();
  ASSERT_TRUE(data_stub_->GetBatch(ctx.get(), br, &batch).ok());
  const scheduler::v1::CostCoefficients& c = response.costs();
  for (int j = 0; j < 2; ++j) {
    const scheduler::v1::Bin& bin = a.bins(2 + j);
    double predicted = 0;
    for (int i : bin.indices()) {
      const auto& rec = batch.samples(i).record();
      const double l = rec.image_tokens() + rec.text_tokens();
      predicted += c.llm_per_sample() + c.llm_per_token() * l + c.llm_per_token_sq() * l * l;
    }
    EXPECT_NEAR(predicted / (10 * bin.llm_cost()), 1.0, 0.01) << "microbatch " << j;
  }

  // Bad reports change nothing and say what is wrong.
  scheduler::v1::ReportTimingsRequest bad = r;
  bad.mutable_timings(1)->set_microbatch(2);
  EXPECT_EQ(Report(bad, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bad = r;
  bad.mutable_timings(0)->set_seconds(-1);
  EXPECT_EQ(Report(bad, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bad = r;
  bad.set_rank(2);
  EXPECT_EQ(Report(bad, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bad = r;
  bad.set_iteration(7);
  EXPECT_EQ(Report(bad, &response).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // An encoder rank may only report the bins it ran.
  bad = r;
  bad.set_role(common::v1::ROLE_ENCODER_WORKER);
  bad.clear_timings();
  auto* t = bad.add_timings();
  t->set_llm_rank(0);
  t->set_microbatch(0);
  t->set_seconds(0.1);
  bad.set_rank(1 - a.bins(0).encoder_rank());
  EXPECT_EQ(Report(bad, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bad.set_rank(a.bins(0).encoder_rank());
  EXPECT_TRUE(Report(bad, &response).ok());
  // Only from the process holding a rank of that replica.
  bad.set_incarnation(Holder(common::v1::ROLE_ENCODER_WORKER, 1 - a.bins(0).encoder_rank()));
  EXPECT_EQ(Report(bad, &response).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  bad.set_incarnation(NewIncarnation());
  EXPECT_EQ(Report(bad, &response).error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(ServedScheduleTest, JobEndProgressCheckpointsAndRendezvousKeys) {
  RegisterAll();
  scheduler::v1::Assignment a;
  std::string ended;
  ASSERT_TRUE(Assignment(8, &a, &ended).ok());  // steps: 8
  EXPECT_EQ(ended, "the job ends after 8 iterations");
  EXPECT_EQ(Assignment(9, &a, &ended).ok(), true);
  EXPECT_EQ(ended, "the job ends after 8 iterations") << "past the end: ended, however far";

  // As LLM rank 0, the reporter, unless `incarnation` is given.
  auto step = [&](int64_t iteration, double loss, const std::string& incarnation = "") {
    scheduler::v1::ReportStepRequest r;
    r.mutable_step()->set_iteration(iteration);
    r.mutable_step()->set_loss(loss);
    r.mutable_step()->set_tokens(1000 + iteration);
    r.set_incarnation(incarnation.empty() ? Holder(common::v1::ROLE_LLM_WORKER, 0) : incarnation);
    scheduler::v1::ReportStepResponse response;
    auto ctx = testing::ContextWithDeadline();
    return stub_->ReportStep(ctx.get(), r, &response).error_code();
  };
  // Steps come from LLM rank 0's process only.
  EXPECT_EQ(step(0, 2.5, Holder(common::v1::ROLE_LLM_WORKER, 1)),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(step(0, 2.5, NewIncarnation()), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(step(0, 2.5), grpc::StatusCode::OK);
  EXPECT_EQ(step(0, 2.5), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(step(1, std::nan("")), grpc::StatusCode::INVALID_ARGUMENT);
  auto progress = [&] {
    scheduler::v1::GetProgressRequest r;
    r.set_after_iteration(-1);
    scheduler::v1::GetProgressResponse response;
    auto ctx = testing::ContextWithDeadline();
    EXPECT_TRUE(stub_->GetProgress(ctx.get(), r, &response).ok());
    return response;
  };
  EXPECT_EQ(progress().steps_size(), 1);
  EXPECT_EQ(progress().end_iteration(), 8);
  EXPECT_EQ(progress().last_checkpoint(), -1);
  // Tokens seen count each step once; the ETA needs a pace (two steps).
  EXPECT_EQ(service_->GetJob("t")->tokens_seen(), 1000);
  EXPECT_EQ(service_->GetJob("t")->eta_seconds(), 0);
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(step(1, 2.4), grpc::StatusCode::OK);
  EXPECT_EQ(service_->GetJob("t")->tokens_seen(), 2001);
  const double eta = service_->GetJob("t")->eta_seconds();
  EXPECT_GE(eta, 6 * 0.1) << "6 iterations left at >= 0.1 s each";
  EXPECT_LT(eta, 6 * 30.0);

  // As the holder of (role, rank), unless `incarnation` is given.
  auto checkpoint = [&](common::v1::Role role, int rank, int64_t step_no, bool* complete,
                        const std::string& incarnation = "") {
    scheduler::v1::ReportCheckpointRequest r;
    r.set_role(role);
    r.set_rank(rank);
    r.set_step(step_no);
    r.set_incarnation(incarnation.empty() ? Holder(role, rank) : incarnation);
    scheduler::v1::ReportCheckpointResponse response;
    auto ctx = testing::ContextWithDeadline(30);
    grpc::Status s = stub_->ReportCheckpoint(ctx.get(), r, &response);
    *complete = response.complete();
    return s.error_code();
  };
  bool complete = false;
  EXPECT_EQ(checkpoint(common::v1::ROLE_LLM_WORKER, 0, 3, &complete),
            grpc::StatusCode::INVALID_ARGUMENT);  // not a multiple of every = 2
  EXPECT_EQ(checkpoint(common::v1::ROLE_SCHEDULER, 0, 2, &complete),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(checkpoint(common::v1::ROLE_LLM_WORKER, 5, 2, &complete),
            grpc::StatusCode::INVALID_ARGUMENT);
  // A part only from the process holding its rank: not from another rank's.
  EXPECT_EQ(checkpoint(common::v1::ROLE_LLM_WORKER, 1, 2, &complete,
                       Holder(common::v1::ROLE_LLM_WORKER, 0)),
            grpc::StatusCode::PERMISSION_DENIED);
  int reported = 0;
  for (auto role : {common::v1::ROLE_ENCODER_WORKER, common::v1::ROLE_LLM_WORKER}) {
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_EQ(checkpoint(role, rank, 2, &complete), grpc::StatusCode::OK);
      EXPECT_EQ(complete, ++reported == 4) << "complete only once every worker reported";
    }
  }
  // Completed on the scheduler's own thread, after the last call returned.
  for (absl::Time until = absl::Now() + absl::Seconds(30);
       progress().last_checkpoint() < 2 && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const std::string dir = testing::TempPath("ckpt/step-2/");
  for (const char* f : {"COMPLETE", kDataCursorFile, kSchedulerStateFile}) {
    EXPECT_TRUE(ReadFile(dir + f).ok()) << f;
  }
  EXPECT_EQ(progress().last_checkpoint(), 2);
  EXPECT_EQ(checkpoint(common::v1::ROLE_LLM_WORKER, 0, 2, &complete),
            grpc::StatusCode::ALREADY_EXISTS);

  auto get = [&](const std::string& key, std::string* value) {
    scheduler::v1::GetKeyRequest r;
    r.set_key(key);
    scheduler::v1::GetKeyResponse response;
    auto ctx = testing::ContextWithDeadline();
    grpc::StatusCode c = stub_->GetKey(ctx.get(), r, &response).error_code();
    *value = response.value();
    return c;
  };
  auto set = [&](const std::string& key, const std::string& value) {
    scheduler::v1::SetKeyRequest r;
    r.set_key(key);
    r.set_value(value);
    scheduler::v1::SetKeyResponse response;
    auto ctx = testing::ContextWithDeadline();
    return stub_->SetKey(ctx.get(), r, &response).error_code();
  };
  std::string v;
  EXPECT_EQ(get("llm/rank0", &v), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(set("llm/rank0", "addr"), grpc::StatusCode::OK);
  EXPECT_EQ(get("llm/rank0", &v), grpc::StatusCode::OK);
  EXPECT_EQ(v, "addr");
  EXPECT_EQ(set("", "x"), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(set("big", std::string(2 << 20, 'x')), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(get("llm/rank0", &v), grpc::StatusCode::OK);  // nothing accepted was lost

  // Keys deleted once their group is connected: the store forgets them.
  auto remove = [&](const std::vector<std::string>& keys) {
    scheduler::v1::DeleteKeysRequest r;
    for (const std::string& k : keys) r.add_keys(k);
    scheduler::v1::DeleteKeysResponse response;
    auto ctx = testing::ContextWithDeadline();
    return stub_->DeleteKeys(ctx.get(), r, &response).error_code();
  };
  EXPECT_EQ(set("llm/rank1", "addr1"), grpc::StatusCode::OK);
  EXPECT_EQ(service_->StoreSize().first, 2u);
  EXPECT_EQ(remove({"llm/rank0", "never/set"}), grpc::StatusCode::OK);
  EXPECT_EQ(get("llm/rank0", &v), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(get("llm/rank1", &v), grpc::StatusCode::OK);
  EXPECT_EQ(service_->StoreSize(), std::make_pair(size_t{1}, std::string("llm/rank1addr1").size()));
  EXPECT_EQ(remove(std::vector<std::string>(4097, "k")), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(remove({"llm/rank1"}), grpc::StatusCode::OK);
  EXPECT_EQ(service_->StoreSize(), std::make_pair(size_t{0}, size_t{0}));
}

// A checkpoint's parts may be reported long after its step was marked (a
// large model, slow shared storage): the step's data cursor was kept at the
// mark, so step 10 completes with batch 10's cursor though loom-preprocess's
// 16-batch window left batch 10 behind 20 iterations ago.
class EpochsTest : public ServedScheduleTest {
 protected:
  void SetUp() override {
    epochs_ = 2.5;
    ServedScheduleTest::SetUp();
  }
};

// 2.5 epochs of loom-preprocess's 32 samples in batches of 8: 10 steps, for
// the job's end, its progress and the workers' learning-rate schedule.
TEST_F(EpochsTest, EpochsBecomeStepsFromTheDatasetSize) {
  absl::StatusOr<control::v1::Job> job = service_->GetJob("t");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->end_iteration(), 10);
  EXPECT_EQ(job->config().train().steps(), 10);
  EXPECT_EQ(job->config().train().epochs(), 2.5);
  scheduler::v1::RegisterWorkerRequest r;
  r.mutable_worker()->set_role(common::v1::ROLE_LLM_WORKER);
  r.mutable_worker()->set_rank(0);
  r.mutable_worker()->set_ucx_address("l0");
  r.set_incarnation(IncarnationOf("l0"));
  scheduler::v1::RegisterWorkerResponse registered;
  auto ctx = testing::ContextWithDeadline();
  ASSERT_TRUE(stub_->RegisterWorker(ctx.get(), r, &registered).ok());
  EXPECT_EQ(registered.job().train().steps(), 10);
  holders_[{common::v1::ROLE_LLM_WORKER, 0}] = r.incarnation();
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(Register(common::v1::ROLE_ENCODER_WORKER, rank, "e" + std::to_string(rank)).ok());
  }
  ASSERT_TRUE(Register(common::v1::ROLE_LLM_WORKER, 1, "l1").ok());
  scheduler::v1::Assignment a;
  std::string ended;
  ASSERT_TRUE(Assignment(0, &a, &ended).ok());
  EXPECT_EQ(ended, "");
  ASSERT_TRUE(Assignment(10, &a, &ended).ok());
  EXPECT_EQ(ended, "the job ends after 10 iterations");
}

TEST(SchedulerServiceImplTest, EpochsNeedLoomPreprocess) {
  Chassis chassis(testing::LocalOptions("loom-scheduler", common::v1::ROLE_SCHEDULER));
  SchedulerServiceOptions so;
  so.plan = sched::PlanOfDegrees({/*llm_dp=*/1, /*microbatches=*/1, /*encoder_dp=*/1});
  so.job.set_name("t");
  so.job.mutable_data()->set_global_batch(8);
  so.job.mutable_train()->set_epochs(1);
  absl::StatusOr<std::unique_ptr<SchedulerServiceImpl>> service =
      SchedulerServiceImpl::Create(&chassis, so);
  EXPECT_EQ(service.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(service.status().message().find("train.epochs"), std::string::npos) << service.status();
}

class LateCheckpointTest : public ServedScheduleTest {
 protected:
  LateCheckpointTest() {
    steps_ = 40;
    every_ = 10;
  }
};

TEST_F(LateCheckpointTest, PartsReportedAfterTheBatchLeftTheWindowComplete) {
  RegisterAll();
  data::v1::DataCursor want;
  {
    data::v1::GetCursorRequest r;
    r.set_iteration(10);
    data::v1::GetCursorResponse response;
    auto ctx = testing::ContextWithDeadline(30);
    ASSERT_TRUE(data_stub_->GetCursor(ctx.get(), r, &response).ok());
    want = response.cursor();
  }
  scheduler::v1::Assignment a;
  for (int64_t it = 0; it <= 30; ++it) {
    ASSERT_TRUE(Assignment(it, &a).ok()) << it;
    EXPECT_EQ(a.checkpoint(), it == 9 || it == 19 || it == 29) << it;
  }
  {
    data::v1::GetCursorRequest r;
    r.set_iteration(10);
    data::v1::GetCursorResponse response;
    auto ctx = testing::ContextWithDeadline(30);
    ASSERT_EQ(data_stub_->GetCursor(ctx.get(), r, &response).error_code(),
              grpc::StatusCode::OUT_OF_RANGE)
        << "batch 10 must have left loom-preprocess's window for this test to mean anything";
  }
  for (auto role : {common::v1::ROLE_ENCODER_WORKER, common::v1::ROLE_LLM_WORKER}) {
    for (int rank = 0; rank < 2; ++rank) {
      scheduler::v1::ReportCheckpointRequest r;
      r.set_role(role);
      r.set_rank(rank);
      r.set_step(10);
      r.set_incarnation(Holder(role, rank));
      scheduler::v1::ReportCheckpointResponse response;
      auto ctx = testing::ContextWithDeadline(30);
      ASSERT_TRUE(stub_->ReportCheckpoint(ctx.get(), r, &response).ok());
    }
  }
  const std::string file = testing::TempPath("ckpt/step-10/") + kDataCursorFile;
  for (absl::Time until = absl::Now() + absl::Seconds(30);
       !ReadFile(file).ok() && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  absl::StatusOr<std::string> bytes = ReadFile(file);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  data::v1::DataCursor got;
  ASSERT_TRUE(got.ParseFromString(*bytes));
  EXPECT_EQ(got.SerializeAsString(), want.SerializeAsString());
  EXPECT_TRUE(ReadFile(testing::TempPath("ckpt/step-10/COMPLETE")).ok());
  control::v1::Job job = *service_->GetJob("t");
  EXPECT_NE(job.state(), control::v1::JOB_STATE_FAILED) << job.message();
}

// A scheduler taking its job back starts from the seed only when there is
// no checkpoint of the job's run yet; a checkpoint folder that cannot be
// read fails the take-back, naming the cause, instead of orphaning it.
TEST(OptionsForJobTest, OnlyNoCheckpointYetLetsATakeBackStartAfresh) {
  SchedulerDeployment deployment;
  deployment.run_dir = testing::TempPath("takeback-run");
  control::v1::JobSpec spec;
  spec.mutable_config()->set_name("t");
  spec.mutable_config()->set_model("tiny");
  spec.mutable_config()->mutable_checkpoint()->set_dir(testing::TempPath("takeback-none"));
  spec.set_resume(true);
  absl::StatusOr<SchedulerServiceOptions> none = OptionsForJob(spec, deployment);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition) << none.status();
  EXPECT_TRUE(IsNoCheckpointYet(none.status())) << none.status();

  const std::string unreadable = testing::TempPath("takeback-unreadable");
  ASSERT_TRUE(MakeDirectories(unreadable + "/RUN").ok());  // read(2): EISDIR
  spec.mutable_config()->mutable_checkpoint()->set_dir(unreadable);
  absl::StatusOr<SchedulerServiceOptions> bad = OptionsForJob(spec, deployment);
  ASSERT_FALSE(bad.ok());
  EXPECT_FALSE(IsNoCheckpointYet(bad.status())) << bad.status();
  EXPECT_NE(bad.status().message().find("RUN"), std::string::npos) << bad.status();
}

// loom-scheduler --profile: the job's plan is priced by the profile (a
// module at a TP it did not measure scaled by the planner's TP model) and
// its costs fixed; a file that is not a profile is named.
TEST(OptionsForJobTest, AProfilePricesTheJobAndFixesItsCosts) {
  SchedulerDeployment deployment;
  deployment.run_dir = testing::TempPath("profile-run");
  deployment.profile_file = testing::TempPath("profile.json");
  ASSERT_TRUE(WriteFileAtomically(deployment.profile_file,
                                  "{\"model\":\"tiny\",\"tp\":1,\"encoder_per_tile\":0.002,"
                                  "\"llm_per_token\":0.0001,\"llm_forward_share\":0.3}")
                  .ok());
  control::v1::JobSpec spec;
  spec.mutable_config()->set_name("t");
  spec.mutable_config()->set_model("tiny");
  spec.mutable_config()->mutable_parallel()->set_llm_tp(2);
  spec.mutable_config()->mutable_checkpoint()->set_dir(testing::TempPath("profile-ckpt"));
  absl::StatusOr<SchedulerServiceOptions> o = OptionsForJob(spec, deployment);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->fixed_costs);
  EXPECT_EQ(o->plan.costs().encoder_per_tile(), 0.002);
  EXPECT_DOUBLE_EQ(o->plan.costs().llm_per_token(), 0.0001 / (2 * sched::TpEfficiency(2)));
  EXPECT_EQ(o->plan.costs().llm_forward_share(), 0.3);

  ASSERT_TRUE(WriteFileAtomically(deployment.profile_file, "{\"tiles\":1}").ok());
  absl::StatusOr<SchedulerServiceOptions> bad = OptionsForJob(spec, deployment);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("profile.json: not a profile"), std::string::npos)
      << bad.status();
}

// SubmitJob's check: a job that does not fit its devices is refused as
// RESOURCE_EXHAUSTED (CheckJobMemory), naming the stage; a bad field stays
// INVALID_ARGUMENT.
TEST(OptionsForJobTest, AJobThatDoesNotFitIsRefusedAsResourceExhausted) {
  SchedulerDeployment deployment;
  deployment.run_dir = testing::TempPath("memory-run");
  control::v1::JobSpec spec;
  job::v1::JobConfig* job = spec.mutable_config();
  job->set_name("m");
  job->set_model("tiny");
  job->mutable_device()->set_memory_gib(0.001);  // 1 MiB: not even tiny's LLM
  job->mutable_parallel()->set_llm_max_tokens(512);
  job->mutable_parallel()->set_encoder_max_tokens(256);
  absl::StatusOr<SchedulerServiceOptions> refused = OptionsForJob(spec, deployment);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(refused.status().message().find("job.config.device.memory_gib: the "),
            std::string::npos)
      << refused.status();
  job->mutable_device()->set_memory_gib(1);
  EXPECT_TRUE(OptionsForJob(spec, deployment).ok());
  job->mutable_device()->set_memory_gib(-1);
  EXPECT_EQ(OptionsForJob(spec, deployment).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom
