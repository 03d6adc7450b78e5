#include "runtime/train/trainer.h"

#include <cstdlib>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/tolerances.h"
#include "runtime/base/test_paths.h"
#include "runtime/train/synthetic_data.h"
#include "runtime/train/train_checkpoint.h"

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
  const auto& tol = testing::kSplitInvarianceTrajectoryF32;
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_NEAR(four[i], one[i], tol.atol + tol.rtol * one[i]) << "step " << i + 1;
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

// Trains steps [from, to) of a run, starting from `model` as it is.
std::vector<double> TrainRange(MultimodalModel& model, int from, int to, uint64_t seed) {
  SyntheticCaptions data(model.config(), seed, false);
  LocalTrainer trainer(&model, TrainOptions());
  trainer.set_steps_taken(from);
  std::vector<double> losses;
  for (int s = from; s < to; ++s) {
    std::vector<Sample> batch;
    for (int i = 0; i < 8; ++i) batch.push_back(data.Get(s * 8 + i));
    losses.push_back(trainer.Step(batch).loss);
  }
  return losses;
}

TEST(TrainerTest, ResumingFromACheckpointContinuesTheSameRun) {
  const ModelConfig c = *ModelConfigByName("tiny");
  const std::string dir = testing::TempPath("ckpt");
  MultimodalModel straight(c);
  straight.Initialize(6);
  const std::vector<double> all = TrainRange(straight, 0, 20, 6);

  MultimodalModel first(c);
  first.Initialize(6);
  std::vector<double> resumed = TrainRange(first, 0, 10, 6);
  absl::StatusOr<CheckpointRun> run = StartCheckpointRun(dir, "tiny seed 6");
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_TRUE(SaveTrainingCheckpoint(first, 10, dir, *run).ok());
  MultimodalModel second(c);
  second.Initialize(123);  // anything: the checkpoint replaces it
  absl::StatusOr<int64_t> latest = ResumableStep(dir, "tiny seed 6");
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 10);
  ASSERT_TRUE(LoadTrainingCheckpoint(second, 10, dir).ok());
  const std::vector<double> rest = TrainRange(second, 10, 20, 6);
  resumed.insert(resumed.end(), rest.begin(), rest.end());
  EXPECT_EQ(resumed, all);  // bit for bit: same math in the same order
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
