#include "deploy/launcher/task_launch.h"

#include <map>
#include <string>

#include "gtest/gtest.h"
#include "services/common/job.h"

namespace loom {
namespace {

std::vector<std::string> Hosts(absl::string_view list) {
  absl::StatusOr<std::vector<std::string>> h = ExpandHostlist(list);
  EXPECT_TRUE(h.ok()) << list << ": " << h.status();
  return h.ok() ? *h : std::vector<std::string>();
}

std::string HostlistError(absl::string_view list) {
  absl::StatusOr<std::vector<std::string>> h = ExpandHostlist(list);
  EXPECT_FALSE(h.ok()) << list;
  return h.ok() ? "" : std::string(h.status().message());
}

TEST(TaskLaunchTest, SlurmHostlistsExpandAsScontrolShowHostnames) {
  using V = std::vector<std::string>;
  EXPECT_EQ(Hosts("node1"), V({"node1"}));
  EXPECT_EQ(Hosts("node[01-03,07],gpu5"), V({"node01", "node02", "node03", "node07", "gpu5"}));
  EXPECT_EQ(Hosts("rack[1-2]-n[8-9]"), V({"rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"}));
  EXPECT_EQ(Hosts("10.77.0.[1-2]"), V({"10.77.0.1", "10.77.0.2"}));
  EXPECT_EQ(Hosts("a[9-11]"), V({"a9", "a10", "a11"}));
  EXPECT_NE(HostlistError("node[3-1]").find("\"3-1\" is not a range"), std::string::npos);
  EXPECT_NE(HostlistError("node[1-2").find("'[' without ']'"), std::string::npos);
  EXPECT_NE(HostlistError("node1]").find("']' without '['"), std::string::npos);
  EXPECT_NE(HostlistError("a,,b").find("an empty host"), std::string::npos);
  EXPECT_NE(HostlistError("").find("empty hostlist"), std::string::npos);
}

// A fake environment.
struct Env {
  std::map<std::string, std::string> vars;
  absl::StatusOr<TaskEnv> Read() const {
    return TaskEnvFromEnvironment([this](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    });
  }
};

TEST(TaskLaunchTest, SlurmAndTorchrunEnvironmentsSayTheTask) {
  Env slurm{{{"SLURM_PROCID", "3"},
             {"SLURM_NTASKS", "4"},
             {"SLURM_LOCALID", "1"},
             {"SLURM_NODEID", "1"},
             {"SLURM_JOB_NODELIST", "gpu[07-08]"},
             {"MASTER_PORT", "29400"}}};
  absl::StatusOr<TaskEnv> t = slurm.Read();
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->source, "slurm");
  EXPECT_EQ(t->task, 3);
  EXPECT_EQ(t->tasks, 4);
  EXPECT_EQ(t->local_rank, 1);
  EXPECT_EQ(t->host, "gpu08");
  EXPECT_EQ(t->scheduler, "gpu07:29400");  // the nodelist's first host
  slurm.vars["MASTER_ADDR"] = "10.0.0.9";
  EXPECT_EQ(slurm.Read()->scheduler, "10.0.0.9:29400");
  slurm.vars.erase("MASTER_PORT");
  EXPECT_EQ(slurm.Read()->scheduler, "");  // --scheduler must say

  Env torchrun{{{"RANK", "2"},
                {"WORLD_SIZE", "8"},
                {"LOCAL_RANK", "2"},
                {"MASTER_ADDR", "head"},
                {"MASTER_PORT", "29500"}}};
  t = torchrun.Read();
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->source, "torchrun");
  EXPECT_EQ(t->task, 2);
  EXPECT_EQ(t->tasks, 8);
  EXPECT_EQ(t->local_rank, 2);
  EXPECT_EQ(t->host, "");
  EXPECT_EQ(t->scheduler, "head:29500");

  auto error = [](const Env& e) {
    absl::StatusOr<TaskEnv> r = e.Read();
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : std::string(r.status().message());
  };
  EXPECT_NE(error(Env{}).find("neither Slurm's SLURM_PROCID nor torchrun's RANK"),
            std::string::npos);
  Env bad = torchrun;
  bad.vars["WORLD_SIZE"] = "x";
  EXPECT_NE(error(bad).find("WORLD_SIZE=x: not a whole number"), std::string::npos);
  bad = torchrun;
  bad.vars["RANK"] = "8";
  EXPECT_NE(error(bad).find("task 8 of 8"), std::string::npos);
  bad = slurm;
  bad.vars.erase("SLURM_JOB_NODELIST");
  EXPECT_NE(error(bad).find("SLURM_JOB_NODELIST is not set"), std::string::npos);
  bad = slurm;
  bad.vars["SLURM_NODEID"] = "2";
  EXPECT_NE(error(bad).find("SLURM_NODEID=2: the step's nodelist has 2 hosts"), std::string::npos);
  // A step on part of the allocation: SLURM_NODEID counts the step's nodes;
  // slurmd's own name for the node comes first.
  Env step = slurm;
  step.vars["SLURM_JOB_NODELIST"] = "gpu[05-08]";
  step.vars["SLURM_STEP_NODELIST"] = "gpu[07-08]";
  EXPECT_EQ(step.Read()->host, "gpu08");
  step.vars["SLURMD_NODENAME"] = "gpu07";
  EXPECT_EQ(step.Read()->host, "gpu07");
  bad = slurm;
  bad.vars.erase("SLURM_LOCALID");
  EXPECT_NE(error(bad).find("SLURM_LOCALID is not set"), std::string::npos);
}

TEST(TaskLaunchTest, TasksAreTheWorkersInModuleOrder) {
  job::v1::JobConfig job;
  job.set_model("tiny-gen");
  job.mutable_parallel()->set_encoder_dp(2);
  job.mutable_parallel()->set_llm_dp(2);
  job.mutable_parallel()->set_llm_tp(2);
  job.mutable_parallel()->set_generator_dp(1);
  ApplyJobDefaults("/tmp/run", &job);
  ASSERT_TRUE(ValidateJob(job).ok()) << ValidateJob(job);
  const std::vector<std::pair<common::v1::Role, int>> want = {
      {common::v1::ROLE_ENCODER_WORKER, 0},  {common::v1::ROLE_ENCODER_WORKER, 1},
      {common::v1::ROLE_LLM_WORKER, 0},      {common::v1::ROLE_LLM_WORKER, 1},
      {common::v1::ROLE_LLM_WORKER, 2},      {common::v1::ROLE_LLM_WORKER, 3},
      {common::v1::ROLE_GENERATOR_WORKER, 0}};
  for (int task = 0; task < 7; ++task) {
    absl::StatusOr<TaskWorker> w = WorkerOfTask(job, task, 7);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->role, want[task].first) << task;
    EXPECT_EQ(w->rank, want[task].second) << task;
  }
  absl::StatusOr<TaskWorker> w = WorkerOfTask(job, 0, 8);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("the job has 7 worker ranks (2 loom-encoder-worker, 4 "
                                      "loom-llm-worker, 1 loom-generator-worker) but the launch "
                                      "has 8 tasks"),
            std::string::npos)
      << w.status();
  job.mutable_parallel()->set_colocate(true);
  w = WorkerOfTask(job, 0, 7);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("parallel.colocate"), std::string::npos);
}

}  // namespace
}  // namespace loom
