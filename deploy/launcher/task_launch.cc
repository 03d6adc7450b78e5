#include "deploy/launcher/task_launch.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "services/common/catalog.h"

namespace loom {
namespace {

// Splits at the commas outside brackets.
std::vector<std::string> TopLevelItems(absl::string_view list) {
  std::vector<std::string> items;
  std::string cur;
  int depth = 0;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      items.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  items.push_back(cur);
  return items;
}

// One item ("rack[1-2]-n[01-02]") expanded, its first bracket group first.
absl::Status ExpandItem(const std::string& item, std::vector<std::string>* out) {
  const size_t open = item.find('[');
  if (open == std::string::npos) {
    if (item.find(']') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("\"", item, "\": ']' without '['"));
    }
    out->push_back(item);
    return absl::OkStatus();
  }
  const size_t close = item.find(']', open);
  if (close == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("\"", item, "\": '[' without ']'"));
  }
  const std::string prefix = item.substr(0, open), rest = item.substr(close + 1);
  const std::string body = item.substr(open + 1, close - open - 1);
  for (const std::string& range : TopLevelItems(body)) {
    const size_t dash = range.find('-');
    const std::string lo = range.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : range.substr(dash + 1);
    int64_t a = 0, b = 0;
    if (lo.empty() || hi.empty() || !absl::SimpleAtoi(lo, &a) || !absl::SimpleAtoi(hi, &b) ||
        a < 0 || b < a || b - a > 100000) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", item, "\": \"", range, "\" is not a range (N or N-M, N <= M)"));
    }
    for (int64_t n = a; n <= b; ++n) {
      std::string digits = absl::StrCat(n);
      if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
      if (absl::Status s = ExpandItem(prefix + digits + rest, out); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> IntVar(const std::function<const char*(const char*)>& getenv, const char* name,
                           int min) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') {
    return absl::InvalidArgumentError(absl::StrCat(name, " is not set"));
  }
  int x = 0;
  if (!absl::SimpleAtoi(v, &x) || x < min) {
    return absl::InvalidArgumentError(absl::StrCat(name, "=", v, ": not a whole number >= ", min));
  }
  return x;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandHostlist(absl::string_view list) {
  std::vector<std::string> hosts;
  if (list.empty()) return absl::InvalidArgumentError("an empty hostlist");
  for (const std::string& item : TopLevelItems(list)) {
    if (item.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("\"", list, "\": an empty host"));
    }
    if (absl::Status s = ExpandItem(item, &hosts); !s.ok()) return s;
  }
  return hosts;
}

absl::StatusOr<TaskEnv> TaskEnvFromEnvironment(
    const std::function<const char*(const char*)>& getenv) {
  TaskEnv env;
  auto set = [&](const char* name) {
    const char* v = getenv(name);
    return v != nullptr && *v != '\0';
  };
  const bool slurm = set("SLURM_PROCID");
  if (!slurm && !set("RANK")) {
    return absl::InvalidArgumentError(
        "neither Slurm's SLURM_PROCID nor torchrun's RANK is set: run it under srun or "
        "torchrun (or set them)");
  }
  env.source = slurm ? "slurm" : "torchrun";
  absl::StatusOr<int> v = IntVar(getenv, slurm ? "SLURM_PROCID" : "RANK", 0);
  if (!v.ok()) return v.status();
  env.task = *v;
  v = IntVar(getenv, slurm ? "SLURM_NTASKS" : "WORLD_SIZE", 1);
  if (!v.ok()) return v.status();
  env.tasks = *v;
  if (env.task >= env.tasks) {
    return absl::InvalidArgumentError(
        absl::StrCat("task ", env.task, " of ", env.tasks, ": the task must be below the count"));
  }
  v = IntVar(getenv, slurm ? "SLURM_LOCALID" : "LOCAL_RANK", 0);
  if (!v.ok()) return v.status();
  env.local_rank = *v;
  std::string scheduler_host = set("MASTER_ADDR") ? getenv("MASTER_ADDR") : "";
  if (slurm) {
    const char* list =
        set("SLURM_JOB_NODELIST") ? getenv("SLURM_JOB_NODELIST") : getenv("SLURM_NODELIST");
    if (list == nullptr || *list == '\0') {
      return absl::InvalidArgumentError("SLURM_JOB_NODELIST is not set");
    }
    absl::StatusOr<std::vector<std::string>> nodes = ExpandHostlist(list);
    if (!nodes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("SLURM_JOB_NODELIST: ", nodes.status().message()));
    }
    if (scheduler_host.empty()) scheduler_host = nodes->front();
    // This task's node: slurmd's name for it, else SLURM_NODEID in the
    // step's nodes (a step may run on part of the allocation).
    if (set("SLURMD_NODENAME")) {
      env.host = getenv("SLURMD_NODENAME");
    } else {
      absl::StatusOr<std::vector<std::string>> step = *nodes;
      if (set("SLURM_STEP_NODELIST")) step = ExpandHostlist(getenv("SLURM_STEP_NODELIST"));
      if (!step.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("SLURM_STEP_NODELIST: ", step.status().message()));
      }
      absl::StatusOr<int> node = IntVar(getenv, "SLURM_NODEID", 0);
      if (!node.ok()) return node.status();
      if (*node >= static_cast<int>(step->size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "SLURM_NODEID=", *node, ": the step's nodelist has ", step->size(), " hosts"));
      }
      env.host = (*step)[*node];
    }
  }
  if (!scheduler_host.empty() && set("MASTER_PORT")) {
    absl::StatusOr<int> port = IntVar(getenv, "MASTER_PORT", 1);
    if (!port.ok()) return port.status();
    env.scheduler = absl::StrCat(scheduler_host, ":", *port);
  }
  return env;
}

absl::StatusOr<TaskWorker> WorkerOfTask(const job::v1::JobConfig& job, int task, int tasks) {
  if (job.parallel().colocate()) {
    return absl::InvalidArgumentError(
        "parallel.colocate: the encoder's ranks share the LLM's GPUs, which one task per GPU "
        "cannot say; launch such a job with loom up or the Helm chart");
  }
  int total = 0;
  std::vector<std::string> counts;
  TaskWorker found;
  for (const ServiceBinary& b : ServiceCatalog()) {
    if (!b.worker) continue;
    const int ranks = ModuleRanks(job, b.role);
    if (ranks <= 0) continue;
    if (task >= total && task < total + ranks) found = {b.role, task - total};
    total += ranks;
    counts.push_back(absl::StrCat(ranks, " ", b.name));
  }
  if (tasks != total) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job has ", total, " worker ranks (", absl::StrJoin(counts, ", "),
                     ") but the launch has ", tasks, " tasks: one task per worker rank"));
  }
  return found;
}

absl::Status ExecWorkerTask(const LauncherOptions& options, const TaskEnv& env) {
  absl::StatusOr<TaskWorker> w = WorkerOfTask(options.job, env.task, env.tasks);
  if (!w.ok()) return w.status();
  const ServiceBinary* binary = nullptr;
  for (const ServiceBinary& b : ServiceCatalog()) {
    if (b.role == w->role) binary = &b;
  }
  if (binary == nullptr) return absl::InternalError("no binary for the task's role");
  if (env.scheduler.empty()) {
    return absl::InvalidArgumentError(
        "where loom-scheduler is: --scheduler HOST:PORT, or MASTER_ADDR (Slurm: the first "
        "host of SLURM_JOB_NODELIST) with MASTER_PORT");
  }
  if (!options.insecure) {
    // The control's loom up makes them in the shared run folder and then
    // writes READY. Those of an earlier run in the same folder may be read
    // before it makes new ones: the worker reads them again every
    // --tls_refresh, and its registration is retried meanwhile.
    const std::string ready = options.certificates + "/READY";
    const absl::Time until = absl::Now() + options.startup_timeout;
    while (access(ready.c_str(), R_OK) != 0) {
      if (absl::Now() > until) {
        return absl::DeadlineExceededError(absl::StrCat(
            ready, " did not appear within ", absl::FormatDuration(options.startup_timeout),
            ": start `loom up --control_only` with the same --run_dir (a shared folder) first"));
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
  }
  ServiceSlot slot;
  slot.rank = w->rank;
  slot.local_rank = env.local_rank;
  slot.host = env.host.empty() ? options.host : env.host;
  slot.scheduler = env.scheduler;
  slot.exit_on_job_end = true;
  std::vector<std::string> argv = ServiceCommand(options, *binary, slot);
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  execv(args[0], args.data());
  return absl::InternalError(absl::StrCat(argv[0], ": ", std::strerror(errno)));
}

}  // namespace loom
