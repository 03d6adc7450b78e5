#include "runtime/hf/hf_llm.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/base/test_paths.h"
#include "runtime/hf/safetensors.h"

namespace loom::hf {
namespace {

using nlohmann::json;

json Llama() {
  return json::parse(R"({
    "model_type": "llama", "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 24,
    "hidden_act": "silu", "rms_norm_eps": 1e-05, "max_position_embeddings": 64,
    "rope_theta": 500000.0, "tie_word_embeddings": false,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 32}})");
}

absl::StatusOr<LlmConfig> Parse(const json& j) { return ParseLlmConfig(j.dump(), "config.json"); }

// The error of parsing `j`, which must fail and name `field`.
void ExpectRefused(const json& j, const std::string& field) {
  absl::StatusOr<LlmConfig> c = Parse(j);
  ASSERT_FALSE(c.ok()) << j.dump();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(field), std::string::npos) << c.status();
}

TEST(HfLlmConfigTest, LlamaFieldsMapOneToOne) {
  absl::StatusOr<LlmConfig> c = Parse(Llama());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab, 40);
  EXPECT_EQ(c->dim, 16);
  EXPECT_EQ(c->layers, 2);
  EXPECT_EQ(c->heads, 4);
  EXPECT_EQ(c->kv(), 2);
  EXPECT_EQ(c->hd(), 4);
  EXPECT_EQ(c->ffn_hidden, 24);
  EXPECT_EQ(c->max_seq, 64);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->tie_embeddings);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 32);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 8.0f);
}

TEST(HfLlmConfigTest, BothRopeSpellingsGiveTheSameModel) {
  json newer = Llama();
  newer.erase("rope_theta");
  newer.erase("rope_scaling");
  newer["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                              {"factor", 8.0},           {"low_freq_factor", 1.0},
                              {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 32}};
  absl::StatusOr<LlmConfig> a = Parse(Llama()), b = Parse(newer);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status();
  EXPECT_EQ(RopeInvFreq(*a), RopeInvFreq(*b));
  // Both present and agreeing is fine; disagreeing is an error.
  json both = Llama();
  both["rope_parameters"] = newer["rope_parameters"];
  EXPECT_TRUE(Parse(both).ok());
  both["rope_parameters"]["factor"] = 4.0;
  ExpectRefused(both, "disagrees");
  // The older "type" key of rope_scaling.
  json old = Llama();
  old["rope_scaling"] = {{"type", "default"}};
  absl::StatusOr<LlmConfig> d = Parse(old);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->rope_scaling.type, RopeScaling::Type::kNone);
}

TEST(HfLlmConfigTest, QwenHasBiasesAndHeadDimDefaultsToHiddenOverHeads) {
  json q = Llama();
  q["model_type"] = "qwen2";
  q["tie_word_embeddings"] = true;
  q["rope_scaling"] = nullptr;
  q["use_sliding_window"] = false;
  q["head_dim"] = 8;  // explicit: not 16 / 4
  absl::StatusOr<LlmConfig> c = Parse(q);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_TRUE(c->tie_embeddings);
  EXPECT_EQ(c->hd(), 8);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  q["use_sliding_window"] = true;
  ExpectRefused(q, "use_sliding_window");
}

TEST(HfLlmConfigTest, NoSilentDefaultsAndNothingLoomWouldComputeDifferently) {
  for (const char* field : {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                            "num_key_value_heads", "intermediate_size", "rms_norm_eps",
                            "max_position_embeddings", "hidden_act"}) {
    json j = Llama();
    j.erase(field);
    ExpectRefused(j, field);
  }
  json j = Llama();
  j.erase("rope_theta");
  ExpectRefused(j, "rope_theta");
  j = Llama();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  ExpectRefused(j, "yarn");
  j = Llama();
  j["rope_scaling"].erase("low_freq_factor");
  ExpectRefused(j, "low_freq_factor");
  j = Llama();
  j["hidden_act"] = "gelu";
  ExpectRefused(j, "hidden_act");
  j = Llama();
  j["attention_bias"] = true;
  ExpectRefused(j, "attention_bias");
  j = Llama();
  j["mlp_bias"] = true;
  ExpectRefused(j, "mlp_bias");
  j = Llama();
  j["model_type"] = "qwen3";
  ExpectRefused(j, "q_norm");
  j = Llama();
  j["num_key_value_heads"] = 3;
  ExpectRefused(j, "num_key_value_heads");
  j = Llama();
  j["vocab_size"] = "40";
  ExpectRefused(j, "vocab_size");
  EXPECT_FALSE(ParseLlmConfig("{not json", "c.json").ok());
}

// A small checkpoint with recognisable values: tensor k holds k + i / 1000.
class HfLlmWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<LlmConfig> c = Parse(Llama());
    ASSERT_TRUE(c.ok());
    config_ = *c;
    config_.qkv_bias = true;  // exercise the bias stacking too
    Llm whole(config_);
    int k = 0;
    for (const ParamSpec& s : whole.params().specs()) {
      for (int64_t i = 0; i < NumElements(s.master_shape); ++i) {
        whole.params().param(k)[i] = static_cast<float>(k) + static_cast<float>(i) / 1000.0f;
      }
      ++k;
    }
    whole_ = whole.params().data();
    tensors_ = LlmToHf(config_, whole.params(), CausalLmKeys(), /*grads=*/false);
    std::vector<TensorView> views;
    for (const NamedTensor& t : tensors_) {
      views.push_back({t.name, DType::kF32, t.shape, t.data.data(), t.data.size() * 4});
    }
    dir_ = loom::testing::TempPath("hf_llm");
    ASSERT_TRUE(WriteSafetensorsModel(dir_, views, /*max_shard_bytes=*/4000).ok());
  }

  LlmConfig config_;
  std::vector<float> whole_;
  std::vector<NamedTensor> tensors_;
  std::string dir_;
};

TEST_F(HfLlmWeightsTest, NamesAndShapesAreTransformers) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const NamedTensor& t : tensors_) shapes[t.name] = t.shape;
  EXPECT_EQ(shapes["model.embed_tokens.weight"], (std::vector<int64_t>{40, 16}));
  EXPECT_EQ(shapes["model.layers.1.self_attn.q_proj.weight"], (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(shapes["model.layers.1.self_attn.k_proj.weight"], (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(shapes["model.layers.0.self_attn.v_proj.bias"], (std::vector<int64_t>{8}));
  EXPECT_EQ(shapes["model.layers.0.self_attn.o_proj.weight"], (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(shapes["model.layers.0.mlp.down_proj.weight"], (std::vector<int64_t>{16, 24}));
  EXPECT_EQ(shapes["lm_head.weight"], (std::vector<int64_t>{40, 16}));
  EXPECT_EQ(tensors_.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(tensors_.back().name, "lm_head.weight");
  EXPECT_EQ(tensors_.size(), 1 + 2 * 12 + 2u);  // 12 per layer with biases
}

TEST_F(HfLlmWeightsTest, LoadsIntoTheWholeModelAndIntoEveryTpSliceAndStage) {
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> m = SafetensorsModel::Open(dir_);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(CheckLlmTensorsKnown(**m, config_, CausalLmKeys()).ok());
  Llm whole(config_);
  ASSERT_TRUE(LoadLlmWeights(**m, config_, CausalLmKeys(), &whole.params()).ok());
  EXPECT_EQ(whole.params().data(), whole_);
  // TP 2, stage 2 of 2: each slice is the master's, as SliceFromMaster cuts it.
  ParamSet master = whole.params();
  for (int rank = 0; rank < 2; ++rank) {
    ParamSet slice(TpShard{rank, 2});
    const int q_rows = config_.heads * config_.hd();
    slice.Add("layers.1.attn.qkv.weight", {config_.qkv_rows(), 16}, Init::kZeros, 0,
              Split::kQkvRows, q_rows);
    slice.Add("layers.1.attn.qkv.bias", {config_.qkv_rows()}, Init::kZeros, 0, Split::kQkvRows,
              q_rows);
    slice.Add("layers.1.attn.proj.weight", {16, q_rows}, Init::kZeros, 0, Split::kCols);
    slice.Add("lm_head.weight", {40, 16}, Init::kZeros, 0, Split::kRows);
    slice.Finalize();
    ParamSet want = slice;
    want.SliceFromMaster(master);
    ASSERT_TRUE(LoadLlmWeights(**m, config_, CausalLmKeys(), &slice).ok());
    EXPECT_EQ(slice.data(), want.data()) << "rank " << rank;
  }
}

TEST_F(HfLlmWeightsTest, AMismatchNamesTheTensor) {
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> m = SafetensorsModel::Open(dir_);
  ASSERT_TRUE(m.ok());
  LlmConfig other = config_;
  other.kv_heads = 4;  // the checkpoint has 2
  Llm llm(other);
  absl::Status s = LoadLlmWeights(**m, other, CausalLmKeys(), &llm.params());
  EXPECT_NE(s.message().find("model.layers.0.self_attn.k_proj.weight is [8, 16], the config "
                             "gives [16, 16]"),
            std::string::npos)
      << s;
  LlmConfig no_bias = config_;
  no_bias.qkv_bias = false;  // the checkpoint has biases Loom would ignore
  s = CheckLlmTensorsKnown(**m, no_bias, CausalLmKeys());
  EXPECT_NE(s.message().find("self_attn.k_proj.bias is not part of the model"), std::string::npos)
      << s;
  LlmConfig tied = config_;
  tied.tie_embeddings = true;  // lm_head stored and different from the table
  s = CheckLlmTensorsKnown(**m, tied, CausalLmKeys());
  EXPECT_NE(s.message().find("lm_head.weight differs from the embedding table"), std::string::npos)
      << s;
  LlmConfig deeper = config_;
  deeper.layers = 3;
  Llm three(deeper);
  s = LoadLlmWeights(**m, deeper, CausalLmKeys(), &three.params());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("model.layers.2.input_layernorm.weight"), std::string::npos) << s;
}

TEST(HfTokenBatchTest, PacksSequencesAndNamesBadIds) {
  absl::StatusOr<LlmBatch> b = ParseTokenBatch("1,2,3/4,5", 10);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->tokens, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(b->targets, (std::vector<int32_t>{2, 3, -1, 5, -1}));
  EXPECT_EQ(b->positions, (std::vector<int32_t>{0, 1, 2, 0, 1}));
  EXPECT_EQ(b->cu_seqlens, (std::vector<int32_t>{0, 3, 5}));
  for (const char* bad : {"1,10", "1,-1", "1,,2", "x", "1/"}) {
    absl::StatusOr<LlmBatch> e = ParseTokenBatch(bad, 10);
    EXPECT_FALSE(e.ok()) << bad;
  }
}

}  // namespace
}  // namespace loom::hf
