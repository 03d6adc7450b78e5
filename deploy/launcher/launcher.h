// The local launcher behind `loom up`: every Loom service as its own process
// on this machine.
//
// Start() makes the job's certificates unless given (LauncherOptions.
// certificates), makes the admin's this process's client security (health
// checks, the control API), then launches, each service with its
// identity's certificate: loom-preprocess (its shards,
// seed, batch; the cursor when resuming), then loom-scheduler (--preprocess; the job itself is
// submitted over the control API by the caller), then encoder_dp loom-encoder-worker and llm_dp
// loom-llm-worker ranks
// (--scheduler), each logging to <run_dir>/logs/<name>[-<rank>].log and
// each stage waiting for the previous one's "serving" record (its ports);
// then it checks every process's grpc.health.v1 (overall and per service)
// and /metrics.
// Stop() sends SIGTERM (or the signal given) to every process still running
// and waits for each to exit, SIGKILL after `stop_timeout`.
//
// Placements put services on other simulated hosts: each such process runs
// in its Linux network namespace (`ip netns exec`, root only) and binds and
// advertises that host's address; the rest run here at `host`.
//
// Thread-safety: one thread.
#ifndef LOOM_DEPLOY_LAUNCHER_LAUNCHER_H_
#define LOOM_DEPLOY_LAUNCHER_LAUNCHER_H_

#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "loom/job/v1/job.pb.h"
#include "services/common/catalog.h"
#include "services/common/subprocess.h"

namespace loom {

// Where some services run: `role` (rank `rank`, or every rank when -1) in
// network namespace `netns` at `host`.
struct Placement {
  common::v1::Role role = common::v1::ROLE_UNSPECIFIED;
  int rank = -1;
  std::string netns;
  std::string host;
};

// "ROLE[:RANK]@NETNS/ADDRESS,..." (ROLE: preprocess, scheduler,
// encoder_worker, llm_worker, generator_worker), each namespace existing
// (/run/netns).
absl::StatusOr<std::vector<Placement>> ParsePlacements(absl::string_view spec);

struct LauncherOptions {
  std::string bin_dir;  // Bazel's bin folder: <bin_dir>/services/<x>/<binary>
  std::string run_dir;  // logs go to <run_dir>/logs
  std::string host = "127.0.0.1";
  std::vector<Placement> placements;  // the services not at `host` in this namespace
  int base_port = 0;                  // 0: free ports; else process i gets base+2i, base+2i+1
  job::v1::JobConfig job;             // defaults applied, validated
  std::string shards;                 // glob the preprocess service reads
  int64_t resume_step = 0;            // > 0: continue after this complete checkpoint
  double peak_flops = 0;              // of the machine, for the scheduler's MFU (CpuPeakFlops)
  std::string trace_dir;   // non-empty: the scheduler and workers write their timelines there
  std::string profile;     // non-empty: loom-scheduler --profile (fixed, measured costs)
  int shared_devices = 0;  // loom-scheduler --shared_devices (CpuSharedDevices for CPU jobs)
  absl::Duration startup_timeout = absl::Seconds(60);
  absl::Duration stop_timeout = absl::Seconds(15);
  // How the services talk: mutual TLS with the job's certificates, a folder
  // laid out by MakeJobCertificates (security.h: a folder per identity, the
  // control tokens beside them); empty: Start() makes a throwaway CA and
  // certificates in <run_dir>/tls. `insecure`: plaintext (--insecure).
  std::string certificates;
  std::string server_name = "loom";
  bool insecure = false;
  // Only loom-preprocess and loom-scheduler, each with --exit_on_job_end:
  // the workers are started elsewhere (srun or torchrun running `loom up
  // --worker_from_env`, task_launch.h) and everything ends with the job.
  bool control_only = false;
};

// The ranks of module `role`'s workers in `job`: its TP x PP x DP grid
// (runtime/parallel/grid.h); 1 for the other services.
int ModuleRanks(const job::v1::JobConfig& job, common::v1::Role role);

// Where one service process runs and whom it talks to.
struct ServiceSlot {
  int rank = 0;
  int local_rank = 0;
  std::string host;   // the address it binds and advertises
  int grpc_port = 0;  // 0: a free one
  int metrics_port = 0;
  std::string preprocess;  // host:port, the scheduler's loom-preprocess
  std::string scheduler;   // host:port, the workers' loom-scheduler
  bool take_back = false;  // a replacement loom-scheduler
  bool exit_on_job_end = false;
};

// The command line of `binary` in a job launched as `options` says: its path
// under options.bin_dir, the chassis's host and ports, the job's mutual TLS
// (the identity's certificate; the scheduler's control tokens) or
// --insecure, and its role's flags (loom-preprocess: the shards and the
// data options; loom-scheduler: its run folder and loom-preprocess;
// workers: rank, local rank, loom-scheduler).
std::vector<std::string> ServiceCommand(const LauncherOptions& options, const ServiceBinary& binary,
                                        const ServiceSlot& slot);

// One launched service process and what the launcher learnt about it.
struct LaunchedService {
  const ServiceBinary* binary = nullptr;  // from ServiceCatalog()
  int rank = 0;
  int local_rank = 0;  // a worker's rank among the workers on its host
  std::string host;    // the address it binds and advertises
  std::string netns;   // its network namespace; empty: the launcher's
  std::unique_ptr<Subprocess> process;
  ServingPorts ports;
  bool same_ports = false;  // a replacement binding the ports `ports` holds
  bool take_back = false;   // a replacement loom-scheduler: takes its job back
  std::string health;       // "SERVING" once checked
  int exit_status = -1;     // wait status once stopped
  bool awaiting_replacement = false;
};

// Each worker's rank among the workers on its host (every module's, in
// launch order): device "cuda" opens that rank's GPU, so the workers on a
// machine spread over its GPUs. Colocated (parallel.colocate), encoder rank
// k takes LLM rank k's instead (the same GPU) when they share a host.
void AssignLocalRanks(bool colocate, std::vector<LaunchedService>* services);

class Launcher {
 public:
  explicit Launcher(LauncherOptions options) : options_(std::move(options)) {}
  ~Launcher() { Stop(); }

  // Launches everything and checks it healthy. On error the processes that
  // did start keep running until Stop(); the error names the service.
  absl::Status Start();

  // A service that has exited by itself (and is not awaiting its
  // replacement), or nullptr.
  const LaunchedService* FindExited();

  // Service `role` rank `rank` ends (SIGKILL, if it still runs) and a new
  // process takes its place, started and checked healthy like the first: a
  // worker registers anew; loom-preprocess comes back on its own ports (the
  // scheduler and the workers keep its address), from checkpoint
  // `resume_step`'s data cursor (0: the run's start).
  absl::Status Replace(common::v1::Role role, int rank, int64_t resume_step);
  // Marks an exited service as awaiting its replacement (FindExited skips it).
  void AwaitReplacement(const LaunchedService* s);
  // Why service `role` rank `rank` ended, once its process has (waiting up
  // to `wait` for one that is ending: a lost one often still is): the last
  // "<binary>: ..." line of its log (what each service's main prints of a
  // fatal error), without the prefix. "" if it said none or still runs.
  std::string ExitMessage(common::v1::Role role, int rank, absl::Duration wait);

  // `signal` (SIGTERM: a clean stop) to all, then wait; true if every
  // process exited 0 (a process that had exited before Stop() counts with
  // its own status).
  bool Stop(int signal = SIGTERM);
  // Waits up to `wait` for every process to exit by itself (services with
  // --exit_on_job_end, once the job ended), then stops the rest as Stop()
  // does; true if every process exited 0.
  bool AwaitExit(absl::Duration wait);

  const std::vector<LaunchedService>& services() const { return services_; }
  // The job's certificates (after Start(): those made), empty if insecure.
  const std::string& certificates() const { return options_.certificates; }
  // host:port of loom-scheduler once Start() got that far.
  std::string scheduler_target() const;

 private:
  absl::Status Launch(LaunchedService& s, int index);
  const LaunchedService* Find(common::v1::Role role) const;
  absl::Status CheckHealthy(LaunchedService& s);

  LauncherOptions options_;
  std::vector<LaunchedService> services_;
  bool stopped_ = false;
};

// This machine's peak fp32 FLOP/s (cores x clock x FMA lanes): the MFU
// denominator when the workers run on its CPU cores.
double CpuPeakFlops();

// How many workers of a CPU job compute at full speed at once on this host:
// its cores over the threads each worker's BLAS runs (OPENBLAS_NUM_THREADS,
// else OMP_NUM_THREADS, else every core), at least 1.
int CpuSharedDevices();

// Prometheus file_sd targets (JSON): every service's /metrics address.
std::string PrometheusTargets(const std::vector<LaunchedService>& services);

// One line per service for the terminal: name, rank, pid, ports, health.
std::string FormatServiceTable(const std::vector<LaunchedService>& services);

}  // namespace loom

#endif  // LOOM_DEPLOY_LAUNCHER_LAUNCHER_H_
