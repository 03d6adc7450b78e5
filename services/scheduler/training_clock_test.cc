#include "services/scheduler/training_clock.h"

#include "gtest/gtest.h"

namespace loom {
namespace {

using control::v1::JOB_STATE_PAUSED;
using control::v1::JOB_STATE_PENDING;
using control::v1::JOB_STATE_RECOVERING;
using control::v1::JOB_STATE_RUNNING;
using control::v1::JOB_STATE_SUCCEEDED;

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

absl::Time At(double seconds) { return kT0 + absl::Seconds(seconds); }

TEST(TrainingClock, StandsStillUntilTheJobFirstRuns) {
  TrainingClock c;
  c.SetState(JOB_STATE_PENDING, At(0));
  control::v1::TrainingTime t = c.Read(At(50));
  EXPECT_EQ(t.started_seconds(), 0);
  EXPECT_EQ(t.elapsed_seconds(), 0);
  EXPECT_EQ(t.effective_ratio(), 0);
  c.SetState(JOB_STATE_RUNNING, At(60));
  t = c.Read(At(70));
  EXPECT_DOUBLE_EQ(t.started_seconds(), 1'000'060);
  EXPECT_DOUBLE_EQ(t.elapsed_seconds(), 10);
}

TEST(TrainingClock, PausesAndTheEndDoNotCount) {
  TrainingClock c;
  c.SetState(JOB_STATE_RUNNING, At(0));
  c.AddIteration(0, 4);
  c.SetState(JOB_STATE_PAUSED, At(5));
  EXPECT_DOUBLE_EQ(c.Read(At(100)).elapsed_seconds(), 5);
  EXPECT_DOUBLE_EQ(c.Read(At(100)).stopped_seconds(), 95);
  c.SetState(JOB_STATE_RUNNING, At(100));
  c.AddIteration(1, 4);
  c.SetState(JOB_STATE_SUCCEEDED, At(105));
  const control::v1::TrainingTime t = c.Read(At(1000));
  EXPECT_DOUBLE_EQ(t.elapsed_seconds(), 10);
  EXPECT_DOUBLE_EQ(t.productive_seconds(), 8);
  EXPECT_DOUBLE_EQ(t.effective_ratio(), 0.8);
}

TEST(TrainingClock, ARollbackDropsTheIterationsAfterTheCheckpointButNotTheirTime) {
  TrainingClock c;
  c.SetState(JOB_STATE_RUNNING, At(0));
  for (int i = 0; i < 4; ++i) c.AddIteration(i, 1);  // iterations 0-3: 4 s
  EXPECT_DOUBLE_EQ(c.ProductiveBefore(2), 2);
  c.CheckpointComplete(2);
  c.SetState(JOB_STATE_RECOVERING, At(4));
  c.RollBack();  // iterations 2 and 3 are trained again
  EXPECT_DOUBLE_EQ(c.Read(At(6)).productive_seconds(), 2);
  c.SetState(JOB_STATE_RUNNING, At(6));
  for (int i = 2; i < 4; ++i) c.AddIteration(i, 1);
  const control::v1::TrainingTime t = c.Read(At(8));
  EXPECT_DOUBLE_EQ(t.productive_seconds(), 4);
  EXPECT_DOUBLE_EQ(t.elapsed_seconds(), 8);  // the lost 2 s and the 2 s recovery stay in
  EXPECT_DOUBLE_EQ(t.effective_ratio(), 0.5);
}

TEST(TrainingClock, AnIterationReportedAfterItsCheckpointSurvivesARollback) {
  TrainingClock c;
  c.SetState(JOB_STATE_RUNNING, At(0));
  c.AddIteration(0, 1);
  c.CheckpointComplete(2);  // before iteration 1's report arrived
  c.AddIteration(1, 1);
  c.AddIteration(2, 1);
  c.RollBack();
  EXPECT_DOUBLE_EQ(c.Read(At(3)).productive_seconds(), 2);
}

TEST(TrainingClock, ARestartedAttemptGoesOnWithTheKeptClock) {
  TrainingClock first;
  first.SetState(JOB_STATE_RUNNING, At(0));
  first.SetState(JOB_STATE_PAUSED, At(10));
  first.SetState(JOB_STATE_RUNNING, At(20));  // 10 s paused
  const control::v1::TrainingTime kept = first.Read(At(30));
  // A new scheduler takes the job back from checkpoint 10, before which 12 s
  // of iterations were kept; the time it took to come back counts.
  TrainingClock second;
  second.Continue(kept, 10, 12);
  second.SetState(JOB_STATE_PENDING, At(40));
  second.AddIteration(10, 2);
  const control::v1::TrainingTime t = second.Read(At(50));
  EXPECT_DOUBLE_EQ(t.started_seconds(), 1'000'000);
  EXPECT_DOUBLE_EQ(t.stopped_seconds(), 10);
  EXPECT_DOUBLE_EQ(t.elapsed_seconds(), 40);
  EXPECT_DOUBLE_EQ(t.productive_seconds(), 14);
  second.RollBack();
  EXPECT_DOUBLE_EQ(second.Read(At(50)).productive_seconds(), 12);
}

TEST(TrainingClock, TheRatioIsCappedAtOne) {
  TrainingClock c;
  c.SetState(JOB_STATE_RUNNING, At(0));
  c.AddIteration(0, 3);  // timed from before the job ran
  EXPECT_DOUBLE_EQ(c.Read(At(2)).effective_ratio(), 1);
}

}  // namespace
}  // namespace loom
