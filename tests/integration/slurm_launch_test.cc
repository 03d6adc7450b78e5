// A job launched as Slurm launches one: `loom up --control_only` (loom-
// preprocess and loom-scheduler) on host A, and four tasks of `loom up
// --worker_from_env` under a faked srun environment (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_JOB_NODELIST
// "10.77.0.[1-2]", MASTER_PORT): tasks 0 and 1 the encoder's ranks on host
// A, tasks 2 and 3 the LLM's on host B, each host a Linux network namespace
// (netns.h), UCX over TCP. Each process finds its worker, its host and
// loom-scheduler's address in that environment alone. The job trains equal
// to loom-train-local, and when it ends every Loom process has exited 0 by
// itself (--exit_on_job_end): the workers, loom-preprocess and
// loom-scheduler. A second run kills an LLM task on host B mid-run and
// starts it again on host A: loom-scheduler admits it there, and the job
// continues with the uninterrupted run's losses. A third is cancelled
// mid-run (loomctl cancel): its workers finish the iterations already
// handed out, and then every process exits 0 too.
//
// Needs root (ip netns add); fails, naming it, where that is refused.
#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/base/file.h"
#include "services/common/subprocess.h"
#include "tests/integration/binaries.h"
#include "tests/integration/netns.h"
#include "tests/integration/training_runs.h"

namespace loom {
namespace {

constexpr int kPort = 29400;  // loom-scheduler's, on host A (MASTER_PORT)

// Waits until `p`'s log holds `text` (or it ended, or the deadline).
bool WaitFor(Subprocess& p, const std::string& text, absl::Time deadline) {
  while (absl::Now() < deadline) {
    if (absl::StrContains(p.ReadLog(), text)) return true;
    if (!p.running()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::StrContains(p.ReadLog(), text);
}

class SlurmLaunchTest : public TwoHostsTest {
 protected:
  // The control on host A: loom up --control_only, its JSON steps in its log.
  std::unique_ptr<Subprocess> StartControl(const std::string& name, int steps) {
    config_ = TempPath(name + ".txtpb");
    run_ = TempPath(name);
    EXPECT_TRUE(WriteFileAtomically(config_, Job("loom", /*checkpoint_every=*/3) +
                                                 "recovery { lease_seconds: 3 }\n")
                    .ok());
    absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(
        {IpBinary(), "netns", "exec", host_a_, "/usr/bin/env", "UCX_TLS=tcp",
         Runfile("deploy/launcher/loom-up"), "--bin_dir=" + Runfile(""), "--run_dir=" + run_,
         "--config=" + config_, absl::StrCat("--steps=", steps), "--json", "--control_only",
         absl::StrCat("--bind_host=", kAddressA), absl::StrCat("--base_port=", kPort)},
        TempPath(name + "-control.log"));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? std::move(*p) : nullptr;
  }

  // srun's task `task` on node `node` (0: host A, 1: host B), local id `local`.
  std::unique_ptr<Subprocess> StartTask(const std::string& name, int task, int node, int local,
                                        const std::string& log) {
    absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(
        {IpBinary(), "netns", "exec", node == 0 ? host_a_ : host_b_, "/usr/bin/env", "UCX_TLS=tcp",
         absl::StrCat("SLURM_PROCID=", task), "SLURM_NTASKS=4",
         absl::StrCat("SLURM_LOCALID=", local), absl::StrCat("SLURM_NODEID=", node),
         "SLURM_JOB_NODELIST=10.77.0.[1-2]", absl::StrCat("MASTER_PORT=", kPort),
         Runfile("deploy/launcher/loom-up"), "--bin_dir=" + Runfile(""), "--run_dir=" + run_,
         "--config=" + config_, "--worker_from_env"},
        TempPath(log));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? std::move(*p) : nullptr;
  }

  // The control, once healthy, and srun's four tasks: 0 and 1 (the
  // encoder's ranks) on host A, 2 and 3 (the LLM's) on host B.
  void StartJob(const std::string& name, absl::Time deadline, int steps = kSteps) {
    control_ = StartControl(name, steps);
    ASSERT_NE(control_, nullptr);
    ASSERT_TRUE(WaitFor(*control_, "services healthy", deadline)) << control_->ReadLog();
    for (int task = 0; task < 4; ++task) {
      tasks_.push_back(
          StartTask(name, task, task / 2, task % 2, absl::StrCat(name, "-task-", task, ".log")));
      ASSERT_NE(tasks_.back(), nullptr);
    }
  }

  std::string config_, run_;
  std::unique_ptr<Subprocess> control_;
  std::vector<std::unique_ptr<Subprocess>> tasks_;
};

TEST_F(SlurmLaunchTest, TasksFromTheEnvironmentTrainAsOneProcessAndAllExitZero) {
  const absl::Time deadline = absl::Now() + absl::Minutes(5);
  ASSERT_NO_FATAL_FAILURE(StartJob("slurm", deadline));
  Subprocess* control = control_.get();
  std::vector<std::unique_ptr<Subprocess>>& tasks = tasks_;
  absl::StatusOr<int> status = control->Wait(deadline - absl::Now());
  ASSERT_TRUE(status.ok()) << status.status() << "\n" << control->ReadLog();
  const std::string log = control->ReadLog();
  EXPECT_EQ(DescribeWaitStatus(*status), "exit 0") << log;
  // Every process ended by itself, exit 0: the control's two services (its
  // table), each worker task (srun's view).
  EXPECT_TRUE(absl::StrContains(log, "loom up: stopped cleanly")) << log;
  EXPECT_TRUE(absl::StrContains(log,
                                "the 4 worker tasks (loom up --worker_from_env) reach "
                                "loom-scheduler at 10.77.0.1:29400"))
      << log;
  for (int task = 0; task < 4; ++task) {
    absl::StatusOr<int> st = tasks[task]->Wait(absl::Minutes(1));
    ASSERT_TRUE(st.ok()) << "task " << task << " still runs:\n" << tasks[task]->ReadLog();
    EXPECT_EQ(DescribeWaitStatus(*st), "exit 0") << "task " << task << ":\n"
                                                 << tasks[task]->ReadLog();
    EXPECT_TRUE(absl::StrContains(tasks[task]->ReadLog(), "the job ended: exiting"))
        << tasks[task]->ReadLog();
  }
  // Each task's worker bound the host its SLURM_NODEID names.
  for (int task = 0; task < 4; ++task) {
    EXPECT_TRUE(absl::StrContains(tasks[task]->ReadLog(),
                                  absl::StrCat("\"host\":\"", task < 2 ? kAddressA : kAddressB)))
        << "task " << task << ":\n"
        << tasks[task]->ReadLog();
  }
  ExpectSameSteps(Steps(StepResults(log), 1, kSteps, "slurm"), local_,
                  "srun-style tasks on two hosts vs loom-train-local");
}

TEST_F(SlurmLaunchTest, ATaskLostOnOneHostStartedOnAnotherIsAdmittedWithTheSameLosses) {
  const absl::Time deadline = absl::Now() + absl::Minutes(6);
  ASSERT_NO_FATAL_FAILURE(StartJob("moved", deadline));
  Subprocess* control = control_.get();
  std::vector<std::unique_ptr<Subprocess>>& tasks = tasks_;
  // Task 3 (LLM rank 1, host B) killed in iteration 8; the node is gone:
  // its task starts again on host A (SLURM_NODEID 0, local id 2).
  ASSERT_TRUE(WaitFor(*control, "checkpoint 6 complete", deadline) &&
              WaitFor(*control, "\"step\":7,", deadline))
      << control->ReadLog();
  tasks[3]->Signal(SIGKILL);
  ASSERT_TRUE(WaitFor(*control, "is a task of its own: start it again", deadline))
      << control->ReadLog();
  std::unique_ptr<Subprocess> moved = StartTask("moved", 3, 0, 2, "moved-task-3-again.log");
  ASSERT_NE(moved, nullptr);
  absl::StatusOr<int> status = control->Wait(deadline - absl::Now());
  ASSERT_TRUE(status.ok()) << status.status() << "\n" << control->ReadLog();
  const std::string log = control->ReadLog();
  EXPECT_EQ(DescribeWaitStatus(*status), "exit 0") << log;
  EXPECT_TRUE(absl::StrContains(log, "RECOVERING: llm_worker rank 1")) << log;
  for (Subprocess* p : {tasks[0].get(), tasks[1].get(), tasks[2].get(), moved.get()}) {
    absl::StatusOr<int> st = p->Wait(absl::Minutes(1));
    ASSERT_TRUE(st.ok()) << p->ReadLog();
    EXPECT_EQ(DescribeWaitStatus(*st), "exit 0") << p->ReadLog();
  }
  // The replacement serves on host A.
  EXPECT_TRUE(absl::StrContains(moved->ReadLog(), absl::StrCat("\"host\":\"", kAddressA)))
      << moved->ReadLog();
  ExpectSameSteps(Steps(StepResults(log), 1, kSteps, "slurm-moved"), local_,
                  "an LLM task lost on host B and started on host A vs loom-train-local");
}

TEST_F(SlurmLaunchTest, ACancelledJobEndsEveryProcessWithExitZero) {
  const absl::Time deadline = absl::Now() + absl::Minutes(5);
  ASSERT_NO_FATAL_FAILURE(StartJob("cancel", deadline, /*steps=*/500));
  ASSERT_TRUE(WaitFor(*control_, "\"step\":3,", deadline)) << control_->ReadLog();
  int rc = -1;
  const std::string out =
      RunToEnd({IpBinary(), "netns", "exec", host_a_, Runfile("services/scheduler/loomctl"),
                "--run_dir=" + run_, "cancel", "loom", "--reason=enough"},
               "loomctl-cancel.log", &rc);
  ASSERT_EQ(rc, 0) << out;
  absl::StatusOr<int> status = control_->Wait(deadline - absl::Now());
  ASSERT_TRUE(status.ok()) << status.status() << "\n" << control_->ReadLog();
  const std::string log = control_->ReadLog();
  EXPECT_EQ(DescribeWaitStatus(*status), "exit 0") << log;
  EXPECT_TRUE(absl::StrContains(log, "loom up: job loom CANCELLED")) << log;
  EXPECT_TRUE(absl::StrContains(log, "loom up: stopped cleanly")) << log;
  for (int task = 0; task < 4; ++task) {
    absl::StatusOr<int> st = tasks_[task]->Wait(absl::Minutes(1));
    ASSERT_TRUE(st.ok()) << "task " << task << " still runs:\n" << tasks_[task]->ReadLog();
    EXPECT_EQ(DescribeWaitStatus(*st), "exit 0") << "task " << task << ":\n"
                                                 << tasks_[task]->ReadLog();
  }
  EXPECT_FALSE(absl::StrContains(log, "\"step\":500,")) << log;
}

}  // namespace
}  // namespace loom
