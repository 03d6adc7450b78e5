#include "services/scheduler/scheduler_service.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <tuple>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "runtime/base/file.h"
#include "runtime/base/log.h"
#include "runtime/base/trace.h"
#include "runtime/checkpoint/steps.h"
#include "runtime/model/config.h"
#include "runtime/scheduling/assign.h"
#include "runtime/scheduling/schedule.h"
#include "services/common/channel.h"
#include "services/common/grpc_status.h"
#include "services/common/job.h"
#include "services/scheduler/job_state.h"

namespace loom {
namespace {

using common::v1::Role;

int RanksOf(const scheduler::v1::Plan& plan, Role role) {
  return role == common::v1::ROLE_ENCODER_WORKER ? plan.encoder().gpus() : plan.llm().gpus();
}

constexpr size_t kMaxKeyBytes = 1024;
constexpr size_t kMaxValueBytes = 1 << 20;
constexpr size_t kMaxStoreBytes = 64 << 20;
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
  iterations_ = counter("loom_train_iterations_total", "Training iterations finished.");
  samples_ = counter("loom_train_samples_total", "Samples trained on.");
  tokens_ = counter("loom_train_tokens_total", "Packed LLM tokens (text and image) trained on.");
  loss_ = gauge("loom_train_loss", "Newest iteration's mean loss per loss token.");
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
  effective_ = gauge("loom_job_effective_training_ratio",
                     "Wall time of the iterations the job kept over the time it has run, "
                     "recoveries included (0-1).");
}

SchedulerServiceImpl::~SchedulerServiceImpl() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    changed_.SignalAll();
  }
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
  if (options.retained_iterations < 1) {
    return absl::InvalidArgumentError("retained_iterations must be at least 1");
  }
  if (options.start_iteration < 0) {
    return absl::InvalidArgumentError("start_iteration must be >= 0");
  }
  // Stage shares start from the layer split the workers use (and restart
  // when a job resumes under another pipeline depth).
  if (model.ok() && ValidateModelParallel(*model, 1, p.encoder().pp(), 1, p.llm().pp()).ok()) {
    stage_model_ = *model;
  }
  absl::StatusOr<scheduler::v1::CostCoefficients> costs =
      StartingCosts(p, options.job.checkpoint().dir(), options.start_iteration);
  if (!costs.ok()) return costs.status();
  SchedulerServiceOptions accepted = options;
  if (options.start_iteration == 0) {  // a fresh run: the checkpoint folder is now its
    absl::StatusOr<CheckpointRun> run =
        StartCheckpointRun(options.job.checkpoint().dir(), JobCheckpointIdentity(options.job));
    if (!run.ok()) return run.status();
    accepted.run = *run;
  }
  if (model.ok()) {
    flops_ = sched::AnalyticFlops(*model, /*recompute=*/false, JobFrozen(options.job));
  }
  peak_flops_ = options.peak_flops > 0 ? options.peak_flops
                                       : p.gpu_peak_flops() * (p.encoder().gpus() + p.llm().gpus());
  options_ = accepted;
  if (!options.preprocess.empty()) {
    preprocess_ = data::v1::PreprocessService::NewStub(ServiceChannel(options.preprocess));
  }
  {
    absl::MutexLock lock(&mu_);
    costs_ = std::make_unique<sched::CostModel>(*costs);
    start_iteration_ = options.start_iteration;
    generation_ = options.generation;
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
  configured_.store(true);  // options_ is immutable from here on
  restarts_->Increment(options.restarts);
  const control::v1::Recovery& r = options.recovered_from;
  if (r.declared_seconds() > 0 && r.last_seen_seconds() > 0) {
    ObserveRecovery("detection", absl::UnixEpoch() + absl::Seconds(r.last_seen_seconds()),
                    absl::UnixEpoch() + absl::Seconds(r.declared_seconds()));
  }
  if (options.job.recovery().lease_seconds() > 0) leases_ = std::thread([this] { WatchLeases(); });
  return absl::OkStatus();
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
  const scheduler::v1::Worker& w = request->worker();
  if (w.role() != common::v1::ROLE_ENCODER_WORKER && w.role() != common::v1::ROLE_LLM_WORKER) {
    return ToGrpcStatus(
        absl::InvalidArgumentError("worker.role: must be ROLE_ENCODER_WORKER or ROLE_LLM_WORKER"));
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
  absl::MutexLock lock(&mu_);
  // A rank whose holder was declared lost is free again (a recovery in
  // place erased it): its replacement registers here from a new address.
  auto [it, inserted] = workers_.try_emplace({w.role(), w.rank()}, w);
  if (!inserted && it->second.ucx_address() != w.ucx_address() && !w.endpoint().empty() &&
      it->second.endpoint() == w.endpoint() &&
      (state_ == control::v1::JOB_STATE_RUNNING || state_ == control::v1::JOB_STATE_PAUSED)) {
    // A new process at the holder's own address (a container restarted in
    // its pod): the holder is gone. Declared lost now, it frees the rank.
    DeclareLostLocked(w.role(), w.rank(), w.endpoint(),
                      "restarted: a new process registered from its endpoint", absl::Now());
    std::tie(it, inserted) = workers_.try_emplace({w.role(), w.rank()}, w);
  }
  if (!inserted && it->second.ucx_address() != w.ucx_address()) {
    return ToGrpcStatus(absl::AlreadyExistsError(absl::StrCat(
        common::v1::Role_Name(w.role()), " rank ", w.rank(), " is registered by another worker")));
  }
  it->second = w;  // a retry may bring a new endpoint
  registered_->Set(static_cast<double>(workers_.size()));
  if (state_ == control::v1::JOB_STATE_PENDING &&
      static_cast<int>(workers_.size()) ==
          options_.plan.encoder().gpus() + options_.plan.llm().gpus()) {
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
  response->set_preprocess(options_.preprocess);
  return grpc::Status::OK;
}

absl::Status SchedulerServiceImpl::ValidateWorkerId(Role role, int rank) const {
  if (role != common::v1::ROLE_ENCODER_WORKER && role != common::v1::ROLE_LLM_WORKER) {
    return absl::InvalidArgumentError("role: must be ROLE_ENCODER_WORKER or ROLE_LLM_WORKER");
  }
  const int ranks = RanksOf(options_.plan, role);
  if (rank < 0 || rank >= ranks) {
    return absl::InvalidArgumentError(absl::StrCat("rank: ", rank, " is outside the plan's ", ranks,
                                                   " ranks of ", Role_Name(role)));
  }
  return absl::OkStatus();
}

grpc::Status SchedulerServiceImpl::GetPlan(grpc::ServerContext*,
                                           const scheduler::v1::GetPlanRequest*,
                                           scheduler::v1::GetPlanResponse* response) {
  if (absl::Status s = Configured(); !s.ok()) return ToGrpcStatus(s);
  absl::MutexLock lock(&mu_);
  *response->mutable_plan() = options_.plan;
  for (const auto& [key, w] : workers_) *response->add_workers() = w;
  response->set_complete(static_cast<int>(workers_.size()) ==
                         options_.plan.encoder().gpus() + options_.plan.llm().gpus());
  return grpc::Status::OK;
}

absl::StatusOr<std::shared_ptr<const SchedulerServiceImpl::Computed>>
SchedulerServiceImpl::AssignmentFor(int64_t iteration, int64_t generation, absl::Time deadline,
                                    absl::Time compute_deadline, std::string* ended,
                                    scheduler::v1::Regroup* regroup) {
  if (iteration < 0) {
    return absl::InvalidArgumentError(absl::StrCat("iteration: ", iteration, " is negative"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (generation < generation_) {  // that generation is over: where the next one starts
      *regroup = RegroupLocked();
      return std::shared_ptr<const Computed>();
    }
    if (absl::Status s = CheckGenerationLocked(generation); !s.ok()) return s;
    if (iteration < start_iteration_) {
      return absl::OutOfRangeError(absl::StrCat("iteration ", iteration, " is before iteration ",
                                                start_iteration_, ", where this job ",
                                                generation_ > 0 ? "recovered" : "resumed"));
    }
  }
  const int64_t end = options_.job.train().steps();
  if (end > 0 && iteration >= end) {
    *ended = absl::StrCat("the job ends after ", end, " iterations");
    return std::shared_ptr<const Computed>();
  }
  auto cached = [&]() -> absl::StatusOr<std::shared_ptr<const Computed>> {
    absl::MutexLock lock(&mu_);
    auto it = assignments_by_iteration_.find(iteration);
    if (it != assignments_by_iteration_.end()) return it->second;
    if (iteration <= newest_ - options_.retained_iterations) {
      return absl::OutOfRangeError(absl::StrCat("iteration ", iteration,
                                                " left the window of the last ",
                                                options_.retained_iterations, " assignments"));
    }
    const int64_t newest = std::max(newest_, start_iteration_ - 1);
    if (iteration > newest + options_.retained_iterations) {
      return absl::OutOfRangeError(
          absl::StrCat("iteration ", iteration, " is more than ", options_.retained_iterations,
                       " iterations ahead of the newest assignment (", newest, ")"));
    }
    return std::shared_ptr<const Computed>();
  };
  absl::StatusOr<std::shared_ptr<const Computed>> hit = cached();
  if (!hit.ok() || *hit) return hit;
  {
    // Iterations already computed are handed out whatever the state (every
    // worker of an iteration gets it); a new one waits out a pause and is
    // refused once the job was stopped.
    absl::MutexLock lock(&mu_);
    ++paused_requests_;  // held by the pause while it waits here
    auto held = [&] {
      return generation == generation_ && (state_ == control::v1::JOB_STATE_PAUSED ||
                                           state_ == control::v1::JOB_STATE_RECOVERING);
    };
    while (held() && absl::Now() < deadline) changed_.WaitWithDeadline(&mu_, deadline);
    --paused_requests_;
    if (generation < generation_) {  // a recovery in place began while this waited
      *regroup = RegroupLocked();
      return std::shared_ptr<const Computed>();
    }
    if (stop_at_ >= 0 && iteration >= stop_at_) {
      *ended = absl::StrCat("the job stopped before iteration ", iteration, ": ", job_message_);
      return std::shared_ptr<const Computed>();
    }
    if (state_ == control::v1::JOB_STATE_PAUSED) {
      return absl::UnavailableError("the job is paused; retry");
    }
    if (state_ == control::v1::JOB_STATE_RECOVERING) {
      // The lost process is being replaced (or every process restarted
      // from the newest complete checkpoint); until then nothing new is
      // handed out.
      return absl::UnavailableError(
          absl::StrCat("the job is recovering (", job_message_, "); retry"));
    }
  }
  // One assignment is computed at a time. A caller waits for its turn, and
  // for loom-preprocess's batch, only until its compute deadline: then it
  // hears "retry", so a batch that takes long to prepare (or a long solve
  // ahead of it) never runs a worker's call past its deadline.
  {
    absl::MutexLock lock(&mu_);
    while (computing_ && absl::Now() < compute_deadline) {
      changed_.WaitWithDeadline(&mu_, compute_deadline);
    }
    if (computing_) {
      return absl::UnavailableError(absl::StrCat(
          "iteration ", iteration, ": another assignment is still being computed; retry"));
    }
    computing_ = true;
  }
  absl::Cleanup computed_or_not = [this] {
    absl::MutexLock lock(&mu_);
    computing_ = false;
    changed_.SignalAll();
  };
  absl::MutexLock compute(&compute_mu_);
  hit = cached();  // another caller may have computed it meanwhile
  if (!hit.ok() || *hit) return hit;
  if (!preprocess_) {
    return absl::FailedPreconditionError("no preprocess service (--preprocess) to read batches");
  }
  if (absl::Status s = RewindPreprocess(); !s.ok()) return s;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(compute_deadline));
  ctx.set_wait_for_ready(true);  // loom-preprocess may be restarting at its address
  data::v1::GetBatchRequest request;
  request.set_iteration(iteration);
  data::v1::GetBatchResponse batch;
  if (grpc::Status s = preprocess_->GetBatch(&ctx, request, &batch); !s.ok()) {
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {  // not prepared yet
      return absl::UnavailableError(absl::StrCat("iteration ", iteration,
                                                 ": loom-preprocess has not prepared its batch "
                                                 "yet (",
                                                 s.error_message(), "); retry"));
    }
    return FromGrpcStatus(s, "preprocess GetBatch");
  }
  auto computed = std::make_shared<Computed>();
  std::vector<std::string> keys;
  for (const data::v1::SampleMetadata& m : batch.samples()) {
    sched::SampleShape s;
    for (int t : m.record().images()) s.tiles += t;
    s.image_tokens = m.record().image_tokens();
    s.text_tokens = m.record().text_tokens();
    computed->shapes.push_back(s);
    keys.push_back(m.record().key());
  }
  std::vector<sched::SampleLoad> loads;
  scheduler::v1::Plan plan = options_.plan;  // with the costs as refitted now
  {
    absl::MutexLock lock(&mu_);
    loads = costs_->Loads(computed->shapes, costs_->coefficients().transfer_per_image_token());
    *plan.mutable_costs() = costs_->coefficients();
  }
  sched::PredictedIteration predicted;
  // An iteration this run assigned before (a restart or resume repeats it):
  // the same bins again, so it trains exactly as it did. Else a new one,
  // recorded before any worker sees it.
  absl::StatusOr<scheduler::v1::Assignment> a = RecordedAssignment(iteration, keys);
  const bool replayed = a.ok();
  if (!replayed) {
    a = sched::AssignForPlan(plan, keys, loads, options_.algorithm, options_.ilp_seconds,
                             options_.trace_dir.empty() ? nullptr : &predicted);
    if (!a.ok()) return a.status();
    a->set_iteration(iteration);
    if (absl::Status s = RecordAssignment(*a); !s.ok()) return s;
  }
  if (!options_.trace_dir.empty() && !replayed) {
    const bool first = !trace_named_.exchange(true);
    absl::Status s = trace::AppendLine(options_.trace_dir + "/predicted.jsonl",
                                       sched::PredictedTrace(predicted, iteration, first));
    if (!s.ok()) LOOM_LOG(WARNING).With("error", std::string(s.message())) << "trace";
  }
  a->set_iteration(iteration);
  computed->assignment = std::move(*a);
  assignments_->Increment();
  llm_imbalance_->Set(computed->assignment.summary().llm().max_over_lower_bound());
  encoder_imbalance_->Set(computed->assignment.summary().encoder().max_over_lower_bound());
  bool mark = false;
  {
    absl::MutexLock lock(&mu_);
    const int every = options_.job.checkpoint().every();
    mark = checkpoint_requested_ || (every > 0 && (iteration + 1) % every == 0);
    checkpoint_requested_ = false;
    if (mark) marking_step_ = iteration + 1;  // a CheckpointJob now gets this step
  }
  if (mark) {
    // Before any worker can see the mark, outside the main lock (compute_mu_
    // still serialises this): an empty partial folder for the step, dropping
    // whatever an interrupted earlier write of it left.
    if (absl::Status s = BeginCheckpointStep(options_.job.checkpoint().dir(), iteration + 1);
        !s.ok()) {
      absl::MutexLock lock(&mu_);
      marking_step_ = 0;
      job_message_ = absl::StrCat("checkpoint ", iteration + 1, " cannot start: ", s.message());
      stop_at_ = newest_ + 1;
      SetStateLocked(control::v1::JOB_STATE_FAILED);
      return s;
    }
  }
  absl::MutexLock lock(&mu_);
  marking_step_ = 0;
  if (stop_at_ >= 0 && iteration >= stop_at_) {  // stopped while computing
    *ended = absl::StrCat("the job stopped before iteration ", iteration, ": ", job_message_);
    return std::shared_ptr<const Computed>();
  }
  if (mark) {
    computed->assignment.set_checkpoint(true);
    checkpoint_steps_.insert(iteration + 1);
  }
  assignments_by_iteration_[iteration] = computed;
  newest_ = std::max(newest_, iteration);
  while (!assignments_by_iteration_.empty() &&
         assignments_by_iteration_.begin()->first <= newest_ - options_.retained_iterations) {
    assignments_by_iteration_.erase(assignments_by_iteration_.begin());
  }
  return std::shared_ptr<const Computed>(computed);
}

grpc::Status SchedulerServiceImpl::GetAssignment(grpc::ServerContext* context,
                                                 const scheduler::v1::GetAssignmentRequest* request,
                                                 scheduler::v1::GetAssignmentResponse* response) {
  if (absl::Status s = Configured(); !s.ok()) return ToGrpcStatus(s);
  // A paused job holds the call until a second before the caller's deadline
  // (at most pause_hold); the caller retries the UNAVAILABLE that follows.
  // Computing the assignment (the wait for the batch included) likewise,
  // at most kComputeHold.
  const absl::Time answer_by = absl::FromChrono(context->deadline()) - absl::Seconds(1);
  const absl::Time deadline = std::min(answer_by, absl::Now() + options_.pause_hold);
  const absl::Time compute_deadline = std::min(answer_by, absl::Now() + kComputeHold);
  std::string ended;
  scheduler::v1::Regroup regroup;
  absl::StatusOr<std::shared_ptr<const Computed>> c = AssignmentFor(
      request->iteration(), request->generation(), deadline, compute_deadline, &ended, &regroup);
  if (!c.ok()) return ToGrpcStatus(c.status());
  if (*c == nullptr) {
    if (ended.empty()) {
      *response->mutable_regroup() = regroup;
    } else {
      response->set_job_ended(ended);
    }
    return grpc::Status::OK;
  }
  *response->mutable_assignment() = (*c)->assignment;
  return grpc::Status::OK;
}

grpc::Status SchedulerServiceImpl::ReportStep(grpc::ServerContext*,
                                              const scheduler::v1::ReportStepRequest* request,
                                              scheduler::v1::ReportStepResponse*) {
  if (absl::Status s = Configured(); !s.ok()) return ToGrpcStatus(s);
  const scheduler::v1::StepReport& r = request->step();
  if (!std::isfinite(r.loss()) || r.samples() < 0 || r.tokens() < 0 || r.loss_tokens() < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "step: loss must be finite and samples, tokens, loss_tokens non-negative"));
  }
  absl::ReleasableMutexLock lock(&mu_);
  if (absl::Status s = CheckGenerationLocked(request->generation()); !s.ok()) {
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
  clock_.AddIteration(r.iteration(), r.seconds());
  effective_->Set(clock_.Read(absl::Now()).effective_ratio());
  AddEventLocked(control::v1::JobEvent::KIND_STEP, &r, 0);
  MaybeSucceedLocked();
  lock.Release();
  ObserveStepMetrics(r);
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
  if (key_bytes_ - old + add > kMaxStoreBytes) {
    return ToGrpcStatus(absl::ResourceExhaustedError("the rendezvous store is full"));
  }
  key_bytes_ = key_bytes_ - old + add;
  keys_[request->key()] = request->value();
  return grpc::Status::OK;
}

grpc::Status SchedulerServiceImpl::GetKey(grpc::ServerContext*,
                                          const scheduler::v1::GetKeyRequest* request,
                                          scheduler::v1::GetKeyResponse* response) {
  absl::MutexLock lock(&keys_mu_);
  auto it = keys_.find(request->key());
  if (it == keys_.end()) {
    return ToGrpcStatus(
        absl::NotFoundError(absl::StrCat("key \"", request->key(), "\" is not set")));
  }
  response->set_value(it->second);
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

void SchedulerServiceImpl::ObserveStepMetrics(const scheduler::v1::StepReport& r) {
  iterations_->Increment();
  samples_->Increment(static_cast<double>(r.samples()));
  tokens_->Increment(static_cast<double>(r.tokens()));
  loss_->Set(r.loss());
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
             flops_.llm_per_token_sq * l * l;
  }
  mfu_->Set(flops / r.seconds() / peak_flops_);
}

}  // namespace loom
