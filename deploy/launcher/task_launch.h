// A job's workers launched as the tasks of `srun` (Slurm) or `torchrun`:
// each task runs `loom up --worker_from_env`, which reads which task it is
// from the environment and becomes that worker rank; `loom up
// --control_only` runs loom-preprocess and loom-scheduler on one host. Every
// process ends with the job (--exit_on_job_end), so the allocation does.
//
//   Slurm:    SLURM_PROCID (task), SLURM_NTASKS, SLURM_LOCALID (the GPU),
//             SLURMD_NODENAME, else SLURM_NODEID in SLURM_STEP_NODELIST (or
//             SLURM_JOB_NODELIST): this task's host; SLURM_JOB_NODELIST's
//             first host runs loom-scheduler unless MASTER_ADDR says
//   torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR (loom-scheduler's host)
//   both:     MASTER_PORT, loom-scheduler's port (the control's --base_port)
//
// Task k is worker k of the job in module order: the encoder's ranks, the
// LLM's, then the generator's; the tasks must be exactly that many.
#ifndef LOOM_DEPLOY_LAUNCHER_TASK_LAUNCH_H_
#define LOOM_DEPLOY_LAUNCHER_TASK_LAUNCH_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "deploy/launcher/launcher.h"
#include "proto/loom/job/v1/job.pb.h"

namespace loom {

// Slurm's hostlist expression expanded: "node[01-03,07],gpu5" -> node01
// node02 node03 node07 gpu5 (zero padding kept; several bracket groups
// multiply). INVALID_ARGUMENT naming a bad range or bracket.
absl::StatusOr<std::vector<std::string>> ExpandHostlist(absl::string_view list);

struct TaskEnv {
  std::string source;  // "slurm" or "torchrun"
  int task = 0;
  int tasks = 0;
  int local_rank = 0;
  std::string host;       // where this task runs, as the others reach it ("": unknown)
  std::string scheduler;  // host:port of loom-scheduler ("" where the environment lacks one)
};

// The task of this process from `getenv` (Slurm's variables first, then
// torchrun's). INVALID_ARGUMENT naming the variable that is missing or not
// a number, or when neither launcher's are set.
absl::StatusOr<TaskEnv> TaskEnvFromEnvironment(
    const std::function<const char*(const char*)>& getenv);

// Task `task` of `tasks`: its worker (role, rank). INVALID_ARGUMENT when
// `tasks` is not the job's worker count (naming both) or the job colocates
// its encoder (its ranks would share the LLM's GPUs, which srun's one task
// per GPU cannot say).
struct TaskWorker {
  common::v1::Role role = common::v1::ROLE_UNSPECIFIED;
  int rank = 0;
};
absl::StatusOr<TaskWorker> WorkerOfTask(const job::v1::JobConfig& job, int task, int tasks);

// Becomes the task's worker (exec; returns only on an error): its command
// (ServiceCommand) with --exit_on_job_end, after the job's certificates
// appear in options.certificates (made by the control's loom up on the
// shared run folder), waiting up to options.startup_timeout.
absl::Status ExecWorkerTask(const LauncherOptions& options, const TaskEnv& env);

}  // namespace loom

#endif  // LOOM_DEPLOY_LAUNCHER_TASK_LAUNCH_H_
