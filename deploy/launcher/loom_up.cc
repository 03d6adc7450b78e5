// loom-up: runs one training job with every Loom service as its own process
// on this machine, shows its progress, and stops everything cleanly at the
// end, on Ctrl-C or on SIGTERM. `./loom up` builds the binaries and runs this.
//
//   loom up                                 # the default job (services/common/job.h)
//   loom up --config job.json --steps 20 --json
//   loom up --config job.json --resume      # after the newest complete checkpoint
//
// A lost service process stops the others, and every service starts again
// from the run's newest complete checkpoint (--max_restarts times, 3 by
// default): one that exits while the job runs (killed, crashed), seen here
// at once, or one loom-scheduler declares lost when its lease expires (hung,
// stopped: the job turns RECOVERING), which is then killed.
//
// With no shards in the job, its data preset is generated on first run.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "deploy/launcher/launcher.h"
#include "deploy/launcher/profile_job.h"
#include "deploy/launcher/task_launch.h"
#include "runtime/base/file.h"
#include "runtime/base/json_line.h"
#include "runtime/base/runfiles.h"
#include "runtime/base/trace.h"
#include "runtime/checkpoint/steps.h"
#include "runtime/data/loader.h"
#include "services/common/catalog.h"
#include "services/common/chassis.h"
#include "services/common/init.h"
#include "services/common/job.h"
#include "services/common/security.h"
#include "services/scheduler/control_client.h"

ABSL_FLAG(std::string, config, "",
          "Job config file (loom.job.v1.JobConfig, JSON or text format). Default: the "
          "default job (tiny model, encoder DP 2, LLM DP 2, onevision preset, loom "
          "assignment).");
ABSL_FLAG(int, steps, -1,
          "Stop after this many iterations (overrides train.steps or train.epochs; 0: never).");
ABSL_FLAG(bool, json, false,
          "One JSON line per iteration on stdout; everything else goes to stderr.");
ABSL_FLAG(bool, resume, false,
          "Continue the job after the newest complete checkpoint of its run (the run that "
          "last started fresh in checkpoint.dir, with the same model, seed, batch and data).");
ABSL_FLAG(int64_t, resume_step, 0,
          "Continue after this complete checkpoint step of the job's run (implies --resume).");
ABSL_FLAG(std::string, certificates, "",
          "The job's certificates: a folder per identity (scheduler, preprocess, worker, admin, "
          "each with ca.crt, tls.crt, tls.key) and the control tokens (tokens), as "
          "MakeJobCertificates lays them out. Empty: made in RUN_DIR/tls (a throwaway CA).");
ABSL_FLAG(bool, exit_on_job_end, true,
          "Stop every service once the job ends (SUCCEEDED, CANCELLED, FAILED); with "
          "--noexit_on_job_end they keep serving until Ctrl-C (to inspect the finished job).");
ABSL_FLAG(bool, submit, true,
          "Submit the job over the control API once the services are up; with --nosubmit, "
          "wait for a job of the config's name submitted by someone else (loomctl submit).");
ABSL_FLAG(int, encoder_dp, 0, "Overrides parallel.encoder_dp.");
ABSL_FLAG(int, llm_dp, 0, "Overrides parallel.llm_dp.");
ABSL_FLAG(int, encoder_tp, 0, "Overrides parallel.encoder_tp.");
ABSL_FLAG(int, llm_tp, 0, "Overrides parallel.llm_tp.");
ABSL_FLAG(int, encoder_pp, 0, "Overrides parallel.encoder_pp.");
ABSL_FLAG(int, llm_pp, 0, "Overrides parallel.llm_pp.");
ABSL_FLAG(std::string, bin_dir, "",
          "Folder holding services/*/loom-* and runtime/data/loom-datagen; default: this "
          "binary's runfiles (RUNFILES_DIR/loom), where Bazel puts the service binaries "
          "together with their data files.");
ABSL_FLAG(std::string, run_dir, ".loom/run", "Folder for this run's logs, data and checkpoints.");
ABSL_FLAG(std::string, trace, "",
          "Write a Chrome/Perfetto trace of the run to FILE: one track per worker (forward, "
          "backward, recompute, sends, receives, allreduces) beside the simulator's predicted "
          "timeline of the same iterations (open in ui.perfetto.dev).");
ABSL_FLAG(std::string, profile, "",
          "A profile (JSON from `loom-schedule profile`) whose measured coefficients price the "
          "job's work in loom-scheduler, fixed (see loom-scheduler --profile); auto: profile "
          "the job's modules on its device first (its model, precision and TPs; "
          "<run_dir>/profile.json).");
ABSL_FLAG(std::string, profile_only, "",
          "Internal (--profile auto runs a child loom-up so): profile the job's modules, write "
          "the profile to this file and exit.");
ABSL_FLAG(std::string, bind_host, "127.0.0.1", "Address every service binds.");
ABSL_FLAG(std::string, hosts, "",
          "Runs some services on other simulated hosts, Linux network namespaces (root): "
          "ROLE[:RANK]@NETNS/ADDRESS,... (ROLE: preprocess, scheduler, encoder_worker, "
          "llm_worker); each binds and advertises ADDRESS. The rest run here at --bind_host.");
ABSL_FLAG(int, base_port, 0,
          "0: every service picks free ports; else service i uses base+2i "
          "(gRPC) and base+2i+1 (/metrics).");
ABSL_FLAG(absl::Duration, startup_timeout, absl::Seconds(120),
          "How long each service may take to report serving.");
ABSL_FLAG(int, max_restarts, 3,
          "When a service process is lost while the job runs (exited: killed, crashed; or "
          "declared lost by loom-scheduler when its lease expired: hung, stopped), stop the rest "
          "and start every service again from the run's newest complete checkpoint (from the "
          "start if there is none), at most this many times; the losses continue exactly as "
          "without the failure. 0: the job ends FAILED instead. Not with --nosubmit.");
ABSL_FLAG(bool, in_place, true,
          "Recover from a lost process in place: a new process takes its place and every other "
          "one stays up and regroups. --noin_place restarts every service instead.");
ABSL_FLAG(bool, control_only, false,
          "Run only loom-preprocess and loom-scheduler here (binding --bind_host; with "
          "--base_port P the scheduler listens on P, loom-preprocess on P+2); the workers are "
          "the tasks of srun or torchrun running `loom up --worker_from_env` with the same "
          "--config and --run_dir (a shared folder: certificates, checkpoints). Every process "
          "exits 0 once the job ends (loom-scheduler 3 if it FAILED).");
ABSL_FLAG(bool, worker_from_env, false,
          "Become one worker of the job, the task Slurm (SLURM_PROCID, SLURM_NTASKS, "
          "SLURM_LOCALID, SLURM_NODEID, SLURM_JOB_NODELIST) or torchrun (RANK, WORLD_SIZE, "
          "LOCAL_RANK) says this process is: task k is worker k (the encoder's ranks, the "
          "LLM's, the generator's); loom-scheduler at --scheduler, else MASTER_ADDR (Slurm: "
          "the nodelist's first host) : MASTER_PORT. It exits 0 when the job ends.");
ABSL_FLAG(std::string, scheduler, "",
          "--worker_from_env: HOST:PORT of loom-scheduler (default MASTER_ADDR:MASTER_PORT).");
ABSL_FLAG(std::string, advertise_host, "",
          "--worker_from_env: the address the worker binds and peers reach it at (default: its "
          "host in SLURM_JOB_NODELIST, else this machine's hostname).");
ABSL_FLAG(bool, exit_when_healthy, false,
          "Stop everything and exit 0 once every service is healthy (a smoke "
          "test of the whole deployment).");

namespace {

FILE* info = stdout;  // stderr with --json

// The service binaries with their data: this binary's runfiles tree (they
// are its data dependencies), which its children also read their data from
// (RUNFILES_DIR, set by ExportRunfilesDir); else the folder this binary was
// built into (<bin>/deploy/launcher/loom-up -> <bin>).
std::string DefaultBinDir(const std::string& runfiles) {
  if (!runfiles.empty()) return runfiles + "/loom";
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  for (int i = 0; i < 3; ++i) path = path.substr(0, path.rfind('/'));
  return path;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "loom up: %s\n", what.c_str());
  return 1;
}

// --worker_from_env: this process becomes its task's worker (task_launch.h).
int WorkerFromEnvironment(loom::LauncherOptions o) {
  absl::StatusOr<loom::TaskEnv> env =
      loom::TaskEnvFromEnvironment([](const char* name) { return std::getenv(name); });
  if (!env.ok()) return Fail("--worker_from_env: " + std::string(env.status().message()));
  if (!absl::GetFlag(FLAGS_scheduler).empty()) env->scheduler = absl::GetFlag(FLAGS_scheduler);
  if (!absl::GetFlag(FLAGS_advertise_host).empty()) {
    env->host = absl::GetFlag(FLAGS_advertise_host);
  } else if (env->host.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    env->host = host;
  }
  o.insecure = absl::GetFlag(FLAGS_insecure);
  o.server_name = absl::GetFlag(FLAGS_tls_server_name);
  o.certificates = absl::GetFlag(FLAGS_certificates).empty() ? o.run_dir + "/tls"
                                                             : absl::GetFlag(FLAGS_certificates);
  if (o.insecure) o.certificates.clear();
  absl::Status s = loom::ExecWorkerTask(o, *env);  // returns only on an error
  return Fail(absl::StrCat("--worker_from_env (", env->source, " task ", env->task, " of ",
                           env->tasks, "): ", s.message()));
}

// The job's shards: its own glob, or its preset, generated on first run.
absl::StatusOr<std::string> EnsureData(const loom::job::v1::JobConfig& job,
                                       const std::string& bin_dir, const std::string& run_dir) {
  if (const std::string shards = loom::JobShards(job); !shards.empty()) return shards;
  const std::string glob = job.data().generated_dir() + "/*.tar";
  if (loom::data::ExpandShardGlob(glob).ok()) return glob;
  std::fprintf(info, "loom up: generating %d %s samples into %s (first run)\n",
               job.data().samples(), job.data().preset().c_str(),
               job.data().generated_dir().c_str());
  std::fflush(info);
  if (absl::Status s = loom::MakeDirectories(run_dir + "/logs"); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<loom::Subprocess>> gen = loom::Subprocess::Start(
      {bin_dir + "/runtime/data/loom-datagen", "--preset=" + job.data().preset(),
       absl::StrCat("--samples=", job.data().samples()), "--out=" + job.data().generated_dir()},
      run_dir + "/logs/loom-datagen.log");
  if (!gen.ok()) return gen.status();
  absl::StatusOr<int> st = (*gen)->Wait(absl::Minutes(30));
  if (!st.ok() || loom::DescribeWaitStatus(*st) != "exit 0") {
    return absl::InternalError("loom-datagen failed:\n" + (*gen)->ReadLog());
  }
  return glob;
}

std::string ProgressLine(const loom::scheduler::v1::StepReport& r,
                         const loom::control::v1::Job& j) {
  const double s = r.seconds() > 0 ? r.seconds() : 1e-9;
  const int64_t end = j.end_iteration();
  return absl::StrFormat(
      "iter %6d%s  loss %.4f  %7.1f samples/s  %9.0f tokens/s  imbalance %.4f  grad_norm %.3f  "
      "%.3f s  %s%s%s%s",
      r.iteration() + 1, end > 0 ? absl::StrCat("/", end) : "", r.loss(), r.samples() / s,
      r.tokens() / s, r.microbatch_imbalance(), r.grad_norm(), r.seconds(),
      loom::DescribeProgress(j), r.skipped() ? "  skipped (not finite: no optimizer step)" : "",
      r.has_validation_loss() ? absl::StrFormat("  validation loss %.4f", r.validation_loss()) : "",
      r.output_images() > 0 ? absl::StrFormat("  generation loss %.4f (%d images)",
                                              r.generation_loss(), r.output_images())
                            : "");
}

std::string JsonLine(const loom::scheduler::v1::StepReport& r) {
  return absl::StrFormat(
      "{\"iteration\":%d,\"step\":%d,\"loss\":%s,\"samples\":%d,\"tokens\":%d,"
      "\"loss_tokens\":%d,\"grad_norm\":%s,\"lr\":%.6g,\"seconds\":%.6f,"
      "\"samples_per_second\":%.2f,\"microbatch_imbalance\":%.6f%s%s%s}",
      r.iteration(), r.iteration() + 1, loom::JsonNumber(r.loss(), 6), r.samples(), r.tokens(),
      r.loss_tokens(), loom::JsonNumber(r.grad_norm(), 6), r.lr(), r.seconds(),
      r.seconds() > 0 ? r.samples() / r.seconds() : 0.0, r.microbatch_imbalance(),
      r.skipped() ? ",\"skipped\":true" : "",
      r.has_validation_loss()
          ? absl::StrCat(
                ",\"validation_loss\":", loom::JsonNumber(r.validation_loss(), 6),
                ",\"validation_loss_tokens\":", r.validation_loss_tokens(),
                r.validation_output_images() > 0
                    ? absl::StrCat(",\"validation_generation_loss\":",
                                   loom::JsonNumber(r.validation_generation_loss(), 6),
                                   ",\"validation_output_images\":", r.validation_output_images())
                    : "")
          : "",
      r.output_images() > 0
          ? absl::StrCat(",\"generation_loss\":", loom::JsonNumber(r.generation_loss(), 6),
                         ",\"output_images\":", r.output_images())
          : "");
}

// What the watching thread hands the main thread.
struct Watched {
  absl::Mutex mu;
  std::deque<loom::control::v1::JobEvent> events ABSL_GUARDED_BY(mu);
  absl::Status result ABSL_GUARDED_BY(mu);
  bool done ABSL_GUARDED_BY(mu) = false;
};

// How RunJob ended: its exit code, and whether a service process was lost
// while the job ran (a failure a restart may recover from), which and how.
struct JobOutcome {
  int rc = 0;
  bool lost = false;
  bool final = false;  // the job reached SUCCEEDED, CANCELLED or FAILED
  loom::control::v1::Recovery recovery;
  loom::control::v1::TrainingTime training_time;  // the job's clock as last seen
};

double UnixNow() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

// One recovery in place as loom up drives it: names the loss `r`, counts it
// against --max_restarts and starts a new process for its role and rank
// (from checkpoint `resume_step`, which the scheduler chose: 0 for none).
// False when the job cannot go on in place: no restart left (`outcome`
// says FAILED), or the new process did not start (`outcome` says lost:
// every service restarts).
bool ReplaceLost(const std::string& job_name, const loom::control::v1::Recovery& r,
                 int64_t resume_step, int* restarts, int max_restarts, loom::Launcher& launcher,
                 JobOutcome* outcome, bool workers_elsewhere) {
  std::fprintf(stderr, "loom up: job %s RECOVERING: %s\n", job_name.c_str(),
               loom::DescribeLoss(r).c_str());
  if (workers_elsewhere && r.role() != loom::common::v1::ROLE_SCHEDULER &&
      r.role() != loom::common::v1::ROLE_PREPROCESS) {
    // --control_only: srun's or torchrun's task is the worker; the cluster
    // (or a person) starts it again, on any host, and it registers anew.
    // loom-scheduler counts these restarts (job.recovery.max_restarts).
    std::fprintf(info,
                 "loom up: %s rank %d is a task of its own: start it again (loom up "
                 "--worker_from_env, the same task's environment, any host); loom-scheduler "
                 "admits it\n",
                 loom::RoleLabel(r.role()).c_str(), r.rank());
    std::fflush(info);
    return true;
  }
  // Its last words if it has ended. Where it is replaced, no waiting for
  // that: a partitioned process that lives on must be ended before it
  // rejoins (Replace), not given time to.
  const bool last = *restarts >= max_restarts;
  if (const std::string why =
          launcher.ExitMessage(r.role(), r.rank(), last ? absl::Seconds(3) : absl::ZeroDuration());
      !why.empty()) {
    std::fprintf(stderr, "loom up: %s rank %d exited: %s\n", loom::RoleLabel(r.role()).c_str(),
                 r.rank(), why.c_str());
  }
  if (last) {
    std::fprintf(stderr, "loom up: job %s FAILED: %s; no restart left (--max_restarts %d)\n",
                 job_name.c_str(), loom::DescribeLoss(r).c_str(), max_restarts);
    outcome->rc = 1;
    return false;
  }
  ++*restarts;
  const bool scheduler = r.role() == loom::common::v1::ROLE_SCHEDULER;
  std::fprintf(
      info, "loom up: restart %d of %d: replacing %s rank %d, the other services stay up; %s%s\n",
      *restarts, max_restarts, loom::RoleLabel(r.role()).c_str(), r.rank(),
      scheduler ? "it takes the job back, " : "",
      resume_step > 0 ? absl::StrCat("resuming after checkpoint step ", resume_step).c_str()
                      : "from the start (no complete checkpoint yet)");
  std::fflush(info);
  if (absl::Status st = launcher.Replace(r.role(), r.rank(), resume_step); !st.ok()) {
    // Lost again while starting: every service starts over.
    std::fprintf(stderr, "loom up: %s\n", std::string(st.message()).c_str());
    outcome->lost = true;
    outcome->recovery = r;
    outcome->recovery.set_cause(absl::StrCat("replacement failed: ", st.message()));
    outcome->rc = 1;
    return false;
  }
  std::fprintf(info, "%s", loom::FormatServiceTable(launcher.services()).c_str());
  std::fprintf(info, "loom up: %s rank %d replaced; all %zu services healthy\n",
               loom::RoleLabel(r.role()).c_str(), r.rank(), launcher.services().size());
  std::fflush(info);
  return true;
}

// Submits the job over the control API (or waits for someone to), then
// prints its progress until it ends, a signal arrives or a service is lost
// in a way the job cannot recover from in place. A lost worker is: the
// scheduler raises the job's generation and waits for the rank to register
// again, and a new process takes it (one of `max_restarts`, counted in
// `*restarts`) while every other process stays up.
JobOutcome RunJob(const loom::job::v1::JobConfig& job, const loom::LauncherOptions& o,
                  int* restarts, int max_restarts,
                  const loom::control::v1::Recovery& recovered_from,
                  const loom::control::v1::TrainingTime& clock, loom::Launcher& launcher) {
  const std::string target = launcher.scheduler_target();
  const std::string run_dir = o.run_dir;
  (void)loom::WriteFileAtomically(run_dir + "/scheduler_address", target + "\n");
  (void)loom::WriteFileAtomically(run_dir + "/prometheus_targets.json",
                                  loom::PrometheusTargets(launcher.services()));
  loom::ControlClient control(target);
  if (absl::GetFlag(FLAGS_submit)) {
    loom::control::v1::JobSpec spec;
    *spec.mutable_config() = job;
    spec.set_resume(o.resume_step > 0);
    spec.set_resume_step(o.resume_step);  // the step preprocess starts from
    spec.set_restarts(*restarts);
    if (*restarts > 0) {
      *spec.mutable_recovered_from() = recovered_from;
      *spec.mutable_training_time() = clock;  // the job's clock goes on
    }
    absl::StatusOr<loom::control::v1::Job> j = control.Submit(spec);
    if (!j.ok()) {
      std::fprintf(stderr, "loom up: %s\n", std::string(j.status().message()).c_str());
      return {1, false, {}};
    }
    std::fprintf(info, "loom up: job %s submitted (loomctl --scheduler %s get %s)\n",
                 j->job_id().c_str(), target.c_str(), j->job_id().c_str());
  } else {
    std::fprintf(info, "loom up: waiting for job %s: loomctl --scheduler %s submit FILE\n",
                 job.name().c_str(), target.c_str());
  }
  std::fflush(info);
  std::atomic<bool> stop{false};
  Watched w;
  std::thread watcher([&] {
    absl::Status s;
    for (;;) {  // the job may not be submitted yet
      absl::StatusOr<loom::control::v1::Job> j = control.Get(job.name());
      if (j.ok() || (j.status().code() != absl::StatusCode::kNotFound &&
                     j.status().code() != absl::StatusCode::kUnavailable)) {
        s = j.status();
        break;
      }
      if (stop.load()) break;
      absl::SleepFor(absl::Milliseconds(200));
    }
    if (s.ok() && !stop.load()) {
      s = control.Watch(
          job.name(), o.resume_step - 1,
          [&](const loom::control::v1::JobEvent& e) {
            absl::MutexLock lock(&w.mu);
            w.events.push_back(e);
            return true;
          },
          absl::InfiniteDuration(), &stop);
    }
    absl::MutexLock lock(&w.mu);
    w.result = s;
    w.done = true;
  });
  JobOutcome outcome;
  int& rc = outcome.rc;
  std::optional<loom::control::v1::Job> last;  // the newest job the watch brought
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  const timespec tick = {0, 100 * 1000 * 1000};
  // A worker that exited, while the scheduler has not yet declared it lost
  // (it does within a lease; at once for a closed port).
  const loom::LaunchedService* exited = nullptr;
  absl::Time exited_at;
  const absl::Duration grace = absl::Seconds(job.recovery().lease_seconds() + 5);
  int64_t generation = 0;  // the job's, as last seen
  for (bool over = false; !over;) {
    int sig = sigtimedwait(&set, nullptr, &tick);
    if (sig == SIGTERM || sig == SIGINT) {
      std::fprintf(info, "\nloom up: %s received, stopping\n",
                   sig == SIGINT ? "SIGINT" : "SIGTERM");
      break;
    }
    const loom::LaunchedService* s = launcher.FindExited();
    if (s != nullptr && o.control_only && WIFEXITED(s->exit_status) &&
        (WEXITSTATUS(s->exit_status) == 0 || (s->binary->role == loom::common::v1::ROLE_SCHEDULER &&
                                              WEXITSTATUS(s->exit_status) == 3))) {
      // --exit_on_job_end: it saw the job's end (3: FAILED), whose event may
      // still be on its way here.
      launcher.AwaitReplacement(s);  // not a loss: FindExited passes it over
      s = nullptr;
    }
    const bool in_place_allowed = absl::GetFlag(FLAGS_in_place);
    if (s != nullptr && s->binary->role == loom::common::v1::ROLE_SCHEDULER && in_place_allowed &&
        absl::GetFlag(FLAGS_submit) && last && !loom::IsFinalJobState(last->state())) {
      // The one that declares losses is lost: this launcher declares it. A
      // new loom-scheduler on its ports takes the job back from the run
      // folder; the other services stay up and regroup with it.
      loom::control::v1::Recovery r;
      r.set_role(s->binary->role);
      r.set_endpoint(absl::StrCat(s->host, ":", s->ports.grpc_port));
      r.set_cause(absl::StrCat("exited (", loom::DescribeWaitStatus(s->exit_status), ")"));
      r.set_phase(loom::JobPhase(*last));
      r.set_last_seen_seconds(UnixNow());
      r.set_declared_seconds(r.last_seen_seconds());
      absl::StatusOr<int64_t> step =
          loom::ResumableStep(job.checkpoint().dir(), loom::JobCheckpointIdentity(job), 0);
      if (!ReplaceLost(job.name(), r, step.ok() ? *step : 0, restarts, max_restarts, launcher,
                       &outcome, o.control_only)) {
        break;
      }
      s = nullptr;
    }
    if (s != nullptr && s->binary->role != loom::common::v1::ROLE_SCHEDULER && in_place_allowed &&
        job.recovery().lease_seconds() > 0 && last &&
        last->state() == loom::control::v1::JOB_STATE_RUNNING) {
      std::fprintf(stderr,
                   "loom up: %s rank %d exited (%s); waiting for loom-scheduler to recover in "
                   "place (its log: %s)\n",
                   s->binary->name.c_str(), s->rank,
                   loom::DescribeWaitStatus(s->exit_status).c_str(),
                   s->process->log_path().c_str());
      launcher.AwaitReplacement(s);
      exited = s;
      exited_at = absl::Now();
      s = nullptr;
    } else if (s == nullptr && exited != nullptr && absl::Now() - exited_at > grace) {
      s = exited;  // never declared: the job cannot recover in place
    }
    if (s != nullptr) {
      std::fprintf(stderr, "loom up: %s rank %d exited (%s); stopping the rest (its log: %s)\n",
                   s->binary->name.c_str(), s->rank,
                   loom::DescribeWaitStatus(s->exit_status).c_str(),
                   s->process->log_path().c_str());
      if (const std::string why =
              launcher.ExitMessage(s->binary->role, s->rank, absl::ZeroDuration());
          !why.empty()) {
        std::fprintf(stderr, "loom up: %s rank %d: %s\n", s->binary->name.c_str(), s->rank,
                     why.c_str());
      }
      rc = 1;
      // Ctrl-C in a terminal reaches the services too: then this is a stop,
      // not a failure to recover from.
      sigset_t pending;
      sigpending(&pending);
      outcome.lost = !sigismember(&pending, SIGINT) && !sigismember(&pending, SIGTERM);
      loom::control::v1::Recovery& r = outcome.recovery;
      r.set_role(s->binary->role);
      r.set_rank(s->rank);
      r.set_endpoint(absl::StrCat(s->host, ":", s->ports.grpc_port));
      r.set_cause(absl::StrCat("exited (", loom::DescribeWaitStatus(s->exit_status), ")"));
      r.set_phase(last ? loom::JobPhase(*last) : "start-up");
      r.set_last_seen_seconds(UnixNow());  // seen within a tick
      r.set_declared_seconds(r.last_seen_seconds());
      break;
    }
    std::deque<loom::control::v1::JobEvent> events;
    bool done = false;
    absl::Status result;
    {
      absl::MutexLock lock(&w.mu);
      events.swap(w.events);
      done = w.done;
      result = w.result;
    }
    for (const loom::control::v1::JobEvent& e : events) {
      const loom::control::v1::Job& j = e.job();
      last = j;
      const bool in_place =
          absl::GetFlag(FLAGS_in_place) && j.state() == loom::control::v1::JOB_STATE_RECOVERING &&
          e.kind() == loom::control::v1::JobEvent::KIND_STATE && j.generation() > generation;
      generation = std::max(generation, j.generation());
      if (e.kind() == loom::control::v1::JobEvent::KIND_STEP) {
        if (absl::GetFlag(FLAGS_json)) std::printf("%s\n", JsonLine(e.step()).c_str());
        std::fprintf(info, "%s\n", ProgressLine(e.step(), j).c_str());
      } else if (e.kind() == loom::control::v1::JobEvent::KIND_CHECKPOINT) {
        std::fprintf(info, "loom up: checkpoint %lld complete\n",
                     static_cast<long long>(e.checkpoint_step()));
      } else if (e.kind() == loom::control::v1::JobEvent::KIND_STATE) {
        std::fprintf(info, "loom up: job %s %s%s\n", j.job_id().c_str(),
                     loom::JobStateName(j.state()).c_str(),
                     j.message().empty() ? "" : absl::StrCat(" (", j.message(), ")").c_str());
        if (j.state() == loom::control::v1::JOB_STATE_SUCCEEDED) {
          std::fprintf(info, "loom up: %lld iterations done%s\n",
                       static_cast<long long>(j.end_iteration()),
                       j.last_checkpoint() >= j.end_iteration() ? ", checkpoint complete" : "");
        }
        if (loom::IsFinalJobState(j.state()) && j.training_time().started_seconds() > 0) {
          std::fprintf(info, "loom up: %s\n",
                       loom::DescribeTrainingTime(j.training_time()).c_str());
        }
        if (j.state() == loom::control::v1::JOB_STATE_FAILED) rc = 1;
        if (in_place && !over) {
          loom::control::v1::Recovery r = j.recovery();
          // The scheduler saw a closed port; this launcher saw how it closed.
          for (const loom::LaunchedService& ls : launcher.services()) {
            if (ls.binary->role == r.role() && ls.rank == r.rank() && ls.process != nullptr &&
                !ls.process->running()) {
              absl::StatusOr<int> st = ls.process->Wait(absl::ZeroDuration());
              if (st.ok()) {
                r.set_cause(absl::StrCat("exited (", loom::DescribeWaitStatus(*st), ")"));
              }
            }
          }
          if (!ReplaceLost(j.job_id(), r, j.start_iteration(), restarts, max_restarts, launcher,
                           &outcome, o.control_only)) {
            over = true;
            continue;
          }
          if (exited != nullptr && exited->binary->role == r.role() && exited->rank == r.rank()) {
            exited = nullptr;
          }
        } else if (j.state() == loom::control::v1::JOB_STATE_RECOVERING && !over) {
          // The scheduler declared a process lost (its lease expired): it
          // may still run, hung or stopped. Kill it; everything restarts.
          outcome.lost = true;
          outcome.recovery = j.recovery();
          rc = 1;
          for (const loom::LaunchedService& s : launcher.services()) {
            if (s.binary->role == j.recovery().role() && s.rank == j.recovery().rank() &&
                s.process != nullptr) {
              std::fprintf(stderr, "loom up: killing %s rank %d (pid %d); its log: %s\n",
                           s.binary->name.c_str(), s.rank, s.process->pid(),
                           s.process->log_path().c_str());
              s.process->Signal(SIGKILL);
            }
          }
          over = true;
        }
        outcome.final = outcome.final || loom::IsFinalJobState(j.state());
        over = over || (loom::IsFinalJobState(j.state()) && absl::GetFlag(FLAGS_exit_on_job_end));
      }
    }
    std::fflush(stdout);
    std::fflush(info);
    // The watch ended: the job is final (maybe already in the first
    // snapshot, so without a state event above), or the watch failed.
    if (done && !over) {
      if (!result.ok()) {
        std::fprintf(stderr, "loom up: %s\n", std::string(result.message()).c_str());
        rc = 1;
        over = true;
      } else {
        over = absl::GetFlag(FLAGS_exit_on_job_end);
      }
    }
  }
  stop.store(true);
  watcher.join();
  if (last) outcome.training_time = last->training_time();
  return outcome;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string runfiles = loom::ExportRunfilesDir();  // before any thread starts
  loom::InitService(argc, argv, "loom-up",
                    "loom-up: run a training job with every Loom service as its own process.\n"
                    "  loom up [--config FILE] [--steps N] [--json] [--resume] [--nosubmit]");
  if (absl::GetFlag(FLAGS_json)) info = stderr;
  const std::string run_dir = absl::GetFlag(FLAGS_run_dir);
  const std::string bin_dir =
      absl::GetFlag(FLAGS_bin_dir).empty() ? DefaultBinDir(runfiles) : absl::GetFlag(FLAGS_bin_dir);

  loom::job::v1::JobConfig job;
  if (!absl::GetFlag(FLAGS_config).empty()) {
    absl::StatusOr<loom::job::v1::JobConfig> j =
        loom::LoadJobConfig(absl::GetFlag(FLAGS_config), run_dir);
    if (!j.ok()) return Fail(std::string(j.status().message()));
    job = *j;
  } else {
    loom::ApplyJobDefaults(run_dir, &job);
  }
  if (absl::GetFlag(FLAGS_steps) >= 0) {  // in place of train.steps or train.epochs
    job.mutable_train()->set_steps(absl::GetFlag(FLAGS_steps));
    job.mutable_train()->clear_epochs();
  }
  if (absl::GetFlag(FLAGS_encoder_dp) != 0) {
    job.mutable_parallel()->set_encoder_dp(absl::GetFlag(FLAGS_encoder_dp));
  }
  if (absl::GetFlag(FLAGS_llm_dp) != 0)
    job.mutable_parallel()->set_llm_dp(absl::GetFlag(FLAGS_llm_dp));
  if (absl::GetFlag(FLAGS_encoder_tp) != 0) {
    job.mutable_parallel()->set_encoder_tp(absl::GetFlag(FLAGS_encoder_tp));
  }
  if (absl::GetFlag(FLAGS_llm_tp) != 0)
    job.mutable_parallel()->set_llm_tp(absl::GetFlag(FLAGS_llm_tp));
  if (absl::GetFlag(FLAGS_encoder_pp) != 0) {
    job.mutable_parallel()->set_encoder_pp(absl::GetFlag(FLAGS_encoder_pp));
  }
  if (absl::GetFlag(FLAGS_llm_pp) != 0)
    job.mutable_parallel()->set_llm_pp(absl::GetFlag(FLAGS_llm_pp));
  if (absl::Status s = loom::ValidateJob(job); !s.ok()) return Fail(std::string(s.message()));
  if (const std::string out = absl::GetFlag(FLAGS_profile_only); !out.empty()) {
    if (absl::Status s = loom::ProfileJobTo(job, out); !s.ok()) {
      return Fail("--profile_only: " + std::string(s.message()));
    }
    return 0;
  }

  loom::LauncherOptions o;
  o.bin_dir = bin_dir;
  o.run_dir = run_dir;
  o.host = absl::GetFlag(FLAGS_bind_host);
  o.base_port = absl::GetFlag(FLAGS_base_port);
  absl::StatusOr<std::vector<loom::Placement>> placements =
      loom::ParsePlacements(absl::GetFlag(FLAGS_hosts));
  if (!placements.ok()) return Fail("--hosts: " + std::string(placements.status().message()));
  o.placements = *placements;
  o.startup_timeout = absl::GetFlag(FLAGS_startup_timeout);
  o.job = job;
  if (absl::GetFlag(FLAGS_worker_from_env)) {
    if (!absl::GetFlag(FLAGS_trace).empty()) o.trace_dir = run_dir + "/trace";
    if (absl::GetFlag(FLAGS_control_only)) {
      return Fail("--worker_from_env and --control_only: one of them (a task or the control)");
    }
    return WorkerFromEnvironment(o);
  }
  o.control_only = absl::GetFlag(FLAGS_control_only);
  if (o.control_only && !absl::GetFlag(FLAGS_hosts).empty()) {
    return Fail("--control_only and --hosts: the workers are srun's or torchrun's tasks");
  }
  if (absl::GetFlag(FLAGS_resume_step) < 0) return Fail("--resume_step: must be >= 0");
  if (absl::GetFlag(FLAGS_resume) || absl::GetFlag(FLAGS_resume_step) > 0) {
    absl::StatusOr<int64_t> step = loom::ResumableStep(
        job.checkpoint().dir(), loom::JobCheckpointIdentity(job), absl::GetFlag(FLAGS_resume_step));
    if (!step.ok()) return Fail("--resume: " + std::string(step.status().message()));
    o.resume_step = *step;
    std::fprintf(info, "loom up: resuming after step %lld (%s)\n", static_cast<long long>(*step),
                 job.checkpoint().dir().c_str());
  }
  absl::StatusOr<std::string> shards = EnsureData(job, bin_dir, run_dir);
  if (!shards.ok()) return Fail(std::string(shards.status().message()));
  o.shards = *shards;
  o.peak_flops = loom::CpuPeakFlops();
  // CPU workers share this host's cores: the scheduler's simulator knows.
  if (job.device().encoder() == "cpu" && job.device().llm() == "cpu") {
    o.shared_devices = loom::CpuSharedDevices();
  }
  o.profile = absl::GetFlag(FLAGS_profile);
  if (o.profile == "auto") {
    absl::StatusOr<std::string> made = loom::ProfileJob(job, run_dir, info);
    if (!made.ok()) return Fail("--profile auto: " + std::string(made.status().message()));
    o.profile = *made;
  } else if (!o.profile.empty()) {
    if (absl::StatusOr<std::string> p = loom::ReadFile(o.profile); !p.ok()) {
      return Fail("--profile: " + std::string(p.status().message()));
    }
    o.profile = std::filesystem::absolute(o.profile).string();
  }
  // Mutual TLS unless --insecure: the certificates given (--certificates),
  // else a throwaway CA and certificates made once for this run in
  // <run_dir>/tls, with an admin and a read-only control token beside them.
  if (!absl::GetFlag(FLAGS_tls_dir).empty()) {
    return Fail("--tls_dir: loom up runs every identity; give it --certificates DIR");
  }
  o.insecure = absl::GetFlag(FLAGS_insecure);
  o.server_name = absl::GetFlag(FLAGS_tls_server_name);
  o.certificates = absl::GetFlag(FLAGS_certificates);
  if (o.insecure && !o.certificates.empty()) {
    return Fail("--certificates and --insecure exclude each other");
  }
  if (!o.insecure && o.certificates.empty()) {
    o.certificates = run_dir + "/tls";
    // READY (task_launch.h): worker tasks on other nodes wait for it, so
    // none reads a half-written set.
    std::error_code ec;
    std::filesystem::remove(o.certificates + "/READY", ec);
    if (absl::Status s = loom::MakeJobCertificates(o.certificates, o.server_name); !s.ok()) {
      return Fail("the job's certificates: " + std::string(s.message()));
    }
    if (absl::Status s = loom::WriteFileAtomically(o.certificates + "/READY", "loom up\n");
        !s.ok()) {
      return Fail("the job's certificates: " + std::string(s.message()));
    }
  }
  std::fprintf(info, "loom up: %s\n",
               o.insecure ? "--insecure: plaintext gRPC, no authentication"
                          : absl::StrCat("mutual TLS with the certificates in ", o.certificates,
                                         " (loomctl finds them)")
                                .c_str());
  const std::string trace_file = absl::GetFlag(FLAGS_trace);
  if (!trace_file.empty()) {
    o.trace_dir = run_dir + "/trace";
    std::error_code ec;
    std::filesystem::remove_all(o.trace_dir, ec);  // a previous run's timelines
    if (absl::Status s = loom::MakeDirectories(o.trace_dir); !s.ok()) {
      return Fail("--trace: " + std::string(s.message()));
    }
  }
  if (absl::Status s = loom::MakeDirectories(run_dir); !s.ok())
    return Fail(std::string(s.message()));
  if (absl::Status s =
          loom::WriteFileAtomically(run_dir + "/job.json", loom::JobToJson(job) + "\n");
      !s.ok()) {
    return Fail(std::string(s.message()));
  }
  // One BLAS thread per worker: the ranks share this machine's cores.
  setenv("OPENBLAS_NUM_THREADS", "1", /*overwrite=*/0);

  const loom::job::v1::ParallelConfig& par = job.parallel();
  int workers = 0;
  for (const loom::ServiceBinary& b : loom::ServiceCatalog()) {
    if (b.worker) workers += loom::ModuleRanks(job, b.role);
  }
  const int services = 2 + (o.control_only ? 0 : workers);
  const std::string generator =
      par.generator_dp() > 0
          ? absl::StrFormat(", generator TP %d x PP %d x DP %d", par.generator_tp(),
                            par.generator_pp(), par.generator_dp())
          : "";
  std::fprintf(info,
               "loom up: job %s: model %s, encoder TP %d x PP %d x DP %d, LLM TP %d x PP %d x DP "
               "%d%s, %s assignment, %s\n",
               job.name().c_str(), loom::JobModelSource(job).Describe().c_str(), par.encoder_tp(),
               par.encoder_pp(), par.encoder_dp(), par.llm_tp(), par.llm_pp(), par.llm_dp(),
               generator.c_str(), job.algorithm().c_str(),
               job.train().has_epochs()  ? absl::StrCat(job.train().epochs(), " epochs").c_str()
               : job.train().steps() > 0 ? absl::StrCat(job.train().steps(), " iterations").c_str()
                                         : "until stopped");
  const int max_restarts = absl::GetFlag(FLAGS_submit) ? absl::GetFlag(FLAGS_max_restarts) : 0;
  if (max_restarts < 0) return Fail("--max_restarts: must be >= 0");
  int rc = 0;
  bool clean = true;
  loom::control::v1::Recovery recovered_from;  // the failure the current attempt recovers from
  loom::control::v1::TrainingTime clock;       // the job's, as the failed attempt left it
  int restarts = 0;  // every replacement and every restart of all services
  for (bool first = true;; first = false) {
    std::fprintf(info, "loom up: starting %d services, logs in %s/logs\n", services,
                 run_dir.c_str());
    std::fflush(info);
    loom::Launcher launcher(o);
    absl::Status started = launcher.Start();
    std::fprintf(info, "%s", loom::FormatServiceTable(launcher.services()).c_str());
    JobOutcome outcome;
    if (!started.ok()) {
      std::fprintf(stderr, "loom up: %s\n", std::string(started.message()).c_str());
      launcher.Stop(SIGKILL);
      // A first start that fails is a deployment error; a restart that
      // fails (a process lost again while starting) is one more failure.
      if (first) return 1;
      outcome.rc = 1;
      outcome.lost = true;
      outcome.recovery.set_cause(absl::StrCat("restart failed: ", started.message()));
      outcome.recovery.set_phase("start-up");
      outcome.recovery.set_declared_seconds(UnixNow());
    } else {
      std::fprintf(info, "loom up: all %zu services healthy.%s\n", launcher.services().size(),
                   absl::GetFlag(FLAGS_exit_when_healthy) ? "" : " Ctrl-C stops them.");
      if (o.control_only) {
        std::fprintf(info,
                     "loom up: --control_only: the %d worker tasks (loom up --worker_from_env) "
                     "reach loom-scheduler at %s\n",
                     workers, launcher.scheduler_target().c_str());
      }
      std::fflush(info);
      if (!absl::GetFlag(FLAGS_exit_when_healthy)) {
        outcome = RunJob(job, o, &restarts, max_restarts, recovered_from, clock, launcher);
      }
      // After a loss nothing of this attempt is kept (the restart rolls back
      // to the checkpoint): no need to let the survivors stop gracefully.
      // --control_only: the services end by themselves once every worker
      // task has been told (loom-scheduler --exit_on_job_end).
      clean = o.control_only && outcome.final ? launcher.AwaitExit(absl::Minutes(3))
                                              : launcher.Stop(outcome.lost ? SIGKILL : SIGTERM);
      std::fprintf(info, "%s", loom::FormatServiceTable(launcher.services()).c_str());
    }
    rc = outcome.rc;
    if (!outcome.lost) break;
    if (restarts >= max_restarts) {
      std::fprintf(stderr, "loom up: job %s FAILED: %s; no restart left (--max_restarts %d)\n",
                   job.name().c_str(), loom::DescribeLoss(outcome.recovery).c_str(), max_restarts);
      break;
    }
    ++restarts;
    recovered_from = outcome.recovery;
    recovered_from.set_restart_seconds(UnixNow());
    if (outcome.training_time.started_seconds() > 0) clock = outcome.training_time;
    std::fprintf(stderr, "loom up: job %s RECOVERING: %s\n", job.name().c_str(),
                 loom::DescribeLoss(outcome.recovery).c_str());
    // Every service again, after the run's newest complete checkpoint: the
    // data cursor, weights and optimizer state roll back together, so no
    // sample is lost and none trained twice.
    absl::StatusOr<int64_t> step =
        loom::ResumableStep(job.checkpoint().dir(), loom::JobCheckpointIdentity(job), 0);
    if (o.resume_step > 0 && !step.ok()) {
      std::fprintf(stderr, "loom up: cannot restart: %s\n",
                   std::string(step.status().message()).c_str());
      break;
    }
    o.resume_step = step.ok() ? *step : 0;
    std::fprintf(info, "loom up: restart %d of %d: %s\n", restarts, max_restarts,
                 o.resume_step > 0
                     ? absl::StrCat("resuming after checkpoint step ", o.resume_step).c_str()
                     : "from the start (no complete checkpoint yet)");
    std::fflush(info);
  }
  if (!trace_file.empty()) {
    if (absl::Status s = loom::trace::MergeTrace(o.trace_dir, trace_file); !s.ok()) {
      std::fprintf(stderr, "loom up: --trace: %s\n", std::string(s.message()).c_str());
      rc = rc == 0 ? 1 : rc;
    } else {
      std::fprintf(info, "loom up: trace in %s (open in ui.perfetto.dev or chrome://tracing)\n",
                   trace_file.c_str());
    }
  }
  std::fprintf(info, "loom up: %s\n",
               clean ? "stopped cleanly" : "some services did not exit cleanly");
  return clean ? rc : 1;
}
