// The command-line flags that say where a model comes from, shared by
// loom-train-local, loom-preprocess and loom-model: --config NAME (the
// binary's own flag), or --llava DIR, or --llm_from DIR --vision_from DIR
// [--vision_feature_layer N] (runtime/hf/pretrained.h).
#ifndef LOOM_RUNTIME_HF_MODEL_FLAGS_H_
#define LOOM_RUNTIME_HF_MODEL_FLAGS_H_

#include <string>

#include "runtime/hf/pretrained.h"

namespace loom::hf {

// The source the flags name; `config` is the binary's --config.
ModelSource ModelSourceFromFlags(const std::string& config);

// The flags that make `source` (for a child process's command line).
std::vector<std::string> ModelSourceFlags(const ModelSource& source);

}  // namespace loom::hf

#endif  // LOOM_RUNTIME_HF_MODEL_FLAGS_H_
