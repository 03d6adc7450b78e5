#include "runtime/scheduling/plan.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/scheduling/cost_model.h"
#include "runtime/scheduling/macro.h"
#include "runtime/scheduling/schedule.h"

namespace loom::sched {
namespace {

ModelConfig Config(const std::string& name) {
  absl::StatusOr<ModelConfig> c = ModelConfigByName(name);
  EXPECT_TRUE(c.ok());
  return *c;
}

// Training FLOPs per token of the LLM are 6 x its matmul parameters (the
// input embedding is a lookup, not a matmul), plus attention.
TEST(CostModelTest, LlmFlopsMatchSixTimesParameters) {
  const ModelConfig c = Config("vit300m-llm1b");
  const ModelFlops f = AnalyticFlops(c, false);
  const double matmul_params =
      static_cast<double>(LlmParameterCount(c.llm)) - 1.0 * c.llm.vocab * c.llm.dim;
  EXPECT_NEAR(f.llm_per_token / (6 * matmul_params), 1.0, 0.01);  // norms are not matmuls
  EXPECT_DOUBLE_EQ(f.llm_per_token_sq, 3 * c.llm.layers * 2.0 * c.llm.dim);
  EXPECT_DOUBLE_EQ(AnalyticFlops(c, true).llm_per_token, f.llm_per_token * 4 / 3);
}

TEST(CostModelTest, VitFlopsPerTileMatchParametersPlusAttention) {
  const ModelConfig c = Config("vit300m-llm1b");
  const ModelFlops f = AnalyticFlops(c, false);
  const double t = c.vit.patches_per_tile();
  const double attention = 3.0 * c.vit.layers * 4 * t * t * c.vit.dim;
  const double dense =
      6 * t * VitParameterCount(c.vit) + 6.0 * c.tokens_per_tile() * ProjectorParameterCount(c);
  // Position embeddings and norms are counted as parameters but are not matmuls.
  EXPECT_NEAR(f.encoder_per_tile / (dense + attention), 1.0, 0.02);
}

// Frozen modules (LLaVA's stages): a frozen LLM that passes gradients to
// the image embeddings runs forward + input gradient (2 passes of its
// weights, attention's backward unchanged); a frozen tower runs forward only
// and a projector after it forward + weight gradient.
TEST(CostModelTest, FrozenModulesCostTheirCheaperBackward) {
  const ModelConfig c = Config("vit300m-llm1b");
  const ModelFlops full = AnalyticFlops(c, false);
  const ModelFlops stage1 = AnalyticFlops(c, false, *ParseFrozen("vision,llm"));
  EXPECT_DOUBLE_EQ(stage1.llm_per_token, full.llm_per_token * 2 / 3);
  EXPECT_DOUBLE_EQ(stage1.llm_per_token_sq, full.llm_per_token_sq);
  const double projector = 2.0 * c.tokens_per_tile() * ProjectorParameterCount(c);
  const double forward_only = (full.encoder_per_tile - 3 * projector) / 3;  // the tower once
  EXPECT_NEAR(stage1.encoder_per_tile / (forward_only + 2 * projector), 1.0, 1e-3);
  EXPECT_LT(stage1.encoder_per_tile, full.encoder_per_tile / 2.5);
  // Stage 2 (the tower frozen): the LLM as in full training.
  const ModelFlops stage2 = AnalyticFlops(c, false, *ParseFrozen("vision"));
  EXPECT_DOUBLE_EQ(stage2.llm_per_token, full.llm_per_token);
  EXPECT_DOUBLE_EQ(stage2.encoder_per_tile, stage1.encoder_per_tile);
  // Nothing trainable before the LLM: the projector runs forward only too.
  const ModelFlops llm_only = AnalyticFlops(c, false, *ParseFrozen("vision,projector"));
  EXPECT_NEAR(llm_only.encoder_per_tile / (forward_only + projector), 1.0, 1e-3);
  // Recompute adds a forward only where a module runs backward.
  EXPECT_DOUBLE_EQ(AnalyticFlops(c, true, *ParseFrozen("vision,llm")).llm_per_token,
                   full.llm_per_token);
}

// The generator's FLOPs per output image: 6 x the denoiser's layer weights
// per row (patches and the 1 + Q prefix rows) plus attention, and the patch
// embedding, the patch head and the conditions' projection; frozen, it runs
// forward and its input gradient (something before it trains).
TEST(CostModelTest, GeneratorFlopsPerOutputImage) {
  EXPECT_EQ(AnalyticFlops(Config("tiny"), false).generator_per_image, 0);
  const ModelConfig c = Config("tiny-gen");
  const GeneratorConfig& g = c.generator;
  const ModelFlops f = AnalyticFlops(c, false);
  const double d = g.denoiser.dim, h = g.denoiser.mlp_hidden;
  const double rows = g.denoiser.patches_per_tile() + 1 + g.queries;
  const double layer = 4 * d * d + 2 * d * h;
  const double dense = 6 * rows * g.denoiser.layers * layer +
                       6 * 2 * g.denoiser.patches_per_tile() * g.denoiser.patch_dim() * d +
                       6 * g.queries * g.cond_dim * d;
  const double attention = 3.0 * g.denoiser.layers * 4 * rows * rows * d;
  EXPECT_DOUBLE_EQ(f.generator_per_image, dense + attention);
  const ModelFlops frozen = AnalyticFlops(c, false, *ParseFrozen("generator", true));
  EXPECT_DOUBLE_EQ(frozen.generator_per_image, dense * 2 / 3 + attention);
  // MetaQuery's: only the generator trains (its weights' gradient, no
  // input gradient); a frozen LLM before a training tower still takes the
  // generator's input gradient.
  const ModelFlops meta = AnalyticFlops(c, false, *ParseFrozen("vision,projector,llm", true));
  EXPECT_DOUBLE_EQ(meta.generator_per_image, dense * 2 / 3 + attention);
  const ModelFlops tower = AnalyticFlops(c, false, *ParseFrozen("llm,generator", true));
  EXPECT_DOUBLE_EQ(tower.generator_per_image, dense * 2 / 3 + attention);
  EXPECT_DOUBLE_EQ(AnalyticFlops(c, true).generator_per_image, (dense + attention) * 4 / 3);
}

// The generator's load is priced per output image, and the LLM's length
// counts the query positions (a scan line's fields, through ShapeOf).
TEST(CostModelTest, GeneratorLoadPerOutputImageAndQueriesInTheLlmLength) {
  scheduler::v1::BatchSample b;
  b.add_images(2);
  b.set_image_tokens(32);
  b.set_text_tokens(20);
  b.add_output_images(16);
  b.add_output_images(16);
  b.set_query_tokens(8);
  const SampleShape s = ShapeOf(b);
  EXPECT_EQ(s.output_images, 2);
  EXPECT_EQ(s.length(), 60);
  scheduler::v1::CostCoefficients k;
  k.set_llm_per_token(1);
  k.set_generator_per_image(0.5);
  const CostModel model(k);
  EXPECT_DOUBLE_EQ(model.LlmSeconds(s), 60);
  EXPECT_DOUBLE_EQ(model.GeneratorSeconds(s), 1.0);
  SampleShape text_only;
  text_only.text_tokens = 10;
  const std::vector<SampleLoad> loads = model.Loads({s, text_only}, 0);
  EXPECT_DOUBLE_EQ(loads[0].generator, 1.0);
  EXPECT_DOUBLE_EQ(loads[1].generator, 0);
}

// Timings generated by known coefficients are recovered by the online fit.
TEST(CostModelTest, RefitRecoversCoefficientsFromTimings) {
  scheduler::v1::CostCoefficients prior;
  prior.set_encoder_per_tile(1e-3);
  prior.set_llm_per_token(1e-6);
  prior.set_llm_per_token_sq(1e-9);
  CostModel model(prior);
  const double tile = 4e-3, per_image_sample = 2e-3, tok = 3e-6, sq = 5e-10;
  for (int k = 0; k < 200; ++k) {
    std::vector<SampleShape> mb;
    for (int i = 0; i < 1 + k % 5; ++i) {
      SampleShape s;
      s.tiles = (k * 7 + i * 3) % 13;
      s.image_tokens = s.tiles * 144;
      s.text_tokens = 50 + (k * 31 + i * 17) % 900;
      mb.push_back(s);
    }
    double enc = 0, llm = 0;
    for (const SampleShape& s : mb) {
      enc += s.tiles > 0 ? per_image_sample + tile * s.tiles : 0;
      llm += tok * s.length() + sq * s.length() * s.length();
    }
    model.ObserveEncoder(mb, enc);
    model.ObserveLlm(mb, llm);
  }
  const auto& c = model.coefficients();
  EXPECT_NEAR(c.encoder_per_tile() / tile, 1.0, 0.01);
  EXPECT_NEAR(c.encoder_per_sample() / per_image_sample, 1.0, 0.02);
  EXPECT_NEAR(c.llm_per_token() / tok, 1.0, 0.01);
  EXPECT_NEAR(c.llm_per_token_sq() / sq, 1.0, 0.01);
  EXPECT_GE(c.llm_per_sample(), 0);
  EXPECT_FALSE(model.ObserveLlm({SampleShape{}}, NAN));
  EXPECT_FALSE(model.ObserveLlm({SampleShape{}}, -1));
}

// The generator's cost per output image refits from its bins' timings, and
// a bin without pictures (nothing the generator ran) teaches it nothing.
TEST(CostModelTest, GeneratorRefitsItsCostPerImage) {
  scheduler::v1::CostCoefficients prior;
  prior.set_generator_per_image(1e-3);
  CostModel model(prior);
  EXPECT_FALSE(model.ObserveGenerator({SampleShape{}}, 1.0));
  EXPECT_EQ(model.coefficients().generator_per_image(), 1e-3);
  const double per_image = 7e-3;
  for (int k = 0; k < 50; ++k) {
    SampleShape a, b;
    a.output_images = 1 + k % 3;
    b.output_images = k % 2;
    ASSERT_TRUE(model.ObserveGenerator({a, b}, per_image * (a.output_images + b.output_images)));
  }
  EXPECT_NEAR(model.coefficients().generator_per_image() / per_image, 1.0, 1e-9);
  EXPECT_FALSE(model.ObserveGenerator({SampleShape{}}, NAN));
}

BatchStats OneVisionLike(double mean_tiles, int global_batch) {
  BatchStats s;
  s.global_batch = global_batch;
  s.mean_tiles = mean_tiles;
  s.mean_image_tokens = mean_tiles * 144;
  s.mean_length = s.mean_image_tokens + 150;
  s.mean_length_sq = 1.6 * s.mean_length * s.mean_length;
  return s;
}

void ExpectConsistent(const scheduler::v1::Plan& p, const ClusterSpec& c, const ModelConfig& m) {
  // Colocated encoder ranks run on the LLM's first-stage GPUs.
  EXPECT_LE((p.colocated() ? 0 : p.encoder().gpus()) + p.llm().gpus(), c.gpus);
  if (p.colocated()) {
    EXPECT_EQ(p.encoder().gpus(), p.llm().tp() * p.llm().dp());
  }
  for (const auto* mod : {&p.encoder(), &p.llm()}) {
    EXPECT_EQ(mod->gpus(), mod->tp() * mod->pp() * mod->dp());
    EXPECT_LE(mod->tp(), c.gpus_per_node);
    EXPECT_GE(mod->dp(), 1);
    EXPECT_LE(mod->memory_bytes(), 0.9 * c.memory_bytes);
  }
  EXPECT_EQ(m.llm.layers % p.llm().pp(), 0);
  EXPECT_EQ(m.vit.layers % p.encoder().pp(), 0);
  EXPECT_GE(p.microbatches(), p.llm().pp());
  EXPECT_LE(p.llm().dp() * p.microbatches(), p.global_batch());
  EXPECT_GT(p.predicted_mfu(), 0);
  EXPECT_LT(p.predicted_mfu(), c.max_efficiency);
  EXPECT_GT(p.candidates(), 0);
}

TEST(PlanTest, LargeClusterPlanIsConsistent) {
  ClusterSpec c;
  c.gpus = 1296;
  const ModelConfig m = Config("vit300m-llm7b");
  absl::StatusOr<scheduler::v1::Plan> p = SearchPlan(c, m, OneVisionLike(5, 4096), {});
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectConsistent(*p, c, m);
  // 7B with AdamW state does not fit one 80 GiB GPU: the LLM is split.
  EXPECT_GE(p->llm().tp() * p->llm().pp(), 2);
}

// A frozen LLM holds its weights alone (no gradients or moments) and
// allreduces no gradients: a 7B LLM frozen fits unsplit where training it
// does not, and the frozen stage-1 plan is faster.
TEST(PlanTest, FrozenModulesNeedLessMemoryAndTime) {
  ClusterSpec c;
  c.gpus = 1296;
  const ModelConfig m = Config("vit300m-llm7b");
  PlanLimits frozen, apart;  // the LLM's memory alone on its GPUs
  apart.colocate = frozen.colocate = false;
  frozen.frozen = *ParseFrozen("vision,llm");
  absl::StatusOr<scheduler::v1::Plan> full = SearchPlan(c, m, OneVisionLike(5, 4096), apart);
  absl::StatusOr<scheduler::v1::Plan> stage1 = SearchPlan(c, m, OneVisionLike(5, 4096), frozen);
  ASSERT_TRUE(full.ok() && stage1.ok()) << full.status() << stage1.status();
  ExpectConsistent(*stage1, c, m);
  EXPECT_LT(stage1->llm().memory_bytes(), full->llm().memory_bytes());
  EXPECT_LT(stage1->predicted_iteration_seconds(), full->predicted_iteration_seconds());
}

// The plan carries each stage's share of a microbatch, as the workers split
// the layers: the LLM's last stage holds the head, so it holds fewer layers.
TEST(PlanTest, StageSharesFollowTheLayerSplit) {
  ClusterSpec c;
  c.gpus = 1296;
  const ModelConfig m = Config("vit300m-llm7b");
  absl::StatusOr<scheduler::v1::Plan> p = SearchPlan(c, m, OneVisionLike(5, 4096), {});
  ASSERT_TRUE(p.ok()) << p.status();
  for (const auto& [share, pp] :
       {std::make_pair(p->costs().llm_stage_share(), p->llm().pp()),
        std::make_pair(p->costs().encoder_stage_share(), p->encoder().pp())}) {
    ASSERT_EQ(share.size(), pp);
    double sum = 0;
    for (double x : share) sum += x;
    EXPECT_NEAR(sum, 1, 1e-12);
  }
  const StageSplit split = LlmStages(m, 4);
  EXPECT_EQ(split.bounds.front(), 0);
  EXPECT_EQ(split.bounds.back(), m.llm.layers);
  EXPECT_LE(split.bounds[4] - split.bounds[3], split.bounds[1] - split.bounds[0]);
  double largest = 0;
  for (double x : split.share) largest = std::max(largest, x);
  EXPECT_LT(largest, 0.3);  // balanced: 4 stages of about a quarter each
}

// Stage shares move toward the measured stage times; malformed reports are
// ignored.
TEST(CostModelTest, StageSharesRefitFromStageTimes) {
  scheduler::v1::CostCoefficients prior;
  prior.add_llm_stage_share(0.5);
  prior.add_llm_stage_share(0.5);
  CostModel costs(prior);
  EXPECT_FALSE(costs.ObserveStages(false, {1, 2, 3}));  // 3 stages, 2 held
  EXPECT_FALSE(costs.ObserveStages(false, {1, -1}));
  EXPECT_FALSE(costs.ObserveStages(false, {0, 0}));
  EXPECT_FALSE(costs.ObserveStages(false, {NAN, 1}));
  EXPECT_FALSE(costs.ObserveStages(true, {1}));  // one stage: nothing to split
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(costs.ObserveStages(false, {1, 3}));
  EXPECT_NEAR(costs.coefficients().llm_stage_share(0), 0.25, 1e-6);
  EXPECT_NEAR(costs.coefficients().llm_stage_share(1), 0.75, 1e-6);
  ASSERT_TRUE(costs.ObserveStages(true, {2, 2, 4}));  // none held: starts even
  EXPECT_EQ(costs.coefficients().encoder_stage_share_size(), 3);
}

// More image tiles per sample: more GPUs go to the encoder.
TEST(PlanTest, HeavierImagesGetMoreEncoderGpus) {
  ClusterSpec c;
  c.gpus = 64;
  const ModelConfig m = Config("vit300m-llm1b");
  PlanLimits apart;  // the encoder on GPUs of its own
  apart.colocate = false;
  auto light = SearchPlan(c, m, OneVisionLike(1, 512), apart);
  auto heavy = SearchPlan(c, m, OneVisionLike(12, 512), apart);
  ASSERT_TRUE(light.ok() && heavy.ok());
  ExpectConsistent(*light, c, m);
  ExpectConsistent(*heavy, c, m);
  EXPECT_GT(heavy->encoder().gpus(), light->encoder().gpus());
}

// A model with a generator: it gets GPUs of its own after the LLM's last
// stage (pp 1), more of them for more output images; the three modules fit
// the cluster, each in memory; the plan prices its pictures; the
// monolithic layout runs it inside the LLM's last stage, slower for the
// pictures' work; a model without one plans none.
TEST(PlanTest, TheGeneratorGetsGpusOfItsOwn) {
  ClusterSpec c;
  c.gpus = 128;
  const ModelConfig m = Config("vit300m-llm7b-gen");
  PlanLimits apart;
  apart.colocate = false;
  BatchStats few = OneVisionLike(3, 512), many = few;
  few.mean_output_images = 0.1;
  many.mean_output_images = 0.8;
  auto a = SearchPlan(c, m, few, apart);
  auto b = SearchPlan(c, m, many, apart);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  for (const scheduler::v1::Plan* p : {&*a, &*b}) {
    ExpectConsistent(*p, c, m);
    const auto& g = p->generator();
    EXPECT_GE(g.dp(), 1);
    EXPECT_EQ(g.pp(), 1);
    EXPECT_EQ(g.gpus(), g.tp() * g.dp());
    EXPECT_EQ(m.generator.denoiser.heads % g.tp(), 0);
    EXPECT_LE(p->encoder().gpus() + p->llm().gpus() + g.gpus(), c.gpus);
    EXPECT_GT(g.memory_bytes(), 0);
    EXPECT_LE(g.memory_bytes(), 0.9 * c.memory_bytes);
    EXPECT_GT(p->costs().generator_per_image(), 0);
  }
  EXPECT_GT(b->generator().gpus(), a->generator().gpus());
  EXPECT_GT(b->predicted_iteration_seconds(), a->predicted_iteration_seconds());
  // Monolithic: inside the LLM's last stage, at its TP and DP.
  auto mono = SearchMonolithicPlan(c, m, many, {}, false);
  BatchStats none = many;
  none.mean_output_images = 0;
  auto mono_none = SearchMonolithicPlan(c, m, none, {}, false);
  ASSERT_TRUE(mono.ok() && mono_none.ok());
  EXPECT_EQ(mono->generator().gpus(), 0);
  EXPECT_EQ(mono->generator().tp(), mono->llm().tp());
  EXPECT_EQ(mono->generator().dp(), mono->llm().dp());
  EXPECT_GT(mono->predicted_iteration_seconds(), mono_none->predicted_iteration_seconds());
  // Without a generator: none planned.
  auto plain = SearchPlan(c, Config("vit300m-llm7b"), many, apart);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->has_generator());
}

// Colocated layouts (the encoder's ranks on the LLM's first-stage GPUs)
// are searched beside disaggregated ones. A 7B LLM runs at TP 8 without a
// pipeline: its first stage is every GPU it has, and an encoder of GPUs of
// its own would leave them idle between its bins; colocated, the encoder
// takes none of the cluster, and the search prefers it.
TEST(PlanTest, ColocatedPlansRunTheEncoderOnTheFirstStagesGpus) {
  ClusterSpec c;
  c.gpus = 1172;
  const ModelConfig m = Config("vit300m-llm7b");
  PlanLimits limits;
  limits.recompute = Recompute::kSelective;
  auto plans = SearchPlans(c, m, OneVisionLike(9, 4096), limits, 20);
  ASSERT_TRUE(plans.ok()) << plans.status();
  for (const scheduler::v1::Plan& p : *plans) {
    ExpectConsistent(p, c, m);
    EXPECT_TRUE(!p.colocated() || p.encoder().tp() % p.llm().tp() == 0);
  }
  limits.colocate = false;
  auto apart = SearchPlan(c, m, OneVisionLike(9, 4096), limits);
  ASSERT_TRUE(apart.ok()) << apart.status();
  EXPECT_FALSE(apart->colocated());
  const scheduler::v1::Plan& best = plans->front();
  EXPECT_TRUE(best.colocated());
  EXPECT_EQ(best.llm().pp(), 1);
  EXPECT_LT(best.predicted_iteration_seconds(), apart->predicted_iteration_seconds());
  // The simulator runs it (encoder rank k beside LLM rank k).
  EXPECT_NE(LayoutText(best).find("colocate: true"), std::string::npos);
}

// The search may choose each module's recompute: never slower than any one
// recompute for both, and the plan says which it chose.
TEST(PlanTest, SearchedRecomputeIsNoSlowerThanAFixedOne) {
  ClusterSpec c;
  c.gpus = 512;
  const ModelConfig m = Config("vit300m-llm7b");
  PlanLimits limits;
  limits.search_recompute = true;
  const BatchStats stats = OneVisionLike(9, 2048);
  auto chosen = SearchPlan(c, m, stats, limits);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  ExpectConsistent(*chosen, c, m);
  std::set<std::string> names;
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    names.insert(RecomputeName(r));
    PlanLimits fixed;
    fixed.recompute = r;
    auto plan = SearchPlan(c, m, stats, fixed);
    if (!plan.ok()) {
      EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
      continue;
    }
    EXPECT_EQ(plan->llm_recompute(), RecomputeName(r));
    EXPECT_EQ(plan->encoder_recompute(), RecomputeName(r));
    EXPECT_LE(chosen->predicted_iteration_seconds(), plan->predicted_iteration_seconds())
        << RecomputeName(r);
  }
  EXPECT_EQ(names.count(chosen->llm_recompute()), 1u);
  EXPECT_EQ(names.count(chosen->encoder_recompute()), 1u);
}

// Heterogeneous clusters: each module on one of the kinds. The plan's
// modules name their kinds,
// use no more GPUs than those kinds have, fit their memory, and the price
// is theirs. Cheapest per sample under a time bound respects the bound and
// costs no more per sample than the fastest plan.
TEST(PlanTest, HeterogeneousPlansPlaceEachModuleOnAKind) {
  std::vector<GpuKind> kinds(3);
  kinds[0].name = "big";
  kinds[0].count = 16;
  kinds[0].price_per_hour = 3;
  kinds[1].name = "slow";
  kinds[1].count = 32;
  kinds[1].gpu.peak_flops = 312e12;
  kinds[1].price_per_hour = 1;
  kinds[2].name = "small";
  kinds[2].count = 64;
  kinds[2].gpu.memory_bytes = 24.0 * (1 << 30);
  kinds[2].price_per_hour = 0.25;
  const ModelConfig m = Config("vit300m-llm1b");
  const BatchStats stats = OneVisionLike(9, 256);
  PlanLimits limits;
  limits.recompute = Recompute::kSelective;
  auto fastest = SearchHeterogeneousPlans(kinds, m, stats, limits, {}, 4);
  ASSERT_TRUE(fastest.ok()) << fastest.status();
  for (const scheduler::v1::Plan& p : *fastest) {
    const GpuKind* l = nullptr;
    const GpuKind* e = nullptr;
    for (const GpuKind& k : kinds) {
      if (k.name == p.llm().gpu_kind()) l = &k;
      if (k.name == p.encoder().gpu_kind()) e = &k;
    }
    ASSERT_TRUE(l != nullptr && e != nullptr) << p.DebugString();
    const bool one = l == e;
    EXPECT_LE(p.llm().gpus() + (one && !p.colocated() ? p.encoder().gpus() : 0), l->count);
    if (!one) {
      EXPECT_LE(p.encoder().gpus(), e->count);
      EXPECT_FALSE(p.colocated());
    }
    EXPECT_LE(p.llm().memory_bytes(), 0.9 * l->gpu.memory_bytes);
    EXPECT_LE(p.encoder().memory_bytes(), 0.9 * e->gpu.memory_bytes);
    EXPECT_DOUBLE_EQ(p.cost_per_hour(),
                     p.llm().gpus() * l->price_per_hour +
                         (p.colocated() ? 0 : p.encoder().gpus() * e->price_per_hour));
  }
  HeterogeneousOptions cost;
  cost.minimise_cost = true;
  cost.max_iteration_seconds = 1.5 * fastest->front().predicted_iteration_seconds();
  auto cheapest = SearchHeterogeneousPlan(kinds, m, stats, limits, cost);
  ASSERT_TRUE(cheapest.ok()) << cheapest.status();
  EXPECT_LE(cheapest->predicted_iteration_seconds(), cost.max_iteration_seconds);
  auto per_sample = [](const scheduler::v1::Plan& p) {
    return p.cost_per_hour() * p.predicted_iteration_seconds();
  };
  EXPECT_LE(per_sample(*cheapest), per_sample(fastest->front()) * (1 + 1e-12));
  cost.max_iteration_seconds = 1e-9;  // nothing is that fast
  EXPECT_EQ(SearchHeterogeneousPlan(kinds, m, stats, limits, cost).status().code(),
            absl::StatusCode::kResourceExhausted);
  kinds[2].name = "big";
  EXPECT_EQ(SearchHeterogeneousPlan(kinds, m, stats, limits, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SearchHeterogeneousPlan({}, m, stats, limits, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The monolithic layout: one grid for both modules, the encoder's state on
// the first stage; balancing that stage moves LLM layers off it and is no
// slower than the LLM's own split.
TEST(PlanTest, MonolithicLayoutIsOneGrid) {
  ClusterSpec c;
  c.gpus = 1172;
  const ModelConfig m = Config("vit300m-llm7b");
  const BatchStats heavy = OneVisionLike(12, 4096);
  auto even = SearchMonolithicPlan(c, m, heavy, {}, false);
  auto balanced = SearchMonolithicPlan(c, m, heavy, {}, true);
  ASSERT_TRUE(even.ok()) << even.status();
  ASSERT_TRUE(balanced.ok()) << balanced.status();
  for (const scheduler::v1::Plan* p : {&*even, &*balanced}) {
    EXPECT_TRUE(p->encoder_in_first_llm_stage());
    EXPECT_EQ(p->encoder().tp(), p->llm().tp());
    EXPECT_EQ(p->encoder().dp(), p->llm().dp());
    EXPECT_EQ(p->encoder().pp(), 1);
    EXPECT_EQ(p->encoder().gpus(), 0);
    EXPECT_EQ(p->llm().gpus(), p->llm().tp() * p->llm().pp() * p->llm().dp());
    EXPECT_LE(p->llm().gpus(), c.gpus);
    EXPECT_LE(p->llm().memory_bytes(), 0.9 * c.memory_bytes);
    EXPECT_EQ(p->costs().transfer_per_image_token(), 0);  // embeddings stay on the GPU
    ASSERT_EQ(p->costs().llm_stage_share_size(), p->llm().pp());
    double sum = 0;
    for (double x : p->costs().llm_stage_share()) sum += x;
    EXPECT_NEAR(sum, 1, 1e-12);
    EXPECT_GT(p->predicted_mfu(), 0);
  }
  EXPECT_LE(balanced->predicted_iteration_seconds(), even->predicted_iteration_seconds());
  if (balanced->llm().pp() > 1) {
    const auto& share = balanced->costs().llm_stage_share();
    EXPECT_LT(share[0], share[1]);  // the encoder's stage holds fewer layers
  }
  c.memory_bytes = 1 << 30;
  EXPECT_EQ(SearchMonolithicPlan(c, m, heavy, {}, true).status().code(),
            absl::StatusCode::kResourceExhausted);
  c.gpus = 1;
  EXPECT_EQ(SearchMonolithicPlan(c, m, heavy, {}, true).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PlanTest, RejectsWhatCannotBePlanned) {
  ClusterSpec c;
  c.gpus = 1;
  const ModelConfig m = Config("vit300m-llm1b");
  EXPECT_EQ(SearchPlan(c, m, OneVisionLike(3, 64), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  c.gpus = 16;
  EXPECT_EQ(SearchPlan(c, m, OneVisionLike(3, 0), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  c.memory_bytes = 1 << 30;  // 1 GiB: not even the ViT's optimizer state
  EXPECT_EQ(SearchPlan(c, m, OneVisionLike(3, 64), {}).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// The search's candidates: distinct layouts, best predicted first, the
// first SearchPlan's own.
TEST(PlanTest, SearchPlansGivesTheBestDistinctLayoutsInOrder) {
  ClusterSpec c;
  c.gpus = 64;
  const ModelConfig m = Config("vit300m-llm7b");
  absl::StatusOr<std::vector<scheduler::v1::Plan>> plans =
      SearchPlans(c, m, OneVisionLike(3, 512), {}, 6);
  absl::StatusOr<scheduler::v1::Plan> one = SearchPlan(c, m, OneVisionLike(3, 512), {});
  ASSERT_TRUE(plans.ok() && one.ok()) << plans.status() << one.status();
  ASSERT_EQ(plans->size(), 6u);
  EXPECT_EQ(LayoutText(plans->front()), LayoutText(*one));
  EXPECT_EQ(plans->front().predicted_iteration_seconds(), one->predicted_iteration_seconds());
  std::set<std::string> degrees;
  for (size_t i = 0; i < plans->size(); ++i) {
    const scheduler::v1::Plan& p = (*plans)[i];
    ExpectConsistent(p, c, m);
    if (i > 0) {
      EXPECT_LE((*plans)[i - 1].predicted_iteration_seconds(), p.predicted_iteration_seconds());
    }
    const std::string layout = LayoutText(p);
    degrees.insert(layout.substr(0, layout.find(" microbatches")));
  }
  EXPECT_EQ(degrees.size(), plans->size());  // one candidate per layout
  EXPECT_EQ(SearchPlans(c, m, OneVisionLike(3, 512), {}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Samples of the shapes a OneVision-like scan has: most short, a few long
// with many tiles (the tail a mean hides).
std::vector<SampleShape> SkewedShapes(int n) {
  std::vector<SampleShape> shapes;
  for (int i = 0; i < n; ++i) {
    SampleShape s;
    s.tiles = i % 10 == 0 ? 10 : 1 + i % 3;
    s.image_tokens = s.tiles * 144;
    s.text_tokens = i % 7 == 0 ? 1800 : 120 + 13 * (i % 11);
    shapes.push_back(s);
  }
  return shapes;
}

TEST(MacroBatchTest, DrawsAreSeededAndInRange) {
  const auto a = DrawGlobalBatches(50, 64, 4, 7), b = DrawGlobalBatches(50, 64, 4, 7);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, DrawGlobalBatches(50, 64, 4, 8));
  ASSERT_EQ(a.size(), 4u);
  EXPECT_NE(a[0], a[1]);  // each batch its own draw
  for (const auto& batch : a) {
    ASSERT_EQ(batch.size(), 64u);  // more than the scan holds: with replacement
    for (int i : batch) EXPECT_TRUE(i >= 0 && i < 50) << i;
  }
}

// Identical samples: every drawn batch is the same, so is every iteration;
// the distribution is one value, the simulation of one batch.
TEST(MacroBatchTest, IdenticalSamplesGiveOneIterationTime) {
  ClusterSpec c;
  c.gpus = 16;
  const ModelConfig m = Config("vit300m-llm1b");
  absl::StatusOr<scheduler::v1::Plan> plan = SearchPlan(c, m, OneVisionLike(2, 64), {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  SampleShape s;
  s.tiles = 2;
  s.image_tokens = 288;
  s.text_tokens = 150;
  MacroBatchOptions o;
  o.batches = 5;
  absl::StatusOr<scheduler::v1::IterationDistribution> d =
      SimulateMacroBatches(*plan, std::vector<SampleShape>(7, s), o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->batches(), 5);
  EXPECT_EQ(d->algorithm(), "loom");
  EXPECT_GT(d->p50(), 0);
  EXPECT_EQ(d->p50(), d->max());
  EXPECT_DOUBLE_EQ(d->mean(), d->max());
  // The same as assigning and simulating one such batch directly.
  const std::vector<SampleLoad> loads =
      CostModel(plan->costs())
          .Loads(std::vector<SampleShape>(64, s), plan->costs().transfer_per_image_token());
  std::vector<std::string> keys;
  for (int i = 0; i < 64; ++i) keys.push_back(absl::StrCat("k", i));
  absl::StatusOr<scheduler::v1::Assignment> a = AssignForPlan(*plan, keys, loads, "loom", 10);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_DOUBLE_EQ(d->max(), a->summary().simulated_iteration_seconds());
}

// A skewed scan: batches differ, so do iterations (p50 <= p90 <= max, not
// all equal); the chosen plan is the candidate of least mean, its
// distribution recorded; bad input is named.
TEST(MacroBatchTest, TheChosenPlanHasTheLeastMeanOverTheSameBatches) {
  ClusterSpec c;
  c.gpus = 64;
  const ModelConfig m = Config("vit300m-llm7b");
  const std::vector<SampleShape> shapes = SkewedShapes(300);
  absl::StatusOr<std::vector<scheduler::v1::Plan>> candidates =
      SearchPlans(c, m, StatsOf(shapes, 512), {}, 5);
  ASSERT_TRUE(candidates.ok()) << candidates.status();
  MacroBatchOptions o;
  o.batches = 12;
  std::vector<scheduler::v1::IterationDistribution> each;
  absl::StatusOr<scheduler::v1::Plan> chosen =
      ChooseOverMacroBatches(*candidates, shapes, o, &each);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  ASSERT_EQ(each.size(), candidates->size());
  double least = INFINITY;
  for (const auto& d : each) {
    EXPECT_LE(d.p50(), d.p90());
    EXPECT_LE(d.p90(), d.max());
    EXPECT_LT(d.p50(), d.max());  // the batches differ
    least = std::min(least, d.mean());
  }
  EXPECT_EQ(chosen->simulated().mean(), least);
  EXPECT_EQ(chosen->simulated().batches(), 12);
  // The chosen layout is the candidate whose distribution that was.
  int matches = 0;
  for (size_t i = 0; i < each.size(); ++i) {
    if (LayoutText((*candidates)[i]) == LayoutText(*chosen)) {
      ++matches;
      EXPECT_EQ(each[i].mean(), least);
    }
  }
  EXPECT_EQ(matches, 1);
  // Seeded: the same batches give the same distribution.
  absl::StatusOr<scheduler::v1::IterationDistribution> again =
      SimulateMacroBatches(*chosen, shapes, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->mean(), least);

  EXPECT_EQ(ChooseOverMacroBatches({}, shapes, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SimulateMacroBatches(*chosen, {}, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.batches = 0;
  EXPECT_EQ(SimulateMacroBatches(*chosen, shapes, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::sched
