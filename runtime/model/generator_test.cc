// The generator (generator.h): seeded draws, bad batches named, a frozen
// generator still handing the LLM its conditions' gradient, TP 2 equal to
// one rank, and training on a batch lowering its loss. Its agreement with
// PyTorch is tests/golden:generator_golden_test.
#include "runtime/model/generator.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gradcheck.h"
#include "kernels/testing/tolerances.h"
#include "runtime/comm/comm_testing.h"
#include "runtime/model/llm.h"

namespace loom {
namespace {

constexpr uint64_t kSeed = 5;

GeneratorConfig Small() {
  GeneratorConfig c = TinyGeneratorConfig(/*cond_dim=*/12);
  c.denoiser.tile_size = 8;
  c.denoiser.dim = 16;
  c.denoiser.mlp_hidden = 32;
  c.queries = 2;
  c.time_freqs = 8;
  return c;
}

GeneratorBatch Batch(const GeneratorConfig& c, int N, int64_t step = 0) {
  GeneratorBatch b;
  b.N = N;
  b.images = testing::RandomVector(static_cast<size_t>(N) * c.pixels(), 7);
  for (int n = 0; n < N; ++n) {
    GenerationDraw d = DrawGeneration(kSeed, step, n, 0, c.pixels());
    b.t.push_back(d.t);
    b.noise.insert(b.noise.end(), d.noise.begin(), d.noise.end());
  }
  return b;
}

TEST(GeneratorTest, DrawsAreSeededPerStepSampleAndImage) {
  const GenerationDraw a = DrawGeneration(1, 3, 7, 0, 500);
  const GenerationDraw again = DrawGeneration(1, 3, 7, 0, 500);
  EXPECT_EQ(a.t, again.t);
  EXPECT_EQ(a.noise, again.noise);
  for (const GenerationDraw& other :
       {DrawGeneration(2, 3, 7, 0, 500), DrawGeneration(1, 4, 7, 0, 500),
        DrawGeneration(1, 3, 8, 0, 500), DrawGeneration(1, 3, 7, 1, 500)}) {
    EXPECT_NE(a.noise, other.noise);
    EXPECT_GT(other.t, 0.0f);
    EXPECT_LT(other.t, 1.0f);
  }
  double mean = 0, sq = 0;
  const GenerationDraw big = DrawGeneration(1, 0, 0, 0, 100000);
  for (float x : big.noise) {
    mean += x;
    sq += static_cast<double>(x) * x;
  }
  mean /= big.noise.size();
  EXPECT_NEAR(mean, 0.0, 0.02);  // 100,000 draws: the mean's deviation is 0.003
  EXPECT_NEAR(sq / big.noise.size() - mean * mean, 1.0, 0.03);
}

TEST(GeneratorTest, BadBatchesAreNamed) {
  const GeneratorConfig c = Small();
  Generator gen(c);
  gen.params().Initialize(kSeed);
  gen.denoiser_params().Initialize(kSeed);
  const std::vector<float> cond(2 * c.queries * c.cond_dim, 0.5f);
  GeneratorBatch b = Batch(c, 2);
  b.noise.pop_back();
  absl::Status s = gen.Forward(b, cond.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("noise"), std::string::npos) << s;
  b = Batch(c, 2);
  b.t[1] = 1.5f;
  s = gen.Forward(b, cond.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("image 1: timestep 1.5"), std::string::npos) << s;
  EXPECT_EQ(gen.Velocity({1.0f}, {0.5f}, cond.data(), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

struct Result {
  double loss = 0;
  std::vector<float> dcond, grads, denoiser_grads;
};

// The master of a module's gradients, gathered over `tp`.
std::vector<float> GatheredGrads(ParamSet& local, Communicator* tp) {
  absl::StatusOr<std::vector<float>> g = GatherGradients(local, tp);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : std::vector<float>();
}

Result RunGenerator(const GeneratorConfig& c, Communicator* tp, bool frozen) {
  Generator gen(c, tp);
  gen.params().Initialize(kSeed);
  gen.denoiser_params().Initialize(kSeed);
  if (frozen) {
    gen.params().Freeze();
    gen.denoiser_params().Freeze();
  }
  const int N = 3;
  const std::vector<float> cond = testing::RandomVector(N * c.queries * c.cond_dim, 9);
  Result r;
  EXPECT_TRUE(gen.Forward(Batch(c, N), cond.data()).ok());
  r.loss = gen.LossSum();
  r.dcond.assign(cond.size(), 0.0f);
  EXPECT_TRUE(gen.Backward(1.0f / N, r.dcond.data()).ok());
  if (!frozen) {
    r.grads = GatheredGrads(gen.params(), tp);
    r.denoiser_grads = GatheredGrads(gen.denoiser_params(), tp);
  }
  return r;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 const testing::Tolerance& t, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], testing::Allowed(t, want[i])) << what << " [" << i << "]";
    norm += std::abs(want[i]);
  }
  EXPECT_GT(norm, 0) << what << ": all zero, nothing compared";
}

// LLaVA-style stages that train the LLM alone still send the generation
// loss's gradient through a frozen generator to the query positions.
TEST(GeneratorTest, AFrozenGeneratorStillPassesTheConditionsGradient) {
  const Result trained = RunGenerator(Small(), nullptr, false),
               frozen = RunGenerator(Small(), nullptr, true);
  EXPECT_EQ(frozen.loss, trained.loss);
  ExpectClose(frozen.dcond, trained.dcond, testing::kSplitInvarianceF32, "dcond");
}

TEST(GeneratorTest, TensorParallelDenoiserEqualsOneRank) {
  const GeneratorConfig c = Small();
  const Result want = RunGenerator(c, nullptr, false);
  for (int tp : {2, 4}) {
    InMemoryStore store;
    testing::OnRanks(tp, "tp", &store, [&](int rank, Communicator* comm) {
      const Result got = RunGenerator(c, comm, false);
      const std::string what = "tp " + std::to_string(tp) + " rank " + std::to_string(rank);
      EXPECT_NEAR(got.loss, want.loss,
                  testing::Allowed(testing::kTensorParallelModelF32, want.loss))
          << what;
      ExpectClose(got.dcond, want.dcond, testing::kTensorParallelModelF32, what + " dcond");
      ExpectClose(got.grads, want.grads, testing::kTensorParallelModelF32, what + " grads");
      ExpectClose(got.denoiser_grads, want.denoiser_grads, testing::kTensorParallelModelF32,
                  what + " denoiser grads");
    });
  }
}

// Two pipeline stages (one block each, the first with the timestep MLP and
// the conditions' projection, the last with the head) chained by hand equal
// the whole generator: the loss, the conditions' gradient and every
// tensor's gradient, matched by name.
TEST(GeneratorTest, PipelineStagesEqualTheWholeGenerator) {
  const GeneratorConfig c = Small();
  ASSERT_EQ(c.denoiser.layers, 2);
  Generator whole(c);
  Generator first(c, nullptr, CpuOps(), GeneratorStageLayers(c, 2, 0));
  Generator last(c, nullptr, CpuOps(), GeneratorStageLayers(c, 2, 1));
  ASSERT_TRUE(first.first_stage() && !first.last_stage());
  ASSERT_TRUE(!last.first_stage() && last.last_stage());
  for (Generator* g : {&whole, &first, &last}) {
    g->params().Initialize(kSeed);
    g->denoiser_params().Initialize(kSeed);
  }
  const int N = 3;
  const GeneratorBatch batch = Batch(c, N);
  const std::vector<float> cond = testing::RandomVector(N * c.queries * c.cond_dim, 9);
  ASSERT_TRUE(whole.Forward(batch, cond.data()).ok());
  std::vector<float> want_dcond(cond.size(), 0.0f);
  ASSERT_TRUE(whole.Backward(1.0f / N, want_dcond.data()).ok());

  std::vector<float> rows(static_cast<size_t>(first.StageFloats(N)));
  ASSERT_TRUE(first.ForwardStage(batch, cond.data(), rows.data()).ok());
  ASSERT_TRUE(last.ForwardStage(batch, rows.data(), nullptr).ok());
  EXPECT_EQ(first.LossSum(), 0);
  EXPECT_NEAR(last.LossSum(), whole.LossSum(),
              testing::Allowed(testing::kSplitInvarianceF32, whole.LossSum()));
  std::vector<float> drows(rows.size(), 0.0f), dcond(cond.size(), 0.0f);
  ASSERT_TRUE(last.BackwardStage(1.0f / N, nullptr, drows.data()).ok());
  ASSERT_TRUE(first.BackwardStage(1.0f / N, drows.data(), dcond.data()).ok());
  ExpectClose(dcond, want_dcond, testing::kSplitInvarianceF32, "dcond");

  // Every tensor of the whole generator is on exactly one stage, with its
  // gradient.
  auto by_name = [](ParamSet& set) {
    std::map<std::string, std::vector<float>> out;
    for (const ParamSpec& s : set.specs()) {
      out[s.name].assign(set.grads().begin() + s.offset, set.grads().begin() + s.offset + s.numel);
    }
    return out;
  };
  for (auto sets : {std::make_pair(&Generator::params, "own"),
                    std::make_pair(&Generator::denoiser_params, "denoiser")}) {
    const auto want = by_name((whole.*sets.first)());
    auto got = by_name((first.*sets.first)());
    for (auto& [name, g] : by_name((last.*sets.first)())) {
      EXPECT_EQ(got.count(name), 0u) << name << " on both stages";
      got[name] = g;
    }
    ASSERT_EQ(got.size(), want.size()) << sets.second;
    for (const auto& [name, w] : want) {
      ASSERT_EQ(got.count(name), 1u) << name << " on no stage";
      ExpectClose(got[name], w, testing::kSplitInvarianceF32, name);
    }
  }
}

// Plain gradient descent on one batch lowers its loss: the gradients point
// downhill (their values are the golden test's).
TEST(GeneratorTest, DescentOnABatchLowersItsLoss) {
  const GeneratorConfig c = Small();
  Generator gen(c);
  gen.params().Initialize(kSeed);
  gen.denoiser_params().Initialize(kSeed);
  const int N = 4;
  const GeneratorBatch b = Batch(c, N);
  const std::vector<float> cond = testing::RandomVector(N * c.queries * c.cond_dim, 9);
  std::vector<double> losses;
  for (int step = 0; step < 60; ++step) {
    gen.params().ZeroGrad();
    gen.denoiser_params().ZeroGrad();
    ASSERT_TRUE(gen.Forward(b, cond.data()).ok());
    losses.push_back(gen.LossSum() / N);
    ASSERT_TRUE(gen.Backward(1.0f / N, nullptr).ok());
    for (ParamSet* ps : {&gen.params(), &gen.denoiser_params()}) {
      for (size_t i = 0; i < ps->data().size(); ++i) ps->data()[i] -= 0.2f * ps->grads()[i];
    }
  }
  EXPECT_LT(losses.back(), 0.5 * losses.front())
      << "first " << losses.front() << ", last " << losses.back();
}

// The LLM's query positions: two output images of Q = 2 queries each among
// text; f = the LM loss + Σ w ⊙ query_states. The learned queries' and a
// layer's gradients, with dquery = w, match finite differences of f, and
// the query rows carry no loss.
TEST(GeneratorTest, TheLlmsQueryPositionsAreTrainedThroughTheirStates) {
  LlmConfig c;
  c.vocab = 16;
  c.dim = 8;
  c.layers = 2;
  c.heads = 2;
  c.ffn_hidden = 12;
  c.gen_queries = 2;
  Llm llm(c);
  llm.params().Initialize(kSeed);
  // Queries of O(1), not the initial 0.02: a step of h = 1e-2 on so short a
  // row would swing its RMSNorm far outside the linear range.
  {
    const int q = llm.params().Find("gen_queries");
    const std::vector<float> v = testing::RandomVector(llm.params().spec(q).numel, 8);
    std::copy(v.begin(), v.end(), llm.params().param(q));
  }
  LlmBatch b;
  b.tokens = {3, 4, kQueryToken, kQueryToken, 5, 6, 7, kQueryToken, kQueryToken};
  b.targets = {4, -1, -1, -1, 6, 7, -1, -1, -1};
  b.positions = {0, 1, 2, 3, 0, 1, 2, 3, 4};
  b.cu_seqlens = {0, 4, 9};
  EXPECT_EQ(b.query_positions(), 4);
  EXPECT_EQ(b.image_positions(), 0);
  const std::vector<float> w = testing::RandomVector(4 * c.dim, 3);
  auto f = [&] {
    EXPECT_TRUE(llm.Forward(b, nullptr).ok());
    const absl::StatusOr<kernels::LossSum> l = llm.Loss();
    EXPECT_TRUE(l.ok());
    return l->sum + testing::WeightedSum(llm.query_states().ToHost(), w);
  };
  f();
  EXPECT_EQ(llm.query_states().size(), static_cast<size_t>(4 * c.dim));
  llm.params().ZeroGrad();
  ASSERT_TRUE(llm.Backward(1.0f, nullptr, nullptr, nullptr, w.data()).ok());
  for (const char* name : {"gen_queries", "layers.0.attn.qkv.weight", "norm.weight"}) {
    const int i = llm.params().Find(name);
    ASSERT_GE(i, 0) << name;
    const std::vector<float> analytic(llm.params().grad(i),
                                      llm.params().grad(i) + llm.params().spec(i).numel);
    double norm = 0;
    for (float g : analytic) norm += std::abs(g);
    EXPECT_GT(norm, 0) << name;
    EXPECT_TRUE(testing::CheckGradient(f, llm.params().param(i), analytic.data(), analytic.size(),
                                       32, 1e-2f, testing::kFiniteDifferenceModelF32))
        << name;
  }
}

}  // namespace
}  // namespace loom
