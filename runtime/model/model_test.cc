#include "runtime/model/model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/matmul/bf16.h"
#include "kernels/testing/gradcheck.h"

namespace loom {
namespace {

// A model small enough for finite differences through every module.
ModelConfig Micro(bool pixel_shuffle) {
  ModelConfig c;
  c.name = "micro";
  c.vit = {/*tile_size=*/8, /*patch=*/4, /*dim=*/8,
           /*layers=*/1,    /*heads=*/2, /*mlp_hidden=*/16};
  c.projector = {pixel_shuffle, /*hidden=*/12};
  c.llm = {/*vocab=*/11, /*dim=*/8, /*layers=*/2, /*heads=*/2, /*ffn_hidden=*/12,
           10000.0f,     64};
  return c;
}

// The Hugging Face LLM families' features on Micro: Llama 3 (grouped-query
// attention, a head_dim that is not dim / heads, llama3 RoPE scaling, another
// eps) and Qwen2 (q/k/v biases, lm_head tied to the embedding table).
ModelConfig MicroLlama3() {
  ModelConfig c = Micro(false);
  c.name = "micro-llama3";
  c.llm.heads = 4;
  c.llm.kv_heads = 2;
  c.llm.head_dim = 6;
  c.llm.rms_norm_eps = 1e-5f;
  c.llm.rope_theta = 500000.0f;
  c.llm.rope_scaling = {RopeScaling::Type::kLlama3, /*factor=*/8, /*low_freq_factor=*/1,
                        /*high_freq_factor=*/4, /*original_max_position_embeddings=*/16};
  return c;
}

ModelConfig MicroQwen2() {
  ModelConfig c = Micro(false);
  c.name = "micro-qwen2";
  c.llm.kv_heads = 1;
  c.llm.qkv_bias = true;
  c.llm.tie_embeddings = true;
  c.llm.rope_theta = 1000000.0f;
  return c;
}

// The Hugging Face vision families' features on Micro, with LLaVA's
// projector (exact GELU): CLIP as LLaVA runs it (class token, no patch bias,
// pre-LayerNorm, quick GELU, no final LayerNorm) and SigLIP (patch bias, no
// class token, tanh GELU, eps 1e-6, no final LayerNorm).
ModelConfig MicroClip() {
  ModelConfig c = Micro(false);
  c.name = "micro-clip";
  c.vit.class_token = true;
  c.vit.patch_bias = false;
  c.vit.pre_norm = true;
  c.vit.final_norm = false;
  c.vit.act = kernels::Activation::kQuickGelu;
  c.projector.act = kernels::Activation::kGeluErf;
  return c;
}

ModelConfig MicroSiglip() {
  ModelConfig c = Micro(false);
  c.name = "micro-siglip";
  c.vit.final_norm = false;
  c.vit.norm_eps = 1e-6f;
  c.projector.act = kernels::Activation::kGeluErf;
  return c;
}

Sample MakeSample(const ModelConfig& c, int tiles, int text_before, int text_after, uint32_t seed) {
  Sample s;
  s.num_tiles = tiles;
  s.tiles = testing::RandomVector(
      static_cast<size_t>(tiles) * 3 * c.vit.tile_size * c.vit.tile_size, seed);
  std::mt19937 rng(seed);
  for (int i = 0; i < text_before; ++i) s.tokens.push_back(rng() % c.llm.vocab);
  for (int i = 0; i < tiles * c.tokens_per_tile(); ++i) s.tokens.push_back(-1);
  for (int i = 0; i < text_after; ++i) s.tokens.push_back(rng() % c.llm.vocab);
  return s;
}

// What a worker refuses from a preprocess started with another model config.
TEST(CheckSampleFitsTest, NamesWhatDoesNotFitTheModel) {
  const ModelConfig c = Micro(false);
  const Sample good = MakeSample(c, 2, 3, 4, 5);
  EXPECT_TRUE(CheckSampleFits(good, c.vit.tile_size, false, c, "k").ok());
  Sample tokens_only = good;
  tokens_only.tiles.clear();
  EXPECT_TRUE(CheckSampleFits(tokens_only, c.vit.tile_size, true, c, "k").ok());

  absl::Status s = CheckSampleFits(good, 16, false, c, "doc-7");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("sample doc-7"), std::string::npos) << s;
  EXPECT_NE(s.message().find("tiles of 16 px; the model takes 8 px tiles"), std::string::npos) << s;
  Sample cut = good;
  cut.tiles.pop_back();
  EXPECT_EQ(CheckSampleFits(cut, 8, false, c, "k").code(), absl::StatusCode::kFailedPrecondition);
  Sample slots = good;
  slots.tokens.push_back(-1);  // a preprocess with more tokens per tile
  s = CheckSampleFits(slots, 8, false, c, "k");
  EXPECT_NE(s.message().find("image-token slots"), std::string::npos) << s;
  Sample vocab = good;
  vocab.tokens[0] = c.llm.vocab;  // a tokenizer larger than the model's vocabulary
  s = CheckSampleFits(vocab, 8, false, c, "k");
  EXPECT_NE(s.message().find("token id 11 outside the vocabulary of 11"), std::string::npos) << s;
  vocab.tokens[0] = -2;
  EXPECT_FALSE(CheckSampleFits(vocab, 8, false, c, "k").ok());
  Sample negative = good;
  negative.num_tiles = -1;
  EXPECT_FALSE(CheckSampleFits(negative, 8, false, c, "k").ok());
}

// On the CPU backend the host vectors are the layers' memory: placing the
// parameters there changes nothing (a GPU backend gets a copy:
// runtime/backends/cuda:cuda_model_test).
TEST(ParamSetTest, PlacingOnTheCpuKeepsTheHostVectors) {
  ParamSet p;
  const int w = p.Add("w", {3, 4}, Init::kNormal, 0.02f);
  p.Finalize();
  p.Initialize(1);
  float* before = p.param(w);
  p.Place(CpuBackend::Get());
  EXPECT_FALSE(p.placed());
  EXPECT_EQ(p.param(w), before);
  EXPECT_EQ(p.param(w), p.data().data());
  EXPECT_EQ(p.grad(w), p.grads().data());
  ParamSet copy = p;  // a copy is never placed; its own host vectors
  EXPECT_EQ(copy.data(), p.data());
  EXPECT_NE(copy.param(w), p.param(w));
}

// Under bf16 the set keeps a bf16 copy of its weights, which the GEMMs read
// and PushData refreshes from the fp32 masters; fp32 and a copy have none.
TEST(ParamSetTest, Bf16PlacementKeepsABf16CopyOfTheMasters) {
  ParamSet p;
  const int a = p.Add("a", {3, 4}, Init::kNormal, 0.5f), b = p.Add("b", {5}, Init::kOnes);
  p.Finalize();
  p.Initialize(1);
  p.Place(CpuBackend::Get());
  EXPECT_EQ(p.weight(a).bf16, nullptr);
  p.Place(CpuBackend::Get(), Precision::kBf16);
  EXPECT_EQ(p.precision(), Precision::kBf16);
  EXPECT_EQ(p.weight(a).f32, p.param(a));
  auto expect_rounded = [&](const std::string& when) {
    for (int i : {a, b}) {
      for (int64_t k = 0; k < p.spec(i).numel; ++k) {
        ASSERT_EQ(p.weight(i).bf16[k], kernels::F32ToBf16(p.param(i)[k])) << when << " " << k;
      }
    }
  };
  expect_rounded("after Place");
  bool narrowed = false;
  for (int64_t k = 0; k < p.spec(a).numel; ++k) {
    narrowed |= kernels::Bf16ToF32(p.weight(a).bf16[k]) != p.param(a)[k];
  }
  EXPECT_TRUE(narrowed) << "N(0, 0.5) draws are not all bf16 values";
  for (float& x : p.data()) x *= 3;  // an optimizer step
  p.PushData();
  expect_rounded("after PushData");
  ParamSet copy = p;
  EXPECT_EQ(copy.precision(), Precision::kFp32);
  EXPECT_EQ(copy.weight(a).bf16, nullptr);
}

TEST(ActivationStashTest, KeepsNarrowTensorsAsBf16AndTheRestAsTheyAre) {
  Buffer<float> x(CpuBackend::Get()), y(CpuBackend::Get()), stat(CpuBackend::Get());
  const std::vector<float> xs = testing::RandomVector(7, 1), ys = testing::RandomVector(3, 2),
                           st = testing::RandomVector(2, 3);
  x.CopyFromHost(xs.data(), xs.size());
  y.CopyFromHost(ys.data(), ys.size());
  stat.CopyFromHost(st.data(), st.size());
  ActivationStash stash;
  stash.Bind(CpuBackend::Get());
  stash.Pack(CpuOps(), {&x, &y}, {&stat});
  EXPECT_EQ(stash.bytes(), 2 * (7 + 3) + 4 * 2);
  x.Zeros(1);  // the working set moves on to the next layer
  y.Zeros(9);
  stat.Zeros(4);
  stash.Unpack(CpuOps(), {&x, &y}, {&stat});
  const std::vector<float> gx = x.ToHost(), gy = y.ToHost();
  ASSERT_EQ(gx.size(), xs.size());
  ASSERT_EQ(gy.size(), ys.size());
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_EQ(gx[i], kernels::RoundToBf16(xs[i])) << i;
  for (size_t i = 0; i < ys.size(); ++i) EXPECT_EQ(gy[i], kernels::RoundToBf16(ys[i])) << i;
  EXPECT_EQ(stat.ToHost(), st);
}

// ||got - want|| / ||want|| over a whole tensor.
double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double d = 0, w = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    d += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
    w += double{want[i]} * want[i];
  }
  return std::sqrt(d / std::max(w, 1e-300));
}

// bf16 mixed precision computes what fp32 does to bf16's precision, every
// module's gradient included, and no more exactly than that (the GEMMs and
// the stored activations really are narrowed).
TEST(ModelTest, Bf16IsFp32ToBf16sPrecision) {
  for (const ModelConfig& c : {Micro(false), Micro(true)}) {
    Sample s1 = MakeSample(c, 1, 3, 4, 11), s2 = MakeSample(c, 2, 1, 2, 12);
    const float scale = 1.0f / (LossTokens(s1) + LossTokens(s2));
    MultimodalModel fp32(c), bf16(c);
    fp32.Initialize(5);
    bf16.Initialize(5);
    bf16.Place(Precision::kBf16);
    fp32.ZeroGrad();
    bf16.ZeroGrad();
    const double l32 = fp32.ForwardBackward({&s1, &s2}, scale).sum;
    const double l16 = bf16.ForwardBackward({&s1, &s2}, scale).sum;
    const testing::Tolerance t = testing::kBf16VsFp32Model;
    EXPECT_NEAR(l16, l32, testing::Allowed(t, l32)) << c.name << ": " << t.reason;
    EXPECT_NE(l16, l32) << c.name << ": bf16 computed in fp32";
    auto a = fp32.param_sets(), b = bf16.param_sets();
    for (size_t m = 0; m < a.size(); ++m) {
      const double err = RelativeError(b[m]->grads(), a[m]->grads());
      EXPECT_LT(err, t.rtol) << c.name << " module " << m << ": " << t.reason;
      EXPECT_GT(err, 0) << c.name << " module " << m;
      std::printf("%s module %zu: gradient relative error %.3g, loss %.3g\n", c.name.c_str(), m,
                  err, std::fabs(l16 - l32) / l32);
    }
  }
}

// Ranks on one machine spread over its GPUs; an explicit index is kept.
TEST(DeviceTest, CudaIsTheLocalRanksGpu) {
  EXPECT_EQ(*ResolveDevice("cuda", 0, 8), 0);
  EXPECT_EQ(*ResolveDevice("cuda", 5, 8), 5);
  EXPECT_EQ(*ResolveDevice("cuda", 9, 8), 1);  // more ranks than GPUs: shared
  EXPECT_EQ(*ResolveDevice("cuda:3", 5, 8), 3);
  EXPECT_EQ(*ResolveDevice("cpu", 5, 8), -1);
  EXPECT_EQ(*ResolveDevice("cuda", 5, 0), 0);  // no GPU: opening device 0 says so
  EXPECT_EQ(ResolveDevice("gpu", 0, 8).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeviceTest, LocalRankComesFromTheLauncher) {
  for (const char* v :
       {"LOOM_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"}) {
    unsetenv(v);
  }
  EXPECT_EQ(*LocalRankFromEnvironment(), 0);
  setenv("SLURM_LOCALID", "3", 1);
  EXPECT_EQ(*LocalRankFromEnvironment(), 3);
  setenv("LOCAL_RANK", "2", 1);  // torchrun's before Slurm's
  EXPECT_EQ(*LocalRankFromEnvironment(), 2);
  setenv("LOOM_LOCAL_RANK", "x", 1);
  absl::StatusOr<int> bad = LocalRankFromEnvironment();
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("LOOM_LOCAL_RANK=x"), std::string::npos) << bad.status();
  for (const char* v : {"LOOM_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID"}) unsetenv(v);
}

TEST(PackTest, TargetsArePredictableTextAndPositionsRestart) {
  Sample a, b;
  a.tokens = {5, -1, -1, 7, 8};
  b.tokens = {3, 4};
  LlmBatch p = PackSamples({&a, &b});
  EXPECT_EQ(p.targets, (std::vector<int32_t>{-1, -1, 7, 8, -1, 4, -1}));
  EXPECT_EQ(p.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1}));
  EXPECT_EQ(p.cu_seqlens, (std::vector<int32_t>{0, 5, 7}));
  EXPECT_EQ(LossTokens(a), 2);
  EXPECT_EQ(LossTokens(b), 1);
}

class ModelGradientTest : public ::testing::TestWithParam<int> {};

ModelConfig Variant(int v) {
  switch (v) {
    case 1:
      return Micro(true);
    case 2:
      return MicroLlama3();
    case 3:
      return MicroQwen2();
    case 4:
      return MicroClip();
    case 5:
      return MicroSiglip();
    default:
      return Micro(false);
  }
}

TEST_P(ModelGradientTest, EveryModuleMatchesFiniteDifferences) {
  const ModelConfig c = Variant(GetParam());
  ASSERT_TRUE(ValidateModelConfig(c).ok()) << c.name;
  MultimodalModel model(c);
  model.Initialize(7);
  // Larger weights than training init, so gradients are not all tiny.
  for (ParamSet* ps : model.param_sets()) {
    auto noise = testing::RandomVector(ps->size(), 99, 0.3f);
    for (int64_t i = 0; i < ps->size(); ++i) ps->data()[i] += noise[i];
  }
  Sample s1 = MakeSample(c, 2, 2, 4, 1), s2 = MakeSample(c, 1, 0, 3, 2),
         s3 = MakeSample(c, 0, 5, 0, 3);
  std::vector<const Sample*> mb = {&s1, &s2, &s3};
  const int64_t loss_tokens = LossTokens(s1) + LossTokens(s2) + LossTokens(s3);
  const float scale = 1.0f / loss_tokens;
  model.ZeroGrad();
  model.ForwardBackward(mb, scale);
  auto loss = [&] { return model.Evaluate(mb).sum * scale; };
  for (ParamSet* ps : model.param_sets()) {
    std::vector<float> analytic = ps->grads();
    EXPECT_TRUE(testing::CheckGradient(loss, ps->data().data(), analytic.data(), ps->size(),
                                       /*max_checks=*/150, /*h=*/1e-2f,
                                       testing::kFiniteDifferenceModelF32));
  }
}

constexpr int kVariants = 6;
std::string VariantName(const ::testing::TestParamInfo<int>& info) {
  static const char* const kNames[kVariants] = {"Plain",         "PixelShuffle",   "Llama3Gqa",
                                                "Qwen2BiasTied", "ClipLlavaTower", "SiglipTower"};
  return kNames[info.param];
}
INSTANTIATE_TEST_SUITE_P(Variants, ModelGradientTest, ::testing::Range(0, kVariants), VariantName);

TEST(ConfigTest, FamilyFeaturesShapeTheParameters) {
  // The counted parameters are the allocated ones, for every variant.
  for (int v = 0; v < kVariants; ++v) {
    const ModelConfig c = Variant(v);
    Llm llm(c.llm);
    EXPECT_EQ(llm.params().size(), LlmParameterCount(c.llm)) << c.name;
    VitEncoder vit(c.vit);
    EXPECT_EQ(vit.params().size(), VitParameterCount(c.vit)) << c.name;
    Projector projector(c);
    EXPECT_EQ(projector.params().size(), ProjectorParameterCount(c)) << c.name;
  }
  const ModelConfig clip = MicroClip();
  VitEncoder clip_vit(clip.vit);
  EXPECT_EQ(clip.vit.seq(), clip.vit.patches_per_tile() + 1);
  EXPECT_EQ(clip_vit.params().spec(clip_vit.params().Find("pos_embed")).master_shape,
            (Shape{clip.vit.seq(), clip.vit.dim}));
  EXPECT_GE(clip_vit.params().Find("cls_token"), 0);
  EXPECT_GE(clip_vit.params().Find("ln_pre.weight"), 0);
  EXPECT_EQ(clip_vit.params().Find("patch_embed.bias"), -1);
  EXPECT_EQ(clip_vit.params().Find("ln_f.weight"), -1);
  const ModelConfig q = MicroQwen2();
  Llm qwen(q.llm);
  EXPECT_EQ(qwen.params().Find("lm_head.weight"), -1) << "tied: one table";
  const int qkv = qwen.params().Find("layers.0.attn.qkv.bias");
  ASSERT_GE(qkv, 0);
  EXPECT_EQ(qwen.params().spec(qkv).master_shape, (Shape{(2 + 2 * 1) * 4}));
  const ModelConfig l = MicroLlama3();
  Llm llama(l.llm);
  const int w = llama.params().Find("layers.1.attn.qkv.weight");
  ASSERT_GE(w, 0);
  EXPECT_EQ(llama.params().spec(w).master_shape, (Shape{(4 + 2 * 2) * 6, 8}));
  EXPECT_EQ(llama.params().Find("layers.0.attn.qkv.bias"), -1);
  EXPECT_EQ(llama.params().spec(llama.params().Find("layers.0.attn.proj.weight")).master_shape,
            (Shape{8, 24}));

  // What cannot run is refused, naming the field.
  ModelConfig bad = MicroLlama3();
  bad.llm.kv_heads = 3;
  EXPECT_NE(ValidateModelConfig(bad).message().find("llm.kv_heads"), absl::string_view::npos);
  bad = MicroLlama3();
  bad.llm.head_dim = 5;
  EXPECT_NE(ValidateModelConfig(bad).message().find("llm.head_dim"), absl::string_view::npos);
  bad = MicroLlama3();
  bad.llm.rope_scaling.high_freq_factor = 0.5f;
  EXPECT_NE(ValidateModelConfig(bad).message().find("llm.rope_scaling"), absl::string_view::npos);
  absl::Status s = ValidateModelParallel(MicroLlama3(), 1, 1, 4, 1);
  EXPECT_NE(s.message().find("key/value heads"), absl::string_view::npos) << s;
  EXPECT_TRUE(ValidateModelParallel(MicroLlama3(), 1, 1, 1, 2).ok());
  s = ValidateModelParallel(MicroQwen2(), 1, 1, 1, 2);
  EXPECT_NE(s.message().find("llm_pp"), absl::string_view::npos) << s;
}

TEST(ConfigTest, Llama3RopeScalingKeepsHighFrequenciesAndDividesLowOnes) {
  // Hugging Face's _compute_llama3_parameters on head_dim 16, theta 10000,
  // factor 8, low 1, high 4, original length 32: wavelengths below 8 stay,
  // above 32 are divided by 8, between them interpolated.
  LlmConfig c;
  c.dim = 64;
  c.heads = 4;
  c.rope_scaling = {RopeScaling::Type::kLlama3, 8, 1, 4, 32};
  const std::vector<float> f = RopeInvFreq(c);
  ASSERT_EQ(f.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    const double plain = 1.0 / std::pow(10000.0, 2.0 * i / 16), wavelen = 2 * M_PI / plain;
    double want = plain;
    if (wavelen > 32) {
      want = plain / 8;
    } else if (wavelen >= 8) {
      const double smooth = (32 / wavelen - 1) / (4 - 1);
      want = (1 - smooth) * plain / 8 + smooth * plain;
    }
    EXPECT_NEAR(f[i], want, 1e-6 * want) << i;
  }
  EXPECT_FLOAT_EQ(f[0], 1.0f);                                      // wavelength 6.3: kept
  EXPECT_NEAR(f[7], 1.0 / std::pow(10000.0, 14.0 / 16) / 8, 1e-9);  // divided
}

TEST(ModelTest, GradientIsTheSameForAnySplitIntoMicrobatches) {
  const ModelConfig c = Micro(false);
  Sample s1 = MakeSample(c, 1, 3, 4, 11), s2 = MakeSample(c, 2, 1, 2, 12),
         s3 = MakeSample(c, 0, 6, 0, 13);
  const float scale = 1.0f / (LossTokens(s1) + LossTokens(s2) + LossTokens(s3));
  MultimodalModel whole(c), split(c);
  whole.Initialize(5);
  split.Initialize(5);
  whole.ZeroGrad();
  split.ZeroGrad();
  const double l_whole = whole.ForwardBackward({&s1, &s2, &s3}, scale).sum;
  const double l_split =
      split.ForwardBackward({&s3}, scale).sum + split.ForwardBackward({&s2, &s1}, scale).sum;
  const testing::Tolerance tol = testing::kSplitInvarianceF32;
  EXPECT_NEAR(l_whole, l_split, tol.atol + tol.rtol * l_whole) << tol.reason;
  auto a = whole.param_sets(), b = split.param_sets();
  for (size_t m = 0; m < a.size(); ++m) {
    EXPECT_TRUE(testing::AllClose(b[m]->grads().data(), a[m]->grads().data(), a[m]->size(),
                                  testing::kSplitInvarianceF32));
  }
}

// Selective recompute (the norms' and SwiGLU's / GELU's outputs computed
// again in backward, not kept) gives the gradients of keeping them: the
// same bits in fp32; under bf16 (the norms then recomputed from the kept
// bf16 input) within bf16's rounding of the fp32 run, as full is.
TEST(ModelTest, SelectiveRecomputeGivesTheSameGradients) {
  for (const ModelConfig& c : {Micro(false), Micro(true)}) {
    for (Precision p : {Precision::kFp32, Precision::kBf16}) {
      Sample s1 = MakeSample(c, 1, 3, 4, 11), s2 = MakeSample(c, 2, 1, 2, 12);
      const float scale = 1.0f / (LossTokens(s1) + LossTokens(s2));
      MultimodalModel full(c), selective(c), fp32(c);
      for (MultimodalModel* m : {&full, &selective, &fp32}) {
        m->Initialize(5);
        m->Place(m == &fp32 ? Precision::kFp32 : p);
        m->ZeroGrad();
      }
      selective.vit().set_recompute(Recompute::kSelective);
      selective.llm().set_recompute(Recompute::kSelective);
      const double l_full = full.ForwardBackward({&s1, &s2}, scale).sum;
      const double l_selective = selective.ForwardBackward({&s1, &s2}, scale).sum;
      fp32.ForwardBackward({&s1, &s2}, scale);
      EXPECT_EQ(l_selective, l_full) << c.name << " " << PrecisionName(p);  // the forward is one
      auto a = full.param_sets(), b = selective.param_sets(), r = fp32.param_sets();
      for (size_t m = 0; m < a.size(); ++m) {
        if (p == Precision::kFp32) {
          EXPECT_EQ(b[m]->grads(), a[m]->grads()) << c.name << " module " << m;
          continue;
        }
        const testing::Tolerance t = testing::kBf16VsFp32Model;
        EXPECT_LT(RelativeError(b[m]->grads(), r[m]->grads()), t.rtol)
            << c.name << " module " << m << ": " << t.reason;
      }
    }
  }
}

// A module's activations detached while another microbatch runs forward
// and backward, then attached for their own backward, give the gradients
// and loss of running the two one after the other in that order (a
// pipeline stage keeping its in-flight microbatches: recompute none or
// selective), the same bits, in either precision.
TEST(ModelTest, DetachedActivationsBackwardAsIfNeverMoved) {
  const ModelConfig c = Micro(true);
  Sample a = MakeSample(c, 0, 6, 3, 13), b = MakeSample(c, 0, 4, 5, 14);
  const LlmBatch ba = PackSamples({&a}), bb = PackSamples({&b});
  const int N = 2, tile = 3 * c.vit.tile_size * c.vit.tile_size;
  std::vector<float> tiles(2 * N * tile), dout(2 * N * c.tokens_per_tile() * c.llm.dim);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (float& v : tiles) v = normal(rng);
  for (float& v : dout) v = normal(rng);
  const size_t out = static_cast<size_t>(N) * c.vit.patches_per_tile() * c.vit.dim,
               dproj = dout.size() / 2;
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    for (Recompute r : {Recompute::kNone, Recompute::kSelective}) {
      const std::string label = absl::StrCat(PrecisionName(p), " ", RecomputeName(r));
      MultimodalModel in_order(c), detached(c);
      for (MultimodalModel* m : {&in_order, &detached}) {
        m->Initialize(5);
        m->Place(p);
        m->ZeroGrad();
        m->vit().set_recompute(r);
        m->llm().set_recompute(r);
      }
      // The LLM: b, then a.
      std::vector<double> losses;
      for (const LlmBatch* batch : {&bb, &ba}) {
        ASSERT_TRUE(in_order.llm().Forward(*batch, nullptr).ok());
        losses.push_back(in_order.llm().Backward(0.1f, nullptr)->sum);
      }
      ASSERT_TRUE(detached.llm().Forward(ba, nullptr).ok());
      SavedActivations saved = detached.llm().Detach();
      EXPECT_GT(saved.bytes(), 0);
      ASSERT_TRUE(detached.llm().Forward(bb, nullptr).ok());
      EXPECT_EQ(detached.llm().Backward(0.1f, nullptr)->sum, losses[0]) << label;
      detached.llm().Attach(&saved);
      EXPECT_EQ(detached.llm().Backward(0.1f, nullptr)->sum, losses[1]) << label;
      // The encoder and projector: tiles [N, 2N), then [0, N).
      std::vector<float> emb(dproj), dvit(out);
      for (int k : {1, 0}) {
        std::vector<float> vit_out(out);
        ASSERT_TRUE(in_order.vit().Forward(tiles.data() + k * N * tile, N, vit_out.data()).ok());
        in_order.projector().Forward(vit_out.data(), N, emb.data());
        std::fill(dvit.begin(), dvit.end(), 0.0f);
        in_order.projector().Backward(dout.data() + k * dproj, dvit.data());
        ASSERT_TRUE(in_order.vit().Backward(dvit.data()).ok());
      }
      std::vector<float> vit_out(out);
      ASSERT_TRUE(detached.vit().Forward(tiles.data(), N, vit_out.data()).ok());
      detached.projector().Forward(vit_out.data(), N, emb.data());
      SavedActivations vit_saved = detached.vit().Detach();
      SavedActivations projector_saved = detached.projector().Detach();
      ASSERT_TRUE(detached.vit().Forward(tiles.data() + N * tile, 2, vit_out.data()).ok());
      detached.projector().Forward(vit_out.data(), N, emb.data());
      std::fill(dvit.begin(), dvit.end(), 0.0f);
      detached.projector().Backward(dout.data() + dproj, dvit.data());
      ASSERT_TRUE(detached.vit().Backward(dvit.data()).ok());
      detached.vit().Attach(&vit_saved);
      detached.projector().Attach(&projector_saved);
      std::fill(dvit.begin(), dvit.end(), 0.0f);
      detached.projector().Backward(dout.data(), dvit.data());
      ASSERT_TRUE(detached.vit().Backward(dvit.data()).ok());
      auto x = in_order.param_sets(), y = detached.param_sets();
      for (size_t m = 0; m < x.size(); ++m) {
        EXPECT_EQ(y[m]->grads(), x[m]->grads()) << label << " module " << m;
      }
    }
  }
}

TEST(ConfigTest, NamedConfigsAreValidAndSized) {
  for (const std::string& name : ModelConfigNames()) {
    absl::StatusOr<ModelConfig> c = ModelConfigByName(name);
    ASSERT_TRUE(c.ok()) << name;
    EXPECT_TRUE(ValidateModelConfig(*c).ok()) << name;
  }
  ModelConfig big = *ModelConfigByName("vit300m-llm1b");
  EXPECT_NEAR(VitParameterCount(big.vit) / 1e6, 300, 15);
  EXPECT_NEAR(LlmParameterCount(big.llm) / 1e9, 1.0, 0.1);
  EXPECT_NEAR(LlmParameterCount(ModelConfigByName("vit300m-llm70b")->llm) / 1e9, 70, 2);
  const ModelConfig small = *ModelConfigByName("vit10m-llm45m");
  EXPECT_NEAR(VitParameterCount(small.vit) / 1e6, 10.7, 0.5);
  EXPECT_NEAR(LlmParameterCount(small.llm) / 1e6, 45.6, 0.5);
  EXPECT_EQ(ModelConfigByName("huge").status().code(), absl::StatusCode::kNotFound);
  ModelConfig bad = *ModelConfigByName("tiny");
  bad.vit.patch = 7;
  absl::Status s = ValidateModelConfig(bad);
  EXPECT_NE(s.message().find("vit.tile_size"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace loom
