#include "runtime/checkpoint/steps.h"

#include <sys/stat.h>

#include <cstdlib>

#include "gtest/gtest.h"
#include "runtime/base/file.h"
#include "runtime/base/test_paths.h"

namespace loom {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Writes step N of `run`: one part, then the commit.
void WriteStep(const std::string& dir, int64_t step, const CheckpointRun& run,
               const std::string& part) {
  ASSERT_TRUE(BeginCheckpointStep(dir, step).ok());
  ASSERT_TRUE(WriteFileAtomically(PartialStepDir(dir, step) + "/part", part).ok());
  ASSERT_TRUE(CommitCheckpointStep(dir, step, run).ok());
}

TEST(StepsTest, AStepIsVisibleOnlyOnceCommitted) {
  const std::string dir = testing::TempPath("visible");
  absl::StatusOr<CheckpointRun> run = StartCheckpointRun(dir, "model=tiny");
  ASSERT_TRUE(run.ok());
  ASSERT_TRUE(BeginCheckpointStep(dir, 5).ok());
  ASSERT_TRUE(WriteFileAtomically(PartialStepDir(dir, 5) + "/part", "a").ok());
  EXPECT_FALSE(Exists(StepDir(dir, 5)));
  EXPECT_EQ(ResumableStep(dir, "model=tiny").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(CommitCheckpointStep(dir, 5, *run).ok());
  EXPECT_FALSE(Exists(PartialStepDir(dir, 5)));
  EXPECT_EQ(*ReadFile(StepDir(dir, 5) + "/part"), "a");
  EXPECT_EQ(*ResumableStep(dir, "model=tiny"), 5);
}

// A crash mid-write leaves a partial folder; the next write of that step
// starts from an empty one, so no step mixes files of two writes.
TEST(StepsTest, AnInterruptedWriteLeavesNothingBehind) {
  const std::string dir = testing::TempPath("interrupted");
  absl::StatusOr<CheckpointRun> run = StartCheckpointRun(dir, "id");
  ASSERT_TRUE(run.ok());
  ASSERT_TRUE(BeginCheckpointStep(dir, 3).ok());
  ASSERT_TRUE(WriteFileAtomically(PartialStepDir(dir, 3) + "/stale", "old").ok());
  WriteStep(dir, 3, *run, "new");
  EXPECT_FALSE(Exists(StepDir(dir, 3) + "/stale"));
  EXPECT_EQ(*ReadFile(StepDir(dir, 3) + "/part"), "new");
}

// The case: run A reached step 20; a fresh run B in the same folder
// stops at step 10. Resuming must continue B at 10, never A's 20, and say so.
// A fresh start that never checkpointed takes nothing away from A.
TEST(StepsTest, AFreshRunNeverResumesAnOlderRunsStep) {
  const std::string dir = testing::TempPath("reused");
  absl::StatusOr<CheckpointRun> a = StartCheckpointRun(dir, "id");
  ASSERT_TRUE(a.ok());
  WriteStep(dir, 10, *a, "a10");
  WriteStep(dir, 20, *a, "a20");
  absl::StatusOr<CheckpointRun> b = StartCheckpointRun(dir, "id");
  ASSERT_TRUE(b.ok());
  ASSERT_NE(a->id, b->id);
  EXPECT_EQ(*ResumableStep(dir, "id"), 20) << "B has no step yet: the folder is still A's";
  WriteStep(dir, 10, *b, "b10");  // B's first step: the folder is B's; A's step 10 replaced
  EXPECT_EQ(ReadCheckpointRun(dir)->id, b->id);
  EXPECT_EQ(*ResumableStep(dir, "id"), 10);
  EXPECT_EQ(*ReadFile(StepDir(dir, 10) + "/part"), "b10");
  EXPECT_FALSE(Exists(PartialStepDir(dir, 10))) << "the replaced step is removed";
  absl::StatusOr<int64_t> old = ResumableStep(dir, "id", 20);
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(old.status().message().find("belongs to run " + a->id), std::string::npos)
      << old.status();
  absl::StatusOr<int64_t> none = ResumableStep(dir, "id", 15);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("20 (run " + a->id + ")"), std::string::npos)
      << none.status();
  EXPECT_EQ(*ResumableStep(dir, "id", 10), 10);
}

TEST(StepsTest, ResumeRefusesAnotherIdentityAndAMissingRun) {
  const std::string dir = testing::TempPath("identity");
  EXPECT_EQ(ResumableStep(dir, "x").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<CheckpointRun> run = StartCheckpointRun(dir, "model=tiny seed=1");
  ASSERT_TRUE(run.ok());
  WriteStep(dir, 4, *run, "p");
  absl::StatusOr<int64_t> other = ResumableStep(dir, "model=vit300m-llm1b seed=1");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.status().message().find("model=tiny seed=1"), std::string::npos);
  EXPECT_EQ(ResumableStep(dir, "model=tiny seed=1", 7).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(StartCheckpointRun(dir, "two\nlines").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// NFS, Lustre, CephFS and FUSE refuse RENAME_EXCHANGE: a step written again
// replaces the old one by renaming it aside, and nothing of the old one is
// left behind.
TEST(StepsTest, AStepIsRewrittenWithoutAnAtomicExchange) {
  const std::string dir = testing::TempPath("aside");
  absl::StatusOr<CheckpointRun> run = StartCheckpointRun(dir, "id");
  ASSERT_TRUE(run.ok());
  ForceRenameAsideForTesting(true);
  WriteStep(dir, 6, *run, "first");
  WriteStep(dir, 6, *run, "second");
  ForceRenameAsideForTesting(false);
  EXPECT_EQ(*ReadFile(StepDir(dir, 6) + "/part"), "second");
  EXPECT_FALSE(Exists(StepDir(dir, 6) + ".replaced"));
  EXPECT_FALSE(Exists(PartialStepDir(dir, 6)));
  EXPECT_EQ(*ResumableStep(dir, "id"), 6);
}

// A crash between the two renames leaves step N only aside: a resume puts
// it back; an aside copy whose replacement is in place is dropped.
TEST(StepsTest, AStepLeftAsideByACrashIsPutBack) {
  const std::string dir = testing::TempPath("crashed-aside");
  absl::StatusOr<CheckpointRun> run = StartCheckpointRun(dir, "id");
  ASSERT_TRUE(run.ok());
  WriteStep(dir, 4, *run, "kept");
  ASSERT_EQ(::rename(StepDir(dir, 4).c_str(), (StepDir(dir, 4) + ".replaced").c_str()), 0);
  EXPECT_EQ(*ResumableStep(dir, "id"), 4);
  EXPECT_EQ(*ReadFile(StepDir(dir, 4) + "/part"), "kept");
  WriteStep(dir, 8, *run, "new");
  ASSERT_EQ(::mkdir((StepDir(dir, 8) + ".replaced").c_str(), 0755), 0);
  EXPECT_EQ(*ResumableStep(dir, "id"), 8);
  EXPECT_FALSE(Exists(StepDir(dir, 8) + ".replaced"));
  EXPECT_EQ(*ReadFile(StepDir(dir, 8) + "/part"), "new");
}

// Only "no run was started" and "no complete step of this run" are
// NOT_FOUND (the answer that lets a job start afresh). A RUN or COMPLETE
// that cannot be read (here: a folder in the file's place; tests run as
// root, so permissions cannot make one unreadable) is an error of its own.
TEST(StepsTest, AnUnreadableRunOrStepIsNotMistakenForNone) {
  const std::string dir = testing::TempPath("unreadable");
  absl::StatusOr<CheckpointRun> run = StartCheckpointRun(dir, "id");
  ASSERT_TRUE(run.ok());
  WriteStep(dir, 2, *run, "p");
  WriteStep(dir, 4, *run, "p");
  ASSERT_EQ(::remove((StepDir(dir, 4) + "/COMPLETE").c_str()), 0);
  ASSERT_EQ(::mkdir((StepDir(dir, 4) + "/COMPLETE").c_str(), 0755), 0);
  absl::StatusOr<int64_t> step = ResumableStep(dir, "id");
  EXPECT_FALSE(step.ok()) << "step 2 resumed while step 4 could not be read: " << *step;
  EXPECT_NE(step.status().code(), absl::StatusCode::kNotFound) << step.status();
  EXPECT_NE(step.status().message().find("step 4"), std::string::npos) << step.status();

  const std::string other = testing::TempPath("unreadable-run");
  ASSERT_TRUE(MakeDirectories(other + "/RUN").ok());
  absl::StatusOr<CheckpointRun> r = ReadCheckpointRun(other);
  EXPECT_NE(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_NE(ResumableStep(other, "id").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace loom
