// Hugging Face vision towers and LLaVA as Loom's encoder, projector and LLM.
//
// Vision towers (config.json `vision_config`, or a whole CLIPModel /
// SiglipModel / *VisionModel directory): CLIP (class token, no patch bias,
// pre_layrnorm, quick_gelu, eps 1e-5) and SigLIP (patch bias, no class
// token, gelu_pytorch_tanh, eps 1e-6). hidden_size, intermediate_size,
// num_attention_heads, num_hidden_layers, image_size and patch_size are
// required; hidden_act and layer_norm_eps default as transformers' family
// configs do (LLaVA's own configs leave them out). Loom runs the tower as
// LLaVA does: the features are hidden_states[vision_feature_layer] (so the
// layers after it are not run and post_layernorm never is), and CLIP's class
// token is dropped ("default" strategy); SigLIP keeps every patch ("full").
//
// LLaVA (model_type "llava", LlavaForConditionalGeneration): text_config
// (hf_llm.h), vision_config, vision_feature_layer (an integer; transformers'
// default -2), vision_feature_select_strategy ("default"),
// projector_hidden_act ("gelu", the exact one), image_token_index (or
// image_token_id; required: it is the LLM's, not a family constant). The
// projector is multi_modal_projector.linear_1 -> act -> linear_2 (with
// biases). Weights in either key layout transformers writes: before 4.52
// (language_model.model.*, language_model.lm_head.*, vision_tower.*,
// multi_modal_projector.*) or after (model.language_model.*, lm_head.*,
// model.vision_tower.*, model.multi_modal_projector.*).
#ifndef LOOM_RUNTIME_HF_HF_LLAVA_H_
#define LOOM_RUNTIME_HF_HF_LLAVA_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "runtime/hf/hf_llm.h"
#include "runtime/hf/hf_params.h"
#include "runtime/hf/safetensors.h"
#include "runtime/model/config.h"
#include "runtime/model/model.h"

namespace loom::hf {

// A vision tower as Loom runs it, and what config.json says of the rest.
struct VisionTower {
  VitConfig vit;       // layers: those LLaVA runs (up to the feature layer)
  int hf_layers = 0;   // num_hidden_layers
  std::string family;  // "clip" or "siglip"
};

// A vision config object (`where` names it in errors). `feature_layer`:
// LLaVA's vision_feature_layer (negative counts from the end: -1 is the last
// layer's output); `strategy`: vision_feature_select_strategy.
absl::StatusOr<VisionTower> ParseVisionConfig(const nlohmann::json& j, const std::string& where,
                                              int feature_layer, const std::string& strategy);

// Where a checkpoint keeps the modules' tensors.
struct LlavaKeys {
  LlmKeys llm;
  std::string vision;     // + "embeddings....", "encoder.layers.N....", "pre_layrnorm...."
  std::string projector;  // + "linear_1.weight", ...
};
// transformers before 4.52, and Loom's export.
LlavaKeys ClassicLlavaKeys();
// transformers 4.52 and later.
LlavaKeys NestedLlavaKeys();
// The layout `model` is in, by its tensor names; INVALID_ARGUMENT when it
// holds no vision tower.
absl::StatusOr<LlavaKeys> DetectLlavaKeys(const SafetensorsModel& model);

struct LlavaConfig {
  ModelConfig model;  // vit, projector (hidden = the LLM's width), llm
  int image_token_id = -1;
  VisionTower tower;
};
absl::StatusOr<LlavaConfig> ParseLlavaConfig(const std::string& json_text,
                                             const std::string& where);
absl::StatusOr<LlavaConfig> ReadLlavaConfig(const std::string& dir);

// The Hugging Face tensors of a ViT / projector parameter (`prefix`: the
// module's key prefix).
absl::StatusOr<HfParts> VitHfParts(const VitConfig& v, const std::string& loom_name,
                                   const std::string& prefix);
absl::StatusOr<HfParts> ProjectorHfParts(const ModelConfig& c, const std::string& loom_name,
                                         const std::string& prefix);

// Fill a VitEncoder's or Projector's parameters (any TP slice, any stage).
absl::Status LoadVitWeights(const SafetensorsModel& model, const VitConfig& v,
                            const std::string& prefix, ParamSet* params);
absl::Status LoadProjectorWeights(const SafetensorsModel& model, const ModelConfig& c,
                                  const std::string& prefix, ParamSet* params);

// INVALID_ARGUMENT naming the first tensor of a LLaVA checkpoint that the
// config does not explain. Ignored: the tower's layers after the feature
// layer, post_layernorm, SigLIP's pooling head and position_ids buffers
// (LLaVA does not run them), the LLM's RoPE buffers.
absl::Status CheckLlavaTensorsKnown(const SafetensorsModel& model, const LlavaConfig& c,
                                    const LlavaKeys& keys);

// The same for a tower alone (a CLIPVisionModel, SiglipVisionModel, CLIPModel
// or SiglipModel directory): tensors under `prefix` only ("vision_model.";
// a CLIPModel's text model is not the tower's and is ignored).
absl::Status CheckVisionTensorsKnown(const SafetensorsModel& model, const VisionTower& t,
                                     const std::string& prefix);

// The whole model (TP 1, every layer) as Hugging Face tensors under `keys`.
// `grads`: the gradients instead.
std::vector<NamedTensor> LlavaToHf(MultimodalModel& model, const LlavaKeys& keys, bool grads);

// Loom's export of a LLaVA model, under ClassicLlavaKeys: the config.json
// `source` (the imported directory's) with the tower cut to the layers Loom
// runs (vision_config.num_hidden_layers, vision_feature_layer -1), and the
// tensors transformers' tower module has that LLaVA never runs (an identity
// post_layernorm), so that transformers loads every weight.
absl::StatusOr<std::string> LlavaExportConfig(const std::string& source, const LlavaConfig& c);
std::vector<NamedTensor> LlavaExportExtras(const LlavaConfig& c);

// A LLaVA directory as one Loom MultimodalModel (one rank, one stage).
struct OpenedLlava {
  LlavaConfig config;
  LlavaKeys keys;
  std::unique_ptr<MultimodalModel> model;
};
absl::StatusOr<OpenedLlava> OpenHfLlava(const std::string& dir);

// Samples for the model from token sequences ("1,2,3/4,5", as
// ParseTokenBatch) in which image_token_id marks image slots, and `pixels`
// (N, 3, S, S), normalised: the images in order, tokens_per_tile slots each.
// INVALID_ARGUMENT when a run of slots is not whole images or the images
// and the slots do not match in number.
absl::StatusOr<std::vector<Sample>> LlavaSamples(const std::string& tokens, const LlavaConfig& c,
                                                 const std::vector<float>& pixels);
// The "pixel_values" tensor (N, 3, S, S) of a safetensors file, as fp32.
absl::StatusOr<std::vector<float>> ReadPixelValues(const std::string& path, int tile_size);

// True when DIR/config.json's model_type is "llava".
bool IsLlavaDir(const std::string& dir);

}  // namespace loom::hf

#endif  // LOOM_RUNTIME_HF_HF_LLAVA_H_
