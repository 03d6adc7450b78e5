#include "services/worker/stall_watch.h"

#include "gtest/gtest.h"

namespace loom {
namespace {

const absl::Time t0 = absl::FromUnixSeconds(1000);

TEST(StallWatch, WorkPastTheFloorOrFactorTimesTheLongestIsAStall) {
  StallWatch w(absl::Seconds(2), 3);
  w.Work("step", t0);
  EXPECT_EQ(w.Stalled(t0 + absl::Seconds(2)), "");  // the floor, nothing seen yet
  EXPECT_NE(w.Stalled(t0 + absl::Seconds(2.5)), "");
  w.Wait(t0 + absl::Seconds(1.5));  // a 1.5 s step: the limit is now 4.5 s
  EXPECT_EQ(w.Stalled(t0 + absl::Hours(1)), "") << "waiting is never a stall";
  w.Work("step", t0 + absl::Seconds(10));
  EXPECT_EQ(w.Stalled(t0 + absl::Seconds(14.5)), "");
  const std::string stall = w.Stalled(t0 + absl::Seconds(15));
  EXPECT_NE(stall.find("(step) for 5.0s, past its limit 4.5s"), std::string::npos) << stall;
}

TEST(StallWatch, PhasesAreMeasuredApart) {
  StallWatch w(absl::Seconds(1), 2);
  w.Work("checkpoint", t0);
  w.Work("step", t0 + absl::Seconds(60));  // a long write
  EXPECT_NE(w.Stalled(t0 + absl::Seconds(62)), "") << "the write does not raise a step's limit";
  w.Work("checkpoint", t0 + absl::Seconds(100));
  EXPECT_EQ(w.Stalled(t0 + absl::Seconds(200)), "") << "nor a step's the write's";
  EXPECT_NE(w.Stalled(t0 + absl::Seconds(221)), "");
}

TEST(StallWatch, AWaitInsideWorkEndsItsStretchAndResumesThePhase) {
  StallWatch w(absl::Milliseconds(500), 1);
  w.Work("step");
  {
    StallWatch::Waiting waiting(&w);
    EXPECT_EQ(w.Stalled(absl::Now() + absl::Hours(1)), "");
  }
  const std::string stall = w.Stalled(absl::Now() + absl::Seconds(10));
  EXPECT_NE(stall.find("(step)"), std::string::npos) << stall;
  StallWatch::Waiting none(nullptr);  // no watch: nothing to mark
}

TEST(StallWatch, AWaitMayTakeTheFloorOrFactorTimesTheLongestIteration) {
  StallWatch w(absl::Seconds(30), 10, /*margin=*/absl::Seconds(3));
  EXPECT_EQ(w.WaitLimit(), absl::Seconds(33));
  w.IterationDone(absl::Seconds(2));
  EXPECT_EQ(w.WaitLimit(), absl::Seconds(33));
  w.IterationDone(absl::Seconds(5));
  w.IterationDone(absl::Seconds(1));
  EXPECT_EQ(w.WaitLimit(), absl::Seconds(53));
}

}  // namespace
}  // namespace loom
