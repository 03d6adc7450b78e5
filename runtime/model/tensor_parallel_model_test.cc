// The ViT and the LLM split over TP = 2 and 4 thread ranks (Gloo) equal the
// single-rank modules: the same initial master weights, the same loss, the
// same image-embedding gradient, and every parameter gradient once the
// slices are gathered; and the TP ranks' owned Σ g² add up to the module's.
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gradcheck.h"
#include "kernels/testing/tolerances.h"
#include "runtime/comm/comm_testing.h"
#include "runtime/model/llm.h"
#include "runtime/model/model.h"
#include "runtime/model/vit.h"

namespace loom {
namespace {

constexpr uint64_t kSeed = 11;

ModelConfig Small() {
  ModelConfig c;
  c.name = "tp-small";
  c.vit = {/*tile_size=*/8, /*patch=*/4, /*dim=*/16,
           /*layers=*/2,    /*heads=*/4, /*mlp_hidden=*/32};
  c.projector = {false, /*hidden=*/24};
  c.llm = {/*vocab=*/12, /*dim=*/16, /*layers=*/2, /*heads=*/4, /*ffn_hidden=*/24,
           10000.0f,     64};
  return c;
}

// Two samples (text, image slots, text) and a text-only one, packed.
LlmBatch Batch(const ModelConfig& c, int* image_tokens) {
  std::mt19937 rng(3);
  std::vector<Sample> samples(3);
  const int tiles[] = {1, 2, 0};
  *image_tokens = 0;
  for (int k = 0; k < 3; ++k) {
    for (int i = 0; i < 3 + k; ++i) samples[k].tokens.push_back(rng() % c.llm.vocab);
    for (int i = 0; i < tiles[k] * c.tokens_per_tile(); ++i) samples[k].tokens.push_back(-1);
    for (int i = 0; i < 4; ++i) samples[k].tokens.push_back(rng() % c.llm.vocab);
    samples[k].num_tiles = tiles[k];
    *image_tokens += tiles[k] * c.tokens_per_tile();
  }
  return PackSamples({&samples[0], &samples[1], &samples[2]});
}

// The master of a module's gradients: a copy of the set with its gradients
// as data, gathered.
std::vector<float> GatheredGrads(ParamSet& local, Communicator* tp) {
  ParamSet g = local;
  g.data() = local.grads();
  ParamSet master;
  EXPECT_TRUE(GatherMaster(g, tp, &master).ok());
  return master.data();
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& what) {
  const testing::Tolerance t = testing::kTensorParallelModelF32;
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], testing::Allowed(t, want[i]))
        << what << " [" << i << "] (" << t.reason << ")";
  }
}

struct LlmResult {
  double loss = 0;
  std::vector<float> master, grads, dimage;
  double owned_sq = 0;
};

LlmResult RunLlm(const ModelConfig& c, Communicator* tp) {
  Llm llm(c.llm, tp);
  llm.params().Initialize(kSeed);
  LlmResult r;
  ParamSet master;
  EXPECT_TRUE(GatherMaster(llm.params(), tp, &master).ok());
  r.master = master.data();
  int image_tokens = 0;
  const LlmBatch batch = Batch(c, &image_tokens);
  const std::vector<float> emb =
      testing::RandomVector(static_cast<size_t>(image_tokens) * c.llm.dim, 9);
  EXPECT_TRUE(llm.Forward(batch, emb.data()).ok());
  r.dimage.assign(emb.size(), 0.0f);
  absl::StatusOr<kernels::LossSum> loss = llm.Backward(1.0f / 16, r.dimage.data());
  EXPECT_TRUE(loss.ok()) << loss.status();
  if (!loss.ok()) return r;
  r.loss = loss->sum;
  absl::StatusOr<kernels::LossSum> eval = llm.Loss();
  EXPECT_TRUE(eval.ok());
  if (eval.ok()) {
    EXPECT_EQ(eval->sum, loss->sum);
  }
  r.grads = GatheredGrads(llm.params(), tp);
  r.owned_sq = llm.params().OwnedGradSumOfSquares();
  if (tp != nullptr) {
    EXPECT_TRUE(tp->AllreduceSum(&r.owned_sq, 1).ok());
  }
  return r;
}

TEST(TensorParallelModelTest, LlmAtTp2AndTp4EqualsOneRank) {
  const ModelConfig c = Small();
  const LlmResult want = RunLlm(c, nullptr);
  EXPECT_GT(want.loss, 0);
  double want_sq = 0;
  for (float g : want.grads) want_sq += static_cast<double>(g) * g;
  EXPECT_DOUBLE_EQ(want.owned_sq, want_sq);
  for (int tp : {2, 4}) {
    InMemoryStore store;
    testing::OnRanks(tp, "tp", &store, [&](int rank, Communicator* comm) {
      const LlmResult got = RunLlm(c, comm);
      const std::string what = "LLM tp " + std::to_string(tp) + " rank " + std::to_string(rank);
      // Slices of the same master tensors: bitwise.
      EXPECT_EQ(got.master, want.master) << what << ": initial weights";
      EXPECT_NEAR(got.loss, want.loss,
                  testing::Allowed(testing::kTensorParallelModelF32, want.loss))
          << what;
      ExpectClose(got.dimage, want.dimage, what + ": image-embedding gradient");
      ExpectClose(got.grads, want.grads, what + ": parameter gradients");
      EXPECT_NEAR(got.owned_sq, want.owned_sq,
                  testing::Allowed(testing::kTensorParallelModelF32, want.owned_sq))
          << what;
    });
  }
}

struct VitResult {
  std::vector<float> master, out, grads;
};

VitResult RunVit(const ModelConfig& c, Communicator* tp) {
  VitEncoder vit(c.vit, tp);
  vit.params().Initialize(kSeed);
  VitResult r;
  ParamSet master;
  EXPECT_TRUE(GatherMaster(vit.params(), tp, &master).ok());
  r.master = master.data();
  const int N = 3;
  const std::vector<float> tiles =
      testing::RandomVector(static_cast<size_t>(N) * 3 * c.vit.tile_size * c.vit.tile_size, 4);
  r.out.resize(static_cast<size_t>(N) * c.vit.patches_per_tile() * c.vit.dim);
  EXPECT_TRUE(vit.Forward(tiles.data(), N, r.out.data()).ok());
  const std::vector<float> dout = testing::RandomVector(r.out.size(), 5);
  EXPECT_TRUE(vit.Backward(dout.data()).ok());
  r.grads = GatheredGrads(vit.params(), tp);
  return r;
}

TEST(TensorParallelModelTest, VitAtTp2AndTp4EqualsOneRank) {
  const ModelConfig c = Small();
  const VitResult want = RunVit(c, nullptr);
  for (int tp : {2, 4}) {
    InMemoryStore store;
    testing::OnRanks(tp, "tp", &store, [&](int rank, Communicator* comm) {
      const VitResult got = RunVit(c, comm);
      const std::string what = "ViT tp " + std::to_string(tp) + " rank " + std::to_string(rank);
      EXPECT_EQ(got.master, want.master) << what << ": initial weights";
      ExpectClose(got.out, want.out, what + ": output");
      ExpectClose(got.grads, want.grads, what + ": parameter gradients");
    });
  }
}

// A gathered master sliced again is the rank's own slice, AdamW state and
// step included (what a checkpoint saved under one TP degree and loaded
// under another relies on).
TEST(TensorParallelModelTest, MasterRoundTripsThroughEverySlice) {
  const ModelConfig c = Small();
  InMemoryStore store;
  testing::OnRanks(2, "tp", &store, [&](int, Communicator* comm) {
    Llm llm(c.llm, comm);
    ParamSet& p = llm.params();
    p.Initialize(kSeed);
    for (size_t i = 0; i < p.adam_m().size(); ++i) {
      p.adam_m()[i] = 0.5f * p.data()[i];
      p.adam_v()[i] = p.data()[i] * p.data()[i];
    }
    p.step() = 7;
    ParamSet master;
    ASSERT_TRUE(GatherMaster(p, comm, &master).ok());
    Llm other(c.llm, comm);
    other.params().SliceFromMaster(master);
    EXPECT_EQ(other.params().data(), p.data());
    EXPECT_EQ(other.params().adam_m(), p.adam_m());
    EXPECT_EQ(other.params().adam_v(), p.adam_v());
    EXPECT_EQ(other.params().step(), 7);
  });
}

}  // namespace
}  // namespace loom
