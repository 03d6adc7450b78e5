#include "deploy/launcher/profile_job.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "runtime/backends/cuda/cuda_ops.h"
#include "runtime/base/file.h"
#include "runtime/model/precision.h"
#include "runtime/scheduling/profile.h"
#include "services/common/job.h"
#include "services/common/subprocess.h"

namespace loom {

absl::Status ProfileJobTo(const job::v1::JobConfig& job, const std::string& path) {
  absl::StatusOr<hf::PretrainedModel> model = JobModel(job);
  if (!model.ok()) return model.status();
  const std::string device = job.device().llm().empty() ? "cpu" : job.device().llm();
  std::unique_ptr<Ops> owned;
  absl::StatusOr<Ops*> ops = OpsForDevice(device, &owned);
  if (!ops.ok()) return ops.status();
  absl::StatusOr<Precision> precision =
      ParsePrecision(job.precision().empty() ? "fp32" : job.precision());
  if (!precision.ok()) return precision.status();
  sched::ProfileOptions o;
  o.precision = *precision;
  o.tps = {1};
  if (device == "cpu") {
    o.tps.clear();
    for (int tp : {job.parallel().llm_tp(), job.parallel().encoder_tp()}) {
      tp = std::max(1, tp);
      if (std::find(o.tps.begin(), o.tps.end(), tp) == o.tps.end() &&
          ValidateModelParallel(model->config, tp, 1, tp, 1).ok()) {
        o.tps.push_back(tp);
      }
    }
    if (o.tps.empty()) o.tps = {1};
  }
  const int context = model->config.llm.max_seq;
  std::vector<int> tokens;
  for (int t : o.tokens) {
    if (t <= context) tokens.push_back(t);
  }
  if (tokens.size() < 2) tokens = {std::max(4, context / 8 * 4), std::max(8, context / 4 * 4)};
  o.tokens = tokens;
  std::printf("loom up: profiling %s on %s in %s at TP %s\n", model->config.name.c_str(),
              device.c_str(), PrecisionName(o.precision), absl::StrJoin(o.tps, ", ").c_str());
  absl::StatusOr<scheduler::v1::Profile> profile = sched::ProfileModules(model->config, *ops, o);
  if (!profile.ok()) return profile.status();
  return sched::WriteProfile(*profile, path);
}

absl::StatusOr<std::string> ProfileJob(const job::v1::JobConfig& job, const std::string& run_dir,
                                       FILE* info) {
  if (absl::Status s = MakeDirectories(run_dir + "/logs"); !s.ok()) return s;
  const std::string config = std::filesystem::absolute(run_dir + "/profile-job.json").string();
  const std::string path = std::filesystem::absolute(run_dir + "/profile.json").string();
  const std::string log = run_dir + "/logs/loom-up-profile.log";
  if (absl::Status s = WriteFileAtomically(config, JobToJson(job) + "\n"); !s.ok()) return s;
  std::fprintf(info, "loom up: profiling the job's modules first (--profile auto; %s)\n",
               log.c_str());
  std::fflush(info);
  absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Start(
      {"/proc/self/exe", "--config=" + config, "--run_dir=" + run_dir, "--profile_only=" + path},
      log);
  if (!child.ok()) return child.status();
  absl::StatusOr<int> st = (*child)->Wait(absl::Minutes(30));
  if (!st.ok() || DescribeWaitStatus(*st) != "exit 0") {
    return absl::InternalError("the profile failed:\n" + (*child)->ReadLog());
  }
  absl::StatusOr<scheduler::v1::Profile> profile = sched::ReadProfile(path);
  if (!profile.ok()) return profile.status();
  std::fprintf(info,
               "loom up: profile of %s on %s in %s at TP %d written to %s: %.4g s a tile "
               "(largest misfit %.1f%%), %.4g s a token + %.4g s a squared token (%.1f%%); "
               "loom-scheduler prices the job by it\n",
               profile->model().c_str(), profile->device().c_str(), profile->precision().c_str(),
               profile->tp(), path.c_str(), profile->encoder_per_tile(),
               100 * profile->encoder_max_residual(), profile->llm_per_token(),
               profile->llm_per_token_sq(), 100 * profile->llm_max_residual());
  return path;
}

}  // namespace loom
