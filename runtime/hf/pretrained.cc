#include "runtime/hf/pretrained.h"

#include <filesystem>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/base/file.h"
#include "runtime/hf/bpe_tokenizer.h"
#include "runtime/hf/hf_image.h"
#include "runtime/hf/hf_llm.h"
#include "runtime/hf/safetensors.h"

namespace loom::hf {
namespace {

using nlohmann::json;

// Where a CLIP/SigLIP directory of its own keeps the tower's tensors.
constexpr char kVisionPrefix[] = "vision_model.";
// What LLaVA adds to the tokenizer to mark an image.
constexpr char kImageToken[] = "<image>";

absl::Status Named(const std::string& field, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(field, ": ", s.message()));
}

absl::StatusOr<json> ReadJson(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError(path + ": not a JSON object");
  return j;
}

absl::Status NeedFile(const std::string& dir, const std::string& name, const std::string& why) {
  std::error_code error;
  if (std::filesystem::is_regular_file(dir + "/" + name, error)) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat(dir, "/", name, ": not found (", why, ")"));
}

// A pretrained source names llava alone, or llm_from with vision_from.
absl::Status CheckSourceFields(const ModelSource& source) {
  if (!source.llava.empty() && (!source.llm_from.empty() || !source.vision_from.empty())) {
    return absl::InvalidArgumentError(
        "llava: one LLaVA directory, or llm_from and vision_from, not both");
  }
  if (source.llava.empty() && (source.llm_from.empty() || source.vision_from.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        source.llm_from.empty() ? "llm_from" : "vision_from",
        ": missing (llm_from and vision_from go together: the LLM and the vision tower)"));
  }
  if (source.vision_feature_layer && !source.llava.empty()) {
    return absl::InvalidArgumentError(
        "vision_feature_layer: only with llm_from + vision_from (a LLaVA directory's "
        "config.json sets it)");
  }
  return absl::OkStatus();
}

// A source's config.json: `path` itself when it is a file, else the one in
// the directory `path`.
std::string ConfigJsonPath(const std::string& path) {
  std::error_code error;
  return std::filesystem::is_regular_file(path, error) ? path : path + "/config.json";
}

// A LLaVA config.json for llm_from + vision_from; `*added` when the LLM's
// tokenizer has no <image> (its id is then text_config.vocab_size). With
// `added` null the tokenizer is not read and the id is vocab_size (the
// configs alone: planning).
absl::StatusOr<std::string> ComposeLlavaConfig(const ModelSource& s, bool* added) {
  absl::StatusOr<json> text = ReadJson(ConfigJsonPath(s.llm_from));
  if (!text.ok()) return Named("llm_from", text.status());
  absl::StatusOr<json> vision = ReadJson(ConfigJsonPath(s.vision_from));
  if (!vision.ok()) return Named("vision_from", vision.status());
  json v = *vision;
  const std::string type = v.value("model_type", "");
  if ((type == "clip" || type == "siglip") && v.contains("vision_config")) {
    v = (*vision)["vision_config"];  // a whole CLIPModel / SiglipModel
    if (!v.is_object()) {
      return absl::InvalidArgumentError("vision_from: config.json vision_config is not an object");
    }
    if (!v.contains("model_type")) v["model_type"] = type + "_vision_model";
  }
  std::optional<int32_t> image;
  std::unique_ptr<BpeTokenizer> tokenizer;
  if (added != nullptr) {
    absl::StatusOr<std::unique_ptr<BpeTokenizer>> tok =
        BpeTokenizer::Load(s.llm_from + "/tokenizer.json");
    if (!tok.ok()) return Named("llm_from", tok.status());
    tokenizer = *std::move(tok);
    image = tokenizer->TokenId(kImageToken);
    *added = !image.has_value();
  }
  if (!image.has_value()) {
    if (!text->contains("vocab_size") || !(*text)["vocab_size"].is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat("llm_from: ", ConfigJsonPath(s.llm_from), ": vocab_size missing"));
    }
    image = (*text)["vocab_size"].get<int32_t>();
  }
  if (added != nullptr && *added) {
    if (*image < tokenizer->vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("llm_from: ", s.llm_from, "/tokenizer.json has no \"", kImageToken,
                       "\" and ids up to ", tokenizer->vocab_size() - 1, ", past the vocabulary (",
                       *image, "): no free id to add it as"));
    }
    LOOM_LOG(WARNING).With("llm_from", s.llm_from).With("image_token_index", *image)
        << "the tokenizer has no <image>: Loom marks images with id " << *image
        << ", just past the text vocabulary (its embedding row is never read); an export adds "
           "the token and its row";
  }
  const bool clip = v.value("model_type", "") == "clip_vision_model";
  json llava = {{"architectures", {"LlavaForConditionalGeneration"}},
                {"model_type", "llava"},
                {"text_config", *text},
                {"vision_config", v},
                {"vision_feature_layer", s.vision_feature_layer.value_or(-2)},
                {"vision_feature_select_strategy", clip ? "default" : "full"},
                {"projector_hidden_act", "gelu"},
                {"multimodal_projector_bias", true},
                {"image_token_index", *image}};
  if (text->contains("torch_dtype")) llava["torch_dtype"] = (*text)["torch_dtype"];
  return llava.dump(2) + "\n";
}

}  // namespace

std::string ModelSource::Describe() const {
  if (!llava.empty()) return "llava=" + llava;
  if (!pretrained()) return config;
  std::string d = absl::StrCat("llm_from=", llm_from, " vision_from=", vision_from);
  if (vision_feature_layer) absl::StrAppend(&d, " vision_feature_layer=", *vision_feature_layer);
  return d;
}

absl::StatusOr<ModelConfig> ModelConfigOfConfigs(const ModelSource& source) {
  if (!source.pretrained()) return ModelConfigByName(source.config);
  if (absl::Status f = CheckSourceFields(source); !f.ok()) return f;
  std::string text;
  if (!source.llava.empty()) {
    absl::StatusOr<std::string> t = ReadFile(ConfigJsonPath(source.llava));
    if (!t.ok()) return Named("llava", t.status());
    text = *t;
  } else {
    absl::StatusOr<std::string> t = ComposeLlavaConfig(source, /*added=*/nullptr);
    if (!t.ok()) return t.status();
    text = *t;
  }
  absl::StatusOr<LlavaConfig> c =
      ParseLlavaConfig(text, source.llava.empty() ? "llm_from + vision_from" : "llava");
  if (!c.ok()) return c.status();
  ModelConfig config = c->model;
  config.name = source.Describe();
  return config;
}

absl::StatusOr<PretrainedModel> ResolveModel(const ModelSource& source) {
  PretrainedModel m;
  m.source = source;
  if (!source.pretrained()) {
    absl::StatusOr<ModelConfig> c = ModelConfigByName(source.config);
    if (!c.ok()) return c.status();
    m.config = *c;
    return m;
  }
  if (absl::Status f = CheckSourceFields(source); !f.ok()) return f;
  const std::string field = source.llava.empty() ? "vision_from" : "llava";
  if (!source.llava.empty()) {
    m.tokenizer_dir = m.image_processor_dir = source.llava;
    absl::StatusOr<std::string> text = ReadFile(ConfigJsonPath(source.llava));
    if (!text.ok()) return Named("llava", text.status());
    m.llava_config_json = *text;
  } else {
    m.tokenizer_dir = source.llm_from;
    m.image_processor_dir = source.vision_from;
    absl::StatusOr<std::string> text = ComposeLlavaConfig(source, &m.image_token_added);
    if (!text.ok()) return text.status();
    m.llava_config_json = *text;
  }
  absl::StatusOr<LlavaConfig> c = ParseLlavaConfig(
      m.llava_config_json, source.llava.empty() ? "llm_from + vision_from" : "llava");
  if (!c.ok()) return c.status();
  m.llava = *c;
  m.config = c->model;
  m.config.name = source.Describe();
  if (absl::Status s = NeedFile(m.tokenizer_dir, "tokenizer.json", "the data pipeline needs it");
      !s.ok()) {
    return Named(source.llava.empty() ? "llm_from" : "llava", s);
  }
  if (absl::Status s = NeedFile(m.image_processor_dir, "preprocessor_config.json",
                                "the data pipeline makes pixels as it says");
      !s.ok()) {
    return Named(field, s);
  }
  // Every tensor name against the configs (headers only).
  if (!source.llava.empty()) {
    absl::StatusOr<std::unique_ptr<SafetensorsModel>> st = SafetensorsModel::Open(source.llava);
    if (!st.ok()) return Named("llava", st.status());
    absl::StatusOr<LlavaKeys> keys = DetectLlavaKeys(**st);
    if (!keys.ok()) return Named("llava", keys.status());
    if (absl::Status s = CheckLlavaTensorsKnown(**st, m.llava, *keys); !s.ok()) {
      return Named("llava", s);
    }
    return m;
  }
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> llm = SafetensorsModel::Open(source.llm_from);
  if (!llm.ok()) return Named("llm_from", llm.status());
  if (absl::Status s = CheckLlmTensorsKnown(**llm, m.config.llm, CausalLmKeys()); !s.ok()) {
    return Named("llm_from", s);
  }
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> vision =
      SafetensorsModel::Open(source.vision_from);
  if (!vision.ok()) return Named("vision_from", vision.status());
  if (absl::Status s = CheckVisionTensorsKnown(**vision, m.llava.tower, kVisionPrefix); !s.ok()) {
    return Named("vision_from", s);
  }
  return m;
}

absl::Status LoadPretrainedWeights(const PretrainedModel& m, Module module, ParamSet* params) {
  const ModelSource& s = m.source;
  if (!s.pretrained()) return absl::OkStatus();
  if (module == Module::kProjector && s.llava.empty()) return absl::OkStatus();
  const std::string& dir = !s.llava.empty()         ? s.llava
                           : module == Module::kLlm ? s.llm_from
                                                    : s.vision_from;
  const std::string field = !s.llava.empty()         ? "llava"
                            : module == Module::kLlm ? "llm_from"
                                                     : "vision_from";
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> st = SafetensorsModel::Open(dir);
  if (!st.ok()) return Named(field, st.status());
  LlavaKeys keys{CausalLmKeys(), kVisionPrefix, ""};
  if (!s.llava.empty()) {
    absl::StatusOr<LlavaKeys> k = DetectLlavaKeys(**st);
    if (!k.ok()) return Named(field, k.status());
    keys = *k;
  }
  absl::Status status;
  switch (module) {
    case Module::kEncoder:
      status = LoadVitWeights(**st, m.config.vit, keys.vision, params);
      break;
    case Module::kProjector:
      status = LoadProjectorWeights(**st, m.config, keys.projector, params);
      break;
    case Module::kLlm:
      status = LoadLlmWeights(**st, m.config.llm, keys.llm, params);
      break;
    case Module::kGenerator:  // no Hugging Face family has Loom's generator
      status = absl::InvalidArgumentError("a Hugging Face model has no Loom generator to load");
      break;
  }
  return status.ok() ? status : Named(field, status);
}

absl::Status LoadPretrainedWeights(const PretrainedModel& m, MultimodalModel* model) {
  for (Module module : {Module::kEncoder, Module::kProjector, Module::kLlm}) {
    if (absl::Status s =
            LoadPretrainedWeights(m, module, model->param_sets()[static_cast<int>(module)]);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DataPipeline> DataPipelineFor(const PretrainedModel& m, const std::string& tokenizer,
                                             const std::string& chat_template,
                                             const std::string& image_aspect_ratio) {
  DataPipeline d;
  if (!image_aspect_ratio.empty() && image_aspect_ratio != "crop" && !m.pretrained()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image_aspect_ratio \"", image_aspect_ratio,
        "\": for a Hugging Face image processor; Loom's own models tile each image dynamically"));
  }
  d.preprocess = data::PreprocessOptionsFor(m.config);
  const std::string path = tokenizer.empty() && m.pretrained() ? m.tokenizer_dir : tokenizer;
  absl::StatusOr<std::unique_ptr<data::Tokenizer>> t = data::Tokenizer::Load(path);
  if (!t.ok()) return t.status();
  if (absl::Status s = data::CheckTokenizerFits(**t, m.config); !s.ok()) return s;
  d.tokenizer = std::move(*t);
  absl::StatusOr<std::shared_ptr<const data::ChatTemplate>> chat =
      data::ChatTemplate::Resolve(chat_template, d.tokenizer.get());
  if (!chat.ok()) return chat.status();
  d.preprocess.chat = std::move(*chat);
  if (m.pretrained()) {
    absl::StatusOr<ImageProcessor> p = ReadImageProcessor(m.image_processor_dir);
    if (!p.ok()) return p.status();
    if (absl::Status s = SetImageAspectRatio(image_aspect_ratio, &*p); !s.ok()) return s;
    const int S = m.config.vit.tile_size;
    // A processor that makes anything but the tower's S x S fails here, not
    // on every image.
    data::Image probe;
    probe.width = 2 * S + 3;
    probe.height = S + 1;
    probe.rgb.assign(static_cast<size_t>(probe.width) * probe.height * 3, 128);
    if (absl::StatusOr<std::vector<float>> px = ProcessImage(*p, probe, S); !px.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          m.image_processor_dir, "/preprocessor_config.json: ", px.status().message()));
    }
    d.preprocess.image_to_tile = [p = *p, S](const data::Image& image) {
      return ProcessImage(p, image, S);
    };
  }
  return d;
}

absl::Status AddImageTokenToExport(const PretrainedModel& m, std::vector<NamedTensor>* tensors,
                                   std::string* config_json,
                                   std::map<std::string, std::string>* files) {
  if (!m.image_token_added) return absl::OkStatus();
  const int64_t id = m.llava.image_token_id, dim = m.config.llm.dim;
  for (NamedTensor& t : *tensors) {
    if (!absl::EndsWith(t.name, "embed_tokens.weight") && !absl::EndsWith(t.name, "lm_head.weight"))
      continue;
    if (t.shape.size() != 2 || t.shape[0] != id || t.shape[1] != dim) {
      return absl::InternalError(absl::StrCat(t.name, ": not (", id, ", ", dim, ")"));
    }
    std::vector<double> mean(dim, 0.0);
    for (int64_t r = 0; r < id; ++r) {
      for (int64_t c = 0; c < dim; ++c) mean[c] += t.data[r * dim + c];
    }
    for (int64_t c = 0; c < dim; ++c) t.data.push_back(static_cast<float>(mean[c] / id));
    t.shape[0] = id + 1;
  }
  json config = json::parse(*config_json, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object() || !config.contains("text_config")) {
    return absl::InternalError("the export's config.json has no text_config");
  }
  config["text_config"]["vocab_size"] = id + 1;
  if (config.contains("vocab_size")) config["vocab_size"] = id + 1;
  *config_json = config.dump(2) + "\n";
  const json token = {{"id", id},        {"content", kImageToken}, {"single_word", false},
                      {"lstrip", false}, {"rstrip", false},        {"normalized", false},
                      {"special", true}};
  absl::StatusOr<json> tok = ReadJson(m.tokenizer_dir + "/tokenizer.json");
  if (!tok.ok()) return tok.status();
  if (!(*tok)["added_tokens"].is_array()) (*tok)["added_tokens"] = json::array();
  (*tok)["added_tokens"].push_back(token);
  (*files)["tokenizer.json"] = tok->dump(2) + "\n";
  const std::string config_path = m.tokenizer_dir + "/tokenizer_config.json";
  std::error_code error;
  if (std::filesystem::is_regular_file(config_path, error)) {
    absl::StatusOr<json> tc = ReadJson(config_path);
    if (!tc.ok()) return tc.status();
    if (tc->contains("added_tokens_decoder") && (*tc)["added_tokens_decoder"].is_object()) {
      json entry = token;
      entry.erase("id");
      (*tc)["added_tokens_decoder"][std::to_string(id)] = entry;
    }
    (*files)["tokenizer_config.json"] = tc->dump(2) + "\n";
  }
  return absl::OkStatus();
}

std::vector<SideFile> ExportSideFiles(const PretrainedModel& m) {
  std::vector<SideFile> out;
  if (!m.pretrained()) return out;
  auto add = [&](const std::string& dir, const char* name) {
    std::error_code error;
    const std::string path = absl::StrCat(dir, "/", name);
    if (std::filesystem::is_regular_file(path, error)) out.push_back({path, name});
  };
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                           "tokenizer.model", "chat_template.json"}) {
    add(m.tokenizer_dir, name);
  }
  for (const char* name : {"preprocessor_config.json", "processor_config.json"}) {
    add(m.image_processor_dir, name);
  }
  add(m.source.llava.empty() ? m.source.llm_from : m.source.llava, "generation_config.json");
  return out;
}

}  // namespace loom::hf
