#include "runtime/hf/loom_export.h"

#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/base/file.h"
#include "runtime/hf/safetensors.h"

namespace loom::hf {
namespace {

using nlohmann::json;

constexpr const char* kModelType = "loom";

json VitJson(const VitConfig& v) {
  return {{"tile_size", v.tile_size},
          {"patch", v.patch},
          {"dim", v.dim},
          {"layers", v.layers},
          {"heads", v.heads},
          {"mlp_hidden", v.mlp_hidden},
          {"class_token", v.class_token},
          {"patch_bias", v.patch_bias},
          {"pre_norm", v.pre_norm},
          {"final_norm", v.final_norm},
          {"act", ActivationName(v.act)},
          {"norm_eps", v.norm_eps},
          {"prefix", v.prefix}};
}

json LlmJson(const LlmConfig& c) {
  json j = {{"vocab", c.vocab},
            {"dim", c.dim},
            {"layers", c.layers},
            {"heads", c.heads},
            {"ffn_hidden", c.ffn_hidden},
            {"rope_theta", c.rope_theta},
            {"max_seq", c.max_seq},
            {"kv_heads", c.kv_heads},
            {"head_dim", c.head_dim},
            {"rms_norm_eps", c.rms_norm_eps},
            {"qkv_bias", c.qkv_bias},
            {"tie_embeddings", c.tie_embeddings},
            {"gen_queries", c.gen_queries},
            {"rope_scaling", nullptr}};
  if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", c.rope_scaling.factor},
        {"low_freq_factor", c.rope_scaling.low_freq_factor},
        {"high_freq_factor", c.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  }
  return j;
}

// A required field of each type (Fields', with presence required for the
// booleans too: an export writes every field).
absl::StatusOr<bool> RequiredBool(const Fields& f, const std::string& key) {
  if (!f.Has(key)) return BadField(f.where(), key, "missing (required)");
  return f.Bool(key, false);
}
absl::StatusOr<float> RequiredFloat(const Fields& f, const std::string& key) {
  absl::StatusOr<double> x = f.Number(key);
  if (!x.ok()) return x.status();
  return static_cast<float>(*x);
}

// OK when `parent` (whose JSON is `j`) has the object `key`.
absl::Status CheckObject(const Fields& parent, const json& j, const std::string& key) {
  if (!parent.Has(key) || !j.at(key).is_object()) {
    return BadField(parent.where(), key, "missing or not an object");
  }
  return absl::OkStatus();
}

absl::Status ParseVit(const Fields& f, VitConfig* v) {
  LOOM_HF_ASSIGN(v->tile_size, f.Int("tile_size"));
  LOOM_HF_ASSIGN(v->patch, f.Int("patch"));
  LOOM_HF_ASSIGN(v->dim, f.Int("dim"));
  LOOM_HF_ASSIGN(v->layers, f.Int("layers", 0));
  LOOM_HF_ASSIGN(v->heads, f.Int("heads"));
  LOOM_HF_ASSIGN(v->mlp_hidden, f.Int("mlp_hidden"));
  LOOM_HF_ASSIGN(v->class_token, RequiredBool(f, "class_token"));
  LOOM_HF_ASSIGN(v->patch_bias, RequiredBool(f, "patch_bias"));
  LOOM_HF_ASSIGN(v->pre_norm, RequiredBool(f, "pre_norm"));
  LOOM_HF_ASSIGN(v->final_norm, RequiredBool(f, "final_norm"));
  std::string act;
  LOOM_HF_ASSIGN(act, f.String("act"));
  LOOM_HF_ASSIGN(v->act, ParseActivation(f.where(), "act", act));
  LOOM_HF_ASSIGN(v->norm_eps, RequiredFloat(f, "norm_eps"));
  LOOM_HF_ASSIGN(v->prefix, f.Int("prefix", 0));
  return absl::OkStatus();
}

absl::Status ParseLlm(const Fields& f, const json& j, LlmConfig* c) {
  LOOM_HF_ASSIGN(c->vocab, f.Int("vocab"));
  LOOM_HF_ASSIGN(c->dim, f.Int("dim"));
  LOOM_HF_ASSIGN(c->layers, f.Int("layers"));
  LOOM_HF_ASSIGN(c->heads, f.Int("heads"));
  LOOM_HF_ASSIGN(c->ffn_hidden, f.Int("ffn_hidden"));
  LOOM_HF_ASSIGN(c->rope_theta, RequiredFloat(f, "rope_theta"));
  LOOM_HF_ASSIGN(c->max_seq, f.Int("max_seq"));
  LOOM_HF_ASSIGN(c->kv_heads, f.Int("kv_heads", 0));
  LOOM_HF_ASSIGN(c->head_dim, f.Int("head_dim", 0));
  LOOM_HF_ASSIGN(c->rms_norm_eps, RequiredFloat(f, "rms_norm_eps"));
  LOOM_HF_ASSIGN(c->qkv_bias, RequiredBool(f, "qkv_bias"));
  LOOM_HF_ASSIGN(c->tie_embeddings, RequiredBool(f, "tie_embeddings"));
  LOOM_HF_ASSIGN(c->gen_queries, f.Int("gen_queries", 0));
  if (!f.Has("rope_scaling")) return absl::OkStatus();  // null: none
  if (absl::Status s = CheckObject(f, j, "rope_scaling"); !s.ok()) return s;
  const Fields r(j.at("rope_scaling"), f.where() + ": rope_scaling");
  std::string type;
  LOOM_HF_ASSIGN(type, r.String("rope_type"));
  if (type != "llama3") return BadField(r.where(), "rope_type", "'" + type + "' (llama3)");
  c->rope_scaling.type = RopeScaling::Type::kLlama3;
  LOOM_HF_ASSIGN(c->rope_scaling.factor, RequiredFloat(r, "factor"));
  LOOM_HF_ASSIGN(c->rope_scaling.low_freq_factor, RequiredFloat(r, "low_freq_factor"));
  LOOM_HF_ASSIGN(c->rope_scaling.high_freq_factor, RequiredFloat(r, "high_freq_factor"));
  LOOM_HF_ASSIGN(c->rope_scaling.original_max_position_embeddings,
                 r.Int("original_max_position_embeddings"));
  return absl::OkStatus();
}

}  // namespace

std::string LoomConfigJson(const ModelConfig& config, const std::string& torch_dtype) {
  json j = {{"architectures", {"LoomMultimodalModel"}},
            {"model_type", kModelType},
            {"loom_config", config.name},
            {"torch_dtype", torch_dtype},
            {"vision_config", VitJson(config.vit)},
            {"projector_config",
             {{"pixel_shuffle", config.projector.pixel_shuffle},
              {"hidden", config.projector.hidden},
              {"act", ActivationName(config.projector.act)}}},
            {"text_config", LlmJson(config.llm)}};
  if (config.has_generator()) {
    const GeneratorConfig& g = config.generator;
    j["generator_config"] = {{"denoiser", VitJson(g.denoiser)},
                             {"queries", g.queries},
                             {"cond_dim", g.cond_dim},
                             {"time_freqs", g.time_freqs},
                             {"time_scale", g.time_scale}};
  }
  return j.dump(2) + "\n";
}

absl::StatusOr<ModelConfig> ParseLoomConfigJson(const std::string& text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  const Fields top(j, "config.json");
  std::string type;
  LOOM_HF_ASSIGN(type, top.String("model_type"));
  if (type != kModelType) {
    return BadField(top.where(), "model_type", "'" + type + "' is not Loom's ('loom')");
  }
  ModelConfig c;
  LOOM_HF_ASSIGN(c.name, top.String("loom_config"));
  for (const char* key : {"vision_config", "projector_config", "text_config"}) {
    if (absl::Status s = CheckObject(top, j, key); !s.ok()) return s;
  }
  if (absl::Status s =
          ParseVit(Fields(j.at("vision_config"), "config.json: vision_config"), &c.vit);
      !s.ok()) {
    return s;
  }
  const Fields p(j.at("projector_config"), "config.json: projector_config");
  LOOM_HF_ASSIGN(c.projector.pixel_shuffle, RequiredBool(p, "pixel_shuffle"));
  LOOM_HF_ASSIGN(c.projector.hidden, p.Int("hidden"));
  std::string act;
  LOOM_HF_ASSIGN(act, p.String("act"));
  LOOM_HF_ASSIGN(c.projector.act, ParseActivation(p.where(), "act", act));
  const json& tj = j.at("text_config");
  if (absl::Status s = ParseLlm(Fields(tj, "config.json: text_config"), tj, &c.llm); !s.ok()) {
    return s;
  }
  if (c.has_generator()) {
    if (absl::Status s = CheckObject(top, j, "generator_config"); !s.ok()) return s;
    const json& gj = j.at("generator_config");
    const Fields f(gj, "config.json: generator_config");
    if (absl::Status s = CheckObject(f, gj, "denoiser"); !s.ok()) return s;
    const Fields d(gj.at("denoiser"), f.where() + ": denoiser");
    GeneratorConfig& g = c.generator;
    if (absl::Status s = ParseVit(d, &g.denoiser); !s.ok()) return s;
    LOOM_HF_ASSIGN(g.queries, f.Int("queries"));
    LOOM_HF_ASSIGN(g.cond_dim, f.Int("cond_dim"));
    LOOM_HF_ASSIGN(g.time_freqs, f.Int("time_freqs"));
    LOOM_HF_ASSIGN(g.time_scale, RequiredFloat(f, "time_scale"));
  } else if (top.Has("generator_config")) {
    return BadField(top.where(), "generator_config",
                    "present, but text_config.gen_queries is 0 (no query positions)");
  }
  if (absl::Status s = ValidateModelConfig(c); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", s.message()));
  }
  return c;
}

std::vector<NamedTensor> LoomModelTensors(MultimodalModel& model) {
  std::vector<NamedTensor> out;
  const std::vector<ParamSet*> sets = model.param_sets();
  const std::vector<std::string> names = model.param_set_names();
  for (size_t k = 0; k < sets.size(); ++k) {
    const ParamSet& set = *sets[k];
    LOOM_CHECK(set.shard().size == 1) << "an export is of one TP 1 process's model";
    for (const ParamSpec& spec : set.specs()) {
      NamedTensor t;
      t.name = names[k] + "." + spec.name;
      t.shape.assign(spec.master_shape.begin(), spec.master_shape.end());
      t.data.assign(set.data().begin() + spec.offset,
                    set.data().begin() + spec.offset + spec.numel);
      out.push_back(std::move(t));
    }
  }
  return out;
}

bool IsLoomModelDir(const std::string& dir) {
  absl::StatusOr<std::string> text = ReadFile(dir + "/config.json");
  if (!text.ok()) return false;
  const json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("model_type") && j["model_type"].is_string() &&
         j["model_type"].get<std::string>() == kModelType;
}

absl::StatusOr<std::unique_ptr<MultimodalModel>> OpenLoomModel(const std::string& dir) {
  absl::StatusOr<std::string> text = ReadFile(dir + "/config.json");
  if (!text.ok()) return text.status();
  absl::StatusOr<ModelConfig> config = ParseLoomConfigJson(*text);
  if (!config.ok()) return config.status();
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> st = SafetensorsModel::Open(dir);
  if (!st.ok()) return st.status();
  auto model = std::make_unique<MultimodalModel>(*config);
  std::set<std::string> unread;
  for (const std::string& name : (*st)->names()) unread.insert(name);
  const std::vector<ParamSet*> sets = model->param_sets();
  const std::vector<std::string> names = model->param_set_names();
  for (size_t k = 0; k < sets.size(); ++k) {
    ParamSet& set = *sets[k];
    for (const ParamSpec& spec : set.specs()) {
      const std::string name = names[k] + "." + spec.name;
      const TensorEntry* entry = (*st)->Find(name);
      if (entry == nullptr) {
        return absl::NotFoundError(absl::StrCat(dir, ": tensor ", name, " is missing"));
      }
      const std::vector<int64_t> want(spec.master_shape.begin(), spec.master_shape.end());
      if (entry->shape != want) {
        return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor ", name, " is ",
                                                       ShapeString(entry->shape), ", config.json ",
                                                       "gives ", ShapeString(want)));
      }
      absl::StatusOr<std::vector<float>> data = (*st)->ReadF32(name);
      if (!data.ok()) return data.status();
      std::memcpy(set.data().data() + spec.offset, data->data(), data->size() * sizeof(float));
      unread.erase(name);
    }
  }
  if (!unread.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor ", *unread.begin(),
                                                   " is not a parameter of the model config.json ",
                                                   "describes (", unread.size(), " such)"));
  }
  return model;
}

}  // namespace loom::hf
