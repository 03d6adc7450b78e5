#include "runtime/hf/loom_export.h"

#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/base/file.h"
#include "runtime/base/test_paths.h"
#include "runtime/hf/safetensors.h"

namespace loom::hf {
namespace {

using nlohmann::json;

// Writes `tensors` (F32) and `config` into a fresh directory `name`.
std::string WriteExport(const std::string& name, const std::vector<NamedTensor>& tensors,
                        const std::string& config) {
  const std::string dir = testing::TempPath(name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<TensorView> views;
  for (const NamedTensor& t : tensors) {
    views.push_back({t.name, DType::kF32, t.shape, t.data.data(), t.data.size() * sizeof(float)});
  }
  EXPECT_TRUE(WriteSafetensorsModel(dir, views, uint64_t{1} << 30).ok());
  EXPECT_TRUE(WriteFileAtomically(dir + "/config.json", config).ok());
  return dir;
}

std::string ParseError(const json& j) {
  absl::StatusOr<ModelConfig> c = ParseLoomConfigJson(j.dump());
  EXPECT_FALSE(c.ok()) << j.dump();
  return c.ok() ? "" : std::string(c.status().message());
}

TEST(LoomExportTest, EveryNamedConfigRoundTrips) {
  for (const std::string& name : ModelConfigNames()) {
    absl::StatusOr<ModelConfig> c = ModelConfigByName(name);
    ASSERT_TRUE(c.ok()) << name;
    const std::string text = LoomConfigJson(*c, "bfloat16");
    absl::StatusOr<ModelConfig> back = ParseLoomConfigJson(text);
    ASSERT_TRUE(back.ok()) << name << ": " << back.status();
    EXPECT_EQ(LoomConfigJson(*back, "bfloat16"), text) << name;
    EXPECT_EQ(back->name, name);
    EXPECT_EQ(back->has_generator(), c->has_generator()) << name;
    EXPECT_EQ(json::parse(text).contains("generator_config"), c->has_generator()) << name;
  }
  // Every field is carried, the Hugging Face families' too.
  ModelConfig c = *ModelConfigByName("tiny-gen");
  c.vit.class_token = true;
  c.vit.patch_bias = false;
  c.vit.pre_norm = true;
  c.vit.final_norm = false;
  c.vit.act = kernels::Activation::kQuickGelu;
  c.vit.norm_eps = 3e-6f;
  c.projector.act = kernels::Activation::kGeluErf;
  c.llm.kv_heads = 2;
  c.llm.qkv_bias = true;
  c.llm.tie_embeddings = true;
  c.llm.rms_norm_eps = 1e-5f;
  c.llm.rope_theta = 500000.0f;
  c.llm.rope_scaling = {RopeScaling::Type::kLlama3, 8.0f, 1.0f, 4.0f, 512};
  c.generator.time_scale = 999.5f;
  absl::StatusOr<ModelConfig> back = ParseLoomConfigJson(LoomConfigJson(c, "float32"));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(LoomConfigJson(*back, "float32"), LoomConfigJson(c, "float32"));
  EXPECT_TRUE(back->vit.class_token);
  EXPECT_EQ(back->vit.act, kernels::Activation::kQuickGelu);
  EXPECT_EQ(back->projector.act, kernels::Activation::kGeluErf);
  EXPECT_EQ(back->llm.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(back->llm.rope_scaling.original_max_position_embeddings, 512);
  EXPECT_EQ(back->llm.rms_norm_eps, 1e-5f);
  EXPECT_EQ(back->generator.time_scale, 999.5f);
}

TEST(LoomExportTest, BadConfigsNameTheField) {
  const json good = json::parse(LoomConfigJson(*ModelConfigByName("tiny-gen"), "float32"));
  json j = good;
  j["model_type"] = "llava";
  EXPECT_NE(ParseError(j).find("model_type: 'llava' is not Loom's"), std::string::npos);
  j = good;
  j["text_config"].erase("dim");
  EXPECT_NE(ParseError(j).find("config.json: text_config: dim: missing"), std::string::npos);
  j = good;
  j["vision_config"]["act"] = "relu";
  EXPECT_NE(ParseError(j).find("vision_config: act: 'relu' is not run by Loom"), std::string::npos);
  j = good;
  j["generator_config"]["denoiser"]["heads"] = "four";
  EXPECT_NE(ParseError(j).find("generator_config: denoiser: heads: must be an integer"),
            std::string::npos);
  j = good;
  j.erase("generator_config");
  EXPECT_NE(ParseError(j).find("generator_config: missing"), std::string::npos);
  j = json::parse(LoomConfigJson(*ModelConfigByName("tiny"), "float32"));
  j["generator_config"] = good["generator_config"];
  EXPECT_NE(ParseError(j).find("gen_queries is 0"), std::string::npos);
  j = good;
  j["vision_config"]["heads"] = 5;  // 64 is not divisible by 5
  EXPECT_NE(ParseError(j).find("vit.dim"), std::string::npos);
  EXPECT_NE(ParseError(json::array()).find("not a JSON object"), std::string::npos);
}

TEST(LoomExportTest, EveryTensorComesBackAndMisfitsAreNamed) {
  const ModelConfig config = *ModelConfigByName("tiny-gen");
  MultimodalModel model(config);
  model.Initialize(7);
  const std::vector<NamedTensor> tensors = LoomModelTensors(model);
  const std::string text = LoomConfigJson(config, "float32");
  bool denoiser = false;
  for (const NamedTensor& t : tensors) {
    denoiser |= t.name.rfind("generator_denoiser.", 0) == 0;
  }
  EXPECT_TRUE(denoiser);
  absl::StatusOr<std::unique_ptr<MultimodalModel>> back =
      OpenLoomModel(WriteExport("whole", tensors, text));
  ASSERT_TRUE(back.ok()) << back.status();
  const std::vector<ParamSet*> a = model.param_sets(), b = (*back)->param_sets();
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(a[k]->data(), b[k]->data()) << k;
  EXPECT_TRUE(IsLoomModelDir(testing::TempPath("whole")));

  std::vector<NamedTensor> missing(tensors.begin() + 1, tensors.end());
  absl::StatusOr<std::unique_ptr<MultimodalModel>> m =
      OpenLoomModel(WriteExport("missing", missing, text));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("tensor " + tensors[0].name + " is missing"),
            std::string::npos)
      << m.status();

  std::vector<NamedTensor> reshaped = tensors;
  reshaped.back().shape = {static_cast<int64_t>(reshaped.back().data.size()), 1};
  m = OpenLoomModel(WriteExport("reshaped", reshaped, text));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("config.json gives"), std::string::npos) << m.status();

  std::vector<NamedTensor> extra = tensors;
  extra.push_back({"generator.unknown", {2}, {1.0f, 2.0f}});
  m = OpenLoomModel(WriteExport("extra", extra, text));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("generator.unknown is not a parameter"), std::string::npos)
      << m.status();

  EXPECT_FALSE(IsLoomModelDir(testing::TempPath("nowhere")));
}

}  // namespace
}  // namespace loom::hf
