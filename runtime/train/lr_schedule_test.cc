#include "runtime/train/lr_schedule.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/tolerances.h"
#include "runtime/model/params.h"
#include "runtime/train/trainer.h"

namespace loom {
namespace {

using testing::Allowed;
using testing::kClosedFormF32;
using testing::kClosedFormF64;

LrScheduleOptions Options(LrSchedule s, int64_t warmup, int64_t total, double min_ratio) {
  LrScheduleOptions o;
  o.schedule = s;
  o.warmup_steps = warmup;
  o.total_steps = total;
  o.min_ratio = min_ratio;
  return o;
}

TEST(LrScheduleTest, WarmUpIsLinearFromTheFirstStep) {
  const LrScheduleOptions o = Options(LrSchedule::kConstant, 4, 0, 0);
  EXPECT_DOUBLE_EQ(LrFactor(o, 1), 0.25);
  EXPECT_DOUBLE_EQ(LrFactor(o, 3), 0.75);
  EXPECT_DOUBLE_EQ(LrFactor(o, 4), 1.0);
  EXPECT_DOUBLE_EQ(LrFactor(o, 1000), 1.0) << "constant after the warm-up";
  EXPECT_DOUBLE_EQ(LrFactor(Options(LrSchedule::kConstant, 0, 0, 0), 1), 1.0) << "no warm-up";
}

// Warm-up 10, last step 110, floor 0.1: halfway through the decay (step
// 60) both schedules are at 0.55; the cosine is above the line before it
// and below after; both reach the floor at step 110 and stay there.
TEST(LrScheduleTest, DecaysReachTheFloorAtTheLastStep) {
  const LrScheduleOptions cosine = Options(LrSchedule::kCosine, 10, 110, 0.1);
  const LrScheduleOptions linear = Options(LrSchedule::kLinear, 10, 110, 0.1);
  for (const LrScheduleOptions& o : {cosine, linear}) {
    EXPECT_DOUBLE_EQ(LrFactor(o, 5), 0.5) << "warm-up first";
    EXPECT_DOUBLE_EQ(LrFactor(o, 10), 1.0);
    EXPECT_NEAR(LrFactor(o, 60), 0.55, Allowed(kClosedFormF64, 0.55));
    EXPECT_NEAR(LrFactor(o, 110), 0.1, Allowed(kClosedFormF64, 0.1));
    EXPECT_NEAR(LrFactor(o, 500), 0.1, Allowed(kClosedFormF64, 0.1)) << "held at the floor";
    for (int64_t s = 11; s <= 110; ++s) EXPECT_LE(LrFactor(o, s), LrFactor(o, s - 1)) << s;
  }
  // p = 1/4: cosine 0.1 + 0.9 (1 + cos(pi/4)) / 2, linear 0.1 + 0.9 * 3/4.
  const double c = 0.1 + 0.9 * (1 + std::sqrt(0.5)) / 2;
  EXPECT_NEAR(LrFactor(cosine, 35), c, Allowed(kClosedFormF64, c));
  EXPECT_NEAR(LrFactor(linear, 35), 0.775, Allowed(kClosedFormF64, 0.775));
  EXPECT_GT(LrFactor(cosine, 35), LrFactor(linear, 35));
  EXPECT_LT(LrFactor(cosine, 85), LrFactor(linear, 85));
  // A run shorter than its warm-up never decays.
  EXPECT_DOUBLE_EQ(LrFactor(Options(LrSchedule::kCosine, 10, 5, 0), 5), 0.5);
}

TEST(LrScheduleTest, BadSchedulesAreNamed) {
  absl::Status s = ValidateLrSchedule(Options(LrSchedule::kCosine, 10, 0, 0));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("a cosine decay ends at the last step: it needs a step count"),
            std::string::npos)
      << s;
  EXPECT_TRUE(ValidateLrSchedule(Options(LrSchedule::kConstant, 10, 0, 0)).ok());
  EXPECT_FALSE(ValidateLrSchedule(Options(LrSchedule::kLinear, 10, 100, 1.5)).ok());
  EXPECT_FALSE(ValidateLrSchedule(Options(LrSchedule::kLinear, -1, 100, 0)).ok());
  EXPECT_EQ(WarmupStepsFromRatio(0.03, 1000), 30);
  EXPECT_EQ(WarmupStepsFromRatio(0.03, 1001), 31) << "ceil, as Hugging Face";
  for (LrSchedule l : {LrSchedule::kConstant, LrSchedule::kCosine, LrSchedule::kLinear}) {
    EXPECT_EQ(*ParseLrSchedule(LrScheduleName(l)), l);
  }
  EXPECT_FALSE(ParseLrSchedule("step").ok());
}

// One tensor per module, every gradient 1: AdamW's first step moves each
// weight by lr / (1 + eps), so each module's step shows its own learning
// rate (and the schedule's factor), and eps is the one configured.
TEST(LrScheduleTest, EachModuleStepsAtItsOwnRate) {
  std::vector<ParamSet> sets(3);
  for (ParamSet& p : sets) {
    p.Add("w", {2, 2}, Init::kNormal, 0.5f);
    p.Finalize();
    p.Initialize(3);
    p.ZeroGrad();
  }
  TrainOptions o;
  o.adam.lr = 0.1f;
  o.adam.eps = 1.0f;  // the step becomes lr / 2: eps reaches AdamW
  o.warmup_steps = 2;
  o.clip_norm = 0;
  o.encoder_lr = 0.02;  // the projector keeps adam.lr
  o.llm_lr = 0.05;
  std::vector<std::vector<float>> before;
  for (ParamSet& p : sets) {
    for (float& g : p.grads()) g = 1.0f;
    before.push_back(p.data());
  }
  const double lr = OptimizerStep({&sets[0], &sets[1], &sets[2]},
                                  {Module::kEncoder, Module::kProjector, Module::kLlm}, o,
                                  /*step=*/1, /*grad_norm=*/0);
  EXPECT_NEAR(lr, 0.05, Allowed(kClosedFormF32, 0.05)) << "adam.lr at half its warm-up";
  const double want[3] = {0.02 * 0.5 / 2, 0.1 * 0.5 / 2, 0.05 * 0.5 / 2};
  for (int m = 0; m < 3; ++m) {
    for (size_t k = 0; k < before[m].size(); ++k) {
      EXPECT_NEAR(before[m][k] - sets[m].data()[k], want[m], Allowed(kClosedFormF32, want[m]))
          << "module " << m << " element " << k;
    }
  }
}

}  // namespace
}  // namespace loom
