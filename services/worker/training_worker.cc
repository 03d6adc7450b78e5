#include "services/worker/training_worker.h"

#include <signal.h>

#include <algorithm>
#include <future>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "runtime/backends/cuda/cuda_backend.h"
#include "runtime/base/file.h"
#include "runtime/base/log.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/steps.h"
#include "runtime/model/precision.h"
#include "runtime/parallel/grid.h"
#include "services/common/channel.h"
#include "services/common/job.h"
#include "services/common/job_end.h"
#include "services/worker/training_worker_impl.h"

namespace loom {

using namespace worker;  // NOLINT: the tags, the clock, IterationData

namespace {

// A group whose collectives count as waiting, not as the thread's own work
// (StallWatch): a rank blocked on a peer is not the one that hangs.
class WatchedCommunicator final : public Communicator {
 public:
  WatchedCommunicator(std::unique_ptr<Communicator> inner, StallWatch* stall)
      : inner_(std::move(inner)), stall_(stall) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status AllreduceSum(float* data, int64_t n) override {
    StallWatch::Waiting waiting(stall_);
    return inner_->AllreduceSum(data, n);
  }
  absl::Status AllreduceSum(double* data, int64_t n) override {
    StallWatch::Waiting waiting(stall_);
    return inner_->AllreduceSum(data, n);
  }
  absl::Status AllreduceMax(float* data, int64_t n) override {
    StallWatch::Waiting waiting(stall_);
    return inner_->AllreduceMax(data, n);
  }
  absl::Status ReduceScatterSum(float* data, int64_t n) override {
    StallWatch::Waiting waiting(stall_);
    return inner_->ReduceScatterSum(data, n);
  }
  absl::Status AllGather(float* data, int64_t n) override {
    StallWatch::Waiting waiting(stall_);
    return inner_->AllGather(data, n);
  }

 private:
  std::unique_ptr<Communicator> inner_;
  StallWatch* stall_;
};

}  // namespace

scheduler::v1::Worker TrainingWorker::Impl::Me() const {
  scheduler::v1::Worker me;
  me.set_role(options.role);
  me.set_rank(options.rank);
  me.set_ucx_address(ucx->address());
  me.set_endpoint(options.endpoint);
  return me;
}

absl::Status TrainingWorker::Impl::Register() {
  scheduler = std::make_unique<SchedulerClient>(options.scheduler, absl::Seconds(60), &cancel);
  peers = std::make_unique<PeerAddresses>(scheduler.get());
  absl::StatusOr<scheduler::v1::RegisterWorkerResponse> reg =
      scheduler->Register(Me(), options.startup_timeout);
  if (!reg.ok()) return reg.status();
  job = reg->job();
  plan = reg->plan();
  const job::v1::RecoveryConfig& r = job.recovery();
  stall = std::make_unique<StallWatch>(
      absl::Seconds(r.stall_floor_seconds() > 0 ? r.stall_floor_seconds() : 300),
      r.stall_factor() > 0 ? r.stall_factor() : 10, absl::Seconds(r.lease_seconds()));
  start_iteration = reg->start_iteration();
  checkpoint_step_dir = reg->checkpoint_step_dir();
  {
    absl::MutexLock lock(&generation_mu);
    generation = reg->generation();
  }
  if (absl::Status s = scheduler->SetGeneration(reg->generation(), reg->data_key()); !s.ok()) {
    return s;
  }
  if (reg->preprocess().empty()) {
    return absl::FailedPreconditionError("the scheduler knows no preprocess service");
  }
  absl::StatusOr<hf::PretrainedModel> resolved = JobModel(job);
  if (!resolved.ok()) return resolved.status();
  pretrained = std::move(*resolved);
  model = pretrained.config;
  train = JobTrainOptions(job);
  data = std::make_unique<DataClient>(ServiceChannel(reg->preprocess()), ucx.get(),
                                      absl::Seconds(30), &model);
  // A batch slow to prepare, or loom-preprocess stopped for less than its
  // lease, is waited for as long as a peer would be.
  data->SetWaitBudget([this] { return stall->WaitLimit(); });

  encoder_grid = {plan.encoder().tp(), plan.encoder().pp(), plan.encoder().dp()};
  llm_grid = {plan.llm().tp(), plan.llm().pp(), plan.llm().dp()};
  if (plan.has_generator()) {
    generator_grid = {plan.generator().tp(), plan.generator().pp(), plan.generator().dp()};
  }
  if (generator && !model.has_generator()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a generator rank, but model ", model.name, " has no generator"));
  }
  if (plan.has_generator() &&
      plan.generator().pp() > std::max(1, model.generator.denoiser.layers)) {
    return absl::InvalidArgumentError(absl::StrCat("plan: generator pp ", plan.generator().pp(),
                                                   " over ", model.generator.denoiser.layers,
                                                   " denoiser blocks"));
  }
  if (model.has_generator() != plan.has_generator()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan: model ", model.name, model.has_generator() ? " has" : " has no",
        " generator, and the plan ", plan.has_generator() ? "gives" : "gives no", " it ranks"));
  }
  const parallel::GridShape& shape = grid();
  if (options.rank < 0 || options.rank >= shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank ", options.rank, " is outside the plan's ", shape.size(), " ranks"));
  }
  if (plan.llm().dp() * plan.microbatches() > kMaxTagBins ||
      std::max({encoder_grid.pp, llm_grid.pp, generator_grid.pp}) > kMaxTagStages) {
    return absl::InvalidArgumentError(absl::StrCat("plan: at most ", kMaxTagBins, " bins and ",
                                                   kMaxTagStages, " stages per module"));
  }
  if (absl::Status s =
          ValidateModelParallel(model, encoder_grid.tp, encoder_grid.pp, llm_grid.tp, llm_grid.pp);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("plan: ", s.message()));
  }
  pos = parallel::PositionOf(shape, options.rank);
  if (!options.trace_dir.empty()) {
    trace_path =
        absl::StrCat(options.trace_dir, "/", RoleLabel(options.role), "-", options.rank, ".jsonl");
    trace_tid =
        generator ? trace::GeneratorTrack(options.rank) : trace::WorkerTrack(encoder, options.rank);
    trace::NameTrack(&spans, trace::kMeasuredPid, trace_tid,
                     absl::StrCat(ModuleLabel(), " rank ", options.rank, " (tp ", pos.tp,
                                  ", stage ", pos.pp, ", dp ", pos.dp, ")"));
  }
  return absl::OkStatus();
}

std::unique_ptr<Communicator> TrainingWorker::Impl::Watched(std::unique_ptr<Communicator> c) {
  return std::unique_ptr<Communicator>(new WatchedCommunicator(std::move(c), stall.get()));
}

absl::Status TrainingWorker::Impl::Join() {
  // The module's device first: a rank without it fails before its peers
  // wait for it in the groups.
  if (absl::Status s = OpenDevice(); !s.ok()) return s;
  absl::StatusOr<scheduler::v1::GetPlanResponse> all =
      scheduler->WaitForAllWorkers(options.startup_timeout);
  if (!all.ok()) return all.status();
  const parallel::GridShape& shape = grid();
  // This generation's addresses: first the pipeline neighbours'.
  peers->Clear();
  std::vector<scheduler::v1::WorkerRef> neighbours;
  for (int peer : {parallel::PrevStageRank(shape, options.rank),
                   parallel::NextStageRank(shape, options.rank)}) {
    if (peer < 0) continue;
    neighbours.emplace_back().set_role(options.role);
    neighbours.back().set_rank(peer);
  }
  if (absl::Status s = peers->Resolve(neighbours); !s.ok()) return s;
  // Each generation rendezvouses under its own keys.
  const std::string module_name = absl::StrCat("g", scheduler->generation(), "-",
                                               encoder     ? "encoder"
                                               : generator ? "generator"
                                                           : "llm");
  SchedulerStore store(scheduler.get());
  auto connect = [&](const std::string& prefix, int rank,
                     int size) -> absl::StatusOr<std::unique_ptr<Communicator>> {
    GlooOptions g;
    g.host = options.host;
    g.timeout = options.startup_timeout;
    g.prefix = prefix;
    g.rank = rank;
    g.size = size;
    g.cancel = &collectives;
    g.wait_limit = [this] { return stall->WaitLimit(); };
    absl::StatusOr<std::unique_ptr<Communicator>> c = ConnectGloo(&store, g);
    if (!c.ok()) return c.status();
    return Watched(*std::move(c));
  };
  if (shape.tp > 1) {
    absl::StatusOr<std::unique_ptr<Communicator>> c =
        connect(absl::StrCat(module_name, "-tp-dp", pos.dp, "-pp", pos.pp), pos.tp, shape.tp);
    if (!c.ok()) return c.status();
    tp_comm = std::move(*c);
  }
  if (shape.pp > 1) {
    absl::StatusOr<std::unique_ptr<Communicator>> c =
        connect(absl::StrCat(module_name, "-pp-tp", pos.tp, "-dp", pos.dp), pos.pp, shape.pp);
    if (!c.ok()) return c.status();
    pp_comm = std::move(*c);
  }
  absl::StatusOr<std::unique_ptr<Communicator>> c =
      connect(absl::StrCat(module_name, "-dp-tp", pos.tp, "-pp", pos.pp), pos.dp, shape.dp);
  if (!c.ok()) return c.status();
  dp_comm = std::move(*c);
  // Each module's rank 0: encoder, LLM, generator (JobSum).
  if (options.rank == 0 && encoder_grid.size() > 0 && llm_grid.size() > 0) {
    const int modules = generator_grid.size() > 0 ? 3 : 2;
    c = connect(absl::StrCat("g", scheduler->generation(), "-bridge"),
                encoder     ? 0
                : generator ? 2
                            : 1,
                modules);
    if (!c.ok()) return c.status();
    bridge_comm = std::move(*c);
  }

  absl::StatusOr<Communicator*> layers_tp = DeviceGroups(&store, module_name);
  if (!layers_tp.ok()) return layers_tp.status();
  if (rss_before_model < 0) rss_before_model = ResidentBytes();
  if (encoder) {
    vit = std::make_unique<VitEncoder>(model.vit, *layers_tp,
                                       VitStageLayers(model, shape.pp, pos.pp), ops);
    sets = {&vit->params()};
    modules = {Module::kEncoder};
    set_tp = {tp_comm.get()};
    if (last_stage()) {
      projector = std::make_unique<Projector>(model, ops);
      sets.push_back(&projector->params());
      modules.push_back(Module::kProjector);
      set_tp.push_back(nullptr);
    }
  } else if (generator) {
    gen = std::make_unique<Generator>(model.generator, *layers_tp, ops,
                                      GeneratorStageLayers(model.generator, shape.pp, pos.pp));
    // Its own tensors are replicated on every TP rank; the denoiser's split.
    sets = {&gen->params(), &gen->denoiser_params()};
    modules = {Module::kGenerator, Module::kGenerator};
    set_tp = {nullptr, tp_comm.get()};
    set_names = {kCheckpointSets[3], kCheckpointSets[4]};
  } else {
    llm =
        std::make_unique<Llm>(model.llm, *layers_tp, LlmStageLayers(model, shape.pp, pos.pp), ops);
    sets = {&llm->params()};
    modules = {Module::kLlm};
    set_tp = {tp_comm.get()};
  }
  if (set_names.empty()) {
    for (Module m : modules) set_names.push_back(kModuleNames[static_cast<int>(m)]);
  }
  // ZeRO-1: each DP rank holds the AdamW moments of its chunk of each set
  // (before loading, which fills that chunk alone).
  if (job.optimizer().shard()) {
    for (ParamSet* p : sets) p->ShardOptimizer(pos.dp, shape.dp);
  }
  const bool resume = !checkpoint_step_dir.empty();
  const std::string& init = job.init().checkpoint();
  for (size_t i = 0; i < sets.size(); ++i) {
    if (!resume && init.empty()) {
      sets[i]->Initialize(ModuleSeed(job.seed(), modules[i]));
      // Hugging Face weights over the seed's (each rank reads its own slice).
      if (absl::Status s = hf::LoadPretrainedWeights(pretrained, modules[i], sets[i]); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("hf.", s.message()));
      }
      continue;
    }
    // Checkpoints hold each module's master tensors: this rank reads its
    // own slice of its stage's tensors straight from the parts, so a job
    // resumes (or starts from another run's weights) under any TP, PP and DP
    // degrees, and no rank holds more than its set.
    const std::string& name = set_names[i];
    const bool whole = modules[i] == Module::kProjector || grid().pp == 1;
    absl::Status s = resume ? LoadModuleCheckpoint(checkpoint_step_dir, name, sets[i], whole)
                            : LoadModuleWeights(init, name, sets[i], whole);
    if (!s.ok()) {
      return resume ? s : absl::Status(s.code(), absl::StrCat("init.checkpoint: ", s.message()));
    }
  }
  frozen = JobFrozen(job);
  // Checked with the job (ValidateJob).
  const Precision precision = ParsePrecision(job.precision()).value_or(Precision::kFp32);
  recompute = ParseRecompute(encoder ? job.recompute().encoder() : job.recompute().llm())
                  .value_or(Recompute::kFull);
  if (vit != nullptr) vit->set_recompute(recompute);
  if (llm != nullptr) llm->set_recompute(recompute);
  if (vit != nullptr) vit->set_sequence_parallel(job.parallel().sequence_parallel());
  if (llm != nullptr) llm->set_sequence_parallel(job.parallel().sequence_parallel());
  for (size_t i = 0; i < sets.size(); ++i) {
    if (frozen.module(modules[i])) sets[i]->Freeze();
    // The weights as set (no-op on the CPU in fp32), with their bf16 copy
    // under bf16. On a GPU the optimizer steps there too where the
    // gradients are reduced there (NCCL) or not at all (DP 1); host
    // collectives bring them to the host, where it then steps.
    sets[i]->Place(ops->backend(), precision,
                   /*optimizer_on_device=*/nccl_dp != nullptr || shape.dp == 1);
  }
  // What the AdamW moments take here, and would take unsharded.
  int64_t whole = 0;
  for (const ParamSet* p : sets) whole += p->frozen() ? 0 : 2 * p->size() * 4;
  LOOM_LOG(INFO)
          .With("optimizer_state_bytes", OptimizerStateBytes())
          .With("unsharded_bytes", whole)
          .With("sharded", job.optimizer().shard())
      << "AdamW state held";
  return absl::OkStatus();
}

MemoryEstimate TrainingWorker::Impl::PredictedMemory() const {
  if (generator) return JobGeneratorMemory(job, model, max_gen_images, /*bins=*/1, pos.pp);
  return JobStageMemory(job, model, encoder, pos.pp, max_tokens, max_image_tokens, max_tiles,
                        max_bins, max_kept_tiles > 0 ? max_kept_tiles : -1);
}

int64_t TrainingWorker::Impl::MeasuredMemory() const {
  if (!on_host()) return static_cast<int64_t>(ops->backend()->peak_bytes());
  const int64_t peak = PeakResidentBytes();
  return peak < 0 || rss_before_model < 0 ? -1 : peak - rss_before_model;
}

void TrainingWorker::Impl::ReportMemory(bool log) {
  const MemoryEstimate e = PredictedMemory();
  const int64_t measured = MeasuredMemory();
  memory_predicted_bytes->Set(static_cast<double>(e.total()));
  memory_measured_bytes->Set(static_cast<double>(measured));
  if (!log) return;
  LOOM_LOG(INFO)
          .With("predicted_bytes", e.total())
          .With("measured_bytes", measured)
          .With("measured", on_host() ? "peak RSS over RSS before the model" : "backend peak")
          .With("held_bytes",  // on a GPU: the allocator's blocks at their peak
                on_host()
                    ? measured
                    : static_cast<int64_t>(GetCudaMemoryStats(ops->backend()).peak_in_use_bytes))
          .With("stage", pos.pp)
          .With("max_tokens", encoder     ? max_tiles
                              : generator ? max_gen_images
                                          : max_tokens)
          .With("predicted", e.ToString())
      << "memory";
}

int64_t TrainingWorker::Impl::OptimizerStateBytes() const {
  int64_t bytes = 0;
  for (const ParamSet* p : sets) bytes += p->optimizer_state_bytes();
  return bytes;
}

void TrainingWorker::Impl::RegisterMetrics() {
  prometheus::Registry& r = chassis->registry();
  const std::string role = RoleLabel(options.role), rank = std::to_string(options.rank);
  const prometheus::Labels labels = {{"role", role}, {"rank", rank}};
  // Compute, wait, bubble and recompute also carry the worker's pipeline
  // stage within its module (a function of the rank: no new series), so a
  // dashboard sums them by stage.
  const prometheus::Labels staged = {
      {"role", role}, {"rank", rank}, {"stage", std::to_string(pos.pp)}};
  iterations = &prometheus::BuildCounter()
                    .Name("loom_worker_iterations_total")
                    .Help("Training iterations this worker finished.")
                    .Register(r)
                    .Add(labels);
  memory_predicted_bytes = &prometheus::BuildGauge()
                                .Name("loom_worker_memory_predicted_bytes")
                                .Help(
                                    "What the memory model (runtime/model/memory.h) predicts "
                                    "this worker holds at the largest microbatch it has run.")
                                .Register(r)
                                .Add(labels);
  memory_measured_bytes = &prometheus::BuildGauge()
                               .Name("loom_worker_memory_measured_bytes")
                               .Help(
                                   "What this worker measured: on the CPU its peak resident set "
                                   "over the one before its model; on a GPU its backend's peak.")
                               .Register(r)
                               .Add(labels);
  optimizer_state_bytes = &prometheus::BuildGauge()
                               .Name("loom_worker_optimizer_state_bytes")
                               .Help(
                                   "Bytes of AdamW moments this worker holds (1/DP of its "
                                   "module's under job.optimizer.shard).")
                               .Register(r)
                               .Add(labels);
  skipped_steps = &prometheus::BuildCounter()
                       .Name("loom_worker_skipped_steps_total")
                       .Help(
                           "Iterations whose loss or gradient norm was not finite: no "
                           "optimizer step (train.max_skipped_steps).")
                       .Register(r)
                       .Add(labels);
  compute_seconds = &prometheus::BuildCounter()
                         .Name("loom_worker_compute_seconds_total")
                         .Help("Time spent computing forward, backward and recompute.")
                         .Register(r)
                         .Add(staged);
  wait_seconds = &prometheus::BuildCounter()
                      .Name("loom_worker_wait_seconds_total")
                      .Help("Time spent waiting for peers' tensors and collectives.")
                      .Register(r)
                      .Add(staged);
  bubble_seconds = &prometheus::BuildCounter()
                        .Name("loom_worker_bubble_seconds_total")
                        .Help(
                            "Idle time of this pipeline stage between its first forward and "
                            "its last backward of each iteration (the pipeline bubble).")
                        .Register(r)
                        .Add(staged);
  recompute_seconds = &prometheus::BuildCounter()
                           .Name("loom_worker_recompute_seconds_total")
                           .Help(
                               "Time spent running forwards again before their backward "
                               "(part of compute).")
                           .Register(r)
                           .Add(staged);
  ucx_sent = &prometheus::BuildCounter()
                  .Name("loom_worker_ucx_sent_bytes_total")
                  .Help("Bytes this worker sent over UCX (embeddings, gradients).")
                  .Register(r)
                  .Add(labels);
  ucx_send_errors = &prometheus::BuildCounter()
                         .Name("loom_worker_ucx_send_failures_total")
                         .Help(
                             "UCX sends of this worker that failed (the receiver gone, or past "
                             "the send timeout).")
                         .Register(r)
                         .Add(labels);
  ucx_received = &prometheus::BuildCounter()
                      .Name("loom_worker_ucx_received_bytes_total")
                      .Help("Bytes this worker received over UCX (samples, embeddings, gradients).")
                      .Register(r)
                      .Add(labels);
  data_stall_seconds = &prometheus::BuildCounter()
                            .Name("loom_worker_data_stall_seconds_total")
                            .Help(
                                "Time the training loop waited for its next iteration's "
                                "assignment and samples (includes a paused job).")
                            .Register(r)
                            .Add(labels);
  iteration_seconds = &prometheus::BuildHistogram()
                           .Name("loom_worker_iteration_seconds")
                           .Help("Wall time of one training iteration on this worker.")
                           .Register(r)
                           .Add(labels, prometheus::Histogram::BucketBoundaries{
                                            0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30});
}

absl::StatusOr<IterationData> TrainingWorker::Impl::Fetch(int64_t iteration, bool validation) {
  IterationData d;
  d.iteration = iteration;
  d.validation = validation;
  absl::StatusOr<scheduler::v1::GetAssignmentResponse> a =
      scheduler->GetAssignment(iteration, validation);
  if (!a.ok()) return a.status();
  if (!a->job_ended().empty()) {
    d.job_ended = a->job_ended();
    return d;
  }
  if (a->has_regroup()) {
    return absl::AbortedError(absl::StrCat("generation ", scheduler->generation(),
                                           " is over: the job recovers in place"));
  }
  d.assignment = std::move(*a->mutable_assignment());
  const auto& bins = d.assignment.bins();
  for (int b = 0; b < bins.size(); ++b) {
    const int rank = encoder     ? bins[b].encoder_rank()
                     : generator ? bins[b].generator_rank()
                                 : bins[b].llm_rank();
    if (rank == pos.dp) d.bins.push_back(b);
  }
  // Encoder: slot by slot (each slot's bins feed the LLM ranks' same
  // microbatch), LLM: its own order.
  std::stable_sort(d.bins.begin(), d.bins.end(), [&](int x, int y) {
    return std::make_pair(bins[x].microbatch(), bins[x].llm_rank()) <
           std::make_pair(bins[y].microbatch(), bins[y].llm_rank());
  });
  std::vector<int> indices;
  for (int b : d.bins)
    indices.insert(indices.end(), bins[b].indices().begin(), bins[b].indices().end());
  if (absl::Status s = ResolvePeers(d); !s.ok()) return s;
  if (indices.empty()) return d;
  // Only the encoder's first stage reads pixels, and only the generator the
  // output images; every other rank needs the tokens and tile counts
  // (shapes, image positions, targets).
  absl::StatusOr<std::vector<Sample>> samples =
      data->FetchSamples(iteration, indices, /*tokens_only=*/!(encoder && first_stage()),
                         validation, /*output_images=*/generator);
  if (!samples.ok()) return samples.status();
  for (size_t k = 0; k < indices.size(); ++k) d.samples[indices[k]] = std::move((*samples)[k]);
  return d;
}

absl::Status TrainingWorker::Impl::JobSum(double* v, int n) {
  auto module_sum = [&]() -> absl::Status {
    for (Communicator* c : {dp_comm.get(), pp_comm.get(), tp_comm.get()}) {
      if (c == nullptr || c->size() == 1) continue;
      if (absl::Status s = c->AllreduceSum(v, n); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  if (absl::Status s = module_sum(); !s.ok()) return s;
  if (bridge_comm != nullptr) {
    if (absl::Status s = bridge_comm->AllreduceSum(v, n); !s.ok()) return s;
  }
  if (options.rank != 0) std::fill(v, v + n, 0.0);  // rank 0 alone hands the total out
  return module_sum();
}

absl::Status TrainingWorker::Impl::Validate(int64_t step, double* loss_sum, int64_t* loss_tokens,
                                            double gen[2]) {
  const auto t0 = Clock::now();
  double sum = 0, gen_sum = 0, gen_images = 0;
  int64_t tokens_of_loss = 0;
  for (int b = 0; b < ValidationBatches(job); ++b) {
    absl::StatusOr<IterationData> d = Fetch(b, /*validation=*/true);
    if (!d.ok()) return d.status();
    if (!d->job_ended.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("validation batch ", b, ": ", d->job_ended));
    }
    double compute = 0, wait = 0, bubble = 0, batch_loss = 0, tokens = 0, samples = 0;
    double gen_loss = 0, images = 0;
    int64_t lt = 0;
    scheduler::v1::ReportTimingsRequest timings;  // not the cost model's: nothing steps
    absl::Status s = encoder ? EncoderIteration(*d, &compute, &wait, &bubble, &timings)
                     : generator
                         ? GeneratorIteration(*d, &compute, &wait, &timings, &gen_loss, &images)
                         : LlmIteration(*d, &compute, &wait, &bubble, &timings, &batch_loss,
                                        &tokens, &samples, &lt);
    if (!s.ok())
      return absl::Status(s.code(), absl::StrCat("validation batch ", b, ": ", s.message()));
    if (pos.tp == 0 && last_stage()) sum += batch_loss;
    if (pos.tp == 0 && last_stage()) gen_sum += gen_loss, gen_images += images;
    tokens_of_loss += lt;
  }
  double total[3] = {encoder || generator ? 0.0 : sum, gen_sum, gen_images};
  if (absl::Status s = JobSum(total, 3); !s.ok()) return s;
  *loss_sum = total[0];
  gen[0] = total[1];
  gen[1] = total[2];
  *loss_tokens = tokens_of_loss;
  LOOM_LOG(INFO)
          .With("step", step)
          .With("batches", ValidationBatches(job))
          .With("seconds", Since(t0))
      << "validation pass";
  return absl::OkStatus();
}

absl::Status TrainingWorker::Impl::RunIteration(const IterationData& d) {
  const auto t0 = Clock::now();
  const int64_t step = d.iteration + 1;
  double compute = 0, wait = 0, bubble = 0, loss_sum = 0, tokens = 0, samples = 0;
  int64_t loss_tokens = 0;
  scheduler::v1::ReportTimingsRequest timings;
  timings.set_role(options.role);
  timings.set_rank(pos.dp);
  timings.set_iteration(d.iteration);
  for (ParamSet* p : sets) p->ZeroGrad();
  InjectFault("forward", d.iteration);
  double gen_loss = 0, images = 0;
  absl::Status s = encoder ? EncoderIteration(d, &compute, &wait, &bubble, &timings)
                   : generator
                       ? GeneratorIteration(d, &compute, &wait, &timings, &gen_loss, &images)
                       : LlmIteration(d, &compute, &wait, &bubble, &timings, &loss_sum, &tokens,
                                      &samples, &loss_tokens);
  if (!s.ok()) return s;

  const bool poison = InjectFault("allreduce", d.iteration);
  const auto w0 = Clock::now();
  const double a0 = trace::NowMicros();
  for (ParamSet* p : sets) {
    if (p->frozen()) continue;  // no gradients (the same on every rank)
    // Reduced where the optimizer steps: on the device (NCCL; nothing to do
    // under DP 1), or brought down to the host and reduced there. A sharded
    // optimizer needs its own chunk summed alone (a reduce-scatter).
    const bool scatter = p->optimizer_sharded();
    if (nccl_dp != nullptr) {
      s = scatter ? nccl_dp->ReduceScatterSum(p->placed_grads(), p->size())
                  : nccl_dp->AllreduceSum(p->placed_grads(), p->size());
      if (!s.ok()) return s;
      if (!p->optimizer_on_device()) p->PullGrads();
      continue;
    }
    if (p->optimizer_on_device()) continue;
    p->PullGrads();
    s = scatter ? dp_comm->ReduceScatterSum(p->grads().data(), p->size())
                : dp_comm->AllreduceSum(p->grads().data(), p->size());
    if (!s.ok()) return s;
  }
  // Σ g² of each module from DP replica 0 (replicas hold equal gradients),
  // or under a sharded optimizer from every replica's own chunk; each
  // stage's TP ranks their own slices and TP rank 0 what they hold whole;
  // the loss, tokens and samples from each LLM replica's last stage, its
  // first TP rank.
  double sq = 0;
  for (size_t i = 0; i < sets.size(); ++i) {
    ParamSet& p = *sets[i];
    if (set_tp[i] == nullptr && pos.tp != 0) continue;
    if (p.optimizer_sharded()) {
      sq += p.OwnedGradSumOfSquares(ops, p.optimizer_begin(), p.optimizer_end());
    } else if (pos.dp == 0) {
      sq += p.OwnedGradSumOfSquares(ops, 0, p.size());
    }
  }
  if (poison) {  // LOOM_FAULTS nan: this rank's gradients, and so the norm, turn NaN
    for (ParamSet* p : sets) {
      if (!p->frozen() && p->size() > 0) p->grads()[0] = std::nanf("");
    }
    sq = std::nan("");
  }
  const bool counts = pos.tp == 0 && last_stage();
  // Σ g² of the encoder and generator, of the LLM; the LM loss, tokens,
  // samples; the generation loss and the output images.
  double scalars[7] = {encoder || generator ? sq : 0.0,
                       encoder || generator ? 0.0 : sq,
                       counts ? loss_sum : 0.0,
                       counts ? tokens : 0.0,
                       counts ? samples : 0.0,
                       generator && counts ? gen_loss : 0.0,
                       generator && counts ? images : 0.0};
  if (s = JobSum(scalars, 7); !s.ok()) return s;
  wait += Since(w0);
  Span("allreduce", a0, d.iteration, "allreduce gradients");
  const double o0 = trace::NowMicros();
  const double grad_norm = std::sqrt(scalars[0] + scalars[1]);
  const double generation_loss = scalars[6] > 0 ? scalars[5] / scalars[6] : 0.0;
  // Every rank holds the job's sums now, so every rank decides alike (the
  // LM loss's sum: the same finiteness as its mean).
  const bool skipped = !StepIsFinite(scalars[2] + generation_loss, grad_norm);
  double lr = 0;
  if (skipped) {
    skipped_steps->Increment();
    LOOM_LOG(WARNING).With("step", step).With("grad_norm", grad_norm)
        << "non-finite loss or gradient norm: no optimizer step";
  } else {
    lr = OptimizerStep(sets, modules, train, step, grad_norm, ops);
    for (ParamSet* p : sets) {
      if (p->frozen()) continue;
      // Each rank stepped its chunk alone: the others' come from them, where
      // they were stepped.
      if (p->optimizer_sharded()) {
        s = p->optimizer_on_device() ? nccl_dp->AllGather(p->optimizer_data(), p->size())
                                     : dp_comm->AllGather(p->data().data(), p->size());
        if (!s.ok()) return s;
      }
      p->WeightsStepped(ops);  // the stepped weights where the layers read them
    }
  }
  Span("optimizer", o0, d.iteration, "optimizer");
  if (!trace_path.empty()) {
    if (absl::Status t = trace::AppendLine(trace_path, spans); !t.ok()) {
      LOOM_LOG(WARNING).With("error", std::string(t.message())) << "trace: stopped writing";
      trace_path.clear();
    }
    spans.Clear();
  }

  iterations->Increment();
  optimizer_state_bytes->Set(static_cast<double>(OptimizerStateBytes()));
  ReportMemory(/*log=*/!memory_logged);  // after this process's first iteration
  memory_logged = true;
  compute_seconds->Increment(compute);
  wait_seconds->Increment(wait);
  bubble_seconds->Increment(bubble);
  const UcxWorker::Stats st = ucx->stats();
  ucx_sent->Increment(static_cast<double>(st.bytes_sent - ucx_sent_seen));
  ucx_received->Increment(static_cast<double>(st.bytes_received - ucx_received_seen));
  ucx_send_errors->Increment(static_cast<double>(st.send_errors - ucx_send_errors_seen));
  ucx_send_errors_seen = st.send_errors;
  ucx_sent_seen = st.bytes_sent;
  ucx_received_seen = st.bytes_received;
  // The replica's timings, summed over its stages; not those of the first
  // iteration this process runs (allocations, page faults and cold caches
  // make it several times slower than the rest).
  if (pos.tp == 0 && first_stage() && d.iteration > start_iteration) {
    StallWatch::Waiting waiting(stall.get());
    if (absl::Status r = scheduler->ReportTimings(timings); !r.ok()) {
      LOOM_LOG(WARNING).With("error", std::string(r.message())) << "timing report failed";
    }
  }
  const double seconds = Since(t0);
  iteration_seconds->Observe(seconds);
  stall->IterationDone(absl::Seconds(seconds));
  // A held-out loss after every data.validation.every steps (on every rank:
  // its batches cross the same stages and modules), not in the step's time.
  double validation_sum = 0, validation_gen[2] = {0, 0};
  int64_t validation_tokens = 0;
  const int every = job.data().validation().every();
  const bool validate = ValidationBatches(job) > 0 && every > 0 && step % every == 0;
  if (validate) {
    if (s = Validate(step, &validation_sum, &validation_tokens, validation_gen); !s.ok()) return s;
  }
  if (!encoder && !generator && options.rank == 0) {
    scheduler::v1::StepReport report;
    report.set_iteration(d.iteration);
    report.set_loss(scalars[2] / static_cast<double>(loss_tokens));
    report.set_samples(static_cast<int64_t>(scalars[4]));
    report.set_tokens(static_cast<int64_t>(scalars[3]));
    report.set_loss_tokens(loss_tokens);
    report.set_grad_norm(grad_norm);
    report.set_lr(lr);
    report.set_seconds(seconds);
    report.set_microbatch_imbalance(d.assignment.summary().objective());
    report.set_skipped(skipped);
    if (scalars[6] > 0) {
      report.set_generation_loss(generation_loss);
      report.set_output_images(static_cast<int64_t>(scalars[6]));
    }
    if (validate && validation_tokens > 0) {
      report.set_validation_loss(validation_sum / static_cast<double>(validation_tokens));
      report.set_validation_loss_tokens(validation_tokens);
      if (validation_gen[1] > 0) {
        report.set_validation_generation_loss(validation_gen[0] / validation_gen[1]);
        report.set_validation_output_images(static_cast<int64_t>(validation_gen[1]));
      }
    }
    StallWatch::Waiting waiting(stall.get());
    if (s = scheduler->ReportStep(report); !s.ok()) return s;
  }
  // The scheduler marks the iterations a checkpoint follows (checkpoint.every
  // or a CheckpointJob).
  if (d.assignment.checkpoint()) return Checkpoint(step);
  return absl::OkStatus();
}

TrainingWorker::TrainingWorker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

// Never destroys the state under a running thread: it waits for the thread
// (a stop request cancels its waits, collectives included).
TrainingWorker::~TrainingWorker() {
  if (!thread_.joinable()) return;
  RequestStop();
  thread_.join();
}

absl::StatusOr<std::unique_ptr<TrainingWorker>> TrainingWorker::Start(
    Chassis* chassis, const TrainingWorkerOptions& options) {
  if (options.role != common::v1::ROLE_ENCODER_WORKER &&
      options.role != common::v1::ROLE_LLM_WORKER &&
      options.role != common::v1::ROLE_GENERATOR_WORKER) {
    return absl::InvalidArgumentError(
        "a training worker is an encoder, an LLM or a generator worker");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->chassis = chassis;
  impl->encoder = options.role == common::v1::ROLE_ENCODER_WORKER;
  impl->generator = options.role == common::v1::ROLE_GENERATOR_WORKER;
  absl::StatusOr<std::unique_ptr<UcxWorker>> u = UcxWorker::Create();
  if (!u.ok()) return u.status();
  impl->ucx = std::move(*u);
  std::unique_ptr<TrainingWorker> w(new TrainingWorker(std::move(impl)));
  w->thread_ = std::thread([p = w.get()] { p->Run(); });
  return w;
}

void TrainingWorker::Run() {
  Impl& m = *impl_;
  absl::Status result = m.Register();
  if (result.ok()) result = m.Join();
  if (!result.ok()) {
    m.ReleaseDevice();
    Finish(absl::Status(result.code(), absl::StrCat("cannot join the job: ", result.message())));
    return;
  }
  m.RegisterMetrics();
  std::thread watcher([&m] { m.WatchGeneration(); });
  for (;;) {
    result = Train();
    if (result.ok() || m.stop.load()) break;
    // Samples that do not fit the model come back after any regroup (it
    // rolls back to them): this worker ends, as its replacement would.
    if (IsSampleMisfit(result)) break;
    // A peer lost (the scheduler raises the generation; every survivor
    // regroups and rolls back to its checkpoint), or this worker's own failure.
    // A regroup cut short by a newer loss (its rendezvous cancelled) waits
    // for that generation in turn.
    bool regrouped = false;
    while (!regrouped && !m.stop.load()) {
      absl::StatusOr<scheduler::v1::Regroup> g = m.AwaitRegroup();
      if (!g.ok()) break;
      LOOM_LOG(WARNING)
              .With("error", std::string(result.message()))
              .With("generation", g->generation())
              .With("start_iteration", g->start_iteration())
          << "the job recovers in place: regrouping";
      absl::Status s = m.Regroup(*g);
      regrouped = s.ok();
      if (!regrouped) {
        result = absl::Status(s.code(), absl::StrCat("cannot regroup: ", s.message()));
      }
    }
    if (!regrouped) break;
  }
  if (!result.ok()) Announce(result);
  m.watching.store(false);
  watcher.join();
  m.ReleaseDevice();
  Finish(result);
  // The job is over for this worker: its workload ends with it.
  if (result.ok() && !m.stop.load() && m.options.exit_on_job_end) {
    if (absl::Status s = m.scheduler->ReportDone(m.options.role, m.options.rank); !s.ok()) {
      LOOM_LOG(WARNING).With("error", std::string(s.message())) << "ReportDone";
    }
    LOOM_LOG(INFO) << "the job ended: exiting (--exit_on_job_end)";
    StopProcessSoon(absl::ZeroDuration());
  }
}

absl::Status TrainingWorker::Train() {
  Impl& m = *impl_;
  absl::Status result;
  LOOM_LOG(INFO).With("start_iteration", m.start_iteration).With("end", m.job.train().steps())
      << "training";
  std::future<absl::StatusOr<IterationData>> next =
      std::async(std::launch::async, [&m, i = m.start_iteration] { return m.Fetch(i); });
  for (int64_t i = m.start_iteration; !m.stop.load(); ++i) {
    const absl::Time waiting = absl::Now();
    m.stall->Wait();
    absl::StatusOr<IterationData> d = next.get();
    m.stall->Work("step");
    m.data_stall_seconds->Increment(absl::ToDoubleSeconds(absl::Now() - waiting));
    if (!d.ok()) {
      result = d.status();
      break;
    }
    if (!d->job_ended.empty()) {  // the scheduler's explicit end (past the last, or stopped)
      LOOM_LOG(INFO).With("reason", d->job_ended) << "job ended";
      break;
    }
    next = std::async(std::launch::async, [&m, i] { return m.Fetch(i + 1); });  // overlaps
    if (absl::Status s = m.RunIteration(*d); !s.ok()) {
      result = absl::Status(s.code(), absl::StrCat("iteration ", i, ": ", s.message()));
      break;
    }
  }
  if (!result.ok()) {
    // Make the prefetch give up instead of waiting out its deadlines; the
    // scheduler calls work again for the regroup.
    m.cancel.store(true);
    m.ucx->Cancel();
  }
  if (result.ok() && m.ops != nullptr && (m.max_tokens > 0 || m.max_tiles > 0)) {
    m.ReportMemory(/*log=*/true);
  }
  // The last checkpoint is written (and reported) before training ends; a
  // failed iteration waits for it too, before any regroup (which may mark
  // its step again). A write that failed fails a run that had not.
  m.stall->Work("checkpoint");
  if (absl::Status w = m.AwaitCheckpointWrite(); result.ok() && !m.stop.load()) result = w;
  m.stall->Wait();
  if (next.valid()) next.wait();
  if (!m.stop.load()) m.cancel.store(false);
  return result;
}

void TrainingWorker::Announce(const absl::Status& result) {
  Impl& m = *impl_;
  if (m.stop.load() || announced_.exchange(true)) return;
  LOOM_LOG(ERROR).With("error", std::string(result.message())) << "training failed; stopping";
  kill(getpid(), SIGTERM);  // the chassis stops the process; main reports the error
}

void TrainingWorker::Finish(absl::Status result) {
  Impl& m = *impl_;
  // Once asked to stop, a failed call means a peer stopped first; unless the
  // stop is this worker's own failure (Announce raised the SIGTERM).
  if (m.stop.load() && !announced_.load()) result = absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    status_ = result;
  }
  if (result.ok()) {
    LOOM_LOG(INFO) << "training finished";
  } else {
    Announce(result);
  }
  finished_.store(true);
}

void TrainingWorker::RequestStop() {
  impl_->stop.store(true);
  impl_->cancel.store(true);
  absl::MutexLock lock(&impl_->generation_mu);  // a regroup clears no stop's cancellation
  impl_->ucx->Cancel();
  impl_->collectives.Cancel();
}

absl::Status TrainingWorker::Stop(absl::Duration wait) {
  if (!thread_.joinable()) return status();
  RequestStop();
  const absl::Time until = absl::Now() + wait;
  while (!finished_.load() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
  if (!finished_.load()) {
    // Blocked past the cancellation (a computation, a call with its own
    // deadline): it ends later. The thread stays joinable (the destructor waits for it); a
    // process that cannot wait exits without destroying it (worker_main).
    return absl::DeadlineExceededError("the training thread did not stop in time");
  }
  thread_.join();
  return status();
}

absl::Status TrainingWorker::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

}  // namespace loom
