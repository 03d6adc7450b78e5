#include "runtime/hf/hf_llm.h"

#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "runtime/base/file.h"
#include "runtime/base/log.h"
#include "runtime/model/model.h"

namespace loom::hf {
namespace {

using nlohmann::json;

absl::Status Bad(const std::string& where, const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", field, ": ", why));
}

// Typed, checked access to one config object.
class Fields {
 public:
  Fields(const json& j, std::string where) : j_(j), where_(std::move(where)) {}

  bool Has(const std::string& key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  absl::StatusOr<int> Int(const std::string& key, int min = 1) const {
    if (!Has(key)) return Bad(where_, key, "missing (required)");
    const json& v = j_.at(key);
    if (!v.is_number_integer()) return Bad(where_, key, "must be an integer, not " + v.dump());
    const int64_t x = v.get<int64_t>();
    if (x < min || x > (int64_t{1} << 30)) {
      return Bad(where_, key, absl::StrCat(x, " is out of range (>= ", min, ")"));
    }
    return static_cast<int>(x);
  }

  absl::StatusOr<double> Number(const std::string& key) const {
    if (!Has(key)) return Bad(where_, key, "missing (required)");
    const json& v = j_.at(key);
    if (!v.is_number()) return Bad(where_, key, "must be a number, not " + v.dump());
    const double x = v.get<double>();
    if (!std::isfinite(x) || x <= 0) return Bad(where_, key, absl::StrCat(x, " must be > 0"));
    return x;
  }

  absl::StatusOr<bool> Bool(const std::string& key, bool absent) const {
    if (!Has(key)) return absent;
    const json& v = j_.at(key);
    if (!v.is_boolean()) return Bad(where_, key, "must be true or false, not " + v.dump());
    return v.get<bool>();
  }

  absl::StatusOr<std::string> String(const std::string& key) const {
    if (!Has(key)) return Bad(where_, key, "missing (required)");
    const json& v = j_.at(key);
    if (!v.is_string()) return Bad(where_, key, "must be a string, not " + v.dump());
    return v.get<std::string>();
  }

  const json& at(const std::string& key) const { return j_.at(key); }
  const std::string& where() const { return where_; }

 private:
  const json& j_;
  std::string where_;
};

#define LOOM_ASSIGN(lhs, expr)                \
  do {                                        \
    auto loom_v = (expr);                     \
    if (!loom_v.ok()) return loom_v.status(); \
    lhs = *loom_v;                            \
  } while (0)

// rope_scaling or rope_parameters (with `theta_key` holding the theta in
// the latter): the type and the llama3 fields into `c`.
absl::Status ParseRope(const Fields& r, const std::string& field, LlmConfig* c) {
  std::string type = "default";
  if (r.Has("rope_type")) {
    LOOM_ASSIGN(type, r.String("rope_type"));
  } else if (r.Has("type")) {  // the older key in rope_scaling
    LOOM_ASSIGN(type, r.String("type"));
  }
  if (type == "default") {
    c->rope_scaling = {};
    return absl::OkStatus();
  }
  if (type != "llama3") {
    return Bad(r.where(), field + ".rope_type",
               "'" + type + "' is not run by Loom (default and llama3 are)");
  }
  RopeScaling s;
  s.type = RopeScaling::Type::kLlama3;
  double x = 0;
  LOOM_ASSIGN(x, r.Number("factor"));
  s.factor = static_cast<float>(x);
  LOOM_ASSIGN(x, r.Number("low_freq_factor"));
  s.low_freq_factor = static_cast<float>(x);
  LOOM_ASSIGN(x, r.Number("high_freq_factor"));
  s.high_freq_factor = static_cast<float>(x);
  LOOM_ASSIGN(s.original_max_position_embeddings, r.Int("original_max_position_embeddings"));
  c->rope_scaling = s;
  return absl::OkStatus();
}

bool SameRope(const LlmConfig& a, const LlmConfig& b) {
  const RopeScaling &x = a.rope_scaling, &y = b.rope_scaling;
  return a.rope_theta == b.rope_theta && x.type == y.type && x.factor == y.factor &&
         x.low_freq_factor == y.low_freq_factor && x.high_freq_factor == y.high_freq_factor &&
         x.original_max_position_embeddings == y.original_max_position_embeddings;
}

absl::StatusOr<LlmConfig> ParseLlmObject(const json& j, const std::string& where) {
  if (!j.is_object()) return Bad(where, "config", "must be a JSON object");
  const Fields f(j, where);
  std::string type;
  LOOM_ASSIGN(type, f.String("model_type"));
  if (type != "llama" && type != "qwen2") {
    return Bad(where, "model_type",
               "'" + type + "': Loom runs llama and qwen2 language models" +
                   (type == "qwen3" ? " (Qwen3's q_norm/k_norm are not implemented)" : ""));
  }
  const bool qwen2 = type == "qwen2";
  LlmConfig c;
  LOOM_ASSIGN(c.vocab, f.Int("vocab_size", 2));
  LOOM_ASSIGN(c.dim, f.Int("hidden_size"));
  LOOM_ASSIGN(c.layers, f.Int("num_hidden_layers"));
  LOOM_ASSIGN(c.heads, f.Int("num_attention_heads"));
  LOOM_ASSIGN(c.kv_heads, f.Int("num_key_value_heads"));
  LOOM_ASSIGN(c.ffn_hidden, f.Int("intermediate_size"));
  LOOM_ASSIGN(c.max_seq, f.Int("max_position_embeddings"));
  double eps = 0;
  LOOM_ASSIGN(eps, f.Number("rms_norm_eps"));
  c.rms_norm_eps = static_cast<float>(eps);
  if (f.Has("head_dim")) {
    LOOM_ASSIGN(c.head_dim, f.Int("head_dim"));
  } else if (c.dim % c.heads != 0) {
    return Bad(where, "head_dim", "missing, and hidden_size does not divide by the heads");
  } else {
    c.head_dim = c.dim / c.heads;
  }
  if (c.heads % c.kv_heads != 0) {
    return Bad(where, "num_key_value_heads",
               absl::StrCat(c.kv_heads, " does not divide num_attention_heads (", c.heads, ")"));
  }
  if (c.head_dim % 2 != 0) return Bad(where, "head_dim", "must be even (RoPE)");
  LOOM_ASSIGN(c.tie_embeddings, f.Bool("tie_word_embeddings", false));
  std::string act;
  LOOM_ASSIGN(act, f.String("hidden_act"));
  if (act != "silu") return Bad(where, "hidden_act", "'" + act + "': Loom's MLP is SwiGLU (silu)");
  bool flag = false;
  if (qwen2) {
    c.qkv_bias = true;
    LOOM_ASSIGN(flag, f.Bool("use_sliding_window", false));
    if (flag) return Bad(where, "use_sliding_window", "true: Loom's attention is full causal");
  } else {
    LOOM_ASSIGN(flag, f.Bool("attention_bias", false));
    if (flag) return Bad(where, "attention_bias", "true (q/k/v/o biases) is not run by Loom");
    LOOM_ASSIGN(flag, f.Bool("mlp_bias", false));
    if (flag) return Bad(where, "mlp_bias", "true is not run by Loom");
  }

  // RoPE, in either spelling.
  const bool has_theta = f.Has("rope_theta"), has_params = f.Has("rope_parameters");
  if (!has_theta && !has_params) {
    return Bad(where, "rope_theta", "missing, and no rope_parameters either (RoPE needs a theta)");
  }
  LlmConfig old_style = c, new_style = c;
  if (has_theta) {
    double theta = 0;
    LOOM_ASSIGN(theta, f.Number("rope_theta"));
    old_style.rope_theta = static_cast<float>(theta);
    if (f.Has("rope_scaling")) {
      if (!f.at("rope_scaling").is_object()) {
        return Bad(where, "rope_scaling", "must be null or an object");
      }
      const Fields r(f.at("rope_scaling"), where);
      if (absl::Status s = ParseRope(r, "rope_scaling", &old_style); !s.ok()) return s;
    }
  }
  if (has_params) {
    if (!f.at("rope_parameters").is_object()) {
      return Bad(where, "rope_parameters", "must be an object");
    }
    const Fields r(f.at("rope_parameters"), where + " rope_parameters");
    double theta = 0;
    LOOM_ASSIGN(theta, r.Number("rope_theta"));
    new_style.rope_theta = static_cast<float>(theta);
    if (absl::Status s = ParseRope(r, "rope_parameters", &new_style); !s.ok()) return s;
  }
  if (has_theta && has_params && !SameRope(old_style, new_style)) {
    return Bad(where, "rope_parameters", "disagrees with rope_theta / rope_scaling");
  }
  c = has_params ? new_style : old_style;

  ModelConfig whole;
  whole.name = where;
  whole.llm = c;
  if (absl::Status s = ValidateModelConfig(whole); !s.ok()) {
    return Bad(where, "config", std::string(s.message()));
  }
  return c;
}

#undef LOOM_ASSIGN

// Loom's name for layer parameter `suffix`, and the HF tensors it is made of.
struct LayerMap {
  const char* loom;
  std::vector<const char*> hf;
};
const std::vector<LayerMap>& LayerMaps() {
  static const std::vector<LayerMap> maps = {
      {"attn_norm.weight", {"input_layernorm.weight"}},
      {"attn.qkv.weight",
       {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}},
      {"attn.qkv.bias",
       {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"}},
      {"attn.proj.weight", {"self_attn.o_proj.weight"}},
      {"mlp_norm.weight", {"post_attention_layernorm.weight"}},
      {"mlp.gate.weight", {"mlp.gate_proj.weight"}},
      {"mlp.up.weight", {"mlp.up_proj.weight"}},
      {"mlp.down.weight", {"mlp.down_proj.weight"}},
  };
  return maps;
}

// The Loom parameter names of the whole LLM, in transformers' order.
std::vector<std::string> LoomNames(const LlmConfig& c) {
  std::vector<std::string> names = {"wte"};
  for (int l = 0; l < c.layers; ++l) {
    for (const LayerMap& m : LayerMaps()) {
      if (std::strcmp(m.loom, "attn.qkv.bias") == 0 && !c.qkv_bias) continue;
      names.push_back(absl::StrCat("layers.", l, ".", m.loom));
    }
  }
  names.push_back("norm.weight");
  if (!c.tie_embeddings) names.push_back("lm_head.weight");
  return names;
}

}  // namespace

absl::StatusOr<LlmConfig> ParseLlmConfig(const std::string& json_text, const std::string& where) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not JSON: ", e.what()));
  }
  return ParseLlmObject(j, where);
}

absl::StatusOr<LlmConfig> ReadLlmConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseLlmConfig(*text, path);
}

absl::StatusOr<HfParts> LlmHfParts(const LlmConfig& c, const std::string& name,
                                   const LlmKeys& keys) {
  const int64_t hd = c.hd();
  if (name == "wte") return HfParts{{keys.body + "embed_tokens.weight"}, {c.vocab}};
  if (name == "norm.weight") return HfParts{{keys.body + "norm.weight"}, {c.dim}};
  if (name == "lm_head.weight") return HfParts{{keys.head + "weight"}, {c.vocab}};
  std::vector<std::string> parts = absl::StrSplit(name, absl::MaxSplits('.', 2));
  int layer = -1;
  if (parts.size() == 3 && parts[0] == "layers" && absl::SimpleAtoi(parts[1], &layer)) {
    for (const LayerMap& m : LayerMaps()) {
      if (parts[2] != m.loom) continue;
      HfParts out;
      const std::string prefix = absl::StrCat(keys.body, "layers.", layer, ".");
      for (const char* hf : m.hf) out.names.push_back(prefix + hf);
      if (out.names.size() == 3) {
        out.rows = {c.heads * hd, c.kv() * hd, c.kv() * hd};
      } else if (parts[2] == "attn.proj.weight" || parts[2] == "mlp.down.weight" ||
                 parts[2] == "attn_norm.weight" || parts[2] == "mlp_norm.weight") {
        out.rows = {c.dim};
      } else {
        out.rows = {c.ffn_hidden};
      }
      return out;
    }
  }
  return absl::InvalidArgumentError("no Hugging Face tensor for the LLM parameter " + name);
}

absl::Status LoadLlmWeights(const SafetensorsModel& model, const LlmConfig& c, const LlmKeys& keys,
                            ParamSet* params) {
  const TpShard shard = params->shard();
  std::vector<float> master;
  for (int i = 0; i < static_cast<int>(params->specs().size()); ++i) {
    const ParamSpec& spec = params->spec(i);
    absl::StatusOr<HfParts> parts = LlmHfParts(c, spec.name, keys);
    if (!parts.ok()) return parts.status();
    const int64_t cols = spec.master_shape.size() == 2 ? spec.master_shape[1] : 0;
    master.clear();
    for (size_t k = 0; k < parts->names.size(); ++k) {
      const std::string& hf = parts->names[k];
      const TensorEntry* e = model.Find(hf);
      if (e == nullptr) {
        return absl::NotFoundError(
            absl::StrCat(model.where(), ": no tensor ", hf, " (for ", spec.name, ")"));
      }
      std::vector<int64_t> want = {parts->rows[k]};
      if (cols > 0) want.push_back(cols);
      if (e->shape != want) {
        std::string got, exp;
        for (int64_t d : e->shape) absl::StrAppend(&got, got.empty() ? "" : ", ", d);
        for (int64_t d : want) absl::StrAppend(&exp, exp.empty() ? "" : ", ", d);
        return absl::InvalidArgumentError(
            absl::StrCat(model.where(), ": ", hf, " is [", got, "], the config gives [", exp, "]"));
      }
      absl::StatusOr<std::vector<float>> data = model.ReadF32(hf);
      if (!data.ok()) return data.status();
      master.insert(master.end(), data->begin(), data->end());
    }
    if (static_cast<int64_t>(master.size()) != NumElements(spec.master_shape)) {
      return absl::InternalError("LLM parameter " + spec.name + ": the parts do not fill it");
    }
    float* dst = params->param(i);
    for (const SliceRun& r : SliceRuns(spec, shard)) {
      std::memcpy(dst + r.offset, master.data() + r.master_offset, sizeof(float) * r.length);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLlmTensorsKnown(const SafetensorsModel& model, const LlmConfig& c,
                                  const LlmKeys& keys) {
  std::set<std::string> known;
  for (const std::string& n : LoomNames(c)) {
    absl::StatusOr<HfParts> parts = LlmHfParts(c, n, keys);
    if (!parts.ok()) return parts.status();
    known.insert(parts->names.begin(), parts->names.end());
  }
  const std::string head = keys.head + "weight";
  for (const std::string& name : model.names()) {
    if (!absl::StartsWith(name, keys.body) && !absl::StartsWith(name, keys.head)) continue;
    if (known.count(name) > 0 || absl::EndsWith(name, ".rotary_emb.inv_freq")) continue;
    if (name == head && c.tie_embeddings) {
      const TensorEntry* a = model.Find(name);
      const TensorEntry* b = model.Find(keys.body + "embed_tokens.weight");
      bool same = a != nullptr && b != nullptr && a->bytes() == b->bytes() &&
                  a->dtype == b->dtype && a->shape == b->shape;
      if (same) {
        std::string x(a->bytes(), '\0'), y(b->bytes(), '\0');
        if (!model.ReadBytes(name, x.data()).ok() ||
            !model.ReadBytes(keys.body + "embed_tokens.weight", y.data()).ok()) {
          same = false;
        } else {
          same = x == y;
        }
      }
      if (same) continue;
      return absl::InvalidArgumentError(
          absl::StrCat(model.where(), ": ", name,
                       " differs from the embedding table, but config.json ties them "
                       "(tie_word_embeddings)"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        model.where(), ": ", name,
        " is not part of the model config.json describes (another family, or a feature Loom "
        "does not run)"));
  }
  return absl::OkStatus();
}

std::vector<NamedTensor> LlmToHf(const LlmConfig& c, ParamSet& master, const LlmKeys& keys,
                                 bool grads) {
  std::vector<NamedTensor> out;
  for (const std::string& n : LoomNames(c)) {
    const int i = master.Find(n);
    if (i < 0) continue;  // the caller's set lacks it: checked by the caller
    const ParamSpec& spec = master.spec(i);
    const float* src = grads ? master.grad(i) : master.param(i);
    absl::StatusOr<HfParts> parts = LlmHfParts(c, n, keys);
    LOOM_CHECK(parts.ok()) << parts.status();
    const int64_t cols = spec.master_shape.size() == 2 ? spec.master_shape[1] : 1;
    int64_t row = 0;
    for (size_t k = 0; k < parts->names.size(); ++k) {
      NamedTensor t;
      t.name = parts->names[k];
      t.shape = {parts->rows[k]};
      if (spec.master_shape.size() == 2) t.shape.push_back(cols);
      t.data.assign(src + row * cols, src + (row + parts->rows[k]) * cols);
      row += parts->rows[k];
      out.push_back(std::move(t));
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Llm>> OpenHfLlm(const std::string& dir) {
  absl::StatusOr<LlmConfig> c = ReadLlmConfig(dir);
  if (!c.ok()) return c.status();
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> model = SafetensorsModel::Open(dir);
  if (!model.ok()) return model.status();
  if (absl::Status s = CheckLlmTensorsKnown(**model, *c, CausalLmKeys()); !s.ok()) return s;
  auto llm = std::make_unique<Llm>(*c);
  if (absl::Status s = LoadLlmWeights(**model, *c, CausalLmKeys(), &llm->params()); !s.ok()) {
    return s;
  }
  return llm;
}

absl::StatusOr<LlmBatch> ParseTokenBatch(const std::string& text, int vocab) {
  std::vector<Sample> samples;
  for (absl::string_view seq : absl::StrSplit(text, '/')) {
    Sample s;
    for (absl::string_view item : absl::StrSplit(seq, ',')) {
      int id = -1;
      if (!absl::SimpleAtoi(item, &id) || id < 0 || id >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("--tokens: '", item, "' is not a token id in [0, ", vocab, ")"));
      }
      s.tokens.push_back(id);
    }
    samples.push_back(std::move(s));
  }
  std::vector<const Sample*> ptrs;
  for (const Sample& s : samples) ptrs.push_back(&s);
  return PackSamples(ptrs);
}

}  // namespace loom::hf
