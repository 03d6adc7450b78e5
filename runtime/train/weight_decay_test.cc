#include "runtime/train/weight_decay.h"

#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/model/model.h"
#include "runtime/model/params.h"
#include "runtime/train/trainer.h"

namespace loom {
namespace {

// Every parameter of every module, one layer each, with every optional
// tensor on: Loom's own ViT and the Hugging Face ones mapped onto its names
// (CLIP: cls_token, ln_pre; SigLIP and Loom: patch_embed.bias, ln_f), the
// projector, and the LLM (Llama; Qwen2's q|k|v bias).
ModelConfig EveryTensor() {
  ModelConfig c = *ModelConfigByName("tiny");
  c.vit.layers = 1;
  c.vit.class_token = true;
  c.vit.patch_bias = true;
  c.vit.pre_norm = true;
  c.vit.final_norm = true;
  c.llm.layers = 1;
  c.llm.qkv_bias = true;
  return c;
}

using Table = std::map<std::string, bool>;  // name -> decays by default

// The rule, module by module: the weight matrices decay; norms, biases and
// embeddings do not.
const Table kVit = {
    {"patch_embed.weight", true},  // a convolution, stored as (D, 3·P·P)
    {"patch_embed.bias", false},
    {"cls_token", false},
    {"pos_embed", false},
    {"ln_pre.weight", false},
    {"ln_pre.bias", false},
    {"blocks.0.ln1.weight", false},
    {"blocks.0.ln1.bias", false},
    {"blocks.0.attn.qkv.weight", true},
    {"blocks.0.attn.qkv.bias", false},
    {"blocks.0.attn.proj.weight", true},
    {"blocks.0.attn.proj.bias", false},
    {"blocks.0.ln2.weight", false},
    {"blocks.0.ln2.bias", false},
    {"blocks.0.mlp.fc1.weight", true},
    {"blocks.0.mlp.fc1.bias", false},
    {"blocks.0.mlp.fc2.weight", true},
    {"blocks.0.mlp.fc2.bias", false},
    {"ln_f.weight", false},
    {"ln_f.bias", false},
};
const Table kProjector = {
    {"fc1.weight", true},
    {"fc1.bias", false},
    {"fc2.weight", true},
    {"fc2.bias", false},
};
const Table kLlm = {
    {"wte", false},  // the token table (and a head tied to it)
    {"layers.0.attn_norm.weight", false},
    {"layers.0.attn.qkv.weight", true},
    {"layers.0.attn.qkv.bias", false},
    {"layers.0.attn.proj.weight", true},
    {"layers.0.mlp_norm.weight", false},
    {"layers.0.mlp.gate.weight", true},
    {"layers.0.mlp.up.weight", true},
    {"layers.0.mlp.down.weight", true},
    {"norm.weight", false},
    {"lm_head.weight", true},  // untied
};

void ExpectTable(const ParamSet& set, const Table& want, const char* module) {
  Table got;
  for (const ParamSpec& s : set.specs()) {
    got[s.name] = Decays(s, WeightDecayScope::kMatrices);
    EXPECT_TRUE(Decays(s, WeightDecayScope::kAll)) << module << " " << s.name;
  }
  EXPECT_EQ(got, want) << module;  // every tensor listed, none extra
}

TEST(WeightDecayTest, EachModulesTensors) {
  MultimodalModel model(EveryTensor());
  ExpectTable(model.vit().params(), kVit, "vit");
  ExpectTable(model.projector().params(), kProjector, "projector");
  ExpectTable(model.llm().params(), kLlm, "llm");
}

// With a generator: the LLM's learned queries are an embedding table; the
// generator's matrices decay, its norms, biases and positions do not.
TEST(WeightDecayTest, AGeneratorAndItsQueries) {
  MultimodalModel model(*ModelConfigByName("tiny-gen"));
  Table llm = kLlm;
  llm["gen_queries"] = false;
  llm.erase("layers.0.attn.qkv.bias");  // tiny-gen's LLM has none
  for (const auto& [name, decays] : kLlm) {
    if (name.rfind("layers.0.", 0) == 0) llm["layers.1." + name.substr(9)] = decays;
  }
  llm.erase("layers.1.attn.qkv.bias");
  ExpectTable(model.llm().params(), llm, "llm");
  ExpectTable(model.generator()->params(),
              {{"time.fc1.weight", true},
               {"time.fc1.bias", false},
               {"time.fc2.weight", true},
               {"time.fc2.bias", false},
               {"cond.weight", true},
               {"cond.bias", false},
               {"head.weight", true},
               {"head.bias", false}},
              "generator");
  for (const ParamSpec& s : model.generator()->denoiser_params().specs()) {
    EXPECT_EQ(Decays(s, WeightDecayScope::kMatrices),
              s.master_shape.size() >= 2 && s.name != "pos_embed")
        << s.name;
  }
}

TEST(WeightDecayTest, TiedHeadIsTheTokenTable) {
  ModelConfig c = EveryTensor();
  c.llm.tie_embeddings = true;
  MultimodalModel model(c);
  Table want = kLlm;
  want.erase("lm_head.weight");
  ExpectTable(model.llm().params(), want, "llm (tied)");
}

// Every TP rank decides as the master does, whatever its slice.
TEST(WeightDecayTest, TensorParallelSlicesDecideAsTheMaster) {
  MultimodalModel model(EveryTensor());
  for (ParamSet* master : model.param_sets()) {
    for (int tp : {2, 4}) {
      for (int rank = 0; rank < tp; ++rank) {
        ParamSet slice(TpShard{rank, tp});
        for (const ParamSpec& s : master->specs()) {
          slice.Add(s.name, s.master_shape, s.init, s.std, s.split, s.q_rows);
        }
        slice.Finalize();
        for (const ParamSpec& s : slice.specs()) {
          const ParamSpec& m = master->spec(master->Find(s.name));
          EXPECT_EQ(Decays(s, WeightDecayScope::kMatrices), Decays(m, WeightDecayScope::kMatrices))
              << s.name << " on TP rank " << rank << " of " << tp;
        }
        // The same runs, each of this rank's part of the same tensors.
        std::vector<bool> got, want;
        for (const DecayRun& r : DecayRuns(slice, WeightDecayScope::kMatrices)) {
          got.push_back(r.decay);
        }
        for (const DecayRun& r : DecayRuns(*master, WeightDecayScope::kMatrices)) {
          want.push_back(r.decay);
        }
        EXPECT_EQ(got, want) << "TP rank " << rank << " of " << tp;
      }
    }
  }
}

TEST(WeightDecayTest, RunsCoverTheBufferAndMergeNeighbours) {
  ParamSet p;
  p.Add("a.weight", {2, 3}, Init::kZeros);  // 0..6 decays
  p.Add("b.weight", {3, 2}, Init::kZeros);  // 6..12 decays
  p.Add("b.bias", {3}, Init::kZeros);       // 12..15
  p.Add("wte", {4, 2}, Init::kZeros);       // 15..23
  p.Add("c.weight", {2, 2}, Init::kZeros);  // 23..27 decays
  p.Finalize();
  const std::vector<DecayRun> runs = DecayRuns(p, WeightDecayScope::kMatrices);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].offset, 0);
  EXPECT_EQ(runs[0].numel, 12);
  EXPECT_TRUE(runs[0].decay);
  EXPECT_EQ(runs[1].offset, 12);
  EXPECT_EQ(runs[1].numel, 11);
  EXPECT_FALSE(runs[1].decay);
  EXPECT_EQ(runs[2].offset, 23);
  EXPECT_EQ(runs[2].numel, 4);
  EXPECT_TRUE(runs[2].decay);
  const std::vector<DecayRun> all = DecayRuns(p, WeightDecayScope::kAll);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].numel, p.size());
  EXPECT_TRUE(all[0].decay);
}

TEST(WeightDecayTest, ScopeNames) {
  for (WeightDecayScope s : {WeightDecayScope::kMatrices, WeightDecayScope::kAll}) {
    EXPECT_EQ(*ParseWeightDecayScope(WeightDecayScopeName(s)), s);
  }
  EXPECT_FALSE(ParseWeightDecayScope("norms").ok());
}

// A set with one tensor of each kind, gradients zero: AdamW's update is then
// 0, so what changes is the decay alone.
struct OneOfEach {
  OneOfEach() {
    w = p.Add("layers.0.mlp.up.weight", {4, 3}, Init::kNormal, 0.5f);
    norm = p.Add("layers.0.attn_norm.weight", {3}, Init::kOnes);
    bias = p.Add("fc1.bias", {3}, Init::kNormal, 0.5f);
    wte = p.Add("wte", {8, 3}, Init::kNormal, 0.5f);
    p.Finalize();
    p.Initialize(7);
    p.ZeroGrad();
    before = p.data();
  }
  // One step with lr 0.1, weight decay 0.1.
  void Step(WeightDecayScope scope) {
    TrainOptions o;
    o.adam.lr = 0.1f;
    o.adam.weight_decay = 0.1f;
    o.warmup_steps = 0;
    o.clip_norm = 0;
    o.weight_decay_scope = scope;
    OptimizerStep({&p}, {Module::kLlm}, o, 1, 0.0);
  }
  // Every element of tensor `i` shrank by 1 - lr·wd, or none changed.
  void ExpectShrunk(int i, bool shrunk) {
    const ParamSpec& s = p.spec(i);
    for (int64_t k = s.offset; k < s.offset + s.numel; ++k) {
      EXPECT_FLOAT_EQ(p.data()[k], shrunk ? before[k] * (1.0f - 0.1f * 0.1f) : before[k])
          << s.name << "[" << k - s.offset << "]";
    }
  }
  ParamSet p;
  int w, norm, bias, wte;
  std::vector<float> before;
};

TEST(WeightDecayTest, OnlyMatricesShrinkByDefault) {
  OneOfEach t;
  t.Step(TrainOptions().weight_decay_scope);
  t.ExpectShrunk(t.w, true);
  t.ExpectShrunk(t.norm, false);
  t.ExpectShrunk(t.bias, false);
  t.ExpectShrunk(t.wte, false);
}

TEST(WeightDecayTest, ScopeAllShrinksEverything) {
  OneOfEach t;
  t.Step(WeightDecayScope::kAll);
  for (int i : {t.w, t.norm, t.bias, t.wte}) t.ExpectShrunk(i, true);
}

}  // namespace
}  // namespace loom
