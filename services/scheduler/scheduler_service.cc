#include "services/scheduler/scheduler_service.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <tuple>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "loom/worker/v1/worker.grpc.pb.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "runtime/base/file.h"
#include "runtime/base/log.h"
#include "runtime/checkpoint/steps.h"
#include "runtime/data/loader.h"
#include "runtime/model/config.h"
#include "runtime/scheduling/schedule.h"
#include "services/common/channel.h"
#include "services/common/grpc_status.h"
#include "services/common/incarnation.h"
#include "services/common/job.h"
#include "services/scheduler/job_state.h"

namespace loom {
namespace {

using common::v1::Role;

int RanksOf(const scheduler::v1::Plan& plan, Role role) {
  switch (role) {
    case common::v1::ROLE_ENCODER_WORKER:
      return plan.encoder().gpus();
    case common::v1::ROLE_LLM_WORKER:
      return plan.llm().gpus();
    case common::v1::ROLE_GENERATOR_WORKER:
      return plan.generator().gpus();
    default:
      return 0;
  }
}

bool IsWorkerRole(Role role) {
  return role == common::v1::ROLE_ENCODER_WORKER || role == common::v1::ROLE_LLM_WORKER ||
         role == common::v1::ROLE_GENERATOR_WORKER;
}

constexpr size_t kMaxKeyBytes = 1024;
constexpr size_t kMaxValueBytes = 1 << 20;

// The rendezvous store's capacity: what the plan's groups hold in it at once
// (Gloo's full mesh: per rank, for each of its TP, PP and DP groups, a key
// with an address for every peer, 136 bytes each measured; 256 allowed for
// the keys, host keys and the bridge), and never less than 64 MiB. 4,096
// ranks of a TP 8 x PP 4 x DP 96 LLM and a TP 2 x PP 2 x DP 256 encoder
// need about 75 MiB.
size_t StoreCapacity(const scheduler::v1::Plan& plan) {
  constexpr size_t kMinStoreBytes = 64 << 20;
  constexpr size_t kPerPeer = 256;
  size_t need = 0;
  for (const scheduler::v1::ModulePlan* m : {&plan.encoder(), &plan.llm(), &plan.generator()}) {
    need += static_cast<size_t>(std::max(0, m->gpus())) *
            static_cast<size_t>(std::max(0, m->tp() + m->pp() + m->dp())) * kPerPeer;
  }
  return std::max(kMinStoreBytes, need);
}
constexpr int kMaxDeleteKeys = 4096;
constexpr size_t kRetainedSteps = 100000;

}  // namespace

SchedulerServiceImpl::SchedulerServiceImpl(Chassis* chassis) : chassis_(chassis) {
  prometheus::Registry& registry = chassis->registry();
  auto counter = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
  };
  auto gauge = [&](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
  };
  auto& limited = prometheus::BuildCounter()
                      .Name("loom_scheduler_rate_limited_total")
                      .Help("Calls refused by a rate limit (RESOURCE_EXHAUSTED; clients retry).")
                      .Register(registry);
  register_limited_ = &limited.Add({{"rpc", "RegisterWorker"}});
  key_limited_ = &limited.Add({{"rpc", "SetKey"}});
  assignments_ = counter("loom_scheduler_assignments_total", "Iteration assignments computed.");
  reports_ =
      counter("loom_scheduler_timing_reports_total", "Microbatch timings received from workers.");
  registered_ = gauge("loom_scheduler_workers_registered", "Workers registered with the job.");
  llm_imbalance_ = gauge("loom_scheduler_llm_microbatch_imbalance_ratio",
                         "Newest assignment: the LLM's max bin cost over its lower bound.");
  encoder_imbalance_ = gauge("loom_scheduler_encoder_microbatch_imbalance_ratio",
                             "Newest assignment: the encoder's max bin cost over its lower bound.");
  checkpoints_ = counter("loom_checkpoints_completed_total", "Coordinated checkpoints completed.");
  checkpoint_seconds_ = &prometheus::BuildHistogram()
                             .Name("loom_checkpoint_duration_seconds")
                             .Help("Coordinated checkpoint: first worker's report to COMPLETE.")
                             .Register(registry)
                             .Add({}, prometheus::Histogram::BucketBoundaries{
                                          0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300});
  get_assignment_seconds_ =
      &prometheus::BuildHistogram()
           .Name("loom_scheduler_get_assignment_seconds")
           .Help(
               "GetAssignment answered, from its handler's start (a call held while the job "
               "is paused or its iteration is being computed included).")
           .Register(registry)
           .Add({}, prometheus::Histogram::BucketBoundaries{0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                                            0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                            0.5, 1, 5, 30});
  iterations_ = counter("loom_train_iterations_total", "Training iterations finished.");
  samples_ = counter("loom_train_samples_total", "Samples trained on.");
  tokens_ = counter("loom_train_tokens_total", "Packed LLM tokens (text and image) trained on.");
  loss_ = gauge("loom_train_loss", "Newest iteration's mean loss per loss token.");
  validation_loss_ =
      gauge("loom_validation_loss", "Newest held-out loss (data.validation) per loss token.");
  generation_loss_ = gauge("loom_train_generation_loss",
                           "Newest iteration's generation loss per output image (a model with a "
                           "generator; 0 otherwise).");
  skipped_steps_ = counter("loom_train_skipped_steps_total",
                           "Steps skipped for a non-finite loss or gradient norm (no optimizer "
                           "step); past train.max_skipped_steps the job fails.");
  mfu_ = gauge("loom_train_mfu_ratio",
               "Newest iteration's model FLOPs per second over the workers' peak (0-1).");
  iteration_seconds_ = &prometheus::BuildHistogram()
                            .Name("loom_train_iteration_seconds")
                            .Help("Wall time of one training iteration (LLM rank 0).")
                            .Register(registry)
                            .Add({}, prometheus::Histogram::BucketBoundaries{
                                         0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30});
  restarts_ = counter("loom_job_restarts_total",
                      "Restarts of the job after a lost process (JobSpec.restarts).");
  lost_ = counter("loom_processes_lost_total",
                  "Processes this scheduler declared lost (lease expired): the job turned "
                  "RECOVERING.");
  auto& recovery = prometheus::BuildHistogram()
                       .Name("loom_recovery_seconds")
                       .Help(
                           "The recovery from a lost process, by part: detection (last sign "
                           "of life to declared lost), regroup (to every worker registered "
                           "again), reload (to the first iteration finished).")
                       .Register(registry);
  const prometheus::Histogram::BucketBoundaries seconds = {0.1, 0.25, 0.5, 1,  2.5, 5,
                                                           10,  20,   30,  60, 120, 300};
  for (const char* part : {"detection", "regroup", "reload"}) {
    recovery_seconds_[part] = &recovery.Add({{"part", part}}, seconds);
  }
  lease_round_seconds_ =
      &prometheus::BuildHistogram()
           .Name("loom_scheduler_lease_round_seconds")
           .Help("One round of the lease thread: every holder's health asked and answered.")
           .Register(registry)
           .Add({}, prometheus::Histogram::BucketBoundaries{0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                            0.5, 1, 2.5, 5, 10, 20, 30, 60, 120});
  effective_ = gauge("loom_job_effective_training_ratio",
                     "Wall time of the iterations the job kept over the time it has run, "
                     "recoveries included (0-1).");
}

SchedulerServiceImpl::~SchedulerServiceImpl() {
  {
    absl::MutexLock lock(&published_mu_);
    published_closing_ = true;
    published_changed_.SignalAll();
  }
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    if (batch_call_ != nullptr) batch_call_->TryCancel();
    changed_.SignalAll();
  }
  if (poll_timer_.joinable()) poll_timer_.join();  // it answers every held poll first
  if (assigner_.joinable()) assigner_.join();
  if (leases_.joinable()) leases_.join();
  if (checkpointer_.joinable()) checkpointer_.join();
}

absl::StatusOr<std::unique_ptr<SchedulerServiceImpl>> SchedulerServiceImpl::Create(
    Chassis* chassis, const SchedulerServiceOptions& options) {
  auto service = std::make_unique<SchedulerServiceImpl>(chassis);
  if (absl::Status s = service->Configure(options); !s.ok()) return s;
  return service;
}

absl::Status SchedulerServiceImpl::Configure(const SchedulerServiceOptions& options) {
  absl::MutexLock configure(&configure_mu_);
  if (configured_.load()) {
    const std::string& held = options_.job.name();
    if (held == options.job.name()) {
      return absl::AlreadyExistsError(
          absl::StrCat("job.config.name: this scheduler already holds job \"", held, "\""));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("this scheduler holds job \"", held,
                     "\"; it runs one job (its deployment's workers train it)"));
  }
  const auto& names = sched::AlgorithmNames();
  if (std::find(names.begin(), names.end(), options.algorithm) == names.end()) {
    return absl::InvalidArgumentError(absl::StrCat("algorithm: unknown \"", options.algorithm,
                                                   "\"; known: ", absl::StrJoin(names, ", ")));
  }
  const scheduler::v1::Plan& p = options.plan;
  for (const auto* m : {&p.encoder(), &p.llm()}) {
    if (m->dp() < 1 || m->tp() < 1 || m->pp() < 1 || m->gpus() != m->dp() * m->tp() * m->pp()) {
      return absl::InvalidArgumentError(
          "plan: encoder and llm need dp, tp, pp >= 1 and gpus = dp * tp * pp");
    }
  }
  if (const scheduler::v1::ModulePlan& g = p.generator();
      p.has_generator() &&
      (g.dp() < 1 || g.tp() < 1 || g.pp() < 1 || g.gpus() != g.dp() * g.tp() * g.pp())) {
    return absl::InvalidArgumentError(
        "plan: the generator needs dp, tp, pp >= 1 and gpus = dp * tp * pp");
  }
  if (p.microbatches() < 1) return absl::InvalidArgumentError("plan: microbatches must be >= 1");
  // The job's model (a named config or Hugging Face directories), else the plan's.
  const bool job_model = !options.job.model().empty() || JobModelSource(options.job).pretrained();
  absl::StatusOr<ModelConfig> model = ModelConfigByName(p.model().empty() ? "tiny" : p.model());
  if (job_model) {
    absl::StatusOr<hf::PretrainedModel> m = JobModel(options.job);
    if (!m.ok()) return m.status();
    model = m->config;
    if (absl::Status s = ValidateModelParallel(*model, p.encoder().tp(), p.encoder().pp(),
                                               p.llm().tp(), p.llm().pp());
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("plan: ", s.message()));
    }
  }
  if (model.ok() && p.has_generator() &&
      p.generator().pp() > std::max(1, model->generator.denoiser.layers)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan: generator pp ", p.generator().pp(), " over the ", model->generator.denoiser.layers,
        " blocks of model ", model->name, "'s denoiser"));
  }
  if (model.ok() && model->has_generator() != p.has_generator()) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: model ", model->name,
                     model->has_generator() ? " has a generator and the plan gives it no ranks"
                                            : " has no generator and the plan gives one ranks"));
  }
  if (options.retained_iterations < 1) {
    return absl::InvalidArgumentError("retained_iterations must be at least 1");
  }
  if (options.assign_ahead < 0 || options.assign_ahead >= options.retained_iterations) {
    return absl::InvalidArgumentError(absl::StrCat("assign_ahead: ", options.assign_ahead,
                                                   " is outside 0 to retained_iterations - 1 (",
                                                   options.retained_iterations - 1, ")"));
  }
  if (options.start_iteration < 0) {
    return absl::InvalidArgumentError("start_iteration must be >= 0");
  }
  // Stage shares start from the layer split the workers use (and restart
  // when a job resumes under another pipeline depth).
  if (model.ok() && ValidateModelParallel(*model, 1, p.encoder().pp(), 1, p.llm().pp()).ok()) {
    stage_model_ = *model;
  }
  if (model.ok()) patches_per_tile_ = model->vit.patches_per_tile();
  absl::StatusOr<scheduler::v1::CostCoefficients> costs =
      StartingCosts(p, options.job.checkpoint().dir(), options.start_iteration);
  if (!costs.ok()) return costs.status();
  SchedulerServiceOptions accepted = options;
  if (options.job.train().has_epochs()) {
    absl::StatusOr<int64_t> steps = StepsOfEpochs(options);
    if (!steps.ok()) return steps.status();
    accepted.job.mutable_train()->set_steps(*steps);
  }
  if (options.start_iteration == 0) {  // a fresh run: the checkpoint folder is now its
    absl::StatusOr<CheckpointRun> run =
        StartCheckpointRun(options.job.checkpoint().dir(), JobCheckpointIdentity(options.job));
    if (!run.ok()) return run.status();
    accepted.run = *run;
  }
  if (model.ok()) {
    flops_ = sched::AnalyticFlops(*model, /*recompute=*/false, JobFrozen(options.job));
  }
  // Colocated encoder ranks run on the LLM's GPUs.
  peak_flops_ = options.peak_flops > 0
                    ? options.peak_flops
                    : p.gpu_peak_flops() * ((p.colocated() ? 0 : p.encoder().gpus()) +
                                            p.llm().gpus() + p.generator().gpus());
  options_ = accepted;
  if (!options.preprocess.empty()) {
    preprocess_ = data::v1::PreprocessService::NewStub(ServiceChannel(options.preprocess));
  }
  {
    absl::MutexLock lock(&mu_);
    costs_ = std::make_unique<sched::CostModel>(*costs);
    start_iteration_ = options.start_iteration;
    generation_ = options.generation;
    PublishRegroupLocked();
    if (options.generation > 0) rewind_to_ = options.start_iteration;  // a job taken back
    reload_pending_ = options.recovered_from.declared_seconds() > 0;
    if (options.start_iteration > 0) last_checkpoint_ = options.start_iteration;
    ContinueClockLocked();
    KeepJobLocked();
    submit_time_ = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
    SetStateLocked(control::v1::JOB_STATE_PENDING);
    // A restart past the job's cap (a scheduler taking its job back once too
    // often) ends it, naming the loss it would recover from.
    if (const int cap = options.job.recovery().max_restarts(); cap > 0 && options.restarts > cap) {
      job_message_ = absl::StrCat(DescribeLoss(options.recovered_from),
                                  "; no restart left (recovery.max_restarts ", cap, ")");
      stop_at_ = options.start_iteration;
      SetStateLocked(control::v1::JOB_STATE_FAILED);
    }
  }
  // A whole job's ranks registering twice at once, or writing 16 keys each,
  // pass without waiting; a sustained flood is held to about one
  // registration per rank and 8 key writes per rank each second.
  const double ranks = sched::PlanWorkerRanks(p);
  register_limit_.Reset(std::max(64.0, 2 * ranks), std::max(20.0, ranks));
  key_limit_.Reset(std::max(256.0, 16 * ranks), std::max(100.0, 8 * ranks));
  if (!options.metrics_dir.empty()) {
    // A new job starts the log afresh; a resumed or taken-back one goes on.
    const bool fresh = options.start_iteration == 0 && options.restarts == 0;
    absl::StatusOr<std::unique_ptr<StepLog>> log =
        StepLog::Open(options.metrics_dir,
                      absl::StrCat(options.job.name().empty() ? "job" : options.job.name(), "-",
                                   options.run.id.empty() ? "run" : options.run.id),
                      fresh);
    if (log.ok()) {
      step_log_ = std::move(*log);
    } else {  // the job trains on; its metrics still go to Prometheus
      LOOM_LOG(WARNING).With("error", std::string(log.status().message()))
          << "no metrics.jsonl or TensorBoard events for this job";
    }
  }
  configured_.store(true);  // options_ is immutable from here on
  restarts_->Increment(options.restarts);
  const control::v1::Recovery& r = options.recovered_from;
  if (r.declared_seconds() > 0 && r.last_seen_seconds() > 0) {
    ObserveRecovery("detection", absl::UnixEpoch() + absl::Seconds(r.last_seen_seconds()),
                    absl::UnixEpoch() + absl::Seconds(r.declared_seconds()));
  }
  if (options.job.recovery().lease_seconds() > 0) leases_ = std::thread([this] { WatchLeases(); });
  if (preprocess_) assigner_ = std::thread([this] { AssignThread(); });
  return absl::OkStatus();
}

absl::StatusOr<int64_t> SchedulerServiceImpl::StepsOfEpochs(
    const SchedulerServiceOptions& options) {
  const double epochs = options.job.train().epochs();
  if (options.preprocess.empty()) {
    return absl::FailedPreconditionError(
        "train.epochs: the steps come from loom-preprocess's dataset size, and this scheduler "
        "has no --preprocess");
  }
  // loom-preprocess indexes its shards before it serves: wait for it.
  std::unique_ptr<data::v1::PreprocessService::Stub> stub =
      data::v1::PreprocessService::NewStub(ServiceChannel(options.preprocess));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(5)));
  ctx.set_wait_for_ready(true);
  data::v1::GetInfoResponse info;
  if (grpc::Status s = stub->GetInfo(&ctx, data::v1::GetInfoRequest(), &info); !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("train.epochs: loom-preprocess at ", options.preprocess,
                     " did not say its dataset size: ", s.error_message()));
  }
  absl::StatusOr<int64_t> steps =
      data::StepsForEpochs(epochs, info.dataset_samples(), options.job.data().global_batch());
  if (!steps.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("train.epochs: ", steps.status().message()));
  }
  LOOM_LOG(INFO)
          .With("epochs", epochs)
          .With("dataset_samples", info.dataset_samples())
          .With("global_batch", options.job.data().global_batch())
          .With("steps", *steps)
      << "train.epochs resolved to steps";
  return steps;
}

absl::StatusOr<scheduler::v1::CostCoefficients> SchedulerServiceImpl::StartingCosts(
    const scheduler::v1::Plan& plan, const std::string& checkpoint_dir, int64_t step) const {
  scheduler::v1::CostCoefficients costs = plan.costs();
  if (step > 0) {
    // The resumed job continues with the cost model it had.
    const std::string path = absl::StrCat(StepDir(checkpoint_dir, step), "/", kSchedulerStateFile);
    absl::StatusOr<std::string> bytes = ReadFile(path);
    if (!bytes.ok() || !costs.ParseFromString(*bytes)) {
      return absl::DataLossError(absl::StrCat("resume: cannot read the scheduler state ", path));
    }
  }
  if (stage_model_) {
    sched::SetStageShares(*stage_model_, plan.encoder().pp(), plan.llm().pp(), &costs);
  }
  return costs;
}

std::string SchedulerJobFile(const std::string& run_dir) {
  return run_dir + "/scheduler_job.binpb";
}

void SchedulerServiceImpl::KeepJobLocked() const {
  if (options_.state_file.empty()) return;
  control::v1::JobSpec spec = options_.spec;
  spec.set_generation(generation_);
  spec.set_restarts(RestartsLocked());
  *spec.mutable_training_time() = clock_.Read(absl::Now());
  if (absl::Status s = WriteFileAtomically(options_.state_file, spec.SerializeAsString());
      !s.ok()) {
    LOOM_LOG(WARNING).With("error", std::string(s.message())) << "cannot keep the job";
  }
}

absl::Status SchedulerServiceImpl::Configured() const {
  if (!configured_.load()) {
    return absl::FailedPreconditionError("this scheduler has no job yet (SubmitJob)");
  }
  return absl::OkStatus();
}

grpc::Status SchedulerServiceImpl::GetInfo(grpc::ServerContext*,
                                           const scheduler::v1::GetInfoRequest*,
                                           scheduler::v1::GetInfoResponse* response) {
  chassis_->FillServiceInfo(response->mutable_info());
  return grpc::Status::OK;
}

grpc::Status SchedulerServiceImpl::RegisterWorker(
    grpc::ServerContext*, const scheduler::v1::RegisterWorkerRequest* request,
    scheduler::v1::RegisterWorkerResponse* response) {
  if (!configured_.load()) {  // workers start before the job is submitted: they retry
    return ToGrpcStatus(absl::UnavailableError("no job submitted yet"));
  }
  if (!register_limit_.TryAcquire()) {
    register_limited_->Increment();
    return ToGrpcStatus(absl::ResourceExhaustedError(
        absl::StrCat("RegisterWorker: over the rate limit (", register_limit_.per_second(),
                     " per s, bursts of ", register_limit_.burst(), "); retry")));
  }
  const scheduler::v1::Worker& w = request->worker();
  if (!IsWorkerRole(w.role())) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "worker.role: must be ROLE_ENCODER_WORKER, ROLE_LLM_WORKER or ROLE_GENERATOR_WORKER"));
  }
  const int ranks = RanksOf(options_.plan, w.role());
  if (w.rank() < 0 || w.rank() >= ranks) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("worker.rank: ", w.rank(), " is outside the plan's ", ranks, " ranks of ",
                     common::v1::Role_Name(w.role()))));
  }
  if (w.ucx_address().empty()) {
    return ToGrpcStatus(absl::InvalidArgumentError("worker.ucx_address: empty"));
  }
  const std::string& incarnation = request->incarnation();
  if (incarnation.size() != kIncarnationBytes) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("incarnation: ", incarnation.size(), " bytes; a worker sends the ",
                     kIncarnationBytes, " random bytes it drew at start")));
  }
  const std::pair<int, int> key(w.role(), w.rank());
  absl::MutexLock lock(&mu_);
  if (lost_incarnations_.count(incarnation) > 0) {
    return ToGrpcStatus(absl::FailedPreconditionError(
        absl::StrCat("this process was declared lost as ", common::v1::Role_Name(w.role()),
                     " rank ", w.rank(), "; a new process takes the rank (exit)")));
  }
  // ALREADY_EXISTS, with why the holder keeps the rank (`detail`).
  auto taken = [&](absl::string_view detail) {
    return ToGrpcStatus(
        absl::AlreadyExistsError(absl::StrCat(common::v1::Role_Name(w.role()), " rank ", w.rank(),
                                              " is registered by another process", detail)));
  };
  auto held = incarnations_.find(key);
  if (held != incarnations_.end() && held->second != incarnation) {
    const std::string holder_incarnation = held->second;
    if (w.endpoint().empty() || workers_.at(key).endpoint() != w.endpoint() ||
        (state_ != control::v1::JOB_STATE_RUNNING && state_ != control::v1::JOB_STATE_PAUSED)) {
      return taken("");
    }
    // From the holder's own endpoint: a container restarted in its pod, or
    // a caller naming the holder's endpoint. Whoever answers there decides.
    mu_.Unlock();  // no RPC under mu_
    absl::StatusOr<std::string> instance = AskInstance(w.role(), w.endpoint());
    mu_.Lock();
    held = incarnations_.find(key);
    const bool still =
        held != incarnations_.end() && held->second == holder_incarnation &&
        (state_ == control::v1::JOB_STATE_RUNNING || state_ == control::v1::JOB_STATE_PAUSED);
    if (!instance.ok()) {
      return taken(absl::StrCat(" (its endpoint: ", instance.status().message(), ")"));
    }
    if (!still) return taken("");
    if (*instance == IncarnationInstance(holder_incarnation)) {
      return taken(", which still answers at its endpoint");
    }
    // Another process answers at the holder's endpoint: the holder is gone.
    // Declared lost now, it frees the rank.
    DeclareLostLocked(w.role(), w.rank(), w.endpoint(),
                      "restarted: a new process registered from its endpoint", absl::Now());
    if (incarnations_.count(key) > 0) return taken("");  // not freed (the job was not running)
  }
  workers_[key] = w;  // the holder's retry may bring new addresses
  incarnations_[key] = incarnation;
  registered_->Set(static_cast<double>(workers_.size()));
  if (state_ == control::v1::JOB_STATE_PENDING &&
      static_cast<int>(workers_.size()) == sched::PlanWorkerRanks(options_.plan)) {
    running_since_ = absl::Now();
    if (const control::v1::Recovery& r = options_.recovered_from; r.declared_seconds() > 0) {
      ObserveRecovery("regroup", absl::UnixEpoch() + absl::Seconds(r.declared_seconds()),
                      running_since_);
    }
    SetStateLocked(control::v1::JOB_STATE_RUNNING);
  }
  MaybeEndRegroupLocked();
  *response->mutable_plan() = options_.plan;
  *response->mutable_job() = options_.job;
  const scheduler::v1::Regroup g = RegroupLocked();
  response->set_start_iteration(g.start_iteration());
  response->set_checkpoint_step_dir(g.checkpoint_step_dir());
  response->set_generation(g.generation());
  response->set_data_key(g.data_key());
  response->set_preprocess(options_.preprocess);
  return grpc::Status::OK;
}

void SchedulerServiceImpl::ReleaseRankLocked(Role role, int rank) {
  workers_.erase({role, rank});
  registered_->Set(static_cast<double>(workers_.size()));
  auto it = incarnations_.find({role, rank});
  if (it == incarnations_.end()) return;
  if (lost_incarnations_.insert(it->second).second) lost_order_.push_back(it->second);
  while (lost_order_.size() > kLostIncarnationsKept) {
    lost_incarnations_.erase(lost_order_.front());
    lost_order_.pop_front();
  }
  incarnations_.erase(it);
}

absl::Status SchedulerServiceImpl::CheckHolderLocked(Role role, int rank,
                                                     const std::string& incarnation) const {
  auto it = incarnations_.find({role, rank});
  if (it != incarnations_.end() && !incarnation.empty() && it->second == incarnation) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat(Role_Name(role), " rank ", rank,
                   it == incarnations_.end() ? " is not registered" : " is held by another process",
                   ": the caller's incarnation does not hold it"));
}

absl::StatusOr<std::string> SchedulerServiceImpl::AskInstance(Role role,
                                                              const std::string& endpoint) const {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  worker::v1::GetInfoResponse response;
  grpc::Status s;
  if (role == common::v1::ROLE_ENCODER_WORKER) {
    s = worker::v1::EncoderWorkerService::NewStub(ServiceChannel(endpoint))
            ->GetInfo(&ctx, {}, &response);
  } else if (role == common::v1::ROLE_GENERATOR_WORKER) {
    s = worker::v1::GeneratorWorkerService::NewStub(ServiceChannel(endpoint))
            ->GetInfo(&ctx, {}, &response);
  } else {
    s = worker::v1::LlmWorkerService::NewStub(ServiceChannel(endpoint))
            ->GetInfo(&ctx, {}, &response);
  }
  if (!s.ok()) return FromGrpcStatus(s, absl::StrCat("GetInfo at ", endpoint));
  return response.info().instance();
}

absl::Status SchedulerServiceImpl::ValidateWorkerId(Role role, int rank) const {
  if (!IsWorkerRole(role)) {
    return absl::InvalidArgumentError(
        "role: must be ROLE_ENCODER_WORKER, ROLE_LLM_WORKER or ROLE_GENERATOR_WORKER");
  }
  const int ranks = RanksOf(options_.plan, role);
  if (rank < 0 || rank >= ranks) {
    return absl::InvalidArgumentError(absl::StrCat("rank: ", rank, " is outside the plan's ", ranks,
                                                   " ranks of ", Role_Name(role)));
  }
  return absl::OkStatus();
}

namespace {

// Until when a long poll asking to wait `wait_ms` is held: at most
// kMaxLongPoll, and a second before the caller's deadline.
absl::Time LongPollUntil(const grpc::ServerContextBase* context, int32_t wait_ms) {
  constexpr absl::Duration kMaxLongPoll = absl::Seconds(5);
  const absl::Time now = absl::Now();
  if (wait_ms <= 0) return now;
  return std::min({now + std::min(absl::Milliseconds(wait_ms), kMaxLongPoll),
                   absl::FromChrono(context->deadline()) - absl::Seconds(1)});
}

}  // namespace

grpc::Status SchedulerServiceImpl::GetPlan(grpc::ServerContext* context,
                                           const scheduler::v1::GetPlanRequest* request,
                                           scheduler::v1::GetPlanResponse* response) {
  if (absl::Status s = Configured(); !s.ok()) return ToGrpcStatus(s);
  const absl::Time until = LongPollUntil(context, request->wait_ms());
  const size_t expected = sched::PlanWorkerRanks(options_.plan);
  absl::MutexLock lock(&mu_);
  while (workers_.size() != expected && !closing_ && absl::Now() < until) {
    changed_.WaitWithDeadline(&mu_, until);  // the last registration signals
  }
  *response->mutable_plan() = options_.plan;
  response->set_complete(workers_.size() == expected);
  response->set_registered(static_cast<int32_t>(workers_.size()));
  if (request->wait_ms() <= 0) {
    for (const auto& [key, w] : workers_) *response->add_workers() = w;
  }
  return grpc::Status::OK;
}

void SchedulerServiceImpl::PublishRegroupLocked() {
  scheduler::v1::Regroup g = RegroupLocked();
  absl::MutexLock lock(&published_mu_);
  published_ = std::move(g);
  published_changed_.SignalAll();
}

// A held GetGeneration. Finish is called once: by whoever takes it out of
// held_polls_ (the timer thread, or OnCancel), or at once when not held.
class SchedulerServiceImpl::GenerationPoll final : public grpc::ServerUnaryReactor {
 public:
  GenerationPoll(SchedulerServiceImpl* service, int64_t known,
                 scheduler::v1::GetGenerationResponse* response)
      : service_(service), known_(known), response_(response) {}
  void OnCancel() override { service_->CancelPoll(this); }
  void OnDone() override { delete this; }

  SchedulerServiceImpl* const service_;
  const int64_t known_;
  scheduler::v1::GetGenerationResponse* const response_;
  bool held_ = false;  // in held_polls_ at at_ (under published_mu_)
  HeldPolls::iterator at_;
};

grpc::ServerUnaryReactor* SchedulerServiceImpl::GetGeneration(
    grpc::CallbackServerContext* context, const scheduler::v1::GetGenerationRequest* request,
    scheduler::v1::GetGenerationResponse* response) {
  auto* poll = new GenerationPoll(this, request->known_generation(), response);
  if (absl::Status s = Configured(); !s.ok()) {
    poll->Finish(ToGrpcStatus(s));
    return poll;
  }
  const absl::Time until = LongPollUntil(context, request->wait_ms());
  {
    absl::MutexLock lock(&published_mu_);
    if (published_.generation() == request->known_generation() && !published_closing_ &&
        absl::Now() < until) {
      poll->held_ = true;
      poll->at_ = held_polls_.emplace(until, poll);
      if (poll->at_ == held_polls_.begin()) published_changed_.SignalAll();  // a new earliest
      if (!poll_timer_.joinable()) poll_timer_ = std::thread([this] { PollTimerThread(); });
      return poll;
    }
    *response->mutable_current() = published_;
  }
  poll->Finish(grpc::Status::OK);
  return poll;
}

void SchedulerServiceImpl::CancelPoll(GenerationPoll* poll) {
  {
    absl::MutexLock lock(&published_mu_);
    if (!poll->held_) return;  // answered already
    held_polls_.erase(poll->at_);
    poll->held_ = false;
  }
  poll->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
}

void SchedulerServiceImpl::PollTimerThread() {
  absl::MutexLock lock(&published_mu_);
  int64_t generation = published_.generation();
  for (;;) {
    // Due: every held poll when closing or when the generation changed
    // (each was held on the generation then current), else those whose
    // time is up.
    const bool all = published_closing_ || published_.generation() != generation;
    generation = published_.generation();
    const absl::Time now = absl::Now();
    std::vector<GenerationPoll*> due;
    for (auto it = held_polls_.begin(); it != held_polls_.end() && (all || it->first <= now);) {
      GenerationPoll* poll = it->second;
      *poll->response_->mutable_current() = published_;
      poll->held_ = false;
      it = held_polls_.erase(it);
      due.push_back(poll);
    }
    if (!due.empty()) {
      published_mu_.Unlock();  // Finish outside the lock: OnCancel takes it
      for (GenerationPoll* poll : due) poll->Finish(grpc::Status::OK);
      published_mu_.Lock();
      continue;
    }
    if (published_closing_) return;
    published_changed_.WaitWithDeadline(
        &published_mu_, held_polls_.empty() ? absl::InfiniteFuture() : held_polls_.begin()->first);
  }
}

grpc::Status SchedulerServiceImpl::GetWorkers(grpc::ServerContext*,
                                              const scheduler::v1::GetWorkersRequest* request,
                                              scheduler::v1::GetWorkersResponse* response) {
  if (absl::Status s = Configured(); !s.ok()) return ToGrpcStatus(s);
  constexpr int kMaxWorkers = 4096;
  if (request->workers_size() > kMaxWorkers) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "workers: ", request->workers_size(), " asked, at most ", kMaxWorkers, " a call")));
  }
  for (int i = 0; i < request->workers_size(); ++i) {
    const scheduler::v1::WorkerRef& r = request->workers(i);
    const int ranks = IsWorkerRole(r.role()) ? RanksOf(options_.plan, r.role()) : 0;
    if (r.rank() < 0 || r.rank() >= ranks) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("workers[", i, "]: ", common::v1::Role_Name(r.role()), " rank ", r.rank(),
                       " is not a worker of the plan")));
    }
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckGenerationLocked(request->generation()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  for (const scheduler::v1::WorkerRef& r : request->workers()) {
    auto it = workers_.find({r.role(), r.rank()});
    if (it == workers_.end()) {
      return ToGrpcStatus(absl::NotFoundError(
          absl::StrCat(common::v1::Role_Name(r.role()), " rank ", r.rank(), " is not registered")));
    }
    *response->add_workers() = it->second;
  }
  return grpc::Status::OK;
}

grpc::Status SchedulerServiceImpl::ReportStep(grpc::ServerContext*,
                                              const scheduler::v1::ReportStepRequest* request,
                                              scheduler::v1::ReportStepResponse*) {
  if (absl::Status s = Configured(); !s.ok()) return ToGrpcStatus(s);
  const scheduler::v1::StepReport& r = request->step();
  if ((!r.skipped() && !std::isfinite(r.loss())) || r.samples() < 0 || r.tokens() < 0 ||
      r.loss_tokens() < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "step: loss must be finite (or the step skipped) and samples, tokens, loss_tokens "
        "non-negative"));
  }
  absl::ReleasableMutexLock lock(&mu_);
  if (absl::Status s = CheckGenerationLocked(request->generation()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  // LLM rank 0 reports the steps.
  if (absl::Status s = CheckHolderLocked(common::v1::ROLE_LLM_WORKER, 0, request->incarnation());
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (r.iteration() < start_iteration_) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "step.iteration: ", r.iteration(), " is before this job's start, ", start_iteration_)));
  }
  if (!steps_.empty() && r.iteration() <= steps_.back().iteration()) {
    return ToGrpcStatus(absl::AlreadyExistsError(
        absl::StrCat("step.iteration: ", r.iteration(), " was already reported")));
  }
  if (reload_pending_) {
    ObserveRecovery("reload", running_since_, absl::Now());  // the first iteration after it
    reload_pending_ = false;
  }
  steps_.push_back(r);
  if (steps_.size() > kRetainedSteps) steps_.pop_front();
  tokens_seen_ += r.tokens();
  const absl::Time now = absl::Now();
  if (last_step_at_ != absl::InfinitePast()) {
    const double gap = absl::ToDoubleSeconds(now - last_step_at_);
    step_interval_ = step_interval_ > 0 ? 0.8 * step_interval_ + 0.2 * gap : gap;
  }
  last_step_at_ = now;
  clock_.AddIteration(r.iteration(), r.seconds());
  effective_->Set(clock_.Read(absl::Now()).effective_ratio());
  AddEventLocked(control::v1::JobEvent::KIND_STEP, &r, 0);
  if (r.skipped()) SkippedStepLocked(r);  // after the step's event: a failure ends the watch
  MaybeSucceedLocked();
  lock.Release();
  ObserveStepMetrics(r);
  if (step_log_ != nullptr) {
    if (absl::Status s = step_log_->Append(r, absl::Now());
        !s.ok() && !step_log_failed_.exchange(true)) {
      LOOM_LOG(WARNING).With("error", std::string(s.message())) << "cannot log the job's steps";
    }
  }
  return grpc::Status::OK;
}

grpc::Status SchedulerServiceImpl::GetProgress(grpc::ServerContext*,
                                               const scheduler::v1::GetProgressRequest* request,
                                               scheduler::v1::GetProgressResponse* response) {
  if (absl::Status s = Configured(); !s.ok()) return ToGrpcStatus(s);
  absl::MutexLock lock(&mu_);
  for (const scheduler::v1::StepReport& r : steps_) {
    if (r.iteration() > request->after_iteration()) *response->add_steps() = r;
  }
  response->set_start_iteration(start_iteration_);
  response->set_end_iteration(options_.job.train().steps());
  response->set_last_checkpoint(last_checkpoint_);
  return grpc::Status::OK;
}

grpc::Status SchedulerServiceImpl::SetKey(grpc::ServerContext*,
                                          const scheduler::v1::SetKeyRequest* request,
                                          scheduler::v1::SetKeyResponse*) {
  if (absl::Status s = Configured(); !s.ok()) return ToGrpcStatus(s);  // the plan sizes the store
  if (!key_limit_.TryAcquire()) {
    key_limited_->Increment();
    return ToGrpcStatus(absl::ResourceExhaustedError(
        absl::StrCat("SetKey: over the rate limit (", key_limit_.per_second(), " per s, bursts of ",
                     key_limit_.burst(), "); retry")));
  }
  if (request->key().empty() || request->key().size() > kMaxKeyBytes) {
    return ToGrpcStatus(
        absl::InvalidArgumentError(absl::StrCat("key: must be 1 to ", kMaxKeyBytes, " bytes")));
  }
  if (request->value().size() > kMaxValueBytes) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("value: ", request->value().size(), " bytes is over ", kMaxValueBytes)));
  }
  absl::MutexLock lock(&keys_mu_);
  auto it = keys_.find(request->key());
  const size_t old = it == keys_.end() ? 0 : it->first.size() + it->second.size();
  const size_t add = request->key().size() + request->value().size();
  if (const size_t capacity = StoreCapacity(options_.plan); key_bytes_ - old + add > capacity) {
    return ToGrpcStatus(absl::ResourceExhaustedError(
        absl::StrCat("the rendezvous store is full (", capacity, " bytes for this plan)")));
  }
  key_bytes_ = key_bytes_ - old + add;
  keys_[request->key()] = request->value();
  if (auto w = key_waits_.find(request->key()); w != key_waits_.end()) w->second->set.SignalAll();
  return grpc::Status::OK;
}

grpc::Status SchedulerServiceImpl::GetKey(grpc::ServerContext* context,
                                          const scheduler::v1::GetKeyRequest* request,
                                          scheduler::v1::GetKeyResponse* response) {
  const absl::Time until = LongPollUntil(context, request->wait_ms());
  absl::MutexLock lock(&keys_mu_);
  auto it = keys_.find(request->key());
  if (it == keys_.end() && absl::Now() < until) {
    // Woken by the SetKey of this key only (not by every SetKey of a
    // rendezvous of thousands).
    std::unique_ptr<KeyWait>& slot = key_waits_[request->key()];
    if (slot == nullptr) slot = std::make_unique<KeyWait>();
    KeyWait* wait = slot.get();
    ++wait->waiters;
    while ((it = keys_.find(request->key())) == keys_.end() && absl::Now() < until) {
      wait->set.WaitWithDeadline(&keys_mu_, until);
    }
    if (--wait->waiters == 0) key_waits_.erase(request->key());
  }
  if (it == keys_.end()) {
    return ToGrpcStatus(
        absl::NotFoundError(absl::StrCat("key \"", request->key(), "\" is not set")));
  }
  response->set_value(it->second);
  return grpc::Status::OK;
}

grpc::Status SchedulerServiceImpl::GetKeys(grpc::ServerContext* context,
                                           const scheduler::v1::GetKeysRequest* request,
                                           scheduler::v1::GetKeysResponse* response) {
  if (request->reads_size() > kMaxDeleteKeys) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "reads: ", request->reads_size(), " is over ", kMaxDeleteKeys, " in one call")));
  }
  for (const scheduler::v1::KeyRead& r : request->reads()) {
    if (r.parts() > 1 && (r.part() < 0 || r.part() >= r.parts())) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("reads: part ", r.part(), " of ", r.parts(), " of \"", r.key(), "\"")));
    }
  }
  const absl::Time until = LongPollUntil(context, request->wait_ms());
  absl::MutexLock lock(&keys_mu_);
  // Held until every key is set: waits on one missing key at a time.
  for (const scheduler::v1::KeyRead& r : request->reads()) {
    if (keys_.count(r.key()) > 0) continue;
    if (absl::Now() >= until) break;
    std::unique_ptr<KeyWait>& slot = key_waits_[r.key()];
    if (slot == nullptr) slot = std::make_unique<KeyWait>();
    KeyWait* wait = slot.get();
    ++wait->waiters;
    while (keys_.count(r.key()) == 0 && absl::Now() < until) {
      wait->set.WaitWithDeadline(&keys_mu_, until);
    }
    if (--wait->waiters == 0) key_waits_.erase(r.key());
  }
  // Bounded by what a client receives (gRPC's default 4 MiB), checked
  // before any value is copied.
  constexpr size_t kMaxResponseBytes = (4 << 20) - (64 << 10);
  size_t bytes = 0;
  for (const scheduler::v1::KeyRead& r : request->reads()) {
    auto it = keys_.find(r.key());
    if (it == keys_.end()) continue;
    bytes += r.key().size() + (r.parts() > 1 ? it->second.size() / r.parts() : it->second.size());
  }
  if (bytes > kMaxResponseBytes) {
    return ToGrpcStatus(absl::ResourceExhaustedError(
        absl::StrCat("reads: the values asked come to ", bytes, " bytes, over the ",
                     kMaxResponseBytes, " a response carries; ask for fewer keys or for parts")));
  }
  for (const scheduler::v1::KeyRead& r : request->reads()) {
    scheduler::v1::KeyValue* v = response->add_values();
    auto it = keys_.find(r.key());
    if (it == keys_.end()) continue;
    const std::string& whole = it->second;
    if (r.parts() > 1) {
      if (whole.size() % r.parts() != 0) {
        return ToGrpcStatus(absl::FailedPreconditionError(
            absl::StrCat("key "
                         ", r.key(), "
                         ": ",
                         whole.size(), " bytes do not cut into ", r.parts(), " parts")));
      }
      const size_t n = whole.size() / r.parts();
      v->set_value(whole.substr(n * r.part(), n));
    } else {
      v->set_value(whole);
    }
    v->set_found(true);
    v->set_size(static_cast<int64_t>(whole.size()));
  }
  return grpc::Status::OK;
}

grpc::Status SchedulerServiceImpl::DeleteKeys(grpc::ServerContext*,
                                              const scheduler::v1::DeleteKeysRequest* request,
                                              scheduler::v1::DeleteKeysResponse*) {
  if (request->keys_size() > kMaxDeleteKeys) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("keys: ", request->keys_size(), " is over ", kMaxDeleteKeys, " in one call")));
  }
  absl::MutexLock lock(&keys_mu_);
  for (const std::string& key : request->keys()) {
    auto it = keys_.find(key);
    if (it == keys_.end()) continue;
    key_bytes_ -= it->first.size() + it->second.size();
    keys_.erase(it);
  }
  return grpc::Status::OK;
}

std::pair<size_t, size_t> SchedulerServiceImpl::StoreSize() const {
  absl::MutexLock lock(&keys_mu_);
  return {keys_.size(), key_bytes_};
}

void SchedulerServiceImpl::SkippedStepLocked(const scheduler::v1::StepReport& r) {
  // A replay after a recovery reports the same iteration again: counted once.
  if (!skipped_iterations_.insert(r.iteration()).second) return;
  skipped_steps_->Increment();
  const int64_t limit = options_.job.train().max_skipped_steps();
  LOOM_LOG(WARNING)
          .With("step", r.iteration() + 1)
          .With("loss", r.loss())
          .With("grad_norm", r.grad_norm())
          .With("skipped", skipped_iterations_.size())
          .With("max_skipped_steps", limit)
      << "non-finite loss or gradient norm: the step was skipped";
  if (static_cast<int64_t>(skipped_iterations_.size()) <= limit || IsFinalJobState(state_)) return;
  job_message_ =
      absl::StrCat("loss diverged at step ", r.iteration() + 1, ": ", skipped_iterations_.size(),
                   " steps with a non-finite loss or gradient norm (train."
                   "max_skipped_steps = ",
                   limit, ")");
  LOOM_LOG(ERROR).With("step", r.iteration() + 1) << job_message_;
  stop_at_ = newest_ + 1;
  SetStateLocked(control::v1::JOB_STATE_FAILED);
  changed_.SignalAll();
}

void SchedulerServiceImpl::ObserveStepMetrics(const scheduler::v1::StepReport& r) {
  iterations_->Increment();
  samples_->Increment(static_cast<double>(r.samples()));
  tokens_->Increment(static_cast<double>(r.tokens()));
  loss_->Set(r.loss());
  if (r.has_validation_loss()) validation_loss_->Set(r.validation_loss());
  if (r.output_images() > 0) generation_loss_->Set(r.generation_loss());
  iteration_seconds_->Observe(r.seconds());
  std::shared_ptr<const Computed> c;
  {
    absl::MutexLock lock(&mu_);
    auto it = assignments_by_iteration_.find(r.iteration());
    if (it != assignments_by_iteration_.end()) c = it->second;
  }
  if (c == nullptr || r.seconds() <= 0 || peak_flops_ <= 0) return;
  // Model FLOPs of the batch as trained: ViT FLOPs per tile, the LLM's over
  // each sample's real packed length (attention per sample, block-diagonal).
  double flops = 0;
  for (const sched::SampleShape& s : c->shapes) {
    const double l = s.length();
    flops += flops_.encoder_per_tile * s.tiles + flops_.llm_per_token * l +
             flops_.llm_per_token_sq * l * l + flops_.generator_per_image * s.output_images;
  }
  mfu_->Set(flops / r.seconds() / peak_flops_);
}

}  // namespace loom
