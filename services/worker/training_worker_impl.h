// The state of one training worker (training_worker.h) and what its
// source files share: training_worker.cc connects, fetches, steps and
// checkpoints; training_worker_stages.cc runs one iteration's pipeline
// stages (forward, backward, the tensors between stages and modules);
// training_worker_recovery.cc regroups under a new job generation.
// Internal to services/worker.
#ifndef LOOM_SERVICES_WORKER_TRAINING_WORKER_IMPL_H_
#define LOOM_SERVICES_WORKER_TRAINING_WORKER_IMPL_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "loom/scheduler/v1/scheduler.pb.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "runtime/backends/cuda/nccl_communicator.h"
#include "runtime/base/trace.h"
#include "runtime/comm/collective.h"
#include "runtime/comm/ucx.h"
#include "runtime/hf/pretrained.h"
#include "runtime/model/memory.h"
#include "runtime/model/model.h"
#include "runtime/model/ops.h"
#include "runtime/parallel/grid.h"
#include "runtime/tensor/buffer.h"
#include "runtime/train/trainer.h"
#include "services/common/chassis.h"
#include "services/preprocess/data_client.h"
#include "services/worker/fault_injection.h"
#include "services/worker/scheduler_client.h"
#include "services/worker/stall_watch.h"
#include "services/worker/training_worker.h"

namespace loom {
namespace worker {

using Clock = std::chrono::steady_clock;

inline double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Worker-to-worker UCX tags: bit 63 set (the data client's tags never have
// it), bits 59-62 what travels (bit 62: of a validation batch), then the
// job's generation (its low 8 bits:
// a message an older generation sent never matches a newer one's receive),
// the iteration (27 bits), the bin and the stage that receives it (the
// stage within its module).
enum class Transfer : uint64_t {
  kEmbeddings = 0,       // last encoder stage -> first LLM stage
  kEmbeddingGrads = 1,   // first LLM stage -> last encoder stage
  kActivations = 2,      // a stage -> the next stage of its module
  kActivationGrads = 3,  // a stage -> the previous stage of its module
  kQueryStates = 4,      // last LLM stage -> the generator: the query positions' hidden states
  kQueryGrads = 5,       // the generator -> last LLM stage: their gradient
};
inline constexpr int kTransferKinds = 6;
inline constexpr uint64_t kValidationTransfer = 8;  // or-ed in: a validation batch's tensors
// What travels, validation aside.
inline Transfer TransferKind(Transfer t) {
  return static_cast<Transfer>(static_cast<uint64_t>(t) & 7);
}
inline const char* TransferName(Transfer t) {
  static const char* const kNames[] = {"embeddings",       "embedding grads", "activations",
                                       "activation grads", "query states",    "query grads"};
  return kNames[static_cast<int>(TransferKind(t))];
}
inline constexpr int kMaxTagBins = 1 << 16, kMaxTagStages = 1 << 8;
inline uint64_t TransferTag(Transfer t, int64_t generation, int64_t iteration, int bin, int stage) {
  return (uint64_t{1} << 63) | (static_cast<uint64_t>(t) << 59) |
         ((static_cast<uint64_t>(generation) & 0xff) << 51) |
         ((static_cast<uint64_t>(iteration) & ((uint64_t{1} << 27) - 1)) << 24) |
         (static_cast<uint64_t>(bin) << 8) | static_cast<uint64_t>(stage);
}

// The tag a transfer travels under: TransferTag keyed by the generation's
// data-plane key (data_key.h), so that only the workers loom-scheduler
// registered in this generation can address each other's receives.
inline uint64_t WireTag(const SchedulerClient& scheduler, Transfer t, int64_t iteration, int bin,
                        int stage) {
  const SchedulerClient::Generation g = scheduler.generation_and_key();
  return g.key.Tag(TransferTag(t, g.generation, iteration, bin, stage));
}

// A tensor received for this rank: in host memory (UCX), or over NCCL in
// the device's.
struct Received {
  std::vector<float> host;
  Buffer<float> device;
};

// One iteration's inputs, fetched ahead of time.
struct IterationData {
  int64_t iteration = 0;  // or, for a validation batch, its index
  bool validation = false;
  // `t` as this iteration's tensors travel: a validation batch's under
  // their own tags, apart from any training iteration's.
  Transfer T(Transfer t) const {
    return validation ? static_cast<Transfer>(static_cast<uint64_t>(t) | kValidationTransfer) : t;
  }
  std::string job_ended;  // non-empty: there is no such iteration (why); nothing else is set
  scheduler::v1::Assignment assignment;
  std::vector<int> bins;          // this rank's bins, in compute order
  std::map<int, Sample> samples;  // by global-batch index
};

}  // namespace worker

struct TrainingWorker::Impl {
  TrainingWorkerOptions options;
  Chassis* chassis = nullptr;
  bool encoder = false;
  bool generator = false;  // a generator rank (encoder is false too)
  job::v1::JobConfig job;
  scheduler::v1::Plan plan;
  ModelConfig model;
  Frozen frozen;  // the job's: frozen sets hold no gradients (ParamSet::Freeze)
  TrainOptions train;
  int64_t start_iteration = 0;
  std::string checkpoint_step_dir;  // the generation's start ("": the seed)
  hf::PretrainedModel pretrained;   // the job's model (config, Hugging Face files)
  // The module's ops on the job's device.encoder or device.llm: CpuOps(),
  // or CUDA's, made at the first Join on the training thread (the thread
  // CudaOps serves). Declared before everything that holds their memory.
  std::unique_ptr<Ops> device_ops;
  Ops* ops = nullptr;
  int device_index = -1;  // ParseDevice's: -1 the CPU
  // Host staging: UCX and the groups move host memory. On a device, the
  // modules' inputs and outputs pass through these buffers of ops' memory
  // (the modules copy their inputs, so one per role serves every
  // microbatch); on the CPU the host vectors are the modules' own memory.
  enum Slot {
    kStageIn,
    kStageOut,
    kStageEmb,
    kStageGrad,
    kStageDvit,
    kStageDin,
    kStageQuery,
    kStageSlots
  };
  Buffer<float> staged[kStageSlots];
  bool on_host() const { return ops->backend()->device().type == DeviceType::kCpu; }
  // `host` in ops' memory: its own data on the CPU, else a copy in `slot`.
  const float* Stage(const std::vector<float>& host, Slot slot) {
    if (on_host()) return host.data();
    staged[slot].CopyFromHost(host.data(), host.size());
    return staged[slot].data();
  }
  float* Stage(std::vector<float>* host, Slot slot) {
    Stage(*host, slot);
    return Staged(host, slot);
  }
  // Room for an output the size of `host` (contents unspecified): `host`
  // itself on the CPU, else `slot`.
  float* Room(std::vector<float>* host, Slot slot) {
    if (on_host()) return host->data();
    staged[slot].resize(host->size());
    return staged[slot].data();
  }
  // Where Stage or Room put `host`; after the op, Unstage brings `slot`
  // back into `host` (nothing to do on the CPU).
  float* Staged(std::vector<float>* host, Slot slot) {
    return on_host() ? host->data() : staged[slot].data();
  }
  void Unstage(std::vector<float>* host, Slot slot) {
    if (!on_host()) *host = staged[slot].ToHost();
  }
  // The generation this worker trains in; the watcher cancels UCX waits
  // under this lock only when the scheduler's is newer.
  absl::Mutex generation_mu;
  int64_t generation ABSL_GUARDED_BY(generation_mu) = 0;
  std::atomic<bool> watching{true};

  std::unique_ptr<UcxWorker> ucx;
  std::unique_ptr<SchedulerClient> scheduler;
  std::unique_ptr<DataClient> data;
  // Both modules' grids (tp x pp x dp) and this worker's place in its own;
  // the other module's grid says where a bin's tensors go.
  parallel::GridShape encoder_grid, llm_grid;
  parallel::GridShape generator_grid{0, 0, 0};  // none without a generator
  parallel::GridPosition pos;
  // The TP group (null when tp is 1), the DP group (same TP position and
  // stage), the pipeline group (same TP position and replica, every stage;
  // null when pp is 1), and on each module's rank 0 only, the two-rank
  // bridge between the modules (JobSum).
  std::unique_ptr<Communicator> tp_comm, dp_comm, pp_comm, bridge_comm;
  // On a device, the TP and DP groups as the device's tensors use them:
  // NCCL communicators (device.collectives "nccl"; null where the group is
  // one rank), else the layers' TP group through host memory (staged_tp).
  // The Gloo groups above keep the host-side sums (JobSum). Null on the CPU.
  std::unique_ptr<Communicator> staged_tp, nccl_tp, nccl_dp;
  // Device-to-device tensors: with device.collectives "nccl", a module's
  // pipeline tensors (on a GPU), and the embeddings and their gradients
  // (both modules on GPUs), go over NCCL; else UCX through host memory.
  // A communicator per direction, by Transfer kind: this rank only sends on
  // nccl_send[k] and only receives on nccl_recv[k], so a queued send never
  // waits behind one of its receives (NcclCommunicator::SendAsync). Each
  // direction's messages are received in the order sent: a module's stages
  // run their bins in the same order, and the encoder sends slot by slot,
  // the order the LLM receives in. Pipeline links are two-rank groups
  // (the earlier stage rank 0); the bridge groups hold the encoder's last
  // stage (BridgeIndex) and the LLM's first.
  // The generator's query states and their gradients travel over UCX.
  std::unique_ptr<NcclCommunicator> nccl_send[worker::kTransferKinds],
      nccl_recv[worker::kTransferKinds];
  // The bytes of sends still queued, released at the iteration's end
  // (FinishDeviceSends).
  std::vector<Buffer<float>> nccl_sending;
  // A rank's place in the bridge groups: the encoder's last-stage ranks
  // first, then the LLM's first-stage ranks.
  int BridgeIndex(bool encoder_side, int dp, int tp) const {
    return encoder_side ? dp * encoder_grid.tp + tp
                        : encoder_grid.dp * encoder_grid.tp + dp * llm_grid.tp + tp;
  }
  // Connects the communicators above (DeviceGroups, every Join).
  // Makes the communicator of a group: its name, this rank's place, its size.
  using NcclConnect = std::function<absl::StatusOr<std::unique_ptr<NcclCommunicator>>(
      const std::string&, int, int)>;
  absl::Status ConnectDeviceTransfers(const std::string& module_name, const NcclConnect& nccl);
  absl::Status ConnectBridge(const NcclConnect& nccl);
  // Sends `n` floats at the start of device buffer `src` over
  // nccl_send[what] to `peer` of that group (a copy, queued).
  absl::Status SendOnDevice(worker::Transfer what, int peer, const Buffer<float>& src, size_t n,
                            int64_t iteration, int bin);
  // Waits for the queued sends and releases their bytes.
  absl::Status FinishDeviceSends();
  bool OverNccl(worker::Transfer what, bool sending) const {
    const auto k = static_cast<int>(worker::TransferKind(what));
    return (sending ? nccl_send[k] : nccl_recv[k]) != nullptr;
  }
  // A received tensor in ops' memory: its device buffer, or its host
  // vector staged in `slot`.
  const float* In(worker::Received& r, Slot slot) {
    return r.device.empty() ? Stage(r.host, slot) : r.device.data();
  }
  // Writes this rank's part of a checkpoint from its copy and reports it
  // (the training thread starts and joins it: AwaitCheckpointWrite).
  std::thread checkpoint_writer;
  absl::Status checkpoint_write_status;
  // The UCX addresses of this worker's pipeline neighbours (Join) and of
  // the other module's ranks its bins go to (Fetch, one iteration ahead).
  std::unique_ptr<PeerAddresses> peers;

  std::unique_ptr<VitEncoder> vit;
  std::unique_ptr<Projector> projector;  // on the encoder's last stage
  std::unique_ptr<Llm> llm;
  std::unique_ptr<Generator> gen;  // a generator rank's
  // The module's job.recompute: full recomputes a microbatch's forward
  // before its backward; none and selective keep each in-flight
  // microbatch's activations (SavedActivations) instead.
  Recompute recompute = Recompute::kFull;
  std::vector<ParamSet*> sets;
  std::vector<Module> modules;
  std::vector<std::string> set_names;  // each set's checkpoint name (kModuleNames, or the
                                       // generator's two: generator, generator_denoiser)
  std::vector<Communicator*> set_tp;   // each set's TP group (null: held whole)

  std::atomic<bool> stop{false};    // asked to stop (RequestStop)
  std::atomic<bool> cancel{false};  // stop or failure: waiting calls give up
  // Ends the groups' collectives and rendezvous in flight (a newer
  // generation, a stop): a survivor blocked with a peer across a partition
  // would otherwise wait out Gloo's timeout.
  Cancellation collectives;
  // The training thread's own work, watched for a hang (null before the job
  // is known); the generation watcher asks it.
  std::unique_ptr<StallWatch> stall;
  bool stalled = false;  // the watcher's: answering NOT_SERVING for a stall

  prometheus::Counter* iterations = nullptr;
  // Steps skipped (a non-finite loss or gradient norm: no optimizer step).
  prometheus::Counter* skipped_steps = nullptr;
  prometheus::Gauge* optimizer_state_bytes = nullptr;
  prometheus::Gauge* memory_predicted_bytes = nullptr;
  prometheus::Gauge* memory_measured_bytes = nullptr;
  prometheus::Counter* compute_seconds = nullptr;
  prometheus::Counter* wait_seconds = nullptr;
  prometheus::Counter* bubble_seconds = nullptr;
  prometheus::Counter* recompute_seconds = nullptr;
  prometheus::Counter* ucx_sent = nullptr;
  prometheus::Counter* ucx_received = nullptr;
  prometheus::Counter* ucx_send_errors = nullptr;
  prometheus::Counter* data_stall_seconds = nullptr;
  prometheus::Histogram* iteration_seconds = nullptr;
  int64_t ucx_sent_seen = 0, ucx_received_seen = 0, ucx_send_errors_seen = 0;

  // Registers with the scheduler (the job, the plan, this rank's place),
  // then joins the current generation: every worker's address, the groups
  // (rendezvous keys under the generation), the model and its weights (the
  // checkpoint the generation starts from, else the seed).
  absl::Status Register();
  scheduler::v1::Worker Me() const;  // this worker's registration
  absl::Status Join();
  // training_worker_device.cc: the module's Ops on the job's device (once,
  // at the first Join, on the training thread); then, each Join, the
  // communicators of the device's tensors (NCCL's, or the TP group through
  // host memory) and the TP group the layers take (null where tp is 1).
  absl::Status OpenDevice();
  absl::StatusOr<Communicator*> DeviceGroups(KeyValueStore* store, const std::string& module_name);
  // `c` with its waits counted by the stall watch.
  std::unique_ptr<Communicator> Watched(std::unique_ptr<Communicator> c);
  void RegisterMetrics();
  // A recovery in place: drops the groups, the models and anything in
  // flight, and joins generation `g` from its start.
  absl::Status Regroup(const scheduler::v1::Regroup& g);
  // The models and the communicators of the device's tensors (NCCL's, the
  // host-staged TP group): a regroup's start.
  void DropModels();
  // Those, the staging buffers and the device's Ops: at the training
  // thread's end, on that thread (CudaOps' and NCCL's rule) and while
  // `collectives` lives (NCCL's teardown waits under it).
  void ReleaseDevice();
  // Until training ends: asks the scheduler for its generation a few times
  // a lease and cancels this worker's UCX waits once it is newer.
  void WatchGeneration();
  // After a failed iteration: the newer generation the scheduler declares
  // within a lease (and a margin), else an error.
  absl::StatusOr<scheduler::v1::Regroup> AwaitRegroup();
  // `validation`: validation batch `iteration` (data.validation).
  absl::StatusOr<worker::IterationData> Fetch(int64_t iteration, bool validation = false);
  absl::Status RunIteration(const worker::IterationData& d);
  // The held-out loss after `step` (every rank runs every validation batch,
  // forward and backward through the iteration's own stages, and steps
  // nothing; the gradients are dropped by the next iteration's ZeroGrad):
  // on LLM rank 0 the job's loss sum and loss tokens, elsewhere zeros.
  // `gen` (a model with a generator): the generation loss's sum over the
  // held-out output images, and their count.
  absl::Status Validate(int64_t step, double* loss_sum, int64_t* loss_tokens, double gen[2]);
  // In place: v[i] = Σ over every worker of the job of v[i] (the global
  // norm, the loss), reduced over the module's own groups (DP, PP, TP: the
  // module's total), across the bridge, then handed back out over the same
  // groups from rank 0. No group spans the job: no rendezvous, key or ring
  // grows with the job's size.
  absl::Status JobSum(double* v, int n);
  // Bytes of AdamW moments in this worker's sets.
  int64_t OptimizerStateBytes() const;
  // The memory model against the measurement (issue 42 item 7): the
  // largest microbatch (LLM) or bin (encoder) this worker has run, and its
  // resident set before it built its modules.
  int64_t rss_before_model = -1;
  int64_t max_tokens = 0, max_image_tokens = 0, max_tiles = 0, max_gen_images = 0;
  int max_bins = 0;
  int64_t max_kept_tiles = 0;  // an encoder iteration's tiles over its bins
  bool memory_logged = false;
  // This rank's prediction at those sizes (runtime/model/memory.h), and
  // what it measured: on the CPU its peak resident set over the one before
  // the modules; on a GPU its backend's peak bytes.
  MemoryEstimate PredictedMemory() const;
  int64_t MeasuredMemory() const;
  void ReportMemory(bool log);
  // LOOM_FAULTS (fault_injection.h) for this rank; true: make the
  // gradients NaN (a nan entry).
  bool InjectFault(const char* phase, int64_t iteration) const {
    return MaybeInjectFault(RoleLabel(options.role), options.rank, phase, iteration);
  }
  // One iteration's stages. `compute` gets forward, backward and recompute
  // seconds, `wait` receives and collectives, `bubble` the idle part of the
  // span from the stage's first forward to its last backward.
  absl::Status EncoderIteration(const worker::IterationData& d, double* compute, double* wait,
                                double* bubble, scheduler::v1::ReportTimingsRequest* timings);
  absl::Status LlmIteration(const worker::IterationData& d, double* compute, double* wait,
                            double* bubble, scheduler::v1::ReportTimingsRequest* timings,
                            double* loss_sum, double* tokens, double* samples,
                            int64_t* loss_tokens);
  // A generator rank: each of its bins' output images, in slot order: the
  // query states from the bin's LLM replica, forward, backward (scale
  // λ / the global batch's output images), their gradient back.
  // `loss_sum` gets Σ over its images of their loss, `images` their count.
  // `timings` gets each bin's forward + backward seconds.
  absl::Status GeneratorIteration(const worker::IterationData& d, double* compute, double* wait,
                                  scheduler::v1::ReportTimingsRequest* timings, double* loss_sum,
                                  double* images);
  // Whether the LLM's last stage wants the query states' gradient: something
  // before the generator trains (the model's rule, MultimodalModel).
  bool QueryGradsWanted() const { return !frozen.llm || !frozen.encoder_side(); }

  absl::Status Checkpoint(int64_t step);
  // Waits for the background write of the previous checkpoint (if any) and
  // returns how it ended (its part written and reported).
  absl::Status AwaitCheckpointWrite();

  const char* ModuleLabel() const { return encoder ? "encoder" : generator ? "generator" : "LLM"; }
  const parallel::GridShape& grid() const {
    return encoder ? encoder_grid : generator ? generator_grid : llm_grid;
  }
  bool first_stage() const { return pos.pp == 0; }
  bool last_stage() const { return pos.pp == grid().pp - 1; }
  // The worker ranks of DP replica `dp`'s TP group in the other module, at
  // the stage that meets this module: the LLM's first, the encoder's last.
  std::vector<int> PeerGroup(int dp) const;
  // Across the generator's border: on a generator rank the LLM replica
  // `dp`'s last-stage TP ranks, on the LLM's last stage the generator
  // replica `dp`'s TP ranks.
  std::vector<int> GeneratorPeerGroup(int dp) const;
  // Sends `data` (kept alive until sent) across the generator's border to
  // every rank of replica `dp`'s group (GeneratorPeerGroup).
  absl::Status SendAcrossGenerator(worker::Transfer what, int64_t iteration, int bin, int dp,
                                   std::shared_ptr<std::vector<float>> data);
  // Asks loom-scheduler for the addresses iteration `d` sends to that this
  // worker does not know yet (the other module's ranks of its bins).
  absl::Status ResolvePeers(const worker::IterationData& d);
  // Sends `data` (kept alive until sent) to this rank's counterpart in the
  // next (`step` 1) or previous (-1) stage, tagged with that stage.
  absl::Status SendToStage(int step, worker::Transfer what, int64_t iteration, int bin,
                           std::shared_ptr<std::vector<float>> data);
  // Receives `n` floats tagged for this stage into `out`: over UCX into its
  // host vector, or over NCCL into its device buffer (from the previous or
  // next stage, or across the bridge from replica `from_dp`'s first TP rank
  // of the other module).
  absl::Status Receive(worker::Transfer what, int64_t iteration, int bin, size_t n, int from_dp,
                       worker::Received* out, double* wait);
  // Σ over the pipeline group of per-bin seconds (each stage's part of a
  // bin's time), so the first stage reports whole replicas' times, and each
  // stage's total into the report's stage_seconds (when pp > 1), and the
  // stages' totals into forward_seconds, recompute_seconds and
  // recomputed_forward_seconds.
  struct StageTotals {
    double forward = 0, recompute = 0, recomputed_forward = 0;
  };
  absl::Status SumOverStages(std::vector<double>* seconds, const StageTotals& totals, double* wait,
                             int64_t iteration, scheduler::v1::ReportTimingsRequest* timings);

  // With a trace directory (TrainingWorkerOptions::trace_dir): this
  // iteration's spans on this worker's track, appended to its file after
  // each iteration (runtime/base/trace.h).
  std::string trace_path;
  int trace_tid = 0;
  trace::v1::TraceFile spans;
  // A span from `start_us` to now named StrCat(name...); nothing (not even
  // the name) when not tracing.
  template <typename... Parts>
  void Span(const char* cat, double start_us, int64_t iteration, const Parts&... name) {
    if (trace_path.empty()) return;
    trace::AddSpan(&spans, absl::StrCat(name...), cat, trace::kMeasuredPid, trace_tid, start_us,
                   trace::NowMicros(), iteration);
  }
  // The input tiles of a bin, and their count.
  std::vector<float> Tiles(const worker::IterationData& d, const scheduler::v1::Bin& bin,
                           int* n) const;
  int TileCount(const worker::IterationData& d, const scheduler::v1::Bin& bin) const;
  // This stage's forward of encoder input `in` (n tiles, in ops' memory):
  // the ViT layers into `vit_out`, and on the last stage the projector into
  // `emb` (both also left in their staging slots, kStageOut and kStageEmb).
  absl::Status ForwardEncoder(const float* in, int n, std::vector<float>* vit_out,
                              std::vector<float>* emb);
};

}  // namespace loom

#endif  // LOOM_SERVICES_WORKER_TRAINING_WORKER_IMPL_H_
