// Which parameters AdamW's decoupled weight decay shrinks, in one place.
//
// The default rule (WeightDecayScope::kMatrices), decided per tensor from its
// master shape and its name alone, so every TP rank and pipeline stage of a
// module decides alike:
//   - decays: the weight matrices of linear and convolution layers (2+ master
//     dimensions): attention q|k|v and output projections, MLP weights, the
//     projector's fc1/fc2, the ViT's patch embedding (a convolution stored as
//     a matrix), the LLM's untied lm_head;
//   - never: 1-D tensors (norm weights, every bias, CLIP's cls_token) and the
//     embedding tables named in kNoDecayEmbeddings (the LLM's token table
//     "wte", and with it a head tied to it; the ViT's "pos_embed"; the
//     LLM's learned generator queries "gen_queries").
// Norms and biases are what the Hugging Face Trainer (and so LLaVA's
// recipes) and Megatron-LM exclude; the embeddings are excluded as minGPT
// (nn.Embedding) and timm (pos_embed, cls_token) do. kAll is the old
// behaviour: every tensor decays.
#ifndef LOOM_RUNTIME_TRAIN_WEIGHT_DECAY_H_
#define LOOM_RUNTIME_TRAIN_WEIGHT_DECAY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/params.h"

namespace loom {

enum class WeightDecayScope : uint8_t {
  kMatrices,  // the rule above (the default)
  kAll,       // every tensor
};

// "matrices" / "all", and back (flags, logs).
const char* WeightDecayScopeName(WeightDecayScope scope);
absl::StatusOr<WeightDecayScope> ParseWeightDecayScope(const std::string& name);

// Embedding tables that never decay under kMatrices, by parameter name (a
// module's own names: runtime/model/{vit,llm}.cc, which Hugging Face imports
// map onto).
inline constexpr const char* kNoDecayEmbeddings[] = {"wte", "pos_embed", "cls_token",
                                                     "gen_queries"};

// Whether `spec` decays under `scope`: the rule above. Uses the master shape
// and the name only, never the slice.
bool Decays(const ParamSpec& spec, WeightDecayScope scope);

// A run of consecutive tensors of a ParamSet that decay alike, in elements of
// its flat buffers.
struct DecayRun {
  int64_t offset = 0;
  int64_t numel = 0;
  bool decay = false;
};
// `set`'s tensors as the fewest such runs, in buffer order, covering
// [0, set.size()): the optimizer steps each run with or without the decay.
std::vector<DecayRun> DecayRuns(const ParamSet& set, WeightDecayScope scope);

}  // namespace loom

#endif  // LOOM_RUNTIME_TRAIN_WEIGHT_DECAY_H_
