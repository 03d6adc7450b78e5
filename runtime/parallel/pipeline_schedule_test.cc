#include "runtime/parallel/pipeline_schedule.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace loom::parallel {
namespace {

// The worked example of pipeline_schedule.h.
TEST(PipelineScheduleTest, WorkedExample) {
  EXPECT_EQ(FormatSchedule(OneFOneBSchedule(3, 0, 4)), "F0 F1 F2 B0 F3 B1 B2 B3");
  EXPECT_EQ(FormatSchedule(OneFOneBSchedule(3, 1, 4)), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(FormatSchedule(OneFOneBSchedule(3, 2, 4)), "F0 B0 F1 B1 F2 B2 F3 B3");
}

TEST(PipelineScheduleTest, FewerMicrobatchesThanStages) {
  EXPECT_EQ(FormatSchedule(OneFOneBSchedule(4, 0, 2)), "F0 F1 B0 B1");
  EXPECT_EQ(FormatSchedule(OneFOneBSchedule(4, 3, 2)), "F0 B0 F1 B1");
  EXPECT_EQ(FormatSchedule(OneFOneBSchedule(5, 1, 1)), "F0 B0");
}

TEST(PipelineScheduleTest, GlobalStagesPutTheEncoderFirst) {
  EXPECT_EQ(GlobalStage(/*encoder=*/true, 1, /*encoder_pp=*/2), 1);
  EXPECT_EQ(GlobalStage(/*encoder=*/false, 0, /*encoder_pp=*/2), 2);
}

// Every stage runs its ops in order; a forward of microbatch j on stage s
// waits for stage s-1's forward of j (the activation it receives), a
// backward for stage s+1's backward of j (the gradient). Sends never block.
// For every pipeline depth and microbatch count, all stages finish (no
// deadlock), each op runs once, and a stage never holds more than S - s
// microbatches' activations at once (1F1B's memory bound).
TEST(PipelineScheduleTest, NeverDeadlocksAndBoundsActivations) {
  for (int stages = 1; stages <= 8; ++stages) {
    for (int m = 1; m <= 12; ++m) {
      SCOPED_TRACE(testing::Message() << stages << " stages, " << m << " microbatches");
      std::vector<std::vector<PipelineOp>> ops(stages);
      for (int s = 0; s < stages; ++s) {
        ops[s] = OneFOneBSchedule(stages, s, m);
        ASSERT_EQ(static_cast<int>(ops[s].size()), 2 * m);
      }
      std::vector<std::vector<bool>> fdone(stages, std::vector<bool>(m)),
          bdone(stages, std::vector<bool>(m));
      std::vector<size_t> next(stages, 0);
      std::vector<int> held(stages, 0);
      for (bool progress = true; progress;) {
        progress = false;
        for (int s = 0; s < stages; ++s) {
          if (next[s] == ops[s].size()) continue;
          const PipelineOp op = ops[s][next[s]];
          const int j = op.microbatch;
          if (op.kind == PipelineOp::kForward) {
            if (s > 0 && !fdone[s - 1][j]) continue;
            ASSERT_FALSE(fdone[s][j]) << "F" << j << " twice on stage " << s;
            fdone[s][j] = true;
            EXPECT_LE(++held[s], stages - s) << "stage " << s << " holds too many activations";
          } else {
            if (s + 1 < stages && !bdone[s + 1][j]) continue;
            ASSERT_TRUE(fdone[s][j]) << "B" << j << " before F" << j << " on stage " << s;
            ASSERT_FALSE(bdone[s][j]) << "B" << j << " twice on stage " << s;
            bdone[s][j] = true;
            --held[s];
          }
          ++next[s];
          progress = true;
        }
      }
      for (int s = 0; s < stages; ++s) {
        EXPECT_EQ(next[s], ops[s].size()) << "deadlock: stage " << s << " stopped at op " << next[s]
                                          << " of " << FormatSchedule(ops[s]);
      }
    }
  }
}

}  // namespace
}  // namespace loom::parallel

namespace loom::parallel {
namespace {

// Layers split into contiguous stages, at least one each, the largest
// stage's cost least; the head's cost moves layers off the last stage.
TEST(SplitLayersTest, BalancesStagesWithTheirExtraCost) {
  EXPECT_EQ(SplitLayers(6, 1, 0, 0), (std::vector<int>{0, 6}));
  EXPECT_EQ(SplitLayers(6, 2, 0, 0), (std::vector<int>{0, 3, 6}));
  EXPECT_EQ(SplitLayers(6, 3, 0, 0), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(SplitLayers(6, 6, 0, 0), (std::vector<int>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(SplitLayers(7, 2, 0, 0), (std::vector<int>{0, 3, 7}));    // ties: later stages larger
  EXPECT_EQ(SplitLayers(6, 2, 0, 2.0), (std::vector<int>{0, 4, 6}));  // 4 | 2 + 2
  EXPECT_EQ(SplitLayers(8, 3, 1.0, 3.0), (std::vector<int>{0, 3, 7, 8}));  // 4 | 4 | 4
  EXPECT_EQ(SplitLayers(3, 3, 0, 10.0), (std::vector<int>{0, 1, 2, 3}));   // one layer at least
}

}  // namespace
}  // namespace loom::parallel
