#include "runtime/hf/hf_llava.h"

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/base/file.h"

namespace loom::hf {
namespace {

using nlohmann::json;

// Loom's ViT parameter names, in the order LlavaToHf writes them.
std::vector<std::string> VitNames(const VitConfig& v) {
  std::vector<std::string> n;
  if (v.class_token) n.push_back("cls_token");
  n.push_back("patch_embed.weight");
  if (v.patch_bias) n.push_back("patch_embed.bias");
  n.push_back("pos_embed");
  if (v.pre_norm) n.insert(n.end(), {"ln_pre.weight", "ln_pre.bias"});
  for (int l = 0; l < v.layers; ++l) {
    for (const char* s : {"ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias",
                          "attn.proj.weight", "attn.proj.bias", "ln2.weight", "ln2.bias",
                          "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias"}) {
      n.push_back(absl::StrCat("blocks.", l, ".", s));
    }
  }
  if (v.final_norm) n.insert(n.end(), {"ln_f.weight", "ln_f.bias"});
  return n;
}

const std::vector<std::string>& ProjectorNames() {
  static const std::vector<std::string> n = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
  return n;
}

// What LLaVA keeps in a tower's checkpoint but does not run.
bool UnusedVisionTensor(const VisionTower& t, const std::string& rest) {
  if (absl::StartsWith(rest, "post_layernorm.") || absl::StartsWith(rest, "head.") ||
      rest == "embeddings.position_ids") {
    return true;
  }
  std::vector<std::string> p = absl::StrSplit(rest, absl::MaxSplits('.', 3));
  int layer = -1;
  return p.size() == 4 && p[0] == "encoder" && p[1] == "layers" && absl::SimpleAtoi(p[2], &layer) &&
         layer >= t.vit.layers && layer < t.hf_layers;
}

}  // namespace

absl::StatusOr<VisionTower> ParseVisionConfig(const json& j, const std::string& where,
                                              int feature_layer, const std::string& strategy) {
  if (!j.is_object()) return BadField(where, "vision_config", "must be a JSON object");
  const Fields f(j, where);
  std::string type;
  LOOM_HF_ASSIGN(type, f.String("model_type"));
  if ((type == "clip" || type == "siglip") && f.Has("vision_config")) {  // a whole CLIP/SigLIP
    return ParseVisionConfig(f.at("vision_config"), where + " vision_config", feature_layer,
                             strategy);
  }
  VisionTower t;
  if (type == "clip_vision_model") {
    t.family = "clip";
  } else if (type == "siglip_vision_model") {
    t.family = "siglip";
  } else {
    return BadField(where, "model_type",
                    "'" + type + "': Loom runs clip_vision_model and siglip_vision_model towers");
  }
  const bool clip = t.family == "clip";
  VitConfig& v = t.vit;
  LOOM_HF_ASSIGN(v.dim, f.Int("hidden_size"));
  LOOM_HF_ASSIGN(v.mlp_hidden, f.Int("intermediate_size"));
  LOOM_HF_ASSIGN(v.heads, f.Int("num_attention_heads"));
  LOOM_HF_ASSIGN(t.hf_layers, f.Int("num_hidden_layers"));
  LOOM_HF_ASSIGN(v.tile_size, f.Int("image_size"));
  LOOM_HF_ASSIGN(v.patch, f.Int("patch_size"));
  if (f.Has("num_channels")) {
    int channels = 0;
    LOOM_HF_ASSIGN(channels, f.Int("num_channels"));
    if (channels != 3) return BadField(where, "num_channels", "Loom's tiles are RGB (3)");
  }
  std::string act = clip ? "quick_gelu" : "gelu_pytorch_tanh";  // the families' defaults
  if (f.Has("hidden_act")) LOOM_HF_ASSIGN(act, f.String("hidden_act"));
  LOOM_HF_ASSIGN(v.act, ParseActivation(where, "hidden_act", act));
  double eps = clip ? 1e-5 : 1e-6;
  if (f.Has("layer_norm_eps")) LOOM_HF_ASSIGN(eps, f.Number("layer_norm_eps"));
  v.norm_eps = static_cast<float>(eps);
  v.class_token = clip;
  v.patch_bias = !clip;
  v.pre_norm = clip;
  v.final_norm = false;
  v.layers = feature_layer < 0 ? t.hf_layers + 1 + feature_layer : feature_layer;
  if (v.layers < 1 || v.layers > t.hf_layers) {
    return BadField(where, "vision_feature_layer",
                    absl::StrCat(feature_layer, " selects no layer of the ", t.hf_layers,
                                 " (Loom takes the output of layer 1 or later)"));
  }
  const std::string want = clip ? "default" : "full";
  if (strategy != want) {
    return BadField(where, "vision_feature_select_strategy",
                    absl::StrCat("'", strategy, "' with a ", t.family, " tower: Loom runs '", want,
                                 "' (", clip ? "drop the class token" : "keep every patch", ")"));
  }
  ModelConfig whole;
  whole.vit = v;
  if (absl::Status s = ValidateModelConfig(whole); !s.ok()) {
    return BadField(where, "vision_config", std::string(s.message()));
  }
  return t;
}

LlavaKeys ClassicLlavaKeys() {
  return {LlavaLlmKeys(), "vision_tower.vision_model.", "multi_modal_projector."};
}

LlavaKeys NestedLlavaKeys() {
  return {{"model.language_model.", "lm_head."},
          "model.vision_tower.vision_model.",
          "model.multi_modal_projector."};
}

absl::StatusOr<LlavaKeys> DetectLlavaKeys(const SafetensorsModel& model) {
  for (const LlavaKeys& k : {ClassicLlavaKeys(), NestedLlavaKeys()}) {
    for (const std::string& n : model.names()) {
      if (absl::StartsWith(n, k.vision)) return k;
    }
  }
  return absl::InvalidArgumentError(
      model.where() +
      ": no vision tower (no tensor under vision_tower.vision_model. or "
      "model.vision_tower.vision_model.): not a LLaVA checkpoint");
}

absl::StatusOr<LlavaConfig> ParseLlavaConfig(const std::string& json_text,
                                             const std::string& where) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not JSON: ", e.what()));
  }
  if (!j.is_object()) return BadField(where, "config", "must be a JSON object");
  const Fields f(j, where);
  std::string type;
  LOOM_HF_ASSIGN(type, f.String("model_type"));
  if (type != "llava") {
    return BadField(where, "model_type", "'" + type + "': not a LLaVA config (\"llava\")");
  }
  for (const char* sub : {"text_config", "vision_config"}) {
    if (!f.Has(sub) || !f.at(sub).is_object()) {
      return BadField(where, sub, "missing or not an object (required)");
    }
  }
  LlavaConfig c;
  absl::StatusOr<LlmConfig> llm =
      ParseLlmConfig(f.at("text_config").dump(), where + " text_config");
  if (!llm.ok()) return llm.status();
  c.model.llm = *llm;

  int feature_layer = -2;  // transformers' LlavaConfig defaults
  std::string strategy = "default", act = "gelu";
  if (f.Has("vision_feature_layer")) {
    if (!f.at("vision_feature_layer").is_number_integer()) {
      return BadField(where, "vision_feature_layer",
                      f.at("vision_feature_layer").dump() +
                          ": Loom takes one layer's features (an integer), not several");
    }
    feature_layer = f.at("vision_feature_layer").get<int>();
  }
  if (f.Has("vision_feature_select_strategy")) {
    LOOM_HF_ASSIGN(strategy, f.String("vision_feature_select_strategy"));
  }
  absl::StatusOr<VisionTower> tower =
      ParseVisionConfig(f.at("vision_config"), where + " vision_config", feature_layer, strategy);
  if (!tower.ok()) return tower.status();
  c.tower = *tower;
  c.model.vit = tower->vit;

  if (f.Has("projector_hidden_act")) LOOM_HF_ASSIGN(act, f.String("projector_hidden_act"));
  LOOM_HF_ASSIGN(c.model.projector.act, ParseActivation(where, "projector_hidden_act", act));
  bool bias = true;
  LOOM_HF_ASSIGN(bias, f.Bool("multimodal_projector_bias", true));
  if (!bias)
    return BadField(where, "multimodal_projector_bias", "false: Loom's projector has biases");
  c.model.projector.pixel_shuffle = false;
  c.model.projector.hidden = c.model.llm.dim;

  const char* token_key = f.Has("image_token_index") ? "image_token_index" : "image_token_id";
  if (!f.Has(token_key)) {
    return BadField(where, "image_token_index",
                    "missing (required; or image_token_id): the text token that marks images");
  }
  LOOM_HF_ASSIGN(c.image_token_id, f.Int(token_key, 0));
  // Past the vocabulary is allowed (Loom never looks the id up: image slots
  // take the projector's output; pretrained.h, image_token_added).
  if (c.image_token_id < 0) {
    return BadField(where, token_key, absl::StrCat(c.image_token_id, " is not a token id"));
  }
  if (f.Has("image_seq_length")) {
    int n = 0;
    LOOM_HF_ASSIGN(n, f.Int("image_seq_length"));
    if (n != c.model.tokens_per_tile()) {
      return BadField(where, "image_seq_length",
                      absl::StrCat(n, ", but the tower gives ", c.model.tokens_per_tile(),
                                   " features per image"));
    }
  }
  c.model.name = where;
  if (absl::Status s = ValidateModelConfig(c.model); !s.ok()) {
    return BadField(where, "config", std::string(s.message()));
  }
  return c;
}

absl::StatusOr<LlavaConfig> ReadLlavaConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseLlavaConfig(*text, path);
}

bool IsLlavaDir(const std::string& dir) {
  absl::StatusOr<std::string> text = ReadFile(dir + "/config.json");
  if (!text.ok()) return false;
  const json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("model_type") && j["model_type"] == "llava";
}

absl::StatusOr<HfParts> VitHfParts(const VitConfig& v, const std::string& name,
                                   const std::string& prefix) {
  const int64_t D = v.dim, H = v.mlp_hidden, P = v.patch;
  const std::string e = prefix + "embeddings.";
  if (name == "patch_embed.weight") {
    return HfParts{{e + "patch_embedding.weight"}, {{D, 3, P, P}}};
  }
  if (name == "patch_embed.bias") return HfParts{{e + "patch_embedding.bias"}, {{D}}};
  if (name == "cls_token") return HfParts{{e + "class_embedding"}, {{D}}};
  if (name == "pos_embed") return HfParts{{e + "position_embedding.weight"}, {{v.seq(), D}}};
  if (name == "ln_pre.weight" || name == "ln_pre.bias") {
    return HfParts{{prefix + "pre_layrnorm." + name.substr(7)}, {{D}}};
  }
  if (name == "ln_f.weight" || name == "ln_f.bias") {
    return HfParts{{prefix + "post_layernorm." + name.substr(5)}, {{D}}};
  }
  std::vector<std::string> p = absl::StrSplit(name, absl::MaxSplits('.', 2));
  int layer = -1;
  if (p.size() == 3 && p[0] == "blocks" && absl::SimpleAtoi(p[1], &layer)) {
    const std::string l = absl::StrCat(prefix, "encoder.layers.", layer, ".");
    const std::string& w = p[2];
    if (w == "attn.qkv.weight" || w == "attn.qkv.bias") {
      const std::string kind = w.substr(9);  // weight | bias
      HfParts out;
      for (const char* x : {"q", "k", "v"}) {
        out.names.push_back(l + "self_attn." + x + "_proj." + kind);
        out.shapes.push_back(kind == "weight" ? std::vector<int64_t>{D, D}
                                              : std::vector<int64_t>{D});
      }
      return out;
    }
    struct One {
      const char* loom;
      const char* hf;
      std::vector<int64_t> shape;
    };
    const One ones[] = {
        {"ln1.weight", "layer_norm1.weight", {D}},
        {"ln1.bias", "layer_norm1.bias", {D}},
        {"attn.proj.weight", "self_attn.out_proj.weight", {D, D}},
        {"attn.proj.bias", "self_attn.out_proj.bias", {D}},
        {"ln2.weight", "layer_norm2.weight", {D}},
        {"ln2.bias", "layer_norm2.bias", {D}},
        {"mlp.fc1.weight", "mlp.fc1.weight", {H, D}},
        {"mlp.fc1.bias", "mlp.fc1.bias", {H}},
        {"mlp.fc2.weight", "mlp.fc2.weight", {D, H}},
        {"mlp.fc2.bias", "mlp.fc2.bias", {D}},
    };
    for (const One& o : ones) {
      if (w == o.loom) return HfParts{{l + o.hf}, {o.shape}};
    }
  }
  return absl::InvalidArgumentError("no Hugging Face tensor for the ViT parameter " + name);
}

absl::StatusOr<HfParts> ProjectorHfParts(const ModelConfig& c, const std::string& name,
                                         const std::string& prefix) {
  const int64_t in = c.projector.pixel_shuffle ? 4 * c.vit.dim : c.vit.dim, H = c.projector.hidden,
                D = c.llm.dim;
  if (name == "fc1.weight") return HfParts{{prefix + "linear_1.weight"}, {{H, in}}};
  if (name == "fc1.bias") return HfParts{{prefix + "linear_1.bias"}, {{H}}};
  if (name == "fc2.weight") return HfParts{{prefix + "linear_2.weight"}, {{D, H}}};
  if (name == "fc2.bias") return HfParts{{prefix + "linear_2.bias"}, {{D}}};
  return absl::InvalidArgumentError("no Hugging Face tensor for the projector parameter " + name);
}

absl::Status LoadVitWeights(const SafetensorsModel& model, const VitConfig& v,
                            const std::string& prefix, ParamSet* params) {
  return LoadParams(
      model, [&](const std::string& n) { return VitHfParts(v, n, prefix); }, params);
}

absl::Status LoadProjectorWeights(const SafetensorsModel& model, const ModelConfig& c,
                                  const std::string& prefix, ParamSet* params) {
  return LoadParams(
      model, [&](const std::string& n) { return ProjectorHfParts(c, n, prefix); }, params);
}

namespace {

// The Hugging Face names of the tower's parameters (under `prefix`) into `known`.
absl::Status AddVitNames(const VitConfig& v, const std::string& prefix,
                         std::set<std::string>* known) {
  for (const std::string& n : VitNames(v)) {
    absl::StatusOr<HfParts> p = VitHfParts(v, n, prefix);
    if (!p.ok()) return p.status();
    known->insert(p->names.begin(), p->names.end());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckVisionTensorsKnown(const SafetensorsModel& model, const VisionTower& t,
                                     const std::string& prefix) {
  std::set<std::string> known;
  if (absl::Status s = AddVitNames(t.vit, prefix, &known); !s.ok()) return s;
  bool any = false;
  for (const std::string& name : model.names()) {
    if (!absl::StartsWith(name, prefix)) continue;
    any = true;
    if (known.count(name) > 0 || UnusedVisionTensor(t, name.substr(prefix.size()))) continue;
    return absl::InvalidArgumentError(
        absl::StrCat(model.where(), ": ", name,
                     " is not part of the vision tower config.json describes (another family, "
                     "or a feature Loom does not run)"));
  }
  if (!any) {
    return absl::InvalidArgumentError(
        absl::StrCat(model.where(), ": no tensor under ", prefix, ": not a vision tower"));
  }
  return absl::OkStatus();
}

absl::Status CheckLlavaTensorsKnown(const SafetensorsModel& model, const LlavaConfig& c,
                                    const LlavaKeys& keys) {
  if (absl::Status s = CheckLlmTensorsKnown(model, c.model.llm, keys.llm); !s.ok()) return s;
  std::set<std::string> known;
  if (absl::Status s = AddVitNames(c.model.vit, keys.vision, &known); !s.ok()) return s;
  for (const std::string& n : ProjectorNames()) {
    absl::StatusOr<HfParts> p = ProjectorHfParts(c.model, n, keys.projector);
    if (!p.ok()) return p.status();
    known.insert(p->names.begin(), p->names.end());
  }
  for (const std::string& name : model.names()) {
    if (known.count(name) > 0) continue;
    if (absl::StartsWith(name, keys.llm.body) || absl::StartsWith(name, keys.llm.head)) continue;
    if (absl::StartsWith(name, keys.vision) &&
        UnusedVisionTensor(c.tower, name.substr(keys.vision.size()))) {
      continue;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        model.where(), ": ", name,
        " is not part of the LLaVA model config.json describes (another family, or a feature "
        "Loom does not run)"));
  }
  return absl::OkStatus();
}

std::vector<NamedTensor> LlavaToHf(MultimodalModel& model, const LlavaKeys& keys, bool grads) {
  const ModelConfig& c = model.config();
  std::vector<NamedTensor> out = LlmToHf(c.llm, model.llm().params(), keys.llm, grads);
  std::vector<NamedTensor> vit = ParamsToHf(
      VitNames(c.vit), [&](const std::string& n) { return VitHfParts(c.vit, n, keys.vision); },
      model.vit().params(), grads);
  std::vector<NamedTensor> projector = ParamsToHf(
      ProjectorNames(),
      [&](const std::string& n) { return ProjectorHfParts(c, n, keys.projector); },
      model.projector().params(), grads);
  for (auto* part : {&vit, &projector}) {
    for (NamedTensor& t : *part) out.push_back(std::move(t));
  }
  return out;
}

absl::StatusOr<std::string> LlavaExportConfig(const std::string& source, const LlavaConfig& c) {
  json j = json::parse(source, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("vision_config") || !j["vision_config"].is_object()) {
    return absl::InvalidArgumentError("the source config.json is not a LLaVA config");
  }
  j["vision_config"]["num_hidden_layers"] = c.model.vit.layers;
  j["vision_feature_layer"] = -1;
  return j.dump(2) + "\n";
}

std::vector<NamedTensor> LlavaExportExtras(const LlavaConfig& c) {
  const int64_t D = c.model.vit.dim;
  const std::string p = ClassicLlavaKeys().vision + "post_layernorm.";
  return {{p + "weight", {D}, std::vector<float>(D, 1.0f)},
          {p + "bias", {D}, std::vector<float>(D, 0.0f)}};
}

absl::StatusOr<OpenedLlava> OpenHfLlava(const std::string& dir) {
  OpenedLlava o;
  LOOM_HF_ASSIGN(o.config, ReadLlavaConfig(dir));
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> st = SafetensorsModel::Open(dir);
  if (!st.ok()) return st.status();
  const SafetensorsModel& m = **st;
  absl::StatusOr<LlavaKeys> keys = DetectLlavaKeys(m);
  if (!keys.ok()) return keys.status();
  if (absl::Status s = CheckLlavaTensorsKnown(m, o.config, *keys); !s.ok()) return s;
  o.keys = *keys;
  o.model = std::make_unique<MultimodalModel>(o.config.model);
  if (absl::Status s =
          LoadVitWeights(m, o.config.model.vit, keys->vision, &o.model->vit().params());
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          LoadProjectorWeights(m, o.config.model, keys->projector, &o.model->projector().params());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = LoadLlmWeights(m, o.config.model.llm, keys->llm, &o.model->llm().params());
      !s.ok()) {
    return s;
  }
  return o;
}

absl::StatusOr<std::vector<Sample>> LlavaSamples(const std::string& tokens, const LlavaConfig& c,
                                                 const std::vector<float>& pixels) {
  const ModelConfig& m = c.model;
  const size_t tile = static_cast<size_t>(3) * m.vit.tile_size * m.vit.tile_size;
  const int per_image = m.tokens_per_tile();
  if (pixels.size() % tile != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(pixels.size(), " pixel values are not whole 3 x ", m.vit.tile_size, " x ",
                     m.vit.tile_size, " images"));
  }
  const size_t images = pixels.size() / tile;
  absl::StatusOr<std::vector<std::vector<int32_t>>> seqs = ParseTokenSequences(tokens, m.llm.vocab);
  if (!seqs.ok()) return seqs.status();
  std::vector<Sample> samples;
  size_t used = 0;
  for (size_t k = 0; k < seqs->size(); ++k) {
    Sample& s = samples.emplace_back();
    int run = 0;
    for (size_t i = 0; i <= (*seqs)[k].size(); ++i) {
      const bool slot = i < (*seqs)[k].size() && (*seqs)[k][i] == c.image_token_id;
      if (slot) {
        ++run;
        s.tokens.push_back(-1);
        continue;
      }
      if (run % per_image != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--tokens: sequence ", k + 1, " has a run of ", run, " image tokens (",
                         c.image_token_id, "); each image is ", per_image));
      }
      s.num_tiles += run / per_image;
      run = 0;
      if (i < (*seqs)[k].size()) s.tokens.push_back((*seqs)[k][i]);
    }
    if (used + s.num_tiles > images) {
      return absl::InvalidArgumentError(
          absl::StrCat("the tokens hold image slots for more than the ", images, " images given"));
    }
    s.tiles.assign(pixels.begin() + used * tile, pixels.begin() + (used + s.num_tiles) * tile);
    used += s.num_tiles;
  }
  if (used != images) {
    return absl::InvalidArgumentError(absl::StrCat(images, " images given, but the tokens hold ",
                                                   used * per_image, " image tokens (", per_image,
                                                   " per image)"));
  }
  return samples;
}

absl::StatusOr<std::vector<float>> ReadPixelValues(const std::string& path, int tile_size) {
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> f = SafetensorsModel::Open(path);
  if (!f.ok()) return f.status();
  const TensorEntry* e = (*f)->Find("pixel_values");
  if (e == nullptr) return absl::NotFoundError(path + ": no tensor pixel_values");
  if (e->shape.size() != 4 || e->shape[1] != 3 || e->shape[2] != tile_size ||
      e->shape[3] != tile_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": pixel_values is ", ShapeString(e->shape), "; the tower takes [N, 3, ",
                     tile_size, ", ", tile_size, "]"));
  }
  return (*f)->ReadF32("pixel_values");
}

}  // namespace loom::hf
