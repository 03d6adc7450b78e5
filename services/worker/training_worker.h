// One rank of a disaggregated training job: an encoder worker (ViT +
// projector), an LLM worker, or a generator worker (a model with a
// generator). loom-encoder-worker, loom-llm-worker and loom-generator-worker
// run one each, next to their gRPC service.
//
// Each module is a grid of tp x dp ranks (runtime/parallel/grid.h, rank =
// dp * tp_size + tp); "rank e" below is a DP replica, a TP group whose ranks
// all run the same bins, each holding its slice of every split layer.
//
// Start(): UCX worker; RegisterWorker with loom-scheduler (which answers the
// plan and the job); waits until every worker registered (their UCX
// addresses); connects Gloo groups over the scheduler's rendezvous store:
// this rank's TP group (when tp > 1), its DP group (the ranks of the same
// TP position), and all the job's workers (for the few scalars both modules
// need: the global gradient norm, the loss). Weights start from the job's
// seed, or from the checkpoint the job resumes from (master tensors: each
// rank keeps its slice).
// Then a thread trains, one iteration at a time:
//
//   encoder rank e                              LLM rank l
//   ──────────────                              ──────────
//   bins with encoder_rank e, by (slot, LLM)    bins with llm_rank l, by slot
//   forward each bin; send its image            Σ loss tokens over LLM ranks
//     embeddings to the bin's LLM rank  ──UCX─▶ per bin: receive embeddings,
//                                                 forward + backward (scale =
//   per bin, same order: receive the  ◀──UCX──    1 / global loss tokens),
//     embedding gradient, recompute the           send the embedding gradient
//     forward, backward                         allreduce LLM gradients
//   allreduce encoder gradients (Gloo)
//   ─────────── job group: Σ g² of both modules, loss, tokens ───────────
//   clip to the global norm; AdamW (runtime/train/trainer.h OptimizerStep)
//
// A bin's embeddings go from the encoder replica's TP rank 0 to every rank of
// the LLM replica's TP group; its gradient from the LLM replica's TP rank 0
// to every encoder TP rank. Sends are asynchronous, so a microbatch's
// embeddings travel while the next one computes; the next iteration's assignment and samples are
// fetched while this one computes. Every K iterations each module's DP replica 0 gathers its master
// tensors over its TP group, its rank 0 writes them, and every rank reports to the scheduler, which
// completes the checkpoint. LLM rank 0 reports each step's loss.
//
// A generator replica (its own tp x pp x dp grid) takes the bins
// with its generator_rank, slot by slot across the LLM replicas: the LLM's
// last stage sends each microbatch's query states after its forward and
// waits for their gradient before its backward; the generator runs the
// bin's forward and backward at once and sends the gradient back (none
// where nothing before it trains). Its Σ g², generation loss and output
// images join the job group's sums.
//
// Summation order is fixed (bins in assignment order, ring allreduce), so a
// run is deterministic given its assignments.
#ifndef LOOM_SERVICES_WORKER_TRAINING_WORKER_H_
#define LOOM_SERVICES_WORKER_TRAINING_WORKER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "loom/common/v1/common.pb.h"
#include "services/common/chassis.h"

namespace loom {

struct TrainingWorkerOptions {
  common::v1::Role role = common::v1::ROLE_UNSPECIFIED;  // ENCODER_WORKER or LLM_WORKER
  int rank = 0;
  // Its rank among the ranks on its machine: device "cuda" is this rank's
  // GPU (runtime/model/ops.h ResolveDevice).
  int local_rank = 0;
  std::string scheduler;  // host:port
  std::string host;       // address peers reach this process on (Gloo); "": hostname
  std::string endpoint;   // this worker's gRPC host:port, for the scheduler's records
  absl::Duration startup_timeout = absl::Seconds(120);
  std::string trace_dir;  // "": no trace; else DIR/<role>-<rank>.jsonl (runtime/base/trace.h)
  // Once the job has ended (job_ended, the last checkpoint written) the
  // process stops as SIGTERM would (--exit_on_job_end: job_end.h).
  bool exit_on_job_end = false;
};

class TrainingWorker {
 public:
  // Starts the thread that connects everything (scheduler, peers, Gloo;
  // errors end the thread like training errors do) and then trains.
  // `chassis` (not owned, must outlive the worker) holds the metrics.
  static absl::StatusOr<std::unique_ptr<TrainingWorker>> Start(
      Chassis* chassis, const TrainingWorkerOptions& options);
  ~TrainingWorker();

  // Asks the training thread to stop; errors from then on (peers stopping
  // too) count as a clean stop. Returns at once.
  void RequestStop();

  // Stops the training thread (between iterations, or cancelling a wait).
  // Returns the thread's outcome: OK when it finished the job or was stopped.
  absl::Status Stop(absl::Duration wait = absl::Seconds(10));

  // Set once the thread ended by itself (the job's last step, or an error).
  bool finished() const { return finished_.load(); }
  // Set once the thread failed on its own error (logged, SIGTERM raised).
  bool failed() const { return announced_.load(); }
  absl::Status status() const;

  struct Impl;

 private:
  explicit TrainingWorker(std::unique_ptr<Impl> impl);
  void Run();
  // Trains from the current generation's start until the job ends, a stop,
  // or an error (the prefetch drained).
  absl::Status Train();
  // Logs a failure and raises SIGTERM (once; not after a stop request).
  void Announce(const absl::Status& result);
  void Finish(absl::Status result);

  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  std::atomic<bool> announced_{false};  // a failure was logged and SIGTERM raised
  std::atomic<bool> finished_{false};
  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom

#endif  // LOOM_SERVICES_WORKER_TRAINING_WORKER_H_
