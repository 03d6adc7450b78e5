#include "runtime/model/config.h"

#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/parallel/pipeline_schedule.h"

namespace loom {
namespace {

ModelConfig Tiny() {
  ModelConfig c;
  c.name = "tiny";
  return c;  // the defaults in config.h
}

// tiny with more layers, for pipeline stages (LLM PP up to 6, ViT PP up to 4).
ModelConfig TinyDeep() {
  ModelConfig c;
  c.name = "tiny-deep";
  c.vit.layers = 4;
  c.llm.layers = 6;
  return c;
}

// ViT-L/14-like encoder at 336 px tiles (~300M parameters).
VitConfig Vit300M() {
  VitConfig v;
  v.tile_size = 336;
  v.patch = 14;
  v.dim = 1024;
  v.layers = 24;
  v.heads = 16;
  v.mlp_hidden = 4096;
  return v;
}

ModelConfig Vit300MLlm1B() {
  ModelConfig c;
  c.name = "vit300m-llm1b";
  c.vit = Vit300M();
  c.projector = {/*pixel_shuffle=*/true, /*hidden=*/2048};
  c.llm = {/*vocab=*/32000,         /*dim=*/2048,    /*layers=*/16, /*heads=*/16,
           /*ffn_hidden=*/5632,
           /*rope_theta=*/10000.0f, /*max_seq=*/4096};
  return c;
}

ModelConfig Vit300MLlm7B() {
  ModelConfig c;
  c.name = "vit300m-llm7b";
  c.vit = Vit300M();
  c.projector = {/*pixel_shuffle=*/true, /*hidden=*/4096};
  c.llm = {/*vocab=*/32000,         /*dim=*/4096,    /*layers=*/32, /*heads=*/32,
           /*ffn_hidden=*/11008,
           /*rope_theta=*/10000.0f, /*max_seq=*/4096};
  return c;
}

// A 70B-class LLM for planning at cluster scale: Llama-2-70B's width, depth
// and vocabulary with multi-head attention (grouped-query attention comes
// with the Hugging Face model families), the FFN narrowed from 28672 to
// 24576 so that the parameter count stays at ~70B.
ModelConfig Vit300MLlm70B() {
  ModelConfig c;
  c.name = "vit300m-llm70b";
  c.vit = Vit300M();
  c.projector = {/*pixel_shuffle=*/true, /*hidden=*/8192};
  c.llm = {/*vocab=*/32000,         /*dim=*/8192,    /*layers=*/80, /*heads=*/64,
           /*ffn_hidden=*/24576,
           /*rope_theta=*/10000.0f, /*max_seq=*/4096};
  return c;
}

}  // namespace

std::vector<std::string> ModelConfigNames() {
  return {"tiny", "tiny-deep", "vit300m-llm1b", "vit300m-llm7b", "vit300m-llm70b"};
}

absl::StatusOr<ModelConfig> ModelConfigByName(const std::string& name) {
  if (name == "tiny") return Tiny();
  if (name == "tiny-deep") return TinyDeep();
  if (name == "vit300m-llm1b") return Vit300MLlm1B();
  if (name == "vit300m-llm7b") return Vit300MLlm7B();
  if (name == "vit300m-llm70b") return Vit300MLlm70B();
  return absl::NotFoundError(absl::StrCat("unknown model config '", name,
                                          "'; known: ", absl::StrJoin(ModelConfigNames(), ", ")));
}

absl::Status ValidateModelConfig(const ModelConfig& c) {
  auto bad = [](const std::string& field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
  };
  if (c.vit.patch <= 0 || c.vit.tile_size <= 0 || c.vit.tile_size % c.vit.patch != 0) {
    return bad("vit.tile_size", "must be a positive multiple of vit.patch");
  }
  if (c.vit.heads <= 0 || c.vit.dim % c.vit.heads != 0) {
    return bad("vit.dim", "must be divisible by vit.heads");
  }
  if (c.vit.layers < 0 || c.vit.mlp_hidden <= 0) return bad("vit.layers", "must be >= 0");
  if (c.projector.pixel_shuffle && c.vit.grid() % 2 != 0) {
    return bad("projector.pixel_shuffle", "needs an even patch grid (tile_size / patch)");
  }
  if (c.projector.hidden <= 0) return bad("projector.hidden", "must be > 0");
  if (c.llm.heads <= 0 || c.llm.dim % c.llm.heads != 0) {
    return bad("llm.dim", "must be divisible by llm.heads");
  }
  if ((c.llm.dim / c.llm.heads) % 2 != 0) return bad("llm.heads", "head dim must be even (RoPE)");
  if (c.llm.vocab <= 1) return bad("llm.vocab", "must be > 1");
  if (c.llm.layers < 0 || c.llm.ffn_hidden <= 0) return bad("llm.layers", "must be >= 0");
  return absl::OkStatus();
}

absl::Status ValidateModelParallel(const ModelConfig& c, int encoder_tp, int encoder_pp, int llm_tp,
                                   int llm_pp) {
  struct Split {
    const char* field;
    int tp;
    const char* what;
    int n;
  };
  const Split splits[] = {
      {"encoder_tp", encoder_tp, "ViT heads", c.vit.heads},
      {"encoder_tp", encoder_tp, "ViT mlp_hidden", c.vit.mlp_hidden},
      {"llm_tp", llm_tp, "LLM heads", c.llm.heads},
      {"llm_tp", llm_tp, "LLM ffn_hidden", c.llm.ffn_hidden},
      {"llm_tp", llm_tp, "LLM vocab", c.llm.vocab},
  };
  for (const Split& s : splits) {
    if (s.tp < 1) return absl::InvalidArgumentError(absl::StrCat(s.field, ": must be >= 1"));
    if (s.n % s.tp != 0) {
      return absl::InvalidArgumentError(absl::StrCat(s.field, ": ", s.tp, " does not divide the ",
                                                     s.what, " (", s.n, ") of model ", c.name));
    }
  }
  for (auto [field, pp, what, layers] :
       {std::make_tuple("encoder_pp", encoder_pp, "ViT", c.vit.layers),
        std::make_tuple("llm_pp", llm_pp, "LLM", c.llm.layers)}) {
    if (pp < 1) return absl::InvalidArgumentError(absl::StrCat(field, ": must be >= 1"));
    if (pp > layers) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", pp, " stages for the ", what,
                                                     "'s ", layers, " layers of model ", c.name,
                                                     " (each stage holds at least one)"));
    }
  }
  return absl::OkStatus();
}

int64_t VitParameterCount(const VitConfig& c) {
  const int64_t D = c.dim, H = c.mlp_hidden;
  const int64_t block = 2 * D + 2 * D +         // ln1, ln2
                        3 * D * D + 3 * D +     // qkv
                        D * D + D +             // attn out
                        H * D + H + D * H + D;  // mlp
  return c.patch_dim() * D + D + c.patches_per_tile() * D + c.layers * block + 2 * D;
}

int64_t ProjectorParameterCount(const ModelConfig& c) {
  const int64_t in = c.projector.pixel_shuffle ? 4 * c.vit.dim : c.vit.dim;
  const int64_t H = c.projector.hidden, D = c.llm.dim;
  return in * H + H + H * D + D;
}

int64_t LlmParameterCount(const LlmConfig& c) {
  const int64_t D = c.dim, F = c.ffn_hidden;
  const int64_t block = 2 * D + 3 * D * D + D * D + 3 * F * D;
  return static_cast<int64_t>(c.vocab) * D + c.layers * block + D +
         static_cast<int64_t>(c.vocab) * D;
}

namespace {

// Layer boundaries and each stage's share, a layer costing `layer` and the
// first and last stages `first` and `last` more.
StageSplit Split(int layers, int pp, double layer, double first, double last) {
  StageSplit split;
  split.bounds = parallel::SplitLayers(layers, pp, first / layer, last / layer);
  const double total = layers * layer + first + last;
  for (int s = 0; s < pp; ++s) {
    const double cost = (split.bounds[s + 1] - split.bounds[s]) * layer + (s == 0 ? first : 0) +
                        (s == pp - 1 ? last : 0);
    split.share.push_back(cost / total);
  }
  return split;
}

}  // namespace

StageSplit LlmStages(const ModelConfig& config, int pp) {
  const LlmConfig& c = config.llm;
  const double C = c.dim;
  return Split(c.layers, pp, 4 * C * C + 3 * C * c.ffn_hidden, 0, C * c.vocab);
}

StageSplit VitStages(const ModelConfig& config, int pp) {
  const VitConfig& v = config.vit;
  const double D = v.dim;
  const double projector = D * config.projector.hidden + config.projector.hidden * config.llm.dim;
  return Split(v.layers, pp, 4 * D * D + 2 * D * v.mlp_hidden, D * v.patch_dim(), projector);
}

}  // namespace loom
