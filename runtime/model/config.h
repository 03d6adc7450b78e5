// Model configurations: the ViT encoder, the projector and the LLM, by name.
//
//   tiny            trains in seconds on 2 CPU cores (tests, loom-train-local)
//   tiny-deep       tiny with a 4-layer ViT and a 6-layer LLM (pipeline stages)
//   vit300m-llm1b   ~300M ViT + ~1B LLM, for GPUs
//   vit300m-llm7b   ~300M ViT + ~7B LLM, for GPUs
#ifndef LOOM_RUNTIME_MODEL_CONFIG_H_
#define LOOM_RUNTIME_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/activation/activation.h"

namespace loom {

struct VitConfig {
  int tile_size = 32;  // S: tiles are (3, S, S)
  int patch = 8;       // P: (S/P)² patches per tile
  int dim = 64;
  int layers = 2;
  int heads = 4;
  int mlp_hidden = 256;
  // The Hugging Face vision families (runtime/hf/hf_vision.h) set these;
  // Loom's own configs keep the defaults.
  bool class_token = false;  // CLIP: a learned token before the patches, not in the output
  bool patch_bias = true;    // a bias on the patch embedding (CLIP's has none)
  bool pre_norm = false;     // LayerNorm after the embeddings (CLIP's pre_layrnorm)
  bool final_norm = true;    // LayerNorm after the last layer (LLaVA's features have none)
  kernels::Activation act = kernels::Activation::kGeluTanh;  // the MLP's
  float norm_eps = 1e-5f;                                    // kernels::kLayerNormEps
  // Rows per tile that the caller hands in before the patches (after the
  // class token), not in the output: the generator's timestep and
  // condition tokens (generator.h). 0 for the encoders.
  int prefix = 0;

  int grid() const { return tile_size / patch; }
  int patches_per_tile() const { return grid() * grid(); }
  int patch_dim() const { return 3 * patch * patch; }
  // Rows per tile inside the encoder (and between its pipeline stages): the
  // class token, the prefix and the patches.
  int seq() const { return patches_per_tile() + (class_token ? 1 : 0) + prefix; }
};

struct ProjectorConfig {
  bool pixel_shuffle = false;  // merge 2×2 patches: 4× fewer image tokens
  int hidden = 128;
  kernels::Activation act = kernels::Activation::kGeluTanh;  // LLaVA's: kGeluErf
};

// The modality generator after the LLM (runtime/model/generator.h).
struct GeneratorConfig {
  // The denoiser: tile_size is the output image's side, patch its patches;
  // prefix is set to 1 + queries by the generator.
  VitConfig denoiser;
  int queries = 4;             // Q: LLM query positions per output image
  int cond_dim = 64;           // the LLM's hidden size
  int time_freqs = 32;         // sinusoidal features of the timestep (even)
  float time_scale = 1000.0f;  // t in [0, 1] scaled as DiT's integer steps

  int pixels() const { return 3 * denoiser.tile_size * denoiser.tile_size; }
};

// RoPE frequency scaling (config.json `rope_scaling` / `rope_parameters`).
// kLlama3 (Llama 3.1+): wavelengths above original_max_position_embeddings /
// low_freq_factor are divided by `factor`, those below .../high_freq_factor
// kept, those between interpolated (Hugging Face's _compute_llama3_parameters).
struct RopeScaling {
  enum class Type : uint8_t { kNone, kLlama3 };
  Type type = Type::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 0;
};

struct LlmConfig {
  int vocab = 256;
  int dim = 128;
  int layers = 2;
  int heads = 4;
  int ffn_hidden = 352;
  float rope_theta = 10000.0f;
  int max_seq = 1024;
  // The Hugging Face families (runtime/hf/model_config.h) set these; Loom's
  // own configs keep the defaults.
  int kv_heads = 0;             // key/value heads (grouped-query attention); 0: heads
  int head_dim = 0;             // 0: dim / heads
  float rms_norm_eps = 1e-6f;   // kernels::kRmsNormEps
  bool qkv_bias = false;        // biases on q, k and v (Qwen2)
  bool tie_embeddings = false;  // lm_head is the embedding table (written once)
  RopeScaling rope_scaling;
  // Learned query embeddings for a generator after the LLM (generator.h):
  // Q rows ("gen_queries") fill each output image's Q query positions
  // (token kQueryToken), whose final hidden states condition the generator.
  // 0: no generator.
  int gen_queries = 0;

  int kv() const { return kv_heads > 0 ? kv_heads : heads; }
  int hd() const { return head_dim > 0 ? head_dim : dim / heads; }
  // Rows of the fused q|k|v projection: (heads + 2 kv) * hd.
  int qkv_rows() const { return (heads + 2 * kv()) * hd(); }
};

// The RoPE frequencies of `c` (hd / 2 of them): rope_theta^(-2i/hd), then
// the scaling.
std::vector<float> RopeInvFreq(const LlmConfig& c);

// Weights one LLM layer multiplies each token by (q|k|v, o, gate, up, down):
// its matmul FLOPs per token are twice this.
int64_t LlmLayerWeights(const LlmConfig& c);

struct ModelConfig {
  std::string name;
  VitConfig vit;
  ProjectorConfig projector;
  LlmConfig llm;
  // Used when llm.gen_queries > 0 (its queries equal to them, its cond_dim
  // to llm.dim).
  GeneratorConfig generator;

  bool has_generator() const { return llm.gen_queries > 0; }

  // Image tokens one tile becomes after the projector.
  int tokens_per_tile() const {
    return projector.pixel_shuffle ? vit.patches_per_tile() / 4 : vit.patches_per_tile();
  }
};

// The model's three modules, in checkpoint and seed order.
// The generator comes last, and only in models that have one: the loops
// over kModuleNames that concern every model stop at kModelModules.
enum class Module : int { kEncoder = 0, kProjector = 1, kLlm = 2, kGenerator = 3 };
inline constexpr const char* kModuleNames[] = {"encoder", "projector", "llm", "generator"};
inline constexpr int kModelModules = 3;
// The checkpoint names of the parameter sets, in the same order: the
// generator's module holds two sets (its own tensors, its denoiser's); the
// first kModelModules are every model's.
inline constexpr const char* kCheckpointSets[] = {"encoder", "projector", "llm", "generator",
                                                  "generator_denoiser"};

// The modules that do not train. LLaVA's stage 1 trains the projector alone
// (vision and llm frozen), its stage 2 everything but the vision tower. A
// frozen module computes no weight gradients and keeps no AdamW state
// (ParamSet::Freeze); with the vision tower frozen the encoder runs no
// backward through it; with the projector frozen too (nothing trainable
// before the LLM) the LLM computes no image-embedding gradient at all.
struct Frozen {
  bool vision = false;
  bool projector = false;
  bool llm = false;
  bool generator = false;

  bool module(Module m) const {
    return m == Module::kEncoder     ? vision
           : m == Module::kProjector ? projector
           : m == Module::kLlm       ? llm
                                     : generator;
  }
  bool encoder_side() const { return vision && projector; }
  bool all() const { return vision && projector && llm; }
  bool any() const { return vision || projector || llm; }
};

// "vision,llm" (any of vision, projector, llm, and generator where the model
// has one; "" none) -> Frozen; INVALID_ARGUMENT naming an unknown module,
// or when every module is frozen (nothing would train).
absl::StatusOr<Frozen> ParseFrozen(const std::string& list, bool has_generator = false);

// The generator of a small config for this CPU: 16 × 16 images of 4 × 4
// patches, conditioned on `cond_dim` hidden states at 4 queries.
GeneratorConfig TinyGeneratorConfig(int cond_dim);

// The named config, or NOT_FOUND listing the names.
absl::StatusOr<ModelConfig> ModelConfigByName(const std::string& name);
std::vector<std::string> ModelConfigNames();

// INVALID_ARGUMENT naming the field if the config is inconsistent (a tile not
// divisible by the patch, a dim not divisible by the heads, odd head dims for
// RoPE, an odd patch grid with pixel shuffle, ...).
absl::Status ValidateModelConfig(const ModelConfig& config);

// INVALID_ARGUMENT naming `encoder_tp`, `llm_tp`, `encoder_pp` or `llm_pp`
// when a degree is below 1, a TP degree does not divide what tensor
// parallelism splits (the ViT's heads and MLP width; the LLM's heads, FFN
// width and vocabulary: no padding, so the vocabulary never depends on the
// TP degree), or a module has more pipeline stages than layers.
absl::Status ValidateModelParallel(const ModelConfig& config, int encoder_tp, int encoder_pp,
                                   int llm_tp, int llm_pp);

// A module's pipeline stages: stage s holds layers [bounds[s], bounds[s+1]),
// split to balance per-token matmul FLOPs (parallel::SplitLayers; the LLM's
// head on its last stage, the ViT's patch embedding on its first and the
// projector on its last), and share[s] is stage s's part of those FLOPs
// (summing to 1), which the simulator divides a microbatch's time by.
// Requires 1 <= pp <= layers (ValidateModelParallel).
struct StageSplit {
  std::vector<int> bounds;
  std::vector<double> share;
};
StageSplit LlmStages(const ModelConfig& config, int pp);
StageSplit VitStages(const ModelConfig& config, int pp);

// Parameter counts per module.
int64_t VitParameterCount(const VitConfig& c);
int64_t ProjectorParameterCount(const ModelConfig& c);
int64_t LlmParameterCount(const LlmConfig& c);

}  // namespace loom

#endif  // LOOM_RUNTIME_MODEL_CONFIG_H_
