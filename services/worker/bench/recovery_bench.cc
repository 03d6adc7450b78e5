// The recovery benchmark (not a test): how long a lost process costs a
// `loom up` job (tiny model, encoder DP 2, LLM DP 2), measured in one run
// side by side with its references.
//
// One job with checkpoints every --every iterations: after step --kill_at
// LLM worker 1 is SIGKILLed (a recovery in place: a new process takes its
// rank, the others stay up and roll back), after step --kill_at + --every
// the scheduler (a new one on its ports takes the job back from the run
// folder; the others regroup with it). For each kill, from the log
// lines' arrival times: kill -> loss declared (detection), -> every service
// healthy again (the replacement, or all of them), -> the first iteration
// finished after it (recovery, the issue's "kill -> next completed
// iteration"). References from the same run: a cold start (the
// first attempt's services starting to its first finished iteration: what
// a person re-running `loom up --resume` by hand waits at least) and the
// median iteration. Exits 1 when a figure is missing.
//
//   bazel run -c opt //services/worker/bench:recovery_bench
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "runtime/base/file.h"
#include "runtime/base/json_line.h"
#include "runtime/base/runfiles.h"
#include "services/common/subprocess.h"

ABSL_FLAG(std::string, work_dir, "/tmp/loom-recovery-bench", "Data, run and logs.");
ABSL_FLAG(int, steps, 40, "Iterations of the job.");
ABSL_FLAG(int, every, 5, "Checkpoint every this many iterations.");
ABSL_FLAG(int, kill_at, 12, "Kill LLM worker 1 after this step; the scheduler --every later.");

namespace {

// The log's lines, each with the time this process first saw it.
struct Lines {
  std::vector<std::string> text;
  std::vector<absl::Time> seen;
  std::string partial;
  size_t consumed = 0;

  void Poll(const std::string& log) {
    const absl::Time now = absl::Now();
    std::string fresh = partial + log.substr(consumed);
    consumed = log.size();
    size_t start = 0;
    for (size_t nl; (nl = fresh.find('\n', start)) != std::string::npos; start = nl + 1) {
      text.push_back(fresh.substr(start, nl - start));
      seen.push_back(now);
    }
    partial = fresh.substr(start);
  }
  // The first line at or after `from` containing `what`; -1 if none.
  int Find(const std::string& what, int from = 0) const {
    for (int i = std::max(from, 0); i < static_cast<int>(text.size()); ++i) {
      if (absl::StrContains(text[i], what)) return i;
    }
    return -1;
  }
};

// The newest PID of `service` (rank `rank`, "-" for none) in the tables.
int NewestPid(const Lines& lines, const std::string& service, const std::string& rank) {
  int pid = 0;
  for (const std::string& line : lines.text) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int p = 0;
    if (f.size() > 3 && f[0] == service && f[1] == rank && absl::SimpleAtoi(f[2], &p)) pid = p;
  }
  return pid;
}

struct Recovery {
  double detected = -1, restarted = -1, recovered = -1;  // seconds after the kill
};

}  // namespace

int main(int argc, char** argv) {
  loom::ExportRunfilesDir();  // loom-up and the services it starts read their data here
  absl::ParseCommandLine(argc, argv);
  std::string tried, loom_up, bin_dir;
  if (!loom::FindLoomUp(&loom_up, &bin_dir, &tried)) {
    std::fprintf(stderr, "recovery_bench: loom-up not found (%s); use bazel run\n", tried.c_str());
    return 1;
  }
  const std::string dir = absl::GetFlag(FLAGS_work_dir);
  const std::string run = dir + "/run", config = dir + "/job.txtpb";
  std::error_code ec;
  (void)loom::MakeDirectories(dir);
  // A previous run's log and run folder would answer this run's waits.
  std::filesystem::remove(dir + "/loom-up.log", ec);
  std::filesystem::remove_all(run, ec);
  const int steps = absl::GetFlag(FLAGS_steps), every = absl::GetFlag(FLAGS_every);
  const int kill_at = absl::GetFlag(FLAGS_kill_at);
  if (absl::Status s = loom::WriteFileAtomically(
          config, absl::StrCat("name: 'recovery'\nmodel: 'tiny'\nseed: 1\n",
                               "data { samples: 128 global_batch: 16 }\n",
                               "checkpoint { every: ", every, " }\n"));
      !s.ok()) {
    std::fprintf(stderr, "recovery_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<loom::Subprocess>> up = loom::Subprocess::Start(
      {loom_up, "--bin_dir=" + bin_dir, "--run_dir=" + run, "--config=" + config,
       absl::StrCat("--steps=", steps), "--json", "--max_restarts=2"},
      dir + "/loom-up.log");
  if (!up.ok()) {
    std::fprintf(stderr, "recovery_bench: %s\n", std::string(up.status().message()).c_str());
    return 1;
  }
  Lines lines;
  const absl::Time deadline = absl::Now() + absl::Minutes(10);
  auto wait_for = [&](const std::string& what, int from) {
    int at = -1;
    while ((at = lines.Find(what, from)) < 0 && absl::Now() < deadline && (*up)->running()) {
      absl::SleepFor(absl::Milliseconds(5));
      lines.Poll((*up)->ReadLog());
    }
    return at;
  };
  // Kills `service` after `step` (first seen after line `from`) and follows
  // the recovery; the line after which the next kill may look.
  auto kill_after = [&](int step, const std::string& service, const std::string& rank, int from,
                        Recovery* r) {
    const int at = wait_for(absl::StrCat("\"step\":", step, ","), from);
    const int pid = at < 0 ? 0 : NewestPid(lines, service, rank);
    if (pid <= 0) return -1;
    const absl::Time killed = absl::Now();
    kill(pid, SIGKILL);
    const int lost = wait_for("RECOVERING: ", at);
    const int healthy = lost < 0 ? -1 : wait_for("services healthy", lost);
    const int next = healthy < 0 ? -1 : wait_for("\"step\":", healthy);
    auto since = [&](int line) {
      return line < 0 ? -1.0 : absl::ToDoubleSeconds(lines.seen[line] - killed);
    };
    r->detected = since(lost);
    r->restarted = since(healthy);
    r->recovered = since(next);
    return next;
  };
  Recovery worker, scheduler;
  const int started = wait_for("starting 6 services", 0);
  const int first_step = wait_for("\"step\":1,", 0);
  const int after = kill_after(kill_at, "loom-llm-worker", "1", 0, &worker);
  kill_after(kill_at + every, "loom-scheduler", "-", std::max(after, 0), &scheduler);
  absl::StatusOr<int> status = (*up)->Wait(deadline - absl::Now());
  lines.Poll((*up)->ReadLog());
  std::vector<double> iteration;
  for (const std::string& line : lines.text) {
    double s = 0;
    if (loom::JsonNumberField(line, "seconds", &s)) iteration.push_back(s);
  }
  std::sort(iteration.begin(), iteration.end());
  const double cold = started < 0 || first_step < 0
                          ? -1
                          : absl::ToDoubleSeconds(lines.seen[first_step] - lines.seen[started]);
  const double median = iteration.empty() ? -1 : iteration[iteration.size() / 2];
  std::printf(
      "recovery_bench: tiny model, encoder DP 2 + LLM DP 2, checkpoints every %d, %d steps\n"
      "  references: cold start (services starting -> first iteration) %.2f s; median "
      "iteration %.3f s\n",
      every, steps, cold, median);
  bool ok = status.ok() && cold > 0 && median > 0;
  for (const auto& [name, r] : {std::make_pair("LLM worker 1 SIGKILL", worker),
                                std::make_pair("scheduler SIGKILL", scheduler)}) {
    std::printf(
        "  %-20s detected %.2f s, services up %.2f s, next iteration %.2f s after the kill: "
        "%.2fx a cold start, %.1f iterations\n",
        name, r.detected, r.restarted, r.recovered, cold > 0 ? r.recovered / cold : -1,
        median > 0 ? r.recovered / median : -1);
    ok = ok && r.detected >= 0 && r.restarted >= 0 && r.recovered > 0;
  }
  if (!ok) {
    std::fprintf(
        stderr, "recovery_bench: no figure for every part (loom up %s); its log: %s/loom-up.log\n",
        status.ok() ? absl::StrCat("exit status ", *status).c_str() : "did not end", dir.c_str());
    return 1;
  }
  std::filesystem::remove_all(run, ec);
  return 0;
}
