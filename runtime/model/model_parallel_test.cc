// The ViT and the LLM split over TP = 2 and 4 thread ranks (Gloo) equal the
// single-rank modules: the same initial master weights, the same loss, the
// same image-embedding gradient, and every parameter gradient once the
// slices are gathered; and the TP ranks' owned Σ g² add up to the module's.
// Split into pipeline stages chained by hand, they equal the whole module
// bitwise (the same operations in the same order). All of it in fp32 and
// under bf16 mixed precision.
#include <random>
#include <tuple>
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

// Small with CLIP's tower as LLaVA runs it: a class token between the
// stages, LN_pre, quick GELU, no LN_f.
ModelConfig SmallClip() {
  ModelConfig c = Small();
  c.vit.class_token = true;
  c.vit.patch_bias = false;
  c.vit.pre_norm = true;
  c.vit.final_norm = false;
  c.vit.act = kernels::Activation::kQuickGelu;
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
    // (the third sample one token longer: T odd, so sequence parallelism pads)
    for (int i = 0; i < 4 + (k == 2); ++i) samples[k].tokens.push_back(rng() % c.llm.vocab);
    samples[k].num_tiles = tiles[k];
    *image_tokens += tiles[k] * c.tokens_per_tile();
  }
  return PackSamples({&samples[0], &samples[1], &samples[2]});
}

// The master of a module's gradients, gathered over `tp`.
std::vector<float> GatheredGrads(ParamSet& local, Communicator* tp) {
  absl::StatusOr<std::vector<float>> g = GatherGradients(local, tp);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : std::vector<float>();
}

// The tolerance of a TP layout against one rank in `p`.
testing::Tolerance TpTolerance(Precision p) {
  return p == Precision::kBf16 ? testing::kTensorParallelModelBf16
                               : testing::kTensorParallelModelF32;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& what, Precision p = Precision::kFp32) {
  const testing::Tolerance t = TpTolerance(p);
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

LlmResult RunLlm(const ModelConfig& c, Communicator* tp, Precision p = Precision::kFp32,
                 bool sequence_parallel = false, Recompute recompute = Recompute::kNone) {
  Llm llm(c.llm, tp);
  llm.set_sequence_parallel(sequence_parallel);
  llm.set_recompute(recompute);
  llm.params().Initialize(kSeed);
  llm.params().Place(CpuBackend::Get(), p);
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

void ExpectLlmTpEqualsOneRank(const ModelConfig& c, std::initializer_list<int> tps,
                              Precision p = Precision::kFp32, bool sequence_parallel = false,
                              Recompute recompute = Recompute::kNone) {
  const LlmResult want = RunLlm(c, nullptr, p, false, recompute);
  EXPECT_GT(want.loss, 0);
  double want_sq = 0;
  for (float g : want.grads) want_sq += static_cast<double>(g) * g;
  EXPECT_DOUBLE_EQ(want.owned_sq, want_sq);
  for (int tp : tps) {
    InMemoryStore store;
    testing::OnRanks(tp, "tp", &store, [&](int rank, Communicator* comm) {
      const LlmResult got = RunLlm(c, comm, p, sequence_parallel, recompute);
      const std::string what = "LLM " + std::string(PrecisionName(p)) +
                               (sequence_parallel ? " sequence-parallel" : "") + " tp " +
                               std::to_string(tp) + " rank " + std::to_string(rank);
      // Slices of the same master tensors: bitwise.
      EXPECT_EQ(got.master, want.master) << what << ": initial weights";
      EXPECT_NEAR(got.loss, want.loss, testing::Allowed(TpTolerance(p), want.loss)) << what;
      ExpectClose(got.dimage, want.dimage, what + ": image-embedding gradient", p);
      ExpectClose(got.grads, want.grads, what + ": parameter gradients", p);
      EXPECT_NEAR(got.owned_sq, want.owned_sq, testing::Allowed(TpTolerance(p), want.owned_sq))
          << what;
    });
  }
}

TEST(TensorParallelModelTest, LlmAtTp2AndTp4EqualsOneRank) {
  ExpectLlmTpEqualsOneRank(Small(), {2, 4});
}

// bf16 mixed precision: the same layers on bf16 GEMM operands and bf16
// stored activations, at TP 2 and 4, equal one bf16 rank.
TEST(TensorParallelModelTest, Bf16LlmAtTp2AndTp4EqualsOneRank) {
  const LlmResult fp32 = RunLlm(Small(), nullptr),
                  bf16 = RunLlm(Small(), nullptr, Precision::kBf16);
  EXPECT_NE(fp32.loss, bf16.loss) << "bf16 computed in fp32";
  ExpectLlmTpEqualsOneRank(Small(), {2, 4}, Precision::kBf16);
}

// Grouped-query attention splits whole key/value groups: 8 query heads over
// 4 KV heads of head_dim 6 (not dim / heads), q/k/v biases (Qwen2), lm_head
// tied to the embedding table, Llama 3's RoPE scaling.
ModelConfig GroupedQueryBiasedTied() {
  ModelConfig c = Small();
  c.llm.heads = 8;
  c.llm.kv_heads = 4;
  c.llm.head_dim = 6;
  c.llm.qkv_bias = true;
  c.llm.tie_embeddings = true;
  c.llm.rope_scaling = {RopeScaling::Type::kLlama3, 4, 1, 4, 8};
  return c;
}

TEST(TensorParallelModelTest, GroupedQueryBiasedTiedLlmAtTp2AndTp4EqualsOneRank) {
  const ModelConfig c = GroupedQueryBiasedTied();
  ASSERT_TRUE(ValidateModelConfig(c).ok());
  ASSERT_TRUE(ValidateModelParallel(c, 1, 1, 4, 1).ok());
  ExpectLlmTpEqualsOneRank(c, {2, 4});
}

// Sequence parallelism: the residual stream and the norms on 1/TP of the
// rows (a batch of an odd length: padded over 2 and 4 ranks), with and without
// selective recompute, in both precisions, and GQA with biases, tied
// embeddings and RoPE scaling; the norms' weight gradients summed over the
// group.
TEST(TensorParallelModelTest, SequenceParallelLlmAtTp2AndTp4EqualsOneRank) {
  int image_tokens = 0;
  ASSERT_NE(Batch(Small(), &image_tokens).T() % 4, 0) << "the test wants padding rows";
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    for (Recompute r : {Recompute::kNone, Recompute::kSelective}) {
      ExpectLlmTpEqualsOneRank(Small(), {2, 4}, p, /*sequence_parallel=*/true, r);
    }
  }
  const ModelConfig c = GroupedQueryBiasedTied();
  ExpectLlmTpEqualsOneRank(c, {2, 4}, Precision::kFp32, /*sequence_parallel=*/true);
}

// What sequence parallelism is for: a layer keeps its stream and norm
// rows 1/TP as large, so the state a forward keeps for its backward at
// TP 4 is smaller with it than without.
TEST(TensorParallelModelTest, SequenceParallelKeepsLessPerRank) {
  ModelConfig c = Small();
  c.llm.layers = 8;
  int64_t kept[2] = {0, 0};
  for (bool sp : {false, true}) {
    InMemoryStore store;
    std::vector<int64_t> bytes(4);
    testing::OnRanks(4, "tp", &store, [&](int rank, Communicator* comm) {
      Llm llm(c.llm, comm);
      llm.set_sequence_parallel(sp);
      llm.params().Initialize(kSeed);
      int image_tokens = 0;
      const LlmBatch batch = Batch(c, &image_tokens);
      const std::vector<float> emb =
          testing::RandomVector(static_cast<size_t>(image_tokens) * c.llm.dim, 9);
      ASSERT_TRUE(llm.Forward(batch, emb.data()).ok());
      // The kept activations: what the saved state holds between calls.
      SavedActivations saved = llm.Detach();
      bytes[rank] = saved.bytes();
      llm.Attach(&saved);
      ASSERT_TRUE(llm.Backward(1.0f, nullptr).ok());
    });
    kept[sp] = bytes[0];
  }
  EXPECT_LT(kept[1], kept[0]) << "sequence parallelism kept as much";
}

struct VitResult {
  std::vector<float> master, out, grads;
};

VitResult RunVit(const ModelConfig& c, Communicator* tp, Precision p = Precision::kFp32,
                 bool sequence_parallel = false, Recompute recompute = Recompute::kNone) {
  VitEncoder vit(c.vit, tp);
  vit.set_sequence_parallel(sequence_parallel);
  vit.set_recompute(recompute);
  vit.params().Initialize(kSeed);
  vit.params().Place(CpuBackend::Get(), p);
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

class VitTpTest : public ::testing::TestWithParam<Precision> {};

// With sequence parallelism too: CLIP's 3 tiles of 5 rows are 15, padded
// over 2 and 4 ranks (the padding rows' LayerNorm is its bias, not zero).
// With sequence parallelism also under selective recompute (against one
// rank under it).
TEST_P(VitTpTest, VitAtTp2AndTp4EqualsOneRank) {
  const Precision p = GetParam();
  for (const ModelConfig& c : {Small(), SmallClip()}) {
    for (Recompute r : {Recompute::kNone, Recompute::kSelective}) {
      const VitResult want = RunVit(c, nullptr, p, false, r);
      for (int tp : {2, 4}) {
        for (bool sp : {false, true}) {
          if (r == Recompute::kSelective && !sp) continue;
          InMemoryStore store;
          testing::OnRanks(tp, "tp", &store, [&](int rank, Communicator* comm) {
            const VitResult got = RunVit(c, comm, p, sp, r);
            const std::string what = "ViT " + std::string(PrecisionName(p)) + " (class token " +
                                     std::to_string(c.vit.class_token) + ")" +
                                     (sp ? " sequence-parallel" : "") + " recompute " +
                                     RecomputeName(r) + " tp " + std::to_string(tp) + " rank " +
                                     std::to_string(rank);
            EXPECT_EQ(got.master, want.master) << what << ": initial weights";
            ExpectClose(got.out, want.out, what + ": output", p);
            ExpectClose(got.grads, want.grads, what + ": parameter gradients", p);
          });
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, VitTpTest,
                         ::testing::Values(Precision::kFp32, Precision::kBf16),
                         [](const auto& info) { return std::string(PrecisionName(info.param)); });

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

// The same tensor in two sets, by name.
void ExpectSameTensors(ParamSet& stage, ParamSet& whole, const std::string& what) {
  for (int i = 0; i < static_cast<int>(stage.specs().size()); ++i) {
    const ParamSpec& s = stage.specs()[i];
    const int w = whole.Find(s.name);
    ASSERT_GE(w, 0) << s.name;
    const std::vector<float> got(stage.param(i), stage.param(i) + s.numel);
    const std::vector<float> want(whole.param(w), whole.param(w) + s.numel);
    EXPECT_EQ(got, want) << what << ": " << s.name;
    const std::vector<float> gg(stage.grad(i), stage.grad(i) + s.numel);
    const std::vector<float> gw(whole.grad(w), whole.grad(w) + s.numel);
    EXPECT_EQ(gg, gw) << what << ": gradient of " << s.name;
  }
}

class LlmStagesTest : public ::testing::TestWithParam<Precision> {};

TEST_P(LlmStagesTest, ChainedStagesEqualTheWholeLlm) {
  const Precision p = GetParam();
  ModelConfig c = Small();
  c.llm.layers = 5;
  int image_tokens = 0;
  const LlmBatch batch = Batch(c, &image_tokens);
  const std::vector<float> emb =
      testing::RandomVector(static_cast<size_t>(image_tokens) * c.llm.dim, 9);
  Llm whole(c.llm);
  whole.params().Initialize(kSeed);
  whole.params().Place(CpuBackend::Get(), p);
  ASSERT_TRUE(whole.Forward(batch, emb.data()).ok());
  std::vector<float> want_dimage(emb.size(), 0.0f);
  absl::StatusOr<kernels::LossSum> want = whole.Backward(0.25f, want_dimage.data());
  ASSERT_TRUE(want.ok());

  for (int pp : {2, 3, 5}) {
    std::vector<std::unique_ptr<Llm>> stages;
    int held = 0;
    for (int s = 0; s < pp; ++s) {
      const LayerRange r = LlmStageLayers(c, pp, s);
      EXPECT_EQ(r.first, held) << "stages are contiguous";
      EXPECT_GT(r.last, r.first) << "every stage holds a layer";
      held = r.last;
      stages.push_back(std::make_unique<Llm>(c.llm, nullptr, r));
      stages.back()->params().Initialize(kSeed);
      stages.back()->params().Place(CpuBackend::Get(), p);
    }
    EXPECT_EQ(held, c.llm.layers);
    for (int s = 0; s < pp; ++s) {
      ASSERT_TRUE(stages[s]
                      ->Forward(batch, s == 0 ? emb.data() : nullptr,
                                s == 0 ? nullptr : stages[s - 1]->output().data())
                      .ok());
    }
    std::vector<float> dimage(emb.size(), 0.0f), dnext, dthis;
    kernels::LossSum loss;
    for (int s = pp - 1; s >= 0; --s) {
      dthis.assign(static_cast<size_t>(batch.T()) * c.llm.dim, 0.0f);
      absl::StatusOr<kernels::LossSum> l = stages[s]->Backward(
          0.25f, s == 0 ? dimage.data() : nullptr, s == pp - 1 ? nullptr : dnext.data(),
          s == 0 ? nullptr : dthis.data());
      ASSERT_TRUE(l.ok());
      if (s == pp - 1) loss = *l;
      dnext = dthis;
    }
    EXPECT_EQ(loss.sum, want->sum) << "pp " << pp;
    EXPECT_EQ(loss.count, want->count);
    EXPECT_EQ(dimage, want_dimage) << "pp " << pp;
    for (int s = 0; s < pp; ++s) {
      ExpectSameTensors(stages[s]->params(), whole.params(),
                        "pp " + std::to_string(pp) + " stage " + std::to_string(s));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, LlmStagesTest,
                         ::testing::Values(Precision::kFp32, Precision::kBf16),
                         [](const auto& info) { return std::string(PrecisionName(info.param)); });

// With a class token the stages hand on seq = patches + 1 rows per tile and
// the last drops the token's row; in either precision.
class VitStagesTest : public ::testing::TestWithParam<std::tuple<bool, Precision>> {};

TEST_P(VitStagesTest, ChainedStagesEqualTheWholeVit) {
  const Precision p = std::get<1>(GetParam());
  ModelConfig c = std::get<0>(GetParam()) ? SmallClip() : Small();
  c.vit.layers = 3;
  const int N = 2;
  const std::vector<float> tiles =
      testing::RandomVector(static_cast<size_t>(N) * 3 * c.vit.tile_size * c.vit.tile_size, 4);
  const size_t out_size = static_cast<size_t>(N) * c.vit.patches_per_tile() * c.vit.dim;
  const size_t stage_size = static_cast<size_t>(N) * c.vit.seq() * c.vit.dim;
  const std::vector<float> dout = testing::RandomVector(out_size, 5);
  VitEncoder whole(c.vit);
  whole.params().Initialize(kSeed);
  whole.params().Place(CpuBackend::Get(), p);
  std::vector<float> want(out_size);
  ASSERT_TRUE(whole.Forward(tiles.data(), N, want.data()).ok());
  ASSERT_TRUE(whole.Backward(dout.data()).ok());

  const int pp = 3;
  std::vector<std::unique_ptr<VitEncoder>> stages;
  std::vector<std::vector<float>> outs(pp);
  for (int s = 0; s < pp; ++s) {
    stages.push_back(std::make_unique<VitEncoder>(c.vit, nullptr, VitStageLayers(c, pp, s)));
    stages.back()->params().Initialize(kSeed);
    stages.back()->params().Place(CpuBackend::Get(), p);
    outs[s].resize(s == pp - 1 ? out_size : stage_size);
    ASSERT_TRUE(
        stages[s]->Forward(s == 0 ? tiles.data() : outs[s - 1].data(), N, outs[s].data()).ok());
  }
  EXPECT_EQ(outs[pp - 1], want);
  std::vector<float> d = dout, din(stage_size);
  for (int s = pp - 1; s >= 0; --s) {
    ASSERT_TRUE(stages[s]->Backward(d.data(), s == 0 ? nullptr : din.data()).ok());
    d = din;
  }
  for (int s = 0; s < pp; ++s) {
    ExpectSameTensors(stages[s]->params(), whole.params(), "ViT stage " + std::to_string(s));
  }
}

INSTANTIATE_TEST_SUITE_P(ClassTokenAndPrecision, VitStagesTest,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(Precision::kFp32, Precision::kBf16)));

}  // namespace
}  // namespace loom
