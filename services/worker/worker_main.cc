#include "services/worker/worker_main.h"

#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/log.h"
#include "runtime/model/ops.h"
#include "services/common/init.h"
#include "services/common/job_end.h"
#include "services/common/subprocess.h"
#include "services/worker/training_worker.h"

ABSL_FLAG(int, rank, 0, "This process's rank within its module (0-based).");
ABSL_FLAG(bool, rank_from_hostname, false,
          "Take the rank from the hostname's last '-N' (a StatefulSet pod, loom-encoder-3 -> 3) "
          "instead of --rank.");
ABSL_FLAG(int, local_rank, -1,
          "This process's rank among the ranks on its machine; device \"cuda\" opens GPU "
          "local_rank mod the GPU count. -1: from LOOM_LOCAL_RANK, LOCAL_RANK, SLURM_LOCALID or "
          "OMPI_COMM_WORLD_LOCAL_RANK, else 0.");
ABSL_FLAG(int, local_ranks, 1,
          "Ranks this process runs, each as a child process of its own (one pod or machine "
          "per R ranks): rank R*rank+i (the rank from --rank or --rank_from_hostname), "
          "--local_rank=i (GPU i), ports --grpc_port+i and --metrics_port+i. The children's "
          "end ends this process: all 0, exit 0; one failing, the others are stopped, exit 1.");
ABSL_FLAG(std::string, scheduler, "",
          "host:port of loom-scheduler: register and train. Empty: serve GetInfo only.");
ABSL_FLAG(std::string, advertise_host, "",
          "Address other workers reach this one on (collectives). Empty: the hostname.");
ABSL_FLAG(absl::Duration, startup_timeout, absl::Seconds(120),
          "How long to wait for the scheduler and every other worker.");
ABSL_FLAG(std::string, trace_dir, "",
          "Append this worker's timeline (forwards, backwards, sends, receives, allreduces) "
          "to DIR/<role>-<rank>.jsonl, one line per iteration (loom up --trace).");

ABSL_DECLARE_FLAG(int, grpc_port);
ABSL_DECLARE_FLAG(int, metrics_port);

namespace loom {
namespace {

// --local_ranks=R: this process's R ranks as children (the same binary and
// arguments, with each one's rank, local rank and ports appended: the last
// value of a flag wins). Signals are passed on; the first child to fail
// stops the rest.
int RunLocalRanks(const char* name, int argc, char** argv, int rank, int ranks) {
  const int grpc = absl::GetFlag(FLAGS_grpc_port), metrics = absl::GetFlag(FLAGS_metrics_port);
  if ((grpc == 0) != (metrics == 0)) {
    std::fprintf(stderr,
                 "%s: --local_ranks needs both --grpc_port and --metrics_port, or neither\n", name);
    return 1;
  }
  std::vector<pid_t> children;
  for (int i = 0; i < ranks; ++i) {
    std::vector<std::string> args(argv, argv + argc);
    for (std::string a :
         {absl::StrCat("--rank=", rank * ranks + i), std::string("--norank_from_hostname"),
          absl::StrCat("--local_rank=", i), std::string("--local_ranks=1")}) {
      args.push_back(std::move(a));
    }
    if (grpc != 0) {
      args.push_back(absl::StrCat("--grpc_port=", grpc + i));
      args.push_back(absl::StrCat("--metrics_port=", metrics + i));
    }
    std::vector<char*> cargs;
    for (std::string& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      for (pid_t c : children) kill(c, SIGTERM);
      return 1;
    }
    if (pid == 0) {
      execv("/proc/self/exe", cargs.data());
      std::perror("execv /proc/self/exe");
      _exit(127);
    }
    children.push_back(pid);
  }
  // InitService blocked SIGTERM and SIGINT (a service takes them with
  // sigwait): this process polls for them between its children's ends.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  int outcome = 0;
  size_t running = children.size();
  bool stopping = false;
  auto stop_all = [&](int sig) {
    stopping = true;
    for (pid_t c : children) kill(c, sig);
  };
  while (running > 0) {
    int status = 0;
    const pid_t done = waitpid(-1, &status, WNOHANG);
    if (done < 0 && errno != EINTR) break;
    if (done > 0) {
      --running;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && outcome == 0) {
        outcome = 1;
        std::fprintf(stderr, "%s: local rank process %d ended (%s); stopping the others\n", name,
                     static_cast<int>(done), DescribeWaitStatus(status).c_str());
        if (!stopping) stop_all(SIGTERM);
      }
      continue;
    }
    timespec wait = {0, 100 * 1000 * 1000};
    const int sig = sigtimedwait(&stop, nullptr, &wait);
    if (sig > 0 && !stopping) stop_all(sig);
  }
  return outcome;
}

}  // namespace

int WorkerMain(int argc, char** argv, const WorkerBinary& b) {
  // Tensors of 128 KiB and more get pages of their own, returned when
  // freed. glibc would otherwise raise this threshold to the largest block
  // freed so far (up to 32 MiB) and serve the next ones from its heaps,
  // where freed activations, staged inputs and gradients fragment: ~15% more
  // resident memory than the tensors held, varying run to run, where the
  // memory model (runtime/model/memory.h) and the job's memory check count
  // the tensors. Fixed, it is what a GPU allocator gives: memory in use.
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  InitService(argc, argv, b.name,
              absl::StrCat(b.name, ": ", b.summary,
                           "\nFlags: --host --grpc_port --metrics_port --shutdown_deadline "
                           "--log_level --rank --rank_from_hostname --local_rank --local_ranks "
                           "--scheduler "
                           "--advertise_host "
                           "--startup_timeout --trace_dir --exit_on_job_end --check_flags"));
  int rank = absl::GetFlag(FLAGS_rank);
  if (absl::GetFlag(FLAGS_rank_from_hostname)) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    const std::string name(host);
    const size_t dash = name.rfind('-');
    if (dash == std::string::npos || !absl::SimpleAtoi(name.substr(dash + 1), &rank)) {
      std::fprintf(stderr, "%s: --rank_from_hostname: hostname \"%s\" does not end in -N\n", b.name,
                   name.c_str());
      return 1;
    }
  }
  if (rank < 0) {
    std::fprintf(stderr, "%s: --rank must be >= 0, got %d\n", b.name, rank);
    return 1;
  }
  const int local_ranks = absl::GetFlag(FLAGS_local_ranks);
  if (local_ranks < 1) {
    std::fprintf(stderr, "%s: --local_ranks must be >= 1, got %d\n", b.name, local_ranks);
    return 1;
  }
  if (local_ranks > 1) return RunLocalRanks(b.name, argc, argv, rank, local_ranks);
  int local_rank = absl::GetFlag(FLAGS_local_rank);
  if (local_rank < 0) {
    absl::StatusOr<int> from_env = LocalRankFromEnvironment();
    if (!from_env.ok()) {
      std::fprintf(stderr, "%s: %s\n", b.name, std::string(from_env.status().message()).c_str());
      return 1;
    }
    local_rank = *from_env;
  }
  Chassis chassis(ChassisOptionsFromFlags(b.name, b.role, rank));
  std::unique_ptr<grpc::Service> service = b.make_service(&chassis);
  chassis.AddService(service.get(), b.service_full_name);
  if (absl::Status s = chassis.Start(); !s.ok()) {
    LOOM_LOG(ERROR).With("code", absl::StatusCodeToString(s.code()))
        << "cannot start: " << s.message();
    return 1;
  }
  std::unique_ptr<TrainingWorker> worker;
  if (!absl::GetFlag(FLAGS_scheduler).empty()) {
    TrainingWorkerOptions o;
    o.role = b.role;
    o.rank = rank;
    o.local_rank = local_rank;
    o.scheduler = absl::GetFlag(FLAGS_scheduler);
    o.host = absl::GetFlag(FLAGS_advertise_host);
    o.endpoint = absl::StrCat(o.host.empty() ? "localhost" : o.host, ":", chassis.grpc_port());
    o.startup_timeout = absl::GetFlag(FLAGS_startup_timeout);
    o.trace_dir = absl::GetFlag(FLAGS_trace_dir);
    o.exit_on_job_end = absl::GetFlag(FLAGS_exit_on_job_end);
    absl::StatusOr<std::unique_ptr<TrainingWorker>> w = TrainingWorker::Start(&chassis, o);
    if (!w.ok()) {
      LOOM_LOG(ERROR).With("error", std::string(w.status().message())) << "cannot start";
      std::fprintf(stderr, "%s: %s\n", b.name, std::string(w.status().message()).c_str());
      chassis.Shutdown();
      return 1;
    }
    worker = std::move(*w);
  }
  chassis.ServeUntilSignal([&worker] {
    if (worker != nullptr) worker->RequestStop();
  });
  if (worker == nullptr) return 0;
  absl::Status s = worker->Stop(absl::Seconds(5));
  if (s.code() == absl::StatusCode::kDeadlineExceeded) {
    LOOM_LOG(WARNING) << "training thread still blocked; exiting without it";
    std::fflush(nullptr);
    _exit(worker->failed() ? 1 : JobEndExitStatus(0));  // a failed worker: non-zero either way
  }
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", b.name, std::string(s.message()).c_str());
    return 1;
  }
  return JobEndExitStatus(0);
}

}  // namespace loom
