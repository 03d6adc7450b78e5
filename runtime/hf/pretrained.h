// Where a training run's model comes from: one of Loom's named configs
// (runtime/model/config.h, weights from the seed) or Hugging Face
// directories, as a job's `model` / `hf` (proto/loom/job/v1/job.proto) or a
// command line's --config / --llava / --llm_from / --vision_from say:
//
//   llava                   one LlavaForConditionalGeneration directory: the
//                           tower, the projector, the LLM, tokenizer.json and
//                           preprocessor_config.json (LLaVA's stage 2, or
//                           fine-tuning a LLaVA model)
//   llm_from + vision_from  a LlamaForCausalLM / Qwen2ForCausalLM directory
//                           (with tokenizer.json) and a CLIP or SigLIP
//                           directory (with preprocessor_config.json): a new
//                           LLaVA model whose projector starts from the seed
//                           (LLaVA's stage 1)
//
// The composed LLaVA model takes the tower's features at
// `vision_feature_layer` (LLaVA's default -2), CLIP's class token dropped
// (SigLIP keeps every patch), and marks images with the LLM tokenizer's
// "<image>" token, which must exist (LLaVA adds it to the tokenizer): its id
// is the image_token_index an export writes. Every module is first drawn from
// the seed (so the projector of llm_from + vision_from is the seed's), then
// the directories' weights overwrite what they hold.
#ifndef LOOM_RUNTIME_HF_PRETRAINED_H_
#define LOOM_RUNTIME_HF_PRETRAINED_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/data/preprocess.h"
#include "runtime/data/tokenizer.h"
#include "runtime/hf/hf_llava.h"
#include "runtime/model/config.h"
#include "runtime/model/model.h"
#include "runtime/model/params.h"

namespace loom::hf {

struct ModelSource {
  std::string config = "tiny";  // Loom's named config when no directory is given
  std::string llava;
  std::string llm_from;
  std::string vision_from;
  std::optional<int> vision_feature_layer;  // with llm_from + vision_from (-2)

  bool pretrained() const { return !llava.empty() || !llm_from.empty() || !vision_from.empty(); }
  // "tiny", "llava=DIR" or "llm_from=DIR vision_from=DIR[ vision_feature_layer=N]".
  std::string Describe() const;
};

struct PretrainedModel {
  ModelSource source;
  ModelConfig config;
  // Hugging Face sources only:
  LlavaConfig llava;                // config, image token, tower
  std::string llava_config_json;    // the LLaVA config.json (the directory's, or composed)
  std::string tokenizer_dir;        // holds tokenizer.json (llava or llm_from)
  std::string image_processor_dir;  // holds preprocessor_config.json (llava or vision_from)
  // llm_from's tokenizer has no "<image>": Loom marks images with the id
  // just past the text vocabulary (text_config.vocab_size), whose embedding
  // row is never read (image slots take the projector's output), and an
  // export adds the token to the tokenizer and a row to the embeddings.
  bool image_token_added = false;

  bool pretrained() const { return source.pretrained(); }
};

// The model the source's configs describe, from its config.json files
// alone (no tokenizer, no weights): what planning needs. Each of llava,
// llm_from and vision_from may name a directory holding config.json or the
// JSON file itself (transformers' config.json of LlavaForConditionalGeneration,
// LlamaForCausalLM / Qwen2ForCausalLM, CLIP / SigLIP). A named config is
// ModelConfigByName's. Errors name the field (as ResolveModel's).
absl::StatusOr<ModelConfig> ModelConfigOfConfigs(const ModelSource& source);

// Reads the directories' config.json files and checks every tensor name
// against them (headers only; no weights are read). INVALID_ARGUMENT or
// NOT_FOUND naming the field of the source at fault ("llava: ...",
// "llm_from: ...").
absl::StatusOr<PretrainedModel> ResolveModel(const ModelSource& source);

// Overwrites `params`, module `module` of the model (any TP slice, any
// pipeline stage), with the source's weights; a module the source does not
// hold (every module of a named config, the projector of llm_from +
// vision_from) is left as it is. The optimizer state is left as it is.
absl::Status LoadPretrainedWeights(const PretrainedModel& m, Module module, ParamSet* params);

// The same for every module of a whole model (one rank, one stage).
absl::Status LoadPretrainedWeights(const PretrainedModel& m, MultimodalModel* model);

// The data pipeline the model trains on: PreprocessOptionsFor(config), with
// a Hugging Face source's image processor (preprocessor_config.json) making
// each image one tile, and the tokenizer: `tokenizer` when given (a
// sentencepiece model, or a directory with tokenizer.json), else the model's
// own (Loom's built-in sentencepiece model; the Hugging Face directory's
// tokenizer.json). FAILED_PRECONDITION when its ids do not fit the
// vocabulary. `chat_template` renders conversations
// (runtime/data/chat_template.h): "" for the tokenizer's own, else
// vicuna_v1; a template name; a file. `image_aspect_ratio`: "" or "crop"
// (the image processor's own), "pad" (LLaVA-1.5's square padding first; a
// Hugging Face source only: Loom's own models tile dynamically).
struct DataPipeline {
  data::PreprocessOptions preprocess;
  std::unique_ptr<data::Tokenizer> tokenizer;
};
absl::StatusOr<DataPipeline> DataPipelineFor(const PretrainedModel& m, const std::string& tokenizer,
                                             const std::string& chat_template = "",
                                             const std::string& image_aspect_ratio = "");

// The files a Hugging Face directory keeps beside its weights that an export
// copies: the tokenizer's (from tokenizer_dir), the image processor's (from
// image_processor_dir) and generation_config.json (from the LLM's).
struct SideFile {
  std::string from;  // a path
  std::string name;  // the file name in the export
};
std::vector<SideFile> ExportSideFiles(const PretrainedModel& m);

// For a model whose "<image>" Loom added (image_token_added): the export's
// embed_tokens and lm_head get the id's row (the mean of the others, as
// transformers' LLaVA conversion starts it), text_config.vocab_size one
// more, and the tokenizer the token (tokenizer.json's added_tokens,
// tokenizer_config.json's added_tokens_decoder), so that transformers looks
// the id up inside the vocabulary. `files`: file name -> new contents.
absl::Status AddImageTokenToExport(const PretrainedModel& m, std::vector<NamedTensor>* tensors,
                                   std::string* config_json,
                                   std::map<std::string, std::string>* files);

}  // namespace loom::hf

#endif  // LOOM_RUNTIME_HF_PRETRAINED_H_
