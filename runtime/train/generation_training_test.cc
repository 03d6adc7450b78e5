// Training a model with a generator in one process (tiny-gen): text → image
// samples beside understanding ones, the step the same however it is split
// into microbatches, frozen modules as MetaQuery and a frozen generator
// need them, an exact resume from a checkpoint, and a generator that learns
// to draw what the caption says.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/tolerances.h"
#include "runtime/base/test_paths.h"
#include "runtime/train/synthetic_data.h"
#include "runtime/train/train_checkpoint.h"
#include "runtime/train/trainer.h"

namespace loom {
namespace {

ModelConfig TinyGen() { return *ModelConfigByName("tiny-gen"); }

std::vector<Sample> Batch(const ModelConfig& c, uint64_t seed, int64_t first, int n) {
  SyntheticCaptions data(c, seed, false);
  std::vector<Sample> b;
  for (int i = 0; i < n; ++i) b.push_back(data.Get(first + i));
  return b;
}

std::vector<const Sample*> Pointers(const std::vector<Sample>& b) {
  std::vector<const Sample*> p;
  for (const Sample& s : b) p.push_back(&s);
  return p;
}

TEST(GenerationTrainingTest, TextToImageSamplesSitBesideUnderstandingOnes) {
  const ModelConfig c = TinyGen();
  ASSERT_TRUE(ValidateModelConfig(c).ok());
  const std::vector<Sample> b = Batch(c, 3, 0, 4);
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    const Sample& s = b[i];
    EXPECT_EQ(s.id, static_cast<uint64_t>(i));
    EXPECT_EQ(s.num_gen_images, i % 2);
    EXPECT_EQ(s.num_tiles, 1 - i % 2);
    EXPECT_EQ(s.gen_images.size(), static_cast<size_t>(s.num_gen_images * c.generator.pixels()));
    int queries = 0;
    for (int32_t t : s.tokens) queries += t == kQueryToken;
    EXPECT_EQ(queries, s.num_gen_images * c.llm.gen_queries);
    EXPECT_GT(LossTokens(s), 0);
    EXPECT_TRUE(CheckSampleFits(s, c.vit.tile_size, false, c, "k").ok());
  }
  // A model without a generator refuses an output image, and a generator
  // model refuses a wrong number of query positions, by name.
  absl::Status s = CheckSampleFits(b[1], c.vit.tile_size, false, *ModelConfigByName("tiny"), "k");
  EXPECT_NE(s.message().find("query positions (-2); the model has no generator"), std::string::npos)
      << s;
  Sample no_queries = b[1];
  no_queries.tokens.erase(
      std::remove(no_queries.tokens.begin(), no_queries.tokens.end(), kQueryToken),
      no_queries.tokens.end());
  s = CheckSampleFits(no_queries, c.vit.tile_size, false, *ModelConfigByName("tiny"), "k");
  EXPECT_NE(s.message().find("1 output images; the model has no generator"), std::string::npos)
      << s;
  Sample bad = b[1];
  bad.tokens.insert(bad.tokens.begin() + 1, kQueryToken);
  s = CheckSampleFits(bad, c.vit.tile_size, false, c, "k");
  EXPECT_NE(s.message().find("5 query positions for 1 output images"), std::string::npos) << s;
  EXPECT_NE(ModelConfigByName("tiny-gen")->llm.gen_queries, 0);
  ModelConfig wrong = c;
  wrong.generator.cond_dim += 1;
  EXPECT_NE(ValidateModelConfig(wrong).message().find("generator.cond_dim"), std::string::npos);
}

// The global batch's step: one microbatch or four give the same losses and
// every gradient (the LM loss over loss tokens, the generation loss over
// output images, both of the global batch).
TEST(GenerationTrainingTest, MicrobatchSplitsGiveTheSameGradients) {
  const ModelConfig c = TinyGen();
  const std::vector<Sample> b = Batch(c, 4, 0, 8);
  int64_t tokens = 0, images = 0;
  for (const Sample& s : b) {
    tokens += LossTokens(s);
    images += s.num_gen_images;
  }
  auto run = [&](int M, double* lm, double* gen) {
    auto m = std::make_unique<MultimodalModel>(c);
    m->Initialize(4);
    m->set_generation_draws(4, 1);
    m->ZeroGrad();
    *lm = *gen = 0;
    const std::vector<const Sample*> all = Pointers(b);
    for (int k = 0; k < M; ++k) {
      std::vector<const Sample*> mb(all.begin() + all.size() * k / M,
                                    all.begin() + all.size() * (k + 1) / M);
      *lm += m->ForwardBackward(mb, 1.0f / tokens, 0.5f / images).sum;
      *gen += m->generation_loss_sum();
    }
    return m;
  };
  double lm1, gen1, lm4, gen4;
  auto one = run(1, &lm1, &gen1), four = run(4, &lm4, &gen4);
  const testing::Tolerance& t = testing::kSplitInvarianceF32;
  EXPECT_NEAR(lm4, lm1, testing::Allowed(t, lm1));
  EXPECT_NEAR(gen4, gen1, testing::Allowed(t, gen1));
  EXPECT_GT(gen1, 0);
  ASSERT_EQ(one->param_sets().size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const std::vector<float>& want = one->param_sets()[i]->grads();
    const std::vector<float>& got = four->param_sets()[i]->grads();
    ASSERT_EQ(got.size(), want.size());
    double norm = 0;
    for (size_t j = 0; j < want.size(); ++j) {
      ASSERT_NEAR(got[j], want[j], testing::Allowed(t, want[j]))
          << one->param_set_names()[i] << " [" << j << "]";
      norm += std::abs(want[j]);
    }
    EXPECT_GT(norm, 0) << one->param_set_names()[i];
  }
}

// Steps [from, to) of a tiny-gen run, 8 samples a step.
std::vector<std::pair<double, double>> TrainRange(MultimodalModel& model, int from, int to,
                                                  uint64_t seed) {
  TrainOptions o;
  o.seed = seed;
  LocalTrainer trainer(&model, o);
  trainer.set_steps_taken(from);
  std::vector<std::pair<double, double>> losses;
  for (int s = from; s < to; ++s) {
    const StepStats st = trainer.Step(Batch(model.config(), seed, s * 8, 8));
    EXPECT_EQ(st.generation_images, 4);
    losses.push_back({st.loss, st.generation_loss});
  }
  return losses;
}

// MetaQuery's recipe (everything before the generator frozen) and the
// opposite (a frozen generator still hands the LLM its gradient).
TEST(GenerationTrainingTest, FrozenModulesAroundTheGenerator) {
  const ModelConfig c = TinyGen();
  const std::vector<Sample> b = Batch(c, 5, 0, 8);
  MultimodalModel all(c);
  all.Initialize(5);
  all.set_generation_draws(5, 1);
  all.ZeroGrad();
  all.ForwardBackward(Pointers(b), 0.01f, 0.25f);
  for (const char* list : {"vision,projector,llm", "generator"}) {
    SCOPED_TRACE(list);
    absl::StatusOr<Frozen> frozen = ParseFrozen(list, true);
    ASSERT_TRUE(frozen.ok()) << frozen.status();
    MultimodalModel m(c);
    m.Initialize(5);
    m.Freeze(*frozen);
    m.set_generation_draws(5, 1);
    m.ZeroGrad();
    m.ForwardBackward(Pointers(b), 0.01f, 0.25f);
    const std::vector<ParamSet*> sets = m.param_sets();
    const std::vector<Module> modules = m.param_set_modules();
    std::vector<std::vector<float>> before;
    for (size_t i = 0; i < sets.size(); ++i) {
      EXPECT_EQ(sets[i]->frozen(), frozen->module(modules[i])) << m.param_set_names()[i];
      if (!sets[i]->frozen()) {
        EXPECT_EQ(sets[i]->grads(), all.param_sets()[i]->grads()) << m.param_set_names()[i];
      }
      before.push_back(sets[i]->data());
    }
    TrainRange(m, 0, 2, 5);
    for (size_t i = 0; i < sets.size(); ++i) {
      if (sets[i]->frozen()) {
        EXPECT_EQ(sets[i]->data(), before[i]) << m.param_set_names()[i] << " moved";
      } else {
        EXPECT_NE(sets[i]->data(), before[i]) << m.param_set_names()[i] << " did not train";
      }
    }
  }
  EXPECT_FALSE(ParseFrozen("generator").ok());  // a model without one
  EXPECT_FALSE(ParseFrozen("vision,projector,llm,generator", true).ok());
  EXPECT_TRUE(ParseFrozen("vision,projector,llm", true).ok());
}

TEST(GenerationTrainingTest, ResumingFromACheckpointContinuesTheSameRun) {
  const ModelConfig c = TinyGen();
  const std::string dir = testing::TempPath("gen-ckpt");
  MultimodalModel straight(c);
  straight.Initialize(6);
  const auto all = TrainRange(straight, 0, 6, 6);
  MultimodalModel first(c);
  first.Initialize(6);
  auto resumed = TrainRange(first, 0, 3, 6);
  absl::StatusOr<CheckpointRun> run = StartCheckpointRun(dir, "tiny-gen seed 6");
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_TRUE(SaveTrainingCheckpoint(first, 3, dir, *run).ok());
  MultimodalModel second(c);
  second.Initialize(123);
  ASSERT_TRUE(LoadTrainingCheckpoint(second, 3, dir).ok());
  const auto rest = TrainRange(second, 3, 6, 6);
  resumed.insert(resumed.end(), rest.begin(), rest.end());
  EXPECT_EQ(resumed, all);
}

// The generation loss of held-out text → image samples, with each image
// paired with its own caption or with another sample's.
double HeldOutGenerationLoss(MultimodalModel& m, bool swapped) {
  std::vector<Sample> b;
  for (const Sample& s : Batch(m.config(), 1, 100000, 64)) {
    if (s.num_gen_images > 0) b.push_back(s);
  }
  if (swapped) {  // each caption with the next sample's picture
    const std::vector<float> first = b[0].gen_images;
    for (size_t i = 0; i + 1 < b.size(); ++i) b[i].gen_images = b[i + 1].gen_images;
    b.back().gen_images = first;
  }
  TrainOptions o;
  o.seed = 1;
  LocalTrainer trainer(&m, o);
  const LocalTrainer::Evaluation e = trainer.Evaluate(b);
  return e.generation_loss_sum / e.generation_images;
}

// The done-when of the model: a trained generator draws what the caption
// says. Its loss on held-out captions falls well below the untrained one's,
// and below its loss when each picture is paired with another caption: the
// LLM's query states carry the caption to it.
TEST(GenerationTrainingTest, TheGeneratorLearnsToDrawTheCaption) {
  const ModelConfig c = TinyGen();
  MultimodalModel m(c);
  m.Initialize(1);
  const double untrained = HeldOutGenerationLoss(m, false);
  TrainOptions o;
  o.seed = 1;
  LocalTrainer trainer(&m, o);
  for (int s = 0; s < 300; ++s) trainer.Step(Batch(c, 1, s * 16, 16));
  const double matched = HeldOutGenerationLoss(m, false), swapped = HeldOutGenerationLoss(m, true);
  std::printf("held-out generation loss: untrained %.4f, trained %.4f, pictures swapped %.4f\n",
              untrained, matched, swapped);
  EXPECT_LT(matched, 0.7 * untrained) << "untrained " << untrained << ", trained " << matched;
  EXPECT_LT(matched, 0.9 * swapped) << "matched " << matched << ", swapped " << swapped;

  // Drawn from noise (GenerateImages, 20 Euler steps) for held-out
  // captions, the pictures are nearer their captions' own pictures than
  // the other captions' pictures, on average (weakly after 300 steps: the
  // colour is drawn, the region hardly).
  SyntheticCaptions data(c, 1, false);
  std::vector<Sample> told;
  for (int64_t i = 200001; told.size() < 8; i += 2) told.push_back(data.Get(i));
  double own = 0, others = 0;
  for (size_t k = 0; k < told.size(); ++k) {
    Sample prompt = told[k];
    prompt.num_gen_images = 0;
    prompt.gen_images.clear();
    prompt.tokens.pop_back();  // <eos>: the prompt ends at the queries
    absl::StatusOr<std::vector<float>> drawn = m.GenerateImages(prompt, 20, 7);
    ASSERT_TRUE(drawn.ok()) << drawn.status();
    for (size_t j = 0; j < told.size(); ++j) {
      double d = 0;
      for (size_t i = 0; i < drawn->size(); ++i) {
        d += ((*drawn)[i] - told[j].gen_images[i]) * ((*drawn)[i] - told[j].gen_images[i]);
      }
      (j == k ? own : others) += d / drawn->size() / (j == k ? 1.0 : told.size() - 1.0);
    }
  }
  std::printf("drawn pictures' mean squared distance: own caption's %.4f, others' %.4f\n",
              own / told.size(), others / told.size());
  EXPECT_LT(own, 0.95 * others);  // 0.579 against 0.636 when written
}

}  // namespace
}  // namespace loom
