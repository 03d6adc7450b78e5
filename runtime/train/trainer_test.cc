#include "runtime/train/trainer.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/tolerances.h"
#include "runtime/train/synthetic_data.h"

namespace loom {
namespace {

std::vector<double> Train(int steps, int microbatches, uint64_t seed, bool shuffle = false,
                          int batch_size = 8) {
  ModelConfig c = *ModelConfigByName("tiny");
  MultimodalModel model(c);
  model.Initialize(seed);
  SyntheticCaptions data(c, seed, shuffle);
  TrainOptions o;
  o.microbatches = microbatches;
  LocalTrainer trainer(&model, o);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    std::vector<Sample> batch;
    for (int i = 0; i < batch_size; ++i) batch.push_back(data.Get(s * batch_size + i));
    losses.push_back(trainer.Step(batch).loss);
  }
  return losses;
}

TEST(TrainerTest, SameSeedSameLosses) {
  EXPECT_EQ(Train(3, 2, 1), Train(3, 2, 1));
  EXPECT_NE(Train(1, 2, 1), Train(1, 2, 2));
}

TEST(TrainerTest, MicrobatchCountDoesNotChangeTheTrajectory) {
  const std::vector<double> one = Train(5, 1, 3), four = Train(5, 4, 3);
  const auto& tol = testing::kSplitInvarianceF32;
  for (size_t i = 0; i < one.size(); ++i) {
    // Five optimizer steps let summation-order differences grow a little.
    EXPECT_NEAR(four[i], one[i], 10 * (tol.atol + tol.rtol * one[i])) << "step " << i + 1;
  }
}

TEST(TrainerTest, LossFallsFromItsStart) {
  const std::vector<double> l = Train(30, 2, 4);
  EXPECT_LT(l.back(), 0.7 * l.front());
}

double MeanOfLast(const std::vector<double>& v, size_t n) {
  double s = 0;
  for (size_t i = v.size() - n; i < v.size(); ++i) s += v[i];
  return s / n;
}

// The done-when of the trainer: it learns to use the images. With shuffled
// images the captions' attributes are unpredictable and the loss stays near
// their entropy (~0.77 nats per loss token); with the true images it falls
// well below.
TEST(TrainerTest, LearnsToUseTheImages) {
  const std::vector<double> real = Train(400, 2, 1, /*shuffle=*/false, 16);
  const std::vector<double> control = Train(400, 2, 1, /*shuffle=*/true, 16);
  const double r = MeanOfLast(real, 50), c = MeanOfLast(control, 50);
  EXPECT_GT(c, 0.7);
  EXPECT_LT(r, c - 0.15) << "real " << r << " control " << c;
}

TEST(SyntheticCaptionsTest, DeterministicAndShuffleKeepsCaptions) {
  ModelConfig c = *ModelConfigByName("tiny");
  SyntheticCaptions a(c, 9, false), b(c, 9, false), ctl(c, 9, true);
  Sample x = a.Get(17), y = b.Get(17), z = ctl.Get(17);
  EXPECT_EQ(x.tiles, y.tiles);
  EXPECT_EQ(x.tokens, y.tokens);
  EXPECT_EQ(x.tokens, z.tokens);  // same caption ...
  EXPECT_NE(x.tiles, z.tiles);    // ... another sample's image
  EXPECT_EQ(x.num_tiles * c.tokens_per_tile() + 1 + 7, static_cast<int>(x.tokens.size()));
  EXPECT_EQ(a.Caption(17).rfind("image of ", 0), 0u);
}

}  // namespace
}  // namespace loom
