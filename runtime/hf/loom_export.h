// Loom's own models (runtime/model/config.h's named configs, the generator's
// among them) as a directory of safetensors with a config: what
// `loom-model export --config NAME --checkpoint STEP` writes and
// `loom-model generate --config DIR` reads back. No Hugging Face family
// holds Loom's generator (DistTrain's third module; BAGEL's export is
// unsupported too), so the format is Loom's own, in Hugging Face's shape:
//
//   config.json        {"architectures": ["LoomMultimodalModel"],
//                       "model_type": "loom", "loom_config": NAME,
//                       "torch_dtype": ..., "vision_config": {...},
//                       "projector_config": {...}, "text_config": {...},
//                       "generator_config": {...} (a model with one)}
//                      every field of ModelConfig under its own name
//   model.safetensors  every parameter, named "<set>.<parameter>" by its
//                      checkpoint set (kCheckpointSets: encoder, projector,
//                      llm, generator, generator_denoiser), whole (TP 1),
//                      in the checkpoint's order (or shards and the index,
//                      as save_pretrained cuts them)
#ifndef LOOM_RUNTIME_HF_LOOM_EXPORT_H_
#define LOOM_RUNTIME_HF_LOOM_EXPORT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/hf/hf_params.h"
#include "runtime/model/config.h"
#include "runtime/model/model.h"

namespace loom::hf {

// config.json of `config` (its tensors stored as `torch_dtype`: "bfloat16",
// "float16" or "float32").
std::string LoomConfigJson(const ModelConfig& config, const std::string& torch_dtype);

// The ModelConfig of such a config.json; INVALID_ARGUMENT naming the field
// ("config.json: text_config: dim: ...") when one is missing, of the wrong
// type or out of range, or when the config is inconsistent
// (ValidateModelConfig).
absl::StatusOr<ModelConfig> ParseLoomConfigJson(const std::string& text);

// Every parameter of `model` (one process, TP 1, every stage) under its
// export name, in checkpoint order.
std::vector<NamedTensor> LoomModelTensors(MultimodalModel& model);

// True when `dir` holds a config.json whose model_type is "loom".
bool IsLoomModelDir(const std::string& dir);

// The model of such a directory, every parameter read from its
// safetensors; INVALID_ARGUMENT or NOT_FOUND naming a tensor that is
// missing, of another shape than the config gives, or that the model does
// not have.
absl::StatusOr<std::unique_ptr<MultimodalModel>> OpenLoomModel(const std::string& dir);

}  // namespace loom::hf

#endif  // LOOM_RUNTIME_HF_LOOM_EXPORT_H_
