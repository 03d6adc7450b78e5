// loomctl: drives a Loom job through loom-scheduler's control API
// (loom.control.v1). Every call carries a deadline (--timeout).
//
//   loomctl submit JOB_FILE [--resume | --resume_step N] [--watch]
//   loomctl get|watch|pause|resume|checkpoint|cancel JOB_ID [--reason TEXT]
//   loomctl health SERVICE   (exit 0 when SERVING: Kubernetes' probe)
//
// The scheduler is --scheduler HOST:PORT, else $LOOM_SCHEDULER, else the
// address `loom up` wrote into .loom/run/scheduler_address. Credentials:
// --tls_dir (the admin's certificate; or only a ca.crt) with --token_file
// (a bearer token), else the admin certificate `loom up` made in
// RUN_DIR/tls/admin; --insecure for a job run without TLS.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"
#include "runtime/base/file.h"
#include "services/common/health_client.h"
#include "services/common/job.h"
#include "services/common/security.h"
#include "services/scheduler/control_client.h"

ABSL_FLAG(std::string, scheduler, "",
          "host:port of loom-scheduler (default: $LOOM_SCHEDULER, else the address in "
          ".loom/run/scheduler_address that `loom up` writes).");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10), "Deadline of each call.");
ABSL_FLAG(absl::Duration, watch_timeout, absl::Hours(24 * 365),
          "How long `watch` (and `submit --watch`) follows the job.");
ABSL_FLAG(bool, json, false, "Print jobs and events as JSON, one per line.");
ABSL_FLAG(bool, resume, false,
          "submit: continue after the newest complete checkpoint of the job's run.");
ABSL_FLAG(int64_t, resume_step, 0,
          "submit: continue after this complete checkpoint step of the job's run (the step "
          "loom-preprocess was started from).");
ABSL_FLAG(bool, watch, false, "submit: then follow the job until it ends.");
ABSL_FLAG(std::string, reason, "", "cancel: why (kept in the job's message).");
ABSL_FLAG(std::string, run_dir, ".loom/run",
          "loom up's run folder (its scheduler_address); validate: roots the default folders.");

namespace {

constexpr char kUsage[] =
    "loomctl: drive a Loom job through loom-scheduler's control API.\n"
    "  loomctl submit JOB_FILE [--resume | --resume_step N] [--watch]   (JSON or text "
    "loom.job.v1.JobConfig)\n"
    "  loomctl validate JOB_FILE    (offline: print the job with defaults, or what is wrong)\n"
    "  loomctl get JOB_ID\n"
    "  loomctl watch JOB_ID         (steps, checkpoints, state changes until the job ends)\n"
    "  loomctl pause JOB_ID | resume JOB_ID | checkpoint JOB_ID\n"
    "  loomctl cancel JOB_ID [--reason TEXT]\n"
    "  loomctl health SERVICE       (grpc.health.v1 of --scheduler HOST:PORT, any Loom service; "
    "exit 0 when SERVING)\n"
    "Flags: --scheduler HOST:PORT --timeout --watch_timeout --json --resume --resume_step --watch "
    "--reason --run_dir\n"
    "Credentials: --tls_dir DIR (ca.crt; tls.crt and tls.key: the admin's certificate) "
    "--token_file FILE (a bearer token) --insecure; default: RUN_DIR/tls/admin from loom up";

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

std::string Summary(const loom::control::v1::Job& j) {
  std::string s =
      absl::StrFormat("job %s: %s  iteration %d%s  last checkpoint %s  workers %d/%d", j.job_id(),
                      loom::JobStateName(j.state()), j.completed_iterations(),
                      j.end_iteration() > 0 ? absl::StrCat("/", j.end_iteration()) : "",
                      j.last_checkpoint() > 0 ? absl::StrCat(j.last_checkpoint()) : "none",
                      j.workers_registered(), j.workers_expected());
  if (j.pending_checkpoint() > 0)
    absl::StrAppend(&s, "  checkpoint pending at ", j.pending_checkpoint());
  if (j.has_last_step()) {
    absl::StrAppend(&s, absl::StrFormat("  loss %.4f", j.last_step().loss()));
    if (j.last_step().output_images() > 0) {  // a model with a generator
      absl::StrAppend(&s,
                      absl::StrFormat("  generation loss %.4f", j.last_step().generation_loss()));
    }
  }
  absl::StrAppend(&s, "  ", loom::DescribeProgress(j));
  if (!j.message().empty()) absl::StrAppend(&s, "  (", j.message(), ")");
  if (j.training_time().started_seconds() > 0) {
    absl::StrAppend(
        &s, absl::StrFormat("  effective %.1f%%", 100 * j.training_time().effective_ratio()));
  }
  if (j.restarts() > 0 && j.state() != loom::control::v1::JOB_STATE_RECOVERING) {
    absl::StrAppend(&s, "  restarts ", j.restarts(),
                    " (the latest after: ", loom::DescribeLoss(j.recovery()), ")");
  }
  return s;
}

void PrintJob(const loom::control::v1::Job& j) {
  std::printf("%s\n", absl::GetFlag(FLAGS_json) ? Json(j).c_str() : Summary(j).c_str());
}

bool PrintEvent(const loom::control::v1::JobEvent& e) {
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(e).c_str());
  } else if (e.kind() == loom::control::v1::JobEvent::KIND_STEP) {
    const auto& r = e.step();
    const double s = r.seconds() > 0 ? r.seconds() : 1e-9;
    const std::string generation = r.output_images() > 0
                                       ? absl::StrFormat("  generation loss %.4f (%d images)",
                                                         r.generation_loss(), r.output_images())
                                       : "";
    std::printf(
        "step %lld%s  loss %.4f%s  %.1f samples/s  %.0f tokens/s  imbalance %.4f  %.3f s  %s\n",
        static_cast<long long>(r.iteration() + 1),
        e.job().end_iteration() > 0 ? absl::StrCat("/", e.job().end_iteration()).c_str() : "",
        r.loss(), generation.c_str(), r.samples() / s, r.tokens() / s, r.microbatch_imbalance(),
        r.seconds(), loom::DescribeProgress(e.job()).c_str());
  } else if (e.kind() == loom::control::v1::JobEvent::KIND_CHECKPOINT) {
    std::printf("checkpoint %lld complete\n", static_cast<long long>(e.checkpoint_step()));
  } else {
    std::printf("%s\n", Summary(e.job()).c_str());
  }
  std::fflush(stdout);
  return true;
}

int Error(const absl::Status& s) {
  std::fprintf(stderr, "loomctl: %s: %s\n", absl::StatusCodeToString(s.code()).c_str(),
               std::string(s.message()).c_str());
  return 1;
}

int Usage(const std::string& why) {
  std::fprintf(stderr, "loomctl: %s\n%s\n", why.c_str(), kUsage);
  return 2;
}

std::string SchedulerTarget() {
  if (!absl::GetFlag(FLAGS_scheduler).empty()) return absl::GetFlag(FLAGS_scheduler);
  if (const char* env = std::getenv("LOOM_SCHEDULER"); env != nullptr && *env != '\0') return env;
  absl::StatusOr<std::string> written =
      loom::ReadFile(absl::GetFlag(FLAGS_run_dir) + "/scheduler_address");
  if (written.ok()) return std::string(absl::StripAsciiWhitespace(*written));
  return "";
}

int Watch(loom::ControlClient& client, const std::string& id) {
  loom::control::v1::JobState last = loom::control::v1::JOB_STATE_UNSPECIFIED;
  absl::Status s = client.Watch(
      id, -1,
      [&](const loom::control::v1::JobEvent& e) {
        last = e.job().state();
        return PrintEvent(e);
      },
      absl::GetFlag(FLAGS_watch_timeout));
  if (!s.ok()) return Error(s);
  return last == loom::control::v1::JOB_STATE_FAILED ? 3 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) return Usage("no command");
  const std::string command = args[1];
  if (args.size() != 3) return Usage(absl::StrCat(command, ": takes exactly one argument"));
  const std::string arg = args[2];
  if (command == "validate") {
    absl::StatusOr<loom::job::v1::JobConfig> job =
        loom::LoadJobConfig(arg, absl::GetFlag(FLAGS_run_dir));
    if (!job.ok()) return Error(job.status());
    std::printf("%s\n", loom::JobToJson(*job).c_str());
    return 0;
  }
  absl::StatusOr<loom::TransportSecurity> security = loom::TransportSecurityFromFlags(
      /*need_identity=*/false, absl::GetFlag(FLAGS_run_dir) + "/tls/admin");
  if (!security.ok()) return Error(security.status());
  loom::SetClientSecurity(*security);
  const std::string target = SchedulerTarget();
  if (target.empty()) {
    return Usage("no scheduler: pass --scheduler HOST:PORT or set LOOM_SCHEDULER");
  }
  if (command == "health") {
    absl::StatusOr<loom::ServingStatus> st =
        loom::CheckHealth(target, arg, absl::GetFlag(FLAGS_timeout));
    if (!st.ok()) return Error(st.status());
    std::printf("%s\n", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*st).c_str());
    return *st == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
  }
  loom::ControlClient client(target, absl::GetFlag(FLAGS_timeout));
  absl::StatusOr<loom::control::v1::Job> job;
  if (command == "submit") {
    absl::StatusOr<std::string> text = loom::ReadFile(arg);
    if (!text.ok()) return Error(text.status());
    absl::StatusOr<loom::job::v1::JobConfig> config = loom::ParseJobConfig(*text, arg);
    if (!config.ok()) return Error(config.status());
    loom::control::v1::JobSpec spec;
    *spec.mutable_config() = *config;
    spec.set_resume(absl::GetFlag(FLAGS_resume));
    spec.set_resume_step(absl::GetFlag(FLAGS_resume_step));
    job = client.Submit(spec);
    if (job.ok() && absl::GetFlag(FLAGS_watch)) {
      PrintJob(*job);
      return Watch(client, job->job_id());
    }
  } else if (command == "get") {
    job = client.Get(arg);
  } else if (command == "watch") {
    return Watch(client, arg);
  } else if (command == "pause") {
    job = client.Pause(arg);
  } else if (command == "resume") {
    job = client.Resume(arg);
  } else if (command == "checkpoint") {
    job = client.Checkpoint(arg, nullptr);
  } else if (command == "cancel") {
    job = client.Cancel(arg, absl::GetFlag(FLAGS_reason));
  } else {
    return Usage(absl::StrCat("unknown command \"", command, "\""));
  }
  if (!job.ok()) return Error(job.status());
  PrintJob(*job);
  return 0;
}
