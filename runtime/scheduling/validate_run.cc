// loom-schedule validate: the job of --config run under each layout of
// --layouts by `loom up` (its model, data and seed; --steps iterations;
// every layout priced by one profile, --profile or one made first), then one
// JSON line per layout (validate.h) and the rankings.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "loom/job/v1/job.pb.h"
#include "runtime/base/file.h"
#include "runtime/base/runfiles.h"
#include "runtime/scheduling/profile.h"
#include "runtime/scheduling/schedule_commands.h"
#include "runtime/scheduling/validate.h"
#include "services/common/job.h"
#include "services/common/subprocess.h"

ABSL_DECLARE_FLAG(std::string, config);
ABSL_DECLARE_FLAG(std::string, output);
ABSL_DECLARE_FLAG(std::string, profile);

ABSL_FLAG(std::string, layouts, "",
          "validate: the layouts, each the text of a parallel { } body (e.g. 'llm_pp: 2 "
          "microbatches: 4'), separated by ';'.");
ABSL_FLAG(int, steps, 8, "validate: iterations each layout runs.");
ABSL_FLAG(int, warmup, 2, "validate: iterations left out at the start of each run.");
ABSL_FLAG(std::string, dir, ".loom/validate",
          "validate: a folder per layout's run (layout-N), the profile made and the job's "
          "generated data, shared.");
ABSL_FLAG(std::string, loom_up, "", "validate: the loom-up binary; default: the runfiles'.");
ABSL_FLAG(absl::Duration, run_timeout, absl::Minutes(20), "validate: the most one run may take.");

namespace loom::sched {
namespace {

// Figures of the finished run in `run_dir` of `job` (defaults applied).
LayoutResult ReadRun(const job::v1::JobConfig& job, const std::string& run_dir,
                     const std::string& up_log, int warmup) {
  LayoutResult r;
  absl::StatusOr<std::string> json = ReadFile(run_dir + "/trace.json");
  trace::v1::TraceFile trace;
  if (!json.ok() || !google::protobuf::util::JsonStringToMessage(*json, &trace).ok()) {
    r.error = absl::StrCat("cannot read the run's trace ", run_dir, "/trace.json");
    return r;
  }
  std::vector<std::pair<bool, std::string>> logs;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(run_dir + "/logs", ec)) {
    const std::string name = e.path().filename().string();
    const bool encoder = absl::StartsWith(name, "loom-encoder-worker");
    if (!encoder && !absl::StartsWith(name, "loom-llm-worker")) continue;
    absl::StatusOr<std::string> text = ReadFile(e.path().string());
    if (text.ok()) logs.emplace_back(encoder, *std::move(text));
  }
  absl::StatusOr<LayoutResult> f = LayoutFigures(job, trace, up_log, logs, warmup);
  if (!f.ok()) r.error = std::string(f.status().message());
  return f.ok() ? *std::move(f) : r;
}

// The last line of `text` that says something.
std::string LastLine(const std::string& text) {
  size_t end = text.find_last_not_of("\n ");
  if (end == std::string::npos) return "";
  const size_t start = text.rfind('\n', end);
  return text.substr(start == std::string::npos ? 0 : start + 1, end - start);
}

// How each layout's `loom up` runs.
struct RunWith {
  std::string loom_up, bin_dir, profile_path;
  int steps = 0, warmup = 0;
};

// Runs `job` by loom up in `run_dir` (emptied first) and reads its figures;
// a run that fails or runs past --run_timeout is the result's error, a
// folder or process that cannot be made the status.
absl::StatusOr<LayoutResult> RunLayout(const job::v1::JobConfig& job, const std::string& run_dir,
                                       const RunWith& with) {
  std::error_code ec;
  std::filesystem::remove_all(run_dir, ec);  // a previous validation's run
  LayoutResult r;
  std::string job_text;
  google::protobuf::TextFormat::PrintToString(job, &job_text);
  if (absl::Status s = MakeDirectories(run_dir); !s.ok()) return s;
  if (absl::Status s = WriteFileAtomically(run_dir + "/job.txtpb", job_text); !s.ok()) return s;
  std::vector<std::string> argv = {with.loom_up,
                                   "--config=" + run_dir + "/job.txtpb",
                                   "--run_dir=" + run_dir,
                                   absl::StrCat("--steps=", with.steps),
                                   "--json",
                                   "--trace=" + run_dir + "/trace.json",
                                   "--profile=" + with.profile_path};
  if (!with.bin_dir.empty()) argv.push_back("--bin_dir=" + with.bin_dir);
  absl::StatusOr<std::unique_ptr<Subprocess>> up = Subprocess::Start(argv, run_dir + "/up.log");
  if (!up.ok()) return up.status();
  absl::StatusOr<int> status = (*up)->Wait(absl::GetFlag(FLAGS_run_timeout));
  if (!status.ok()) {
    (*up)->Signal(SIGTERM);
    status = (*up)->Wait(absl::Minutes(1));
    r.error = absl::StrCat("loom up ran past --run_timeout ",
                           absl::FormatDuration(absl::GetFlag(FLAGS_run_timeout)));
  } else if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    r.error = absl::StrCat("loom up ended with ", DescribeWaitStatus(*status), ": ",
                           LastLine((*up)->ReadLog()), " (", run_dir, "/up.log)");
  } else {
    r = ReadRun(job, run_dir, (*up)->ReadLog(), with.warmup);
  }
  return r;
}

}  // namespace

int ValidateCommand() {
  ExportRunfilesDir();  // before any thread starts: it changes the environment
  const std::vector<std::string> layouts = SplitLayouts(absl::GetFlag(FLAGS_layouts));
  const int steps = absl::GetFlag(FLAGS_steps), warmup = absl::GetFlag(FLAGS_warmup);
  if (layouts.empty()) return Fail(absl::InvalidArgumentError("--layouts: none given"));
  if (warmup < 0 || steps <= warmup) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--steps ", steps, " --warmup ", warmup, ": want 0 <= warmup < steps")));
  }
  const std::string config = absl::GetFlag(FLAGS_config);
  absl::StatusOr<std::string> text = ReadFile(config);
  if (!text.ok()) return Fail(text.status());
  absl::StatusOr<job::v1::JobConfig> base = ParseJobConfig(*text, config);
  if (!base.ok()) return Fail(base.status());
  const std::string dir = std::filesystem::absolute(absl::GetFlag(FLAGS_dir)).string();
  if (absl::Status s = MakeDirectories(dir); !s.ok()) return Fail(s);
  // Every layout's job, checked before anything runs: the data generated
  // once under DIR, the checkpoints of each run its own.
  ApplyJobDefaults(dir, &*base);
  std::vector<job::v1::JobConfig> jobs;
  for (size_t i = 0; i < layouts.size(); ++i) {
    job::v1::JobConfig j = *base;
    if (absl::Status s = ApplyLayout(layouts[i], &j); !s.ok()) return Fail(s);
    j.mutable_checkpoint()->set_dir(absl::StrCat(dir, "/layout-", i, "/checkpoints"));
    if (absl::Status s = ValidateJob(j); !s.ok()) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("layout \"", layouts[i], "\": job.", s.message())));
    }
    jobs.push_back(std::move(j));
  }
  std::string profile_path = absl::GetFlag(FLAGS_profile);
  absl::StatusOr<scheduler::v1::Profile> profile;
  if (profile_path.empty()) {
    absl::StatusOr<hf::PretrainedModel> model = JobModel(*base);
    if (!model.ok()) return Fail(model.status());
    std::vector<int> tps;  // every TP a layout runs a module at
    for (const job::v1::JobConfig& j : jobs) {
      for (int tp : {j.parallel().encoder_tp(), j.parallel().llm_tp()}) {
        if (std::find(tps.begin(), tps.end(), tp) == tps.end()) tps.push_back(tp);
      }
    }
    profile = ProfileFromFlags(model->config, tps,
                               base->precision().empty() ? "fp32" : base->precision());
    if (!profile.ok()) return Fail(profile.status());
    profile_path = dir + "/profile.json";
    if (absl::Status s = WriteProfile(*profile, profile_path); !s.ok()) return Fail(s);
  } else {
    profile = ReadProfile(profile_path);
    if (!profile.ok()) return Fail(profile.status());
    profile_path = std::filesystem::absolute(profile_path).string();
  }
  std::string loom_up = absl::GetFlag(FLAGS_loom_up), bin_dir, tried;
  if (loom_up.empty() && !FindLoomUp(&loom_up, &bin_dir, &tried)) {
    return Fail(absl::NotFoundError("no loom-up among the runfiles (give --loom_up): " + tried));
  }
  FILE* out = stdout;
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output != "-" && (out = std::fopen(output.c_str(), "w")) == nullptr) {
    return Fail(absl::InvalidArgumentError("--output: cannot write " + output));
  }
  const RunWith run_with{loom_up, bin_dir, profile_path, steps, warmup};
  std::vector<LayoutResult> results;
  for (size_t i = 0; i < layouts.size(); ++i) {
    const std::string run_dir = absl::StrCat(dir, "/layout-", i);
    std::fprintf(stderr, "loom-schedule: validate: layout %zu/%zu \"%s\" (%s)\n", i + 1,
                 layouts.size(), layouts[i].c_str(), run_dir.c_str());
    absl::StatusOr<LayoutResult> run = RunLayout(jobs[i], run_dir, run_with);
    if (!run.ok()) return Fail(run.status());
    LayoutResult& r = *run;
    r.layout = layouts[i];
    r.host_cores = static_cast<int>(std::thread::hardware_concurrency());
    scheduler::v1::Plan plan;
    plan.mutable_encoder()->set_tp(jobs[i].parallel().encoder_tp());
    plan.mutable_llm()->set_tp(jobs[i].parallel().llm_tp());
    (void)ApplyProfile(*profile, &plan, &r.tp_scaled, JobFrozen(jobs[i]));
    std::fprintf(out, "%s\n", LayoutJson(r).c_str());
    std::fflush(out);
    if (r.error.empty()) {
      std::fprintf(
          stderr,
          "loom-schedule: validate: \"%s\": predicted %.4g s, measured %.4g s (x%.3f) "
          "over %d iterations%s\n",
          r.layout.c_str(), r.predicted_s, r.measured_s, r.predicted_s / r.measured_s, r.iterations,
          r.host_cores > 0 && r.ranks > r.host_cores
              ? absl::StrCat(" (", r.ranks, " ranks share ", r.host_cores, " cores)").c_str()
              : "");
    } else {
      std::fprintf(stderr, "loom-schedule: validate: \"%s\": %s\n", r.layout.c_str(),
                   r.error.c_str());
    }
    results.push_back(std::move(r));
  }
  std::fprintf(out, "%s\n", RankingJson(results).c_str());
  if (out != stdout) std::fclose(out);
  for (const LayoutResult& r : results) {
    if (!r.error.empty()) return 1;
  }
  return 0;
}

}  // namespace loom::sched
