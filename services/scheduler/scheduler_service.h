// loom-scheduler's gRPC service (scheduler::v1::SchedulerService): the job's
// fixed plan, the workers' rendezvous, each iteration's assignment (computed
// from the preprocess service's batch metadata with the cost model), and the
// timing reports that refit the cost model.
#ifndef LOOM_SERVICES_SCHEDULER_SCHEDULER_SERVICE_H_
#define LOOM_SERVICES_SCHEDULER_SCHEDULER_SERVICE_H_

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "loom/control/v1/control.pb.h"
#include "loom/data/v1/data.grpc.pb.h"
#include "loom/job/v1/job.pb.h"
#include "loom/scheduler/v1/scheduler.grpc.pb.h"
#include "runtime/checkpoint/steps.h"
#include "runtime/comm/data_key.h"
#include "runtime/model/config.h"
#include "runtime/scheduling/cost_model.h"
#include "services/common/chassis.h"
#include "services/common/rate_limiter.h"
#include "services/scheduler/step_log.h"
#include "services/scheduler/training_clock.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
}  // namespace prometheus

namespace loom {

struct SchedulerServiceOptions {
  scheduler::v1::Plan plan;  // fixed for the job; costs from the plan's coefficients
  std::string algorithm = "loom";
  std::string preprocess;        // host:port of loom-preprocess; empty: no assignments
  int retained_iterations = 16;  // assignments kept for fetches and timing reports
  // Iterations computed ahead of the newest one handed out (0 to
  // retained_iterations - 1), so GetAssignment finds them ready.
  int assign_ahead = 2;
  double ilp_seconds = 10;
  // The job workers train (defaults applied). Its checkpoint.dir holds the
  // coordinated checkpoints; train.steps ends the job (0: no end).
  job::v1::JobConfig job;
  // Resume: continue after the checkpoint of step `start_iteration` (the
  // iteration after it is numbered start_iteration); 0 starts fresh.
  int64_t start_iteration = 0;
  // The run the job's checkpoints belong to (runtime/checkpoint/steps.h):
  // a fresh job starts one, a resumed job continues the one it resumes.
  CheckpointRun run;
  // How long a GetAssignment for a new iteration of a paused job is held
  // (at most until a second before the caller's deadline) before it answers
  // UNAVAILABLE "paused" and the worker asks again.
  absl::Duration pause_hold = absl::Seconds(10);
  // Peak FLOP/s of all the job's worker devices together, the denominator
  // of loom_train_mfu_ratio; 0: the plan's gpu_peak_flops times its GPUs.
  double peak_flops = 0;
  // Non-empty: each iteration's simulated timeline is appended to
  // DIR/predicted.jsonl (runtime/base/trace.h; loom up --trace).
  std::string trace_dir;
  // Non-empty: every reported step goes to DIR/metrics.jsonl and DIR/
  // tensorboard's events file (step_log.h); loom-scheduler's --run_dir.
  std::string metrics_dir;
  // This job was restarted `restarts` times after failures (JobSpec), the
  // latest from `recovered_from`.
  int restarts = 0;
  control::v1::Recovery recovered_from;
  // The job as submitted and the file it is kept in (with the generation
  // reached) for a restarted scheduler to take it back; "" keeps nothing.
  control::v1::JobSpec spec;
  std::string state_file;
  int64_t generation = 0;  // the generation to start at
  // The plan's costs stand as they are (a measured profile's): timing
  // reports do not refit them, so each predicted timeline (trace_dir) is
  // the profile's prediction, and validation compares it with the run.
  bool fixed_costs = false;
};

// The longest one GetAssignment call waits for an iteration not computed yet
// before it answers UNAVAILABLE "...; retry" (the workers ask again): a batch
// slow to prepare costs time, not the job. Also the assignment thread's
// deadline for one GetBatch call (it asks again while the batch is not there).
inline constexpr absl::Duration kComputeHold = absl::Seconds(30);

// The lease thread's health probes in flight at once (scheduler_leases.cc).
inline constexpr int kMaxProbesInFlight = 64;

// Where a scheduler keeps its job: <run_dir>/scheduler_job.binpb.
std::string SchedulerJobFile(const std::string& run_dir);

// Thread-safe: gRPC calls its methods from many threads at once.
// GetGeneration is a callback method (a held long poll pins no thread);
// every other method is synchronous.
class SchedulerServiceImpl final
    : public scheduler::v1::SchedulerService::WithCallbackMethod_GetGeneration<
          scheduler::v1::SchedulerService::Service> {
 public:
  // `chassis` is not owned and must outlive this service. Until a job is
  // configured (Configure, or SubmitJob through the control API) the worker
  // RPCs answer FAILED_PRECONDITION.
  explicit SchedulerServiceImpl(Chassis* chassis);
  ~SchedulerServiceImpl() override;

  // A service with its job configured. INVALID_ARGUMENT: an unknown
  // algorithm, a plan without degrees.
  static absl::StatusOr<std::unique_ptr<SchedulerServiceImpl>> Create(
      Chassis* chassis, const SchedulerServiceOptions& options);

  // The job lifecycle behind loom.control.v1 (control_service.h). Configure
  // takes the one job this scheduler runs: FAILED_PRECONDITION when it holds
  // one already (ALREADY_EXISTS when it has the same name).
  absl::Status Configure(const SchedulerServiceOptions& options);
  // NOT_FOUND unless `job_id` names the job held.
  absl::StatusOr<control::v1::Job> GetJob(const std::string& job_id) const;
  // FAILED_PRECONDITION for a transition the state does not allow.
  absl::StatusOr<control::v1::Job> PauseJob(const std::string& job_id);
  absl::StatusOr<control::v1::Job> ResumeJob(const std::string& job_id);
  absl::StatusOr<control::v1::Job> CancelJob(const std::string& job_id, const std::string& reason);
  // The checkpoint is placed after the next iteration handed out; *step is its
  // step once placed (0 until then).
  absl::StatusOr<control::v1::Job> CheckpointJob(const std::string& job_id, int64_t* step);
  // Events with a sequence number above `after_seq` (each paired with its
  // number), waiting up to `wait` for one. Empty when nothing happened
  // within `wait`.
  std::vector<std::pair<int64_t, control::v1::JobEvent>> EventsAfter(int64_t after_seq,
                                                                     absl::Duration wait) const;
  // The job with the sequence number of the newest event it includes.
  absl::StatusOr<std::pair<int64_t, control::v1::Job>> Snapshot(const std::string& job_id) const;

  // What --exit_on_job_end waits for (services/common/job_end.h): whether
  // the job is final (FAILED among them), and how many of the plan's worker
  // ranks are done with it (ReportDone).
  struct JobEnd {
    bool final = false;
    bool failed = false;
    std::string job_id;
    std::string state;  // SUCCEEDED, CANCELLED, FAILED
    int done = 0;
    int ranks = 0;
  };
  JobEnd JobEndProgress() const;
  // Tells loom-preprocess that the job ended (its EndJob); OK once it
  // answered, or when this scheduler has no loom-preprocess.
  absl::Status EndPreprocess(const JobEnd& end);

  grpc::Status GetInfo(grpc::ServerContext* context, const scheduler::v1::GetInfoRequest* request,
                       scheduler::v1::GetInfoResponse* response) override;
  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const scheduler::v1::RegisterWorkerRequest* request,
                              scheduler::v1::RegisterWorkerResponse* response) override;
  grpc::Status GetPlan(grpc::ServerContext* context, const scheduler::v1::GetPlanRequest* request,
                       scheduler::v1::GetPlanResponse* response) override;
  grpc::Status GetWorkers(grpc::ServerContext* context,
                          const scheduler::v1::GetWorkersRequest* request,
                          scheduler::v1::GetWorkersResponse* response) override;
  grpc::Status GetAssignment(grpc::ServerContext* context,
                             const scheduler::v1::GetAssignmentRequest* request,
                             scheduler::v1::GetAssignmentResponse* response) override;
  // Answered at once, or held in held_polls_ (no thread waits for it) until
  // the generation changes, its time is up or it is cancelled.
  grpc::ServerUnaryReactor* GetGeneration(grpc::CallbackServerContext* context,
                                          const scheduler::v1::GetGenerationRequest* request,
                                          scheduler::v1::GetGenerationResponse* response) override;
  grpc::Status ReportTimings(grpc::ServerContext* context,
                             const scheduler::v1::ReportTimingsRequest* request,
                             scheduler::v1::ReportTimingsResponse* response) override;
  grpc::Status ReportStep(grpc::ServerContext* context,
                          const scheduler::v1::ReportStepRequest* request,
                          scheduler::v1::ReportStepResponse* response) override;
  grpc::Status GetProgress(grpc::ServerContext* context,
                           const scheduler::v1::GetProgressRequest* request,
                           scheduler::v1::GetProgressResponse* response) override;
  grpc::Status ReportCheckpoint(grpc::ServerContext* context,
                                const scheduler::v1::ReportCheckpointRequest* request,
                                scheduler::v1::ReportCheckpointResponse* response) override;
  grpc::Status ReportDone(grpc::ServerContext* context,
                          const scheduler::v1::ReportDoneRequest* request,
                          scheduler::v1::ReportDoneResponse* response) override;
  grpc::Status SetKey(grpc::ServerContext* context, const scheduler::v1::SetKeyRequest* request,
                      scheduler::v1::SetKeyResponse* response) override;
  grpc::Status GetKey(grpc::ServerContext* context, const scheduler::v1::GetKeyRequest* request,
                      scheduler::v1::GetKeyResponse* response) override;
  grpc::Status GetKeys(grpc::ServerContext* context, const scheduler::v1::GetKeysRequest* request,
                       scheduler::v1::GetKeysResponse* response) override;
  grpc::Status DeleteKeys(grpc::ServerContext* context,
                          const scheduler::v1::DeleteKeysRequest* request,
                          scheduler::v1::DeleteKeysResponse* response) override;
  // Keys in the rendezvous store, and their bytes (tests, metrics).
  std::pair<size_t, size_t> StoreSize() const;

 private:
  struct Computed {
    scheduler::v1::Assignment assignment;
    std::vector<sched::SampleShape> shapes;  // by batch index
    // The serialized data cursor after this batch (where a resume from step
    // iteration + 1 starts); empty from a loom-preprocess that sends none.
    std::string next_cursor;
  };

  // The assignment of `iteration` for a caller in `generation`; null with
  // `ended` set (no such iteration) or `regroup` set (that generation is over).
  // `deadline`: how long a paused job may hold the call; `compute_deadline`:
  // how long the caller waits for the iteration to be computed (then
  // UNAVAILABLE "...; retry"). Hands out computed iterations
  // (scheduler_assign.cc).
  // A batch's sample shapes (into `computed`), keys, loads under the cost
  // model as refitted now, and the plan with those costs.
  void LoadsOf(const data::v1::GetBatchResponse& batch, Computed* computed,
               std::vector<std::string>* keys, std::vector<sched::SampleLoad>* loads,
               scheduler::v1::Plan* plan) ABSL_LOCKS_EXCLUDED(mu_);
  // Validation batch `index`'s assignment (data.validation), computed by the
  // first caller from loom-preprocess's batch and kept for every pass; null
  // with `regroup` set when the caller's generation is over. UNAVAILABLE
  // "...; retry" past `deadline`.
  absl::StatusOr<std::shared_ptr<const Computed>> ValidationAssignment(
      int64_t index, int64_t generation, absl::Time deadline, scheduler::v1::Regroup* regroup);
  absl::StatusOr<std::shared_ptr<const Computed>> AssignmentFor(
      int64_t iteration, int64_t generation, absl::Time deadline, absl::Time compute_deadline,
      std::string* ended, scheduler::v1::Regroup* regroup);
  // The assignment thread: computes the iterations callers asked for and
  // assign_ahead beyond the newest handed out, in order, into ahead_ (or
  // compute_failed_) until the service closes.
  void AssignThread();
  // The next iteration the assignment thread computes; -1: none now.
  int64_t NextToComputeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads the batch of `iteration` from loom-preprocess and solves it.
  // *retry: the batch is not there yet, or a recovery (a newer generation
  // than `generation`) or the service's end abandoned it.
  absl::StatusOr<std::shared_ptr<Computed>> ComputeAssignment(int64_t iteration, int64_t generation,
                                                              bool* retry);
  // Moves ahead_[iteration] into the assignments handed out, placing a
  // checkpoint mark on it when one is due (mu_ is released while the step's
  // folder is made).
  absl::Status HandOutLocked(int64_t iteration) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The plan's cost coefficients with the stage shares of the workers'
  // layer split, or those checkpoint `step` saved (step > 0).
  // train.epochs as steps: floor(epochs x loom-preprocess's dataset size /
  // global batch), asked of loom-preprocess (which may still be starting).
  static absl::StatusOr<int64_t> StepsOfEpochs(const SchedulerServiceOptions& options);
  absl::StatusOr<scheduler::v1::CostCoefficients> StartingCosts(const scheduler::v1::Plan& plan,
                                                                const std::string& checkpoint_dir,
                                                                int64_t step) const;
  // Where the current generation starts.
  scheduler::v1::Regroup RegroupLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies RegroupLocked() to published_ and wakes the GetGeneration calls
  // held. Called wherever generation_, data_key_ or start_iteration_ change.
  void PublishRegroupLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FAILED_PRECONDITION unless `generation` is the current one.
  absl::Status CheckGenerationLocked(int64_t generation) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker was declared lost: a recovery in place (scheduler_leases.cc).
  void BeginRegroupLocked(common::v1::Role role, int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RECOVERING -> RUNNING once every worker is registered and
  // loom-preprocess answers again.
  void MaybeEndRegroupLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Job.restarts: the spec's, plus each recovery in place since.
  int RestartsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes options_.spec with the current generation, restarts and the
  // training clock to options_.state_file.
  void KeepJobLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Continues the clock of options_.spec.training_time, if it has one, from
  // the checkpoint the job starts after.
  void ContinueClockLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rolls loom-preprocess back to the generation's start once (on the
  // assignment thread).
  absl::Status RewindPreprocess();
  absl::Status Configured() const;
  absl::Status ValidateWorkerId(common::v1::Role role, int rank) const;
  // Writes the cursor and the scheduler's state (with `productive_before`,
  // the kept iterations' time before the step) into the step's folder, then
  // COMPLETE. Called once every worker of `generation` reported its part;
  // ABORTED (nothing committed) once a recovery ended that generation.
  absl::Status CompleteCheckpoint(int64_t step, int64_t generation, double productive_before);
  // The checkpoint thread: reads cursors and completes checkpoints
  // (checkpoint_work_, in order) until the service closes.
  void CheckpointThread();
  // The serialized data cursor before batch `step`, from loom-preprocess.
  absl::StatusOr<std::string> ReadCursor(int64_t step);
  // Every assignment is recorded in the checkpoint folder,
  // DIR/assignments/<run>/<iteration>.binpb, until a complete checkpoint
  // after it: a restart or resume from that checkpoint replays the same bins
  // (scheduler_checkpoint.cc). NOT_FOUND: none recorded, or one that does
  // not fit this plan and batch (`keys`, by batch index).
  absl::StatusOr<scheduler::v1::Assignment> RecordedAssignment(
      int64_t iteration, const std::vector<std::string>& keys) const;
  absl::Status RecordAssignment(const scheduler::v1::Assignment& a) const;
  // Drops the records before `step` and every other run's.
  void PruneRecordedAssignments(int64_t step) const;
  // Job lifecycle helpers; mu_ held.
  control::v1::Job JobLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FindJobLocked(const std::string& job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetStateLocked(control::v1::JobState state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddEventLocked(control::v1::JobEvent::Kind kind, const scheduler::v1::StepReport* step,
                      int64_t checkpoint_step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeSucceedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsCheckpointStep(int64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ObserveStepMetrics(const scheduler::v1::StepReport& r);
  // Counts a skipped step; the one past train.max_skipped_steps fails the
  // job, "loss diverged at step N" (the workers end at their next
  // assignment, as for any final state).
  void SkippedStepLocked(const scheduler::v1::StepReport& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The lease thread (scheduler_leases.cc): while the job runs, asks every
  // registered worker and loom-preprocess for its health in rounds, several
  // a lease (job.recovery.lease_seconds), all holders at once with at most
  // kMaxProbesInFlight probes in flight, over one kept channel per endpoint;
  // declares lost a holder whose port refuses connections, or that has not
  // answered SERVING for a lease since the first probe it failed
  // (loom_scheduler_lease_round_seconds: each round's time).
  void WatchLeases();
  // RUNNING or PAUSED -> RECOVERING, naming the process and the cause.
  void DeclareLostLocked(common::v1::Role role, int rank, const std::string& endpoint,
                         const std::string& cause, absl::Time last_seen)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One part of the recovery this attempt recovers from (loom_recovery_seconds
  // {part="detection"|"regroup"|"reload"}).
  void ObserveRecovery(const char* part, absl::Time begin, absl::Time end);

  Chassis* chassis_;
  SchedulerServiceOptions options_;  // immutable once configured_
  std::atomic<bool> configured_{false};
  std::atomic<bool> trace_named_{false};  // the predicted tracks' names written
  absl::Mutex configure_mu_;              // one Configure at a time
  sched::ModelFlops flops_;               // per tile / token of the job's model, for MFU
  double peak_flops_ = 0;
  std::unique_ptr<data::v1::PreprocessService::Stub> preprocess_;
  // Registrations and rendezvous key writes, sized by the plan at Configure
  // (a whole job registering and connecting at once stays well inside).
  RateLimiter register_limit_;
  RateLimiter key_limit_;
  prometheus::Counter* register_limited_ = nullptr;
  prometheus::Counter* key_limited_ = nullptr;
  prometheus::Counter* assignments_ = nullptr;
  prometheus::Counter* reports_ = nullptr;
  prometheus::Gauge* registered_ = nullptr;
  prometheus::Gauge* llm_imbalance_ = nullptr;
  prometheus::Gauge* encoder_imbalance_ = nullptr;

  // Held over the I/O that makes or publishes a step folder (the partial
  // folder's creation at the mark, the commit's fsyncs and renames), never
  // with mu_ held across that I/O: a commit of generation G and the next
  // generation's new partial folder of the same step never interleave, and
  // no RPC waits on the disk. Taken before mu_, if both.
  absl::Mutex step_io_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::map<std::pair<int, int>, scheduler::v1::Worker> workers_ ABSL_GUARDED_BY(mu_);
  // The incarnation holding each rank in workers_ (RegisterWorkerRequest),
  // never sent to anyone; and the incarnations declared lost, whose late
  // registrations are refused (the newest kLostIncarnationsKept).
  std::map<std::pair<int, int>, std::string> incarnations_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> lost_incarnations_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> lost_order_ ABSL_GUARDED_BY(mu_);
  static constexpr size_t kLostIncarnationsKept = 65536;
  // Frees (role, rank): its holder's incarnation is lost from now on.
  void ReleaseRankLocked(common::v1::Role role, int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PERMISSION_DENIED unless `incarnation` holds (role, rank).
  absl::Status CheckHolderLocked(common::v1::Role role, int rank,
                                 const std::string& incarnation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ServiceInfo.instance of the `role` worker answering at `endpoint`.
  absl::StatusOr<std::string> AskInstance(common::v1::Role role, const std::string& endpoint) const;
  // Handed out (the newest of them: newest_), and computed ahead by the
  // assignment thread but not handed out yet (no mark placed).
  std::map<int64_t, std::shared_ptr<const Computed>> assignments_by_iteration_ ABSL_GUARDED_BY(mu_);
  int64_t newest_ ABSL_GUARDED_BY(mu_) = -1;
  std::map<int64_t, std::shared_ptr<Computed>> ahead_ ABSL_GUARDED_BY(mu_);
  // Validation batches' assignments (the same every pass), and those being
  // computed by a caller now.
  std::map<int64_t, std::shared_ptr<const Computed>> validation_assignments_ ABSL_GUARDED_BY(mu_);
  std::set<int64_t> validation_computing_ ABSL_GUARDED_BY(mu_);
  // The assignment thread: an iteration whose computation failed (its next
  // caller hears why), the newest iteration a caller asked for (-1: none
  // this generation), the one being computed (-1: none) and whether it waits
  // for loom-preprocess's batch (batch_call_, cancelled by a recovery or the
  // service's end), the one being handed out (-1: none).
  std::map<int64_t, absl::Status> compute_failed_ ABSL_GUARDED_BY(mu_);
  int64_t wanted_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t computing_ ABSL_GUARDED_BY(mu_) = -1;
  bool waiting_for_batch_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* batch_call_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t handing_out_ ABSL_GUARDED_BY(mu_) = -1;
  std::thread assigner_;
  // Requests for a new iteration waiting in AssignmentFor now; while paused,
  // Job.paused_requests (the calls held by the pause).
  int64_t paused_requests_ ABSL_GUARDED_BY(mu_) = 0;
  // The step an assignment being handed out will carry the checkpoint mark
  // for (0: none), from the decision until it is published.
  int64_t marking_step_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<sched::CostModel> costs_ ABSL_GUARDED_BY(mu_);
  std::deque<scheduler::v1::StepReport> steps_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::set<std::pair<int, int>>> checkpoint_parts_ ABSL_GUARDED_BY(mu_);
  int64_t last_checkpoint_ ABSL_GUARDED_BY(mu_) = -1;
  std::map<int64_t, absl::Time> checkpoint_started_ ABSL_GUARDED_BY(mu_);  // first report
  // The data cursor before batch N, read at the first report of step N:
  // workers write in the background while training goes on, and by the last
  // report batch N may have left loom-preprocess's retention window.
  std::map<int64_t, std::string> checkpoint_cursors_ ABSL_GUARDED_BY(mu_);
  // The rendezvous store, under its own lock: a rendezvous of many ranks
  // never waits on (or holds up) the job's state. Taken after mu_, if both.
  mutable absl::Mutex keys_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::map<std::string, std::string> keys_ ABSL_GUARDED_BY(keys_mu_);
  size_t key_bytes_ ABSL_GUARDED_BY(keys_mu_) = 0;
  // GetKey calls waiting for a key not set yet, by key.
  struct KeyWait {
    absl::CondVar set;
    int waiters = 0;
  };
  std::map<std::string, std::unique_ptr<KeyWait>> key_waits_ ABSL_GUARDED_BY(keys_mu_);
  prometheus::Counter* checkpoints_ = nullptr;
  prometheus::Histogram* checkpoint_seconds_ = nullptr;
  prometheus::Counter* iterations_ = nullptr;
  prometheus::Counter* skipped_steps_ = nullptr;
  prometheus::Counter* samples_ = nullptr;
  prometheus::Counter* tokens_ = nullptr;
  prometheus::Gauge* loss_ = nullptr;
  prometheus::Gauge* validation_loss_ = nullptr;
  prometheus::Gauge* generation_loss_ = nullptr;
  prometheus::Gauge* mfu_ = nullptr;
  prometheus::Histogram* iteration_seconds_ = nullptr;
  prometheus::Histogram* get_assignment_seconds_ = nullptr;

  // The job's state, events for WatchJob, and the control requests that the
  // worker RPCs act on.
  control::v1::JobState state_ ABSL_GUARDED_BY(mu_) = control::v1::JOB_STATE_UNSPECIFIED;
  // Worker ranks (role, rank) done with the ended job (ReportDone).
  std::set<std::pair<int, int>> done_ ABSL_GUARDED_BY(mu_);
  std::string job_message_ ABSL_GUARDED_BY(mu_);
  double submit_time_ ABSL_GUARDED_BY(mu_) = 0;
  bool checkpoint_requested_ ABSL_GUARDED_BY(mu_) = false;
  std::set<int64_t> checkpoint_steps_ ABSL_GUARDED_BY(mu_);  // placed, not complete yet
  int64_t stop_at_ ABSL_GUARDED_BY(mu_) = -1;  // cancelled: no assignment from here on
  std::deque<std::pair<int64_t, control::v1::JobEvent>> events_ ABSL_GUARDED_BY(mu_);
  int64_t event_seq_ ABSL_GUARDED_BY(mu_) = 0;
  mutable absl::CondVar changed_;

  // Failures and recovery.
  // Recovery in place: the generation (raised by each), the iteration it
  // (and the job) starts from, a lost worker's rank not re-registered yet,
  // loom-preprocess still to rewind (-1: done), the first step's reload
  // time still to observe.
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // The generation's data-plane key (runtime/comm/data_key.h): drawn anew
  // with each generation, given only to the workers registered in it.
  std::string data_key_ ABSL_GUARDED_BY(mu_) = DataKey::Random().bytes();
  int64_t start_iteration_ ABSL_GUARDED_BY(mu_) = 0;
  bool regrouping_ ABSL_GUARDED_BY(mu_) = false;
  bool awaiting_preprocess_ ABSL_GUARDED_BY(mu_) = false;
  int64_t rewind_to_ ABSL_GUARDED_BY(mu_) = -1;
  bool reload_pending_ ABSL_GUARDED_BY(mu_) = false;
  // Iterations reported skipped (StepReport.skipped), for train.max_skipped_steps.
  std::set<int64_t> skipped_iterations_ ABSL_GUARDED_BY(mu_);
  std::optional<ModelConfig> stage_model_;  // set by Configure: the stage shares' layer split
  int patches_per_tile_ = 0;  // set by Configure: a tile's ViT tokens (the encoder's token cap)
  control::v1::Recovery recovery_ ABSL_GUARDED_BY(mu_);                   // RECOVERING: the loss
  bool closing_ ABSL_GUARDED_BY(mu_) = false;                             // the lease thread ends
  absl::Time running_since_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // every worker in
  std::thread leases_;
  // The current generation's Regroup as GetGeneration answers it, under a
  // lock of its own: every worker holds a GetGeneration long poll, and none
  // of them waits on (or holds up) mu_. Taken after mu_, if both.
  mutable absl::Mutex published_mu_ ABSL_ACQUIRED_AFTER(mu_);
  scheduler::v1::Regroup published_ ABSL_GUARDED_BY(published_mu_);
  bool published_closing_ ABSL_GUARDED_BY(published_mu_) = false;  // held calls answer
  absl::CondVar published_changed_;  // a publish, a new earliest poll, closing
  // GetGeneration calls held, by when they answer at the latest. poll_timer_
  // answers them when that time comes or the generation changes; a
  // cancelled one answers at once (GenerationPoll::OnCancel).
  class GenerationPoll;
  using HeldPolls = std::multimap<absl::Time, GenerationPoll*>;
  HeldPolls held_polls_ ABSL_GUARDED_BY(published_mu_);
  void PollTimerThread();
  void CancelPoll(GenerationPoll* poll);
  std::thread poll_timer_;
  // The steps as people follow them (options_.metrics_dir; null: none, or
  // the folder could not be made). Written after ReportStep's lock.
  std::unique_ptr<StepLog> step_log_;
  // Job.tokens_seen and the pace behind Job.eta_seconds: a moving average of
  // the wall time between step reports (reset by a rollback).
  int64_t tokens_seen_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_step_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  double step_interval_ ABSL_GUARDED_BY(mu_) = 0;  // seconds; 0: unknown
  std::atomic<bool> step_log_failed_{false};       // warned once
  // The checkpoint thread's work: a step's cursor to read (its first part
  // is in) or the step to complete (every part is in: also in completing_).
  struct CheckpointWork {
    int64_t step = 0;
    int64_t generation = 0;
    double productive_before = 0;
    bool complete = false;
  };
  std::deque<CheckpointWork> checkpoint_work_ ABSL_GUARDED_BY(mu_);
  std::set<int64_t> completing_ ABSL_GUARDED_BY(mu_);
  std::thread checkpointer_;
  prometheus::Counter* restarts_ = nullptr;
  prometheus::Counter* lost_ = nullptr;
  prometheus::Gauge* effective_ = nullptr;  // TrainingTime.effective_ratio
  prometheus::Histogram* lease_round_seconds_ = nullptr;
  TrainingClock clock_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, prometheus::Histogram*> recovery_seconds_;  // by part
};

// Checkpoint files the scheduler writes into DIR/step-N/ besides the
// workers' module files: the preprocess cursor before batch N
// (kDataCursorFile) and the cost model's coefficients.
inline constexpr char kSchedulerStateFile[] = "scheduler_costs.binpb";

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_SCHEDULER_SERVICE_H_
