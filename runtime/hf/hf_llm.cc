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

// rope_scaling or rope_parameters (with `theta_key` holding the theta in
// the latter): the type and the llama3 fields into `c`.
absl::Status ParseRope(const Fields& r, const std::string& field, LlmConfig* c) {
  std::string type = "default";
  if (r.Has("rope_type")) {
    LOOM_HF_ASSIGN(type, r.String("rope_type"));
  } else if (r.Has("type")) {  // the older key in rope_scaling
    LOOM_HF_ASSIGN(type, r.String("type"));
  }
  if (type == "default") {
    c->rope_scaling = {};
    return absl::OkStatus();
  }
  if (type != "llama3") {
    return BadField(r.where(), field + ".rope_type",
                    "'" + type + "' is not run by Loom (default and llama3 are)");
  }
  RopeScaling s;
  s.type = RopeScaling::Type::kLlama3;
  double x = 0;
  LOOM_HF_ASSIGN(x, r.Number("factor"));
  s.factor = static_cast<float>(x);
  LOOM_HF_ASSIGN(x, r.Number("low_freq_factor"));
  s.low_freq_factor = static_cast<float>(x);
  LOOM_HF_ASSIGN(x, r.Number("high_freq_factor"));
  s.high_freq_factor = static_cast<float>(x);
  LOOM_HF_ASSIGN(s.original_max_position_embeddings, r.Int("original_max_position_embeddings"));
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
  if (!j.is_object()) return BadField(where, "config", "must be a JSON object");
  const Fields f(j, where);
  std::string type;
  LOOM_HF_ASSIGN(type, f.String("model_type"));
  if (type != "llama" && type != "qwen2") {
    return BadField(where, "model_type",
                    "'" + type + "': Loom runs llama and qwen2 language models" +
                        (type == "qwen3" ? " (Qwen3's q_norm/k_norm are not implemented)" : ""));
  }
  const bool qwen2 = type == "qwen2";
  LlmConfig c;
  LOOM_HF_ASSIGN(c.vocab, f.Int("vocab_size", 2));
  LOOM_HF_ASSIGN(c.dim, f.Int("hidden_size"));
  LOOM_HF_ASSIGN(c.layers, f.Int("num_hidden_layers"));
  LOOM_HF_ASSIGN(c.heads, f.Int("num_attention_heads"));
  LOOM_HF_ASSIGN(c.kv_heads, f.Int("num_key_value_heads"));
  LOOM_HF_ASSIGN(c.ffn_hidden, f.Int("intermediate_size"));
  LOOM_HF_ASSIGN(c.max_seq, f.Int("max_position_embeddings"));
  double eps = 0;
  LOOM_HF_ASSIGN(eps, f.Number("rms_norm_eps"));
  c.rms_norm_eps = static_cast<float>(eps);
  if (f.Has("head_dim")) {
    LOOM_HF_ASSIGN(c.head_dim, f.Int("head_dim"));
  } else if (c.dim % c.heads != 0) {
    return BadField(where, "head_dim", "missing, and hidden_size does not divide by the heads");
  } else {
    c.head_dim = c.dim / c.heads;
  }
  if (c.heads % c.kv_heads != 0) {
    return BadField(
        where, "num_key_value_heads",
        absl::StrCat(c.kv_heads, " does not divide num_attention_heads (", c.heads, ")"));
  }
  if (c.head_dim % 2 != 0) return BadField(where, "head_dim", "must be even (RoPE)");
  LOOM_HF_ASSIGN(c.tie_embeddings, f.Bool("tie_word_embeddings", false));
  std::string act;
  LOOM_HF_ASSIGN(act, f.String("hidden_act"));
  if (act != "silu")
    return BadField(where, "hidden_act", "'" + act + "': Loom's MLP is SwiGLU (silu)");
  bool flag = false;
  if (qwen2) {
    c.qkv_bias = true;
    LOOM_HF_ASSIGN(flag, f.Bool("use_sliding_window", false));
    if (flag) return BadField(where, "use_sliding_window", "true: Loom's attention is full causal");
  } else {
    LOOM_HF_ASSIGN(flag, f.Bool("attention_bias", false));
    if (flag) return BadField(where, "attention_bias", "true (q/k/v/o biases) is not run by Loom");
    LOOM_HF_ASSIGN(flag, f.Bool("mlp_bias", false));
    if (flag) return BadField(where, "mlp_bias", "true is not run by Loom");
  }

  // RoPE, in either spelling.
  const bool has_theta = f.Has("rope_theta"), has_params = f.Has("rope_parameters");
  if (!has_theta && !has_params) {
    return BadField(where, "rope_theta",
                    "missing, and no rope_parameters either (RoPE needs a theta)");
  }
  LlmConfig old_style = c, new_style = c;
  if (has_theta) {
    double theta = 0;
    LOOM_HF_ASSIGN(theta, f.Number("rope_theta"));
    old_style.rope_theta = static_cast<float>(theta);
    if (f.Has("rope_scaling")) {
      if (!f.at("rope_scaling").is_object()) {
        return BadField(where, "rope_scaling", "must be null or an object");
      }
      const Fields r(f.at("rope_scaling"), where);
      if (absl::Status s = ParseRope(r, "rope_scaling", &old_style); !s.ok()) return s;
    }
  }
  if (has_params) {
    if (!f.at("rope_parameters").is_object()) {
      return BadField(where, "rope_parameters", "must be an object");
    }
    const Fields r(f.at("rope_parameters"), where + " rope_parameters");
    double theta = 0;
    LOOM_HF_ASSIGN(theta, r.Number("rope_theta"));
    new_style.rope_theta = static_cast<float>(theta);
    if (absl::Status s = ParseRope(r, "rope_parameters", &new_style); !s.ok()) return s;
  }
  if (has_theta && has_params && !SameRope(old_style, new_style)) {
    return BadField(where, "rope_parameters", "disagrees with rope_theta / rope_scaling");
  }
  c = has_params ? new_style : old_style;

  ModelConfig whole;
  whole.name = where;
  whole.llm = c;
  if (absl::Status s = ValidateModelConfig(whole); !s.ok()) {
    return BadField(where, "config", std::string(s.message()));
  }
  return c;
}

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
  const int64_t hd = c.hd(), D = c.dim, F = c.ffn_hidden, A = c.heads * hd, KV = c.kv() * hd;
  if (name == "wte") return HfParts{{keys.body + "embed_tokens.weight"}, {{c.vocab, D}}};
  if (name == "norm.weight") return HfParts{{keys.body + "norm.weight"}, {{D}}};
  if (name == "lm_head.weight") return HfParts{{keys.head + "weight"}, {{c.vocab, D}}};
  std::vector<std::string> parts = absl::StrSplit(name, absl::MaxSplits('.', 2));
  int layer = -1;
  if (parts.size() == 3 && parts[0] == "layers" && absl::SimpleAtoi(parts[1], &layer)) {
    const std::string& what = parts[2];
    for (const LayerMap& m : LayerMaps()) {
      if (what != m.loom) continue;
      HfParts out;
      const std::string prefix = absl::StrCat(keys.body, "layers.", layer, ".");
      for (const char* hf : m.hf) out.names.push_back(prefix + hf);
      if (what == "attn.qkv.weight") {
        out.shapes = {{A, D}, {KV, D}, {KV, D}};
      } else if (what == "attn.qkv.bias") {
        out.shapes = {{A}, {KV}, {KV}};
      } else if (what == "attn.proj.weight") {
        out.shapes = {{D, A}};
      } else if (what == "mlp.down.weight") {
        out.shapes = {{D, F}};
      } else if (what == "attn_norm.weight" || what == "mlp_norm.weight") {
        out.shapes = {{D}};
      } else {
        out.shapes = {{F, D}};  // gate, up
      }
      return out;
    }
  }
  return absl::InvalidArgumentError("no Hugging Face tensor for the LLM parameter " + name);
}

absl::Status LoadLlmWeights(const SafetensorsModel& model, const LlmConfig& c, const LlmKeys& keys,
                            ParamSet* params) {
  return LoadParams(
      model, [&](const std::string& name) { return LlmHfParts(c, name, keys); }, params);
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
  return ParamsToHf(
      LoomNames(c), [&](const std::string& name) { return LlmHfParts(c, name, keys); }, master,
      grads);
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

absl::StatusOr<std::vector<std::vector<int32_t>>> ParseTokenSequences(const std::string& text,
                                                                      int vocab) {
  std::vector<std::vector<int32_t>> seqs;
  for (absl::string_view seq : absl::StrSplit(text, '/')) {
    std::vector<int32_t>& s = seqs.emplace_back();
    for (absl::string_view item : absl::StrSplit(seq, ',')) {
      int id = -1;
      if (!absl::SimpleAtoi(item, &id) || id < 0 || id >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("--tokens: '", item, "' is not a token id in [0, ", vocab, ")"));
      }
      s.push_back(id);
    }
  }
  return seqs;
}

absl::StatusOr<LlmBatch> ParseTokenBatch(const std::string& text, int vocab) {
  absl::StatusOr<std::vector<std::vector<int32_t>>> seqs = ParseTokenSequences(text, vocab);
  if (!seqs.ok()) return seqs.status();
  std::vector<Sample> samples(seqs->size());
  std::vector<const Sample*> ptrs;
  for (size_t i = 0; i < samples.size(); ++i) {
    samples[i].tokens = std::move((*seqs)[i]);
    ptrs.push_back(&samples[i]);
  }
  return PackSamples(ptrs);
}

}  // namespace loom::hf
