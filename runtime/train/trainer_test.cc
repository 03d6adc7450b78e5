#include "runtime/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
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

// A step whose loss or gradient norm is not finite changes nothing: no
// weight, no AdamW moment, no AdamW step count; the next finite step trains.
TEST(TrainerTest, ANonFiniteStepIsSkipped) {
  ModelConfig c = *ModelConfigByName("tiny");
  MultimodalModel model(c);
  model.Initialize(5);
  SyntheticCaptions data(c, 5, false);
  LocalTrainer trainer(&model, TrainOptions());
  std::vector<Sample> batch;
  for (int i = 0; i < 8; ++i) batch.push_back(data.Get(i));
  ASSERT_FALSE(trainer.Step(batch).skipped);

  ParamSet& llm = *model.param_sets()[static_cast<int>(Module::kLlm)];
  const std::vector<float> kept = llm.data();
  std::fill(llm.data().begin(), llm.data().end(), std::numeric_limits<float>::infinity());
  llm.PushData();  // a NaN loss
  std::vector<std::vector<float>> before;
  std::vector<int64_t> steps;
  for (ParamSet* p : model.param_sets()) {
    before.push_back(p->data());
    before.push_back(p->adam_m());
    before.push_back(p->adam_v());
    steps.push_back(p->step());
  }
  const StepStats st = trainer.Step(batch);
  EXPECT_TRUE(st.skipped);
  EXPECT_FALSE(std::isfinite(st.loss) && std::isfinite(st.grad_norm));
  EXPECT_EQ(st.lr, 0.0);
  size_t k = 0, j = 0;
  for (ParamSet* p : model.param_sets()) {
    for (const std::vector<float>* v : {&p->data(), &p->adam_m(), &p->adam_v()}) {
      const std::vector<float>& was = before[k++];
      ASSERT_EQ(v->size(), was.size());
      for (size_t i = 0; i < was.size(); ++i) {
        ASSERT_TRUE(v->at(i) == was[i] || (std::isnan(v->at(i)) && std::isnan(was[i])))
            << "element " << i << " changed in a skipped step";
      }
    }
    EXPECT_EQ(p->step(), steps[j++]) << "AdamW's step count moved";
  }
  llm.data() = kept;
  llm.PushData();
  const StepStats next = trainer.Step(batch);
  EXPECT_FALSE(next.skipped);
  EXPECT_TRUE(std::isfinite(next.loss));
  EXPECT_GT(next.lr, 0.0);
}

// A sharded optimizer (ZeRO-1): each of DP ranks, given the summed
// gradients, clips and steps its chunk alone, holding that chunk's moments
// only; put together the chunks are the unsharded step's weights and
// moments, bit for bit, over several steps and with weight decay on some
// tensors and not others.
TEST(TrainerTest, AShardedOptimizerStepsItsChunkAsTheWholeStepWould) {
  ModelConfig c = *ModelConfigByName("tiny");
  MultimodalModel model(c);
  model.Initialize(7);
  const ParamSet& seeded = *model.param_sets()[static_cast<int>(Module::kLlm)];
  TrainOptions o;
  o.adam.weight_decay = 0.1f;
  o.clip_norm = 0.5;
  constexpr int kRanks = 3;
  ParamSet whole = seeded;
  std::vector<ParamSet> shards(kRanks, seeded);
  for (int r = 0; r < kRanks; ++r) shards[r].ShardOptimizer(r, kRanks);
  for (int step = 1; step <= 3; ++step) {
    // The same gradients on every rank (after the reduce-scatter, each
    // rank's chunk is the sum every rank would have).
    for (int64_t i = 0; i < whole.size(); ++i) {
      whole.grads()[i] = 0.01f * static_cast<float>((i * 31 + step * 7) % 17) - 0.08f;
    }
    for (ParamSet& s : shards) s.grads() = whole.grads();
    const double norm = std::sqrt(GradSumOfSquares({&whole}));
    double sharded = 0;
    for (ParamSet& s : shards)
      sharded += s.OwnedGradSumOfSquares(s.optimizer_begin(), s.optimizer_end());
    EXPECT_NEAR(std::sqrt(sharded), norm, 1e-12 * norm) << "the chunks' norms sum to the whole's";
    OptimizerStep({&whole}, {Module::kLlm}, o, step, norm);
    for (ParamSet& s : shards) OptimizerStep({&s}, {Module::kLlm}, o, step, norm);
    for (int r = 0; r < kRanks; ++r) {
      const ParamSet& s = shards[r];
      const int64_t b = s.optimizer_begin(), e = s.optimizer_end();
      ASSERT_EQ(s.adam_m().size(), static_cast<size_t>(e - b));
      EXPECT_EQ(s.optimizer_state_bytes(), (e - b) * 8);
      for (int64_t i = b; i < e; ++i) {
        ASSERT_EQ(s.data()[i], whole.data()[i]) << "step " << step << " rank " << r << " " << i;
        ASSERT_EQ(s.adam_m()[i - b], whole.adam_m()[i]) << "step " << step << " rank " << r;
        ASSERT_EQ(s.adam_v()[i - b], whole.adam_v()[i]) << "step " << step << " rank " << r;
      }
      EXPECT_EQ(s.step(), whole.step());
    }
    // The all-gather: every rank takes the others' chunks.
    for (int r = 0; r < kRanks; ++r) {
      for (int k = 0; k < kRanks; ++k) {
        for (int64_t i = shards[k].optimizer_begin(); i < shards[k].optimizer_end(); ++i) {
          shards[r].data()[i] = shards[k].data()[i];
        }
      }
    }
  }
  EXPECT_NE(whole.data(), seeded.data());
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

// Frozen modules (LLaVA's stages): the frozen ones keep their weights bit for
// bit over training and hold no gradients or AdamW state; the trainable ones
// get exactly the gradients they get when nothing is frozen (the first step,
// from the same weights and batch, before the trajectories part).
TEST(TrainerTest, FrozenModulesKeepTheirWeightsAndTheRestGetTheSameGradients) {
  const ModelConfig c = *ModelConfigByName("tiny");
  SyntheticCaptions data(c, 5, false);
  std::vector<Sample> batch;
  for (int i = 0; i < 8; ++i) batch.push_back(data.Get(i));
  std::vector<const Sample*> mb;
  for (const Sample& s : batch) mb.push_back(&s);
  MultimodalModel all(c);
  all.Initialize(5);
  all.ZeroGrad();
  all.ForwardBackward(mb, 0.01f);
  for (const char* list : {"vision,llm", "vision", "vision,projector", "llm", "projector"}) {
    SCOPED_TRACE(list);
    absl::StatusOr<Frozen> frozen = ParseFrozen(list);
    ASSERT_TRUE(frozen.ok()) << frozen.status();
    MultimodalModel m(c);
    m.Initialize(5);
    m.Freeze(*frozen);
    m.ZeroGrad();
    m.ForwardBackward(mb, 0.01f);
    for (Module mod : {Module::kEncoder, Module::kProjector, Module::kLlm}) {
      const int i = static_cast<int>(mod);
      ParamSet& p = *m.param_sets()[i];
      EXPECT_EQ(p.frozen(), frozen->module(mod)) << kModuleNames[i];
      if (p.frozen()) {
        EXPECT_TRUE(p.grads().empty() && p.adam_m().empty() && p.adam_v().empty());
        EXPECT_EQ(p.grad(0), nullptr);
      } else {
        EXPECT_EQ(p.grads(), all.param_sets()[i]->grads()) << kModuleNames[i];
      }
    }
    const std::vector<std::vector<float>> before = {
        m.vit().params().data(), m.projector().params().data(), m.llm().params().data()};
    TrainRange(m, 0, 3, 5);
    for (Module mod : {Module::kEncoder, Module::kProjector, Module::kLlm}) {
      const int i = static_cast<int>(mod);
      if (frozen->module(mod)) {
        EXPECT_EQ(m.param_sets()[i]->data(), before[i]) << kModuleNames[i] << " moved";
        EXPECT_EQ(m.param_sets()[i]->step(), 0);
      } else {
        EXPECT_NE(m.param_sets()[i]->data(), before[i]) << kModuleNames[i] << " did not train";
        EXPECT_EQ(m.param_sets()[i]->step(), 3);
      }
    }
  }
  EXPECT_FALSE(ParseFrozen("vision,projector,llm").ok());
  absl::StatusOr<Frozen> bad = ParseFrozen("vision,tower");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("\"tower\""), std::string::npos) << bad.status();
}

// A frozen module's checkpoint holds its weights and zero AdamW state; a run
// resumed from it continues exactly.
TEST(TrainerTest, FrozenModulesCheckpointAndResume) {
  const ModelConfig c = *ModelConfigByName("tiny");
  const std::string dir = testing::TempPath("frozen-ckpt");
  const Frozen frozen = *ParseFrozen("vision,llm");
  MultimodalModel straight(c);
  straight.Initialize(7);
  straight.Freeze(frozen);
  const std::vector<double> all = TrainRange(straight, 0, 6, 7);
  MultimodalModel first(c);
  first.Initialize(7);
  first.Freeze(frozen);
  std::vector<double> resumed = TrainRange(first, 0, 3, 7);
  absl::StatusOr<CheckpointRun> run = StartCheckpointRun(dir, "frozen");
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_TRUE(SaveTrainingCheckpoint(first, 3, dir, *run).ok());
  MultimodalModel second(c);
  second.Initialize(99);
  second.Freeze(frozen);
  ASSERT_TRUE(LoadTrainingCheckpoint(second, 3, dir).ok());
  const std::vector<double> rest = TrainRange(second, 3, 6, 7);
  resumed.insert(resumed.end(), rest.begin(), rest.end());
  EXPECT_EQ(resumed, all);
  // Unfrozen, the same checkpoint loads with zero AdamW state for the frozen modules.
  MultimodalModel unfrozen(c);
  unfrozen.Initialize(99);
  ASSERT_TRUE(LoadTrainingCheckpoint(unfrozen, 3, dir).ok());
  EXPECT_EQ(unfrozen.vit().params().data(), first.vit().params().data());
  for (float v : unfrozen.llm().params().adam_m()) ASSERT_EQ(v, 0.0f);
  EXPECT_EQ(unfrozen.projector().params().adam_m(), first.projector().params().adam_m());
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
