// loom-scheduler: the profiler/scheduler and control plane.
//
//   loom-scheduler --plan plan.json --preprocess HOST:PORT [--algorithm loom]
//   loom-scheduler --llm_dp 2 --microbatches 4 --encoder_dp 2 --preprocess HOST:PORT
//   loom-scheduler --job job.json --preprocess HOST:PORT [--resume]
//   loom-scheduler --preprocess HOST:PORT     (the job comes by SubmitJob)
//
// Serves loom.scheduler.v1.SchedulerService (the workers) and
// loom.control.v1.ControlService (loomctl, loom up, automation).
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/message_differencer.h"
#include "runtime/base/file.h"
#include "runtime/base/log.h"
#include "runtime/checkpoint/steps.h"
#include "runtime/model/config.h"
#include "runtime/scheduling/plan.h"
#include "runtime/scheduling/profile.h"
#include "runtime/scheduling/schedule.h"
#include "services/common/init.h"
#include "services/common/job.h"
#include "services/common/job_end.h"
#include "services/scheduler/control_service.h"
#include "services/scheduler/scheduler_service.h"

ABSL_FLAG(std::string, plan, "", "The job's plan (JSON from `loom-schedule plan`).");
ABSL_FLAG(absl::Duration, exit_grace, absl::Minutes(2),
          "--exit_on_job_end: how long after the job's end to wait for every worker and "
          "loom-preprocess to be told before exiting anyway (peers that are gone).");
ABSL_FLAG(int, llm_dp, 0, "Instead of --plan: LLM DP ranks.");
ABSL_FLAG(int, microbatches, 0, "Instead of --plan: microbatches per LLM rank.");
ABSL_FLAG(int, encoder_dp, 0, "Instead of --plan: encoder DP ranks.");
ABSL_FLAG(int, llm_tp, 1, "With --llm_dp: ranks splitting each LLM layer.");
ABSL_FLAG(int, encoder_tp, 1, "With --encoder_dp: ranks splitting each encoder layer.");
ABSL_FLAG(int, llm_pp, 1, "With --llm_dp: LLM pipeline stages.");
ABSL_FLAG(int, encoder_pp, 1, "With --encoder_dp: encoder pipeline stages.");
ABSL_FLAG(std::string, config, "tiny", "Model config, for costs when the plan has none.");
ABSL_FLAG(std::string, algorithm, "loom",
          "Assignment: sequential, lpt, disttrain, entrain, ilp, loom.");
ABSL_FLAG(std::string, preprocess, "", "host:port of loom-preprocess (batch metadata).");
ABSL_FLAG(int, retained_iterations, 16, "Assignments kept for fetches and timing reports.");
ABSL_FLAG(int, assign_ahead, 2,
          "Iterations computed ahead of the newest one handed out (0 to retained_iterations - "
          "1).");
ABSL_FLAG(double, ilp_seconds, 10, "Time limit of the ilp algorithm.");
ABSL_FLAG(std::string, job, "",
          "The job config (loom.job.v1.JobConfig, JSON or text): model, degrees (unless "
          "--plan), algorithm, steps, checkpoints. Replaces --config/--algorithm/--llm_dp/...");
ABSL_FLAG(std::string, run_dir, ".loom/run", "Roots the job's default folders.");
ABSL_FLAG(bool, resume, false,
          "Continue the job after the newest complete checkpoint of its run (in "
          "checkpoint.dir).");
ABSL_FLAG(int64_t, resume_step, 0,
          "Continue after this complete checkpoint step of the job's run (implies --resume; "
          "loom-preprocess must start from the same step's cursor).");
ABSL_FLAG(bool, take_back, false,
          "Take back the job a previous loom-scheduler kept in --run_dir "
          "(scheduler_job.binpb): after its newest complete checkpoint, at the next "
          "generation, so the workers still running regroup with this one. Without a kept job, "
          "or with a --job of another config, this flag does nothing.");
ABSL_FLAG(std::string, profile, "",
          "A profile (JSON from `loom-schedule profile`): its measured coefficients price the "
          "job's work, fixed (no refit from timings); a module at a TP it did not measure is "
          "scaled by the planner's TP model; a frozen module by its frozen points; a job with "
          "host collectives reduces and sends on the links it measured.");
ABSL_FLAG(int, shared_devices, 0,
          "The workers share this many devices' worth of compute (CPU workers on one host: its "
          "cores over each worker's threads); the simulator shares them among the tasks that "
          "run at once. 0: a device per rank.");
ABSL_FLAG(std::string, trace_dir, "",
          "Append each iteration's simulated timeline to DIR/predicted.jsonl (loom up --trace).");
ABSL_FLAG(double, peak_flops, 0,
          "Peak FLOP/s of all the workers' devices together, for loom_train_mfu_ratio (0: the "
          "plan's GPU peak times its GPUs).");

namespace {

absl::StatusOr<loom::scheduler::v1::Plan> PlanFromFlags() {
  loom::sched::Degrees degrees;
  degrees.llm_dp = absl::GetFlag(FLAGS_llm_dp);
  degrees.microbatches = absl::GetFlag(FLAGS_microbatches);
  degrees.encoder_dp = absl::GetFlag(FLAGS_encoder_dp);
  degrees.llm_tp = absl::GetFlag(FLAGS_llm_tp);
  degrees.encoder_tp = absl::GetFlag(FLAGS_encoder_tp);
  degrees.llm_pp = absl::GetFlag(FLAGS_llm_pp);
  degrees.encoder_pp = absl::GetFlag(FLAGS_encoder_pp);
  absl::StatusOr<loom::scheduler::v1::Plan> read =
      loom::sched::PlanFromFileOrDegrees(absl::GetFlag(FLAGS_plan), degrees);
  if (!read.ok()) return read.status();
  loom::scheduler::v1::Plan plan = std::move(*read);
  if (!plan.has_costs()) {
    absl::StatusOr<loom::ModelConfig> model =
        loom::ModelConfigByName(plan.model().empty() ? absl::GetFlag(FLAGS_config) : plan.model());
    if (!model.ok()) return model.status();
    plan.set_model(model->name);
    *plan.mutable_costs() = loom::sched::CoefficientsOnOneGpu(*model, loom::sched::ClusterSpec());
  }
  return plan;
}

}  // namespace

int main(int argc, char** argv) {
  loom::InitService(argc, argv, "loom-scheduler",
                    "loom-scheduler: the profiler/scheduler and control plane.\n"
                    "  loom-scheduler (--plan FILE | --llm_dp N --microbatches M --encoder_dp E) "
                    "--preprocess HOST:PORT [--algorithm loom]\n"
                    "  loom-scheduler --job FILE --preprocess HOST:PORT [--resume]\n"
                    "  loom-scheduler --preprocess HOST:PORT (the job comes by SubmitJob)\n"
                    "Flags: --host --grpc_port --metrics_port --shutdown_deadline --log_level "
                    "--config --retained_iterations --assign_ahead --ilp_seconds --job --run_dir "
                    "--resume --resume_step "
                    "--peak_flops --trace_dir --profile --shared_devices --take_back");
  loom::Chassis chassis(
      loom::ChassisOptionsFromFlags("loom-scheduler", loom::common::v1::ROLE_SCHEDULER, 0));
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "loom-scheduler: %s\n", std::string(s.message()).c_str());
    return 2;
  };
  if (absl::GetFlag(FLAGS_peak_flops) < 0) {
    return fail(absl::InvalidArgumentError("--peak_flops: must be >= 0"));
  }
  loom::SchedulerDeployment deployment;
  deployment.plan_file = absl::GetFlag(FLAGS_plan);
  deployment.preprocess = absl::GetFlag(FLAGS_preprocess);
  deployment.run_dir = absl::GetFlag(FLAGS_run_dir);
  deployment.retained_iterations = absl::GetFlag(FLAGS_retained_iterations);
  deployment.assign_ahead = absl::GetFlag(FLAGS_assign_ahead);
  deployment.ilp_seconds = absl::GetFlag(FLAGS_ilp_seconds);
  deployment.peak_flops = absl::GetFlag(FLAGS_peak_flops);
  deployment.trace_dir = absl::GetFlag(FLAGS_trace_dir);
  deployment.profile_file = absl::GetFlag(FLAGS_profile);
  deployment.shared_devices = absl::GetFlag(FLAGS_shared_devices);
  if (deployment.shared_devices < 0) {
    return fail(absl::InvalidArgumentError("--shared_devices: must be >= 0"));
  }
  if (!deployment.profile_file.empty()) {  // a bad file fails here, not each job's submission
    absl::StatusOr<loom::scheduler::v1::Profile> p =
        loom::sched::ReadProfile(deployment.profile_file);
    if (!p.ok()) {
      return fail(
          absl::Status(p.status().code(), absl::StrCat("--profile ", p.status().message())));
    }
  }
  // The job is kept there (for --take_back) from the first state change on.
  if (absl::Status s = loom::MakeDirectories(deployment.run_dir); !s.ok()) {
    return fail(absl::Status(s.code(), absl::StrCat("--run_dir: ", s.message())));
  }
  auto service = std::make_unique<loom::SchedulerServiceImpl>(&chassis);
  const std::string kept = loom::SchedulerJobFile(deployment.run_dir);
  bool take_back = absl::GetFlag(FLAGS_take_back) && std::filesystem::exists(kept);
  const bool has_job = !absl::GetFlag(FLAGS_job).empty();
  loom::control::v1::JobSpec kept_spec;
  if (take_back) {
    absl::StatusOr<std::string> bytes = loom::ReadFile(kept);
    if (!bytes.ok() || !kept_spec.ParseFromString(*bytes)) {
      return fail(absl::DataLossError(absl::StrCat("--take_back: cannot read ", kept)));
    }
  }
  if (take_back && has_job) {
    // A pod restarted with the same --job takes its job back; a new job
    // (another config) starts as submitted.
    absl::StatusOr<loom::job::v1::JobConfig> job =
        loom::LoadJobConfig(absl::GetFlag(FLAGS_job), absl::GetFlag(FLAGS_run_dir));
    if (!job.ok()) return fail(job.status());
    take_back = google::protobuf::util::MessageDifferencer::Equals(*job, kept_spec.config());
  }
  const bool has_degrees = absl::GetFlag(FLAGS_llm_dp) || absl::GetFlag(FLAGS_microbatches) ||
                           absl::GetFlag(FLAGS_encoder_dp);
  if (take_back) {  // the job of a scheduler that was lost
    loom::control::v1::JobSpec spec = kept_spec;
    spec.set_generation(spec.generation() + 1);
    spec.set_restarts(spec.restarts() + 1);
    loom::control::v1::Recovery* r = spec.mutable_recovered_from();
    r->Clear();
    r->set_role(loom::common::v1::ROLE_SCHEDULER);
    r->set_cause("restarted; took its job back");
    r->set_declared_seconds(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
    spec.set_resume(true);  // after the newest complete checkpoint, if there is one
    spec.set_resume_step(0);
    absl::StatusOr<loom::SchedulerServiceOptions> o = loom::OptionsForJob(spec, deployment);
    if (!o.ok() && loom::IsNoCheckpointYet(o.status())) {
      spec.set_resume(false);  // none yet: from the start
      o = loom::OptionsForJob(spec, deployment);
    }
    // Any other resume error (RUN or a step unreadable, another identity)
    // fails here, naming it: starting from the seed under a new run would
    // orphan the checkpoints that exist.
    if (!o.ok()) return fail(o.status());
    if (absl::Status s = service->Configure(*o); !s.ok()) return fail(s);
    LOOM_LOG(INFO)
            .With("job", spec.config().name())
            .With("generation", spec.generation())
            .With("start_iteration", o->start_iteration)
        << "took the job back from " << kept;
  } else if (has_job) {  // the job of the deployment, submitted at start
    absl::StatusOr<loom::job::v1::JobConfig> job =
        loom::LoadJobConfig(absl::GetFlag(FLAGS_job), absl::GetFlag(FLAGS_run_dir));
    if (!job.ok()) return fail(job.status());
    loom::control::v1::JobSpec spec;
    *spec.mutable_config() = *job;
    spec.set_resume(absl::GetFlag(FLAGS_resume));
    spec.set_resume_step(absl::GetFlag(FLAGS_resume_step));
    absl::StatusOr<loom::SchedulerServiceOptions> o = loom::OptionsForJob(spec, deployment);
    if (!o.ok()) return fail(o.status());
    if (absl::Status s = service->Configure(*o); !s.ok()) return fail(s);
  } else if (!deployment.plan_file.empty() || has_degrees) {  // a plan without a job config
    loom::SchedulerServiceOptions o;
    o.job.set_model(absl::GetFlag(FLAGS_config));
    o.job.set_algorithm(absl::GetFlag(FLAGS_algorithm));
    loom::ApplyJobDefaults(deployment.run_dir, &o.job);
    absl::StatusOr<loom::scheduler::v1::Plan> plan = PlanFromFlags();
    if (!plan.ok()) return fail(plan.status());
    o.plan = *plan;
    loom::ApplyDeployment(deployment, &o);
    if (absl::Status s = service->Configure(o); !s.ok()) return fail(s);
  }
  loom::ControlServiceImpl control(service.get(), deployment);
  chassis.AddService(service.get(), loom::scheduler::v1::SchedulerService::service_full_name());
  chassis.AddService(&control, loom::control::v1::ControlService::service_full_name());
  // --exit_on_job_end: once the job is final, tell loom-preprocess, let
  // every worker rank be answered job_ended (each then exits 0 by itself),
  // then stop; --exit_grace bounds the wait for peers that are gone.
  std::atomic<bool> stopping{false}, failed{false};
  std::thread ender;
  if (absl::GetFlag(FLAGS_exit_on_job_end)) {
    ender = std::thread([&] {
      const absl::Duration grace = absl::GetFlag(FLAGS_exit_grace);
      absl::Time ended = absl::InfiniteFuture();
      bool preprocess_told = false;
      while (!stopping.load()) {
        absl::SleepFor(absl::Milliseconds(100));
        const loom::SchedulerServiceImpl::JobEnd e = service->JobEndProgress();
        if (!e.final) continue;
        if (ended == absl::InfiniteFuture()) {
          ended = absl::Now();
          LOOM_LOG(INFO).With("job", e.job_id).With("state", e.state)
              << "the job ended: waiting for every worker to finish (--exit_on_job_end)";
        }
        // The workers first (a cancelled job's last iterations still read
        // samples), then loom-preprocess.
        const bool late = absl::Now() - ended >= grace;
        if (e.done < e.ranks && !late) continue;
        if (!preprocess_told) {
          absl::Status s = service->EndPreprocess(e);
          preprocess_told = s.ok();
          if (!s.ok()) LOOM_LOG(WARNING).With("error", std::string(s.message())) << "EndJob";
        }
        if (!preprocess_told && absl::Now() - ended < grace + absl::Seconds(30)) continue;
        LOOM_LOG(INFO)
                .With("workers_done", e.done)
                .With("workers", e.ranks)
                .With("preprocess_told", preprocess_told)
            << "exiting (--exit_on_job_end)";
        failed.store(e.failed);
        loom::StopProcessSoon(absl::Milliseconds(500));  // the last answers leave first
        return;
      }
    });
  }
  int rc = chassis.ServeUntilSignal([&stopping] { stopping.store(true); });
  stopping.store(true);
  if (ender.joinable()) ender.join();
  // A FAILED job's scheduler says so in its exit status (loomctl watch's 3).
  return rc == 0 && failed.load() ? 3 : loom::JobEndExitStatus(rc);
}
