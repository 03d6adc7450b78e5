#include "runtime/hf/model_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, llava, "",
          "Train a LlavaForConditionalGeneration directory (weights, tokenizer.json, "
          "preprocessor_config.json) instead of --config.");
ABSL_FLAG(std::string, llm_from, "",
          "With --vision_from: a LlamaForCausalLM / Qwen2ForCausalLM directory (with "
          "tokenizer.json, which has an <image> token) as the LLM.");
ABSL_FLAG(std::string, vision_from, "",
          "With --llm_from: a CLIP or SigLIP directory (with preprocessor_config.json) as the "
          "vision tower; the projector starts from the seed.");
ABSL_FLAG(int, vision_feature_layer, 0,
          "With --llm_from/--vision_from: the tower layer whose output the LLM takes, negative "
          "from the end (0: LLaVA's -2).");

namespace loom::hf {

ModelSource ModelSourceFromFlags(const std::string& config) {
  ModelSource s;
  s.config = config;
  s.llava = absl::GetFlag(FLAGS_llava);
  s.llm_from = absl::GetFlag(FLAGS_llm_from);
  s.vision_from = absl::GetFlag(FLAGS_vision_from);
  if (absl::GetFlag(FLAGS_vision_feature_layer) != 0) {
    s.vision_feature_layer = absl::GetFlag(FLAGS_vision_feature_layer);
  }
  return s;
}

std::vector<std::string> ModelSourceFlags(const ModelSource& source) {
  if (!source.pretrained()) return {"--config=" + source.config};
  std::vector<std::string> out;
  if (!source.llava.empty()) out.push_back("--llava=" + source.llava);
  if (!source.llm_from.empty()) out.push_back("--llm_from=" + source.llm_from);
  if (!source.vision_from.empty()) out.push_back("--vision_from=" + source.vision_from);
  if (source.vision_feature_layer) {
    out.push_back(absl::StrCat("--vision_feature_layer=", *source.vision_feature_layer));
  }
  return out;
}

}  // namespace loom::hf
