#include "runtime/model/config.h"

#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/rope/rope.h"
#include "runtime/parallel/pipeline_schedule.h"

namespace loom {
namespace {

ModelConfig Tiny() {
  ModelConfig c;
  c.name = "tiny";
  return c;  // the defaults in config.h
}

// tiny with a generator after the LLM (4 query positions per output image,
// 16 × 16 output images): text → image beside image → text.
ModelConfig TinyGen() {
  ModelConfig c;
  c.name = "tiny-gen";
  c.llm.gen_queries = 4;
  c.generator = TinyGeneratorConfig(c.llm.dim);
  return c;
}

// tiny with more layers, for pipeline stages (LLM PP up to 6, ViT PP up to 4).
ModelConfig TinyDeep() {
  ModelConfig c;
  c.name = "tiny-deep";
  c.vit.layers = 4;
  c.llm.layers = 6;
  return c;
}

// The LLaVA shape at a size a CPU trains in seconds a step, with a real
// vocabulary (its logits are a large part of the LLM's memory): a
// ViT-S-like tower on 64 px tiles (~11M) and a 4-layer LLM (~46M), for
// measurements on the CPU (the memory model's, docs/figures.md).
ModelConfig Vit10MLlm45M() {
  ModelConfig c;
  c.name = "vit10m-llm45m";
  c.vit = {/*tile_size=*/64,   /*patch=*/8, /*dim=*/384, /*layers=*/6, /*heads=*/6,
           /*mlp_hidden=*/1536};
  c.projector = {/*pixel_shuffle=*/false, /*hidden=*/512};
  c.llm = {/*vocab=*/32000,         /*dim=*/512,     /*layers=*/4, /*heads=*/8,
           /*ffn_hidden=*/1408,
           /*rope_theta=*/10000.0f, /*max_seq=*/4096};
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

// `c` with a generator at the scale MetaQuery and BLIP3-o attach to an
// LLM: a denoiser of DiT-XL's depth and width (28 layers, 1152; ~450M
// parameters, conditioned in context where DiT's adaLN adds ~225M) over
// 256 x 256 output images in 16 x 16 pixel patches, conditioned on 64 query
// positions. For planning and scheduling.
ModelConfig WithGenerator(ModelConfig c) {
  c.name += "-gen";
  c.llm.gen_queries = 64;
  GeneratorConfig& g = c.generator;
  g.denoiser.tile_size = 256;
  g.denoiser.patch = 16;
  g.denoiser.dim = 1152;
  g.denoiser.layers = 28;
  g.denoiser.heads = 16;
  g.denoiser.mlp_hidden = 4608;
  g.queries = 64;
  g.cond_dim = c.llm.dim;
  g.time_freqs = 256;
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
  return {
      "tiny",          "tiny-deep",         "tiny-gen",       "vit10m-llm45m",     "vit300m-llm1b",
      "vit300m-llm7b", "vit300m-llm7b-gen", "vit300m-llm70b", "vit300m-llm70b-gen"};
}

absl::StatusOr<Frozen> ParseFrozen(const std::string& list, bool has_generator) {
  Frozen f;
  for (absl::string_view m : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    m = absl::StripAsciiWhitespace(m);
    bool* flag = m == "vision"                       ? &f.vision
                 : m == "projector"                  ? &f.projector
                 : m == "llm"                        ? &f.llm
                 : m == "generator" && has_generator ? &f.generator
                                                     : nullptr;
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown module \"", m,
                                                     "\" (modules: vision, projector, llm",
                                                     has_generator ? ", generator" : "", ")"));
    }
    *flag = true;
  }
  if (f.all() && (!has_generator || f.generator)) {
    return absl::InvalidArgumentError(has_generator
                                          ? "vision, projector, llm and generator all frozen: "
                                            "nothing would train"
                                          : "vision, projector and llm all frozen: nothing would "
                                            "train");
  }
  return f;
}

GeneratorConfig TinyGeneratorConfig(int cond_dim) {
  GeneratorConfig g;
  g.denoiser.tile_size = 16;
  g.denoiser.patch = 4;
  g.denoiser.dim = 64;
  g.denoiser.layers = 2;
  g.denoiser.heads = 4;
  g.denoiser.mlp_hidden = 256;
  g.queries = 4;
  g.cond_dim = cond_dim;
  g.time_freqs = 32;
  return g;
}

absl::StatusOr<ModelConfig> ModelConfigByName(const std::string& name) {
  if (name == "tiny") return Tiny();
  if (name == "tiny-deep") return TinyDeep();
  if (name == "tiny-gen") return TinyGen();
  if (name == "vit10m-llm45m") return Vit10MLlm45M();
  if (name == "vit300m-llm1b") return Vit300MLlm1B();
  if (name == "vit300m-llm7b") return Vit300MLlm7B();
  if (name == "vit300m-llm7b-gen") return WithGenerator(Vit300MLlm7B());
  if (name == "vit300m-llm70b") return Vit300MLlm70B();
  if (name == "vit300m-llm70b-gen") return WithGenerator(Vit300MLlm70B());
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
  if (!(c.vit.norm_eps > 0)) return bad("vit.norm_eps", "must be > 0");
  if (c.projector.pixel_shuffle && c.vit.grid() % 2 != 0) {
    return bad("projector.pixel_shuffle", "needs an even patch grid (tile_size / patch)");
  }
  if (c.projector.hidden <= 0) return bad("projector.hidden", "must be > 0");
  const LlmConfig& l = c.llm;
  if (l.heads <= 0) return bad("llm.heads", "must be > 0");
  if (l.head_dim < 0 || (l.head_dim == 0 && l.dim % l.heads != 0)) {
    return bad("llm.dim", "must be divisible by llm.heads (or give llm.head_dim)");
  }
  if (l.hd() % 2 != 0) return bad("llm.head_dim", "must be even (RoPE)");
  if (l.kv_heads < 0 || l.heads % l.kv() != 0) {
    return bad("llm.kv_heads", absl::StrCat(l.kv(), " does not divide the ", l.heads, " heads"));
  }
  if (!(l.rms_norm_eps > 0)) return bad("llm.rms_norm_eps", "must be > 0");
  if (!(l.rope_theta > 0)) return bad("llm.rope_theta", "must be > 0");
  if (l.rope_scaling.type == RopeScaling::Type::kLlama3 &&
      (!(l.rope_scaling.factor >= 1) || l.rope_scaling.original_max_position_embeddings <= 0 ||
       !(l.rope_scaling.high_freq_factor > l.rope_scaling.low_freq_factor) ||
       !(l.rope_scaling.low_freq_factor > 0))) {
    return bad("llm.rope_scaling",
               "llama3 needs factor >= 1, original_max_position_embeddings > 0 "
               "and high_freq_factor > low_freq_factor > 0");
  }
  if (c.llm.vocab <= 1) return bad("llm.vocab", "must be > 1");
  if (c.llm.layers < 0 || c.llm.ffn_hidden <= 0) return bad("llm.layers", "must be >= 0");
  if (c.llm.gen_queries < 0) return bad("llm.gen_queries", "must be >= 0");
  if (c.has_generator()) {
    const GeneratorConfig& g = c.generator;
    const VitConfig& d = g.denoiser;
    if (g.queries != c.llm.gen_queries) {
      return bad("generator.queries",
                 absl::StrCat(g.queries, " but llm.gen_queries is ", c.llm.gen_queries));
    }
    if (g.cond_dim != c.llm.dim) {
      return bad("generator.cond_dim", absl::StrCat(g.cond_dim, " but llm.dim is ", c.llm.dim));
    }
    if (d.patch <= 0 || d.tile_size <= 0 || d.tile_size % d.patch != 0) {
      return bad("generator.denoiser.tile_size", "must be a positive multiple of its patch");
    }
    if (d.heads <= 0 || d.dim % d.heads != 0) {
      return bad("generator.denoiser.dim", "must be divisible by its heads");
    }
    if (d.layers < 0 || d.mlp_hidden <= 0) {
      return bad("generator.denoiser.layers", "must be >= 0");
    }
    if (g.time_freqs < 2 || g.time_freqs % 2 != 0) {
      return bad("generator.time_freqs", "must be even and >= 2");
    }
  }
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
      {"llm_tp", llm_tp, "LLM key/value heads", c.llm.kv()},
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
    if (c.llm.tie_embeddings && pp > 1 && std::string(field) == "llm_pp") {
      return absl::InvalidArgumentError(absl::StrCat(
          "llm_pp: ", pp, " stages, but model ", c.name,
          " ties lm_head to the embedding table, which both ends of the pipeline would need; "
          "tied models train with llm_pp 1 for now"));
    }
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
  return c.patch_dim() * D + (c.patch_bias ? D : 0) + c.seq() * D + (c.class_token ? D : 0) +
         (c.pre_norm ? 2 * D : 0) + c.layers * block + (c.final_norm ? 2 * D : 0);
}

int64_t ProjectorParameterCount(const ModelConfig& c) {
  const int64_t in = c.projector.pixel_shuffle ? 4 * c.vit.dim : c.vit.dim;
  const int64_t H = c.projector.hidden, D = c.llm.dim;
  return in * H + H + H * D + D;
}

int64_t LlmLayerWeights(const LlmConfig& c) {
  const int64_t D = c.dim, F = c.ffn_hidden, A = static_cast<int64_t>(c.heads) * c.hd();
  return static_cast<int64_t>(c.qkv_rows()) * D + A * D + 3 * F * D;
}

int64_t LlmParameterCount(const LlmConfig& c) {
  const int64_t D = c.dim, table = static_cast<int64_t>(c.vocab) * D;
  const int64_t block = 2 * D + LlmLayerWeights(c) + (c.qkv_bias ? c.qkv_rows() : 0);
  return table + c.layers * block + D + (c.tie_embeddings ? 0 : table) +
         static_cast<int64_t>(c.gen_queries) * D;
}

std::vector<float> RopeInvFreq(const LlmConfig& c) {
  std::vector<float> f(c.hd() / 2);
  kernels::rope_inv_freq(f.data(), c.hd(), c.rope_theta);
  const RopeScaling& s = c.rope_scaling;
  if (s.type != RopeScaling::Type::kLlama3) return f;
  const double old_len = s.original_max_position_embeddings;
  const double low_wavelen = old_len / s.low_freq_factor;
  const double high_wavelen = old_len / s.high_freq_factor;
  for (float& x : f) {
    const double wavelen = 2 * M_PI / x;
    if (wavelen > low_wavelen) {
      x = static_cast<float>(x / s.factor);
    } else if (wavelen >= high_wavelen) {
      const double smooth =
          (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      x = static_cast<float>((1 - smooth) * x / s.factor + smooth * x);
    }
  }
  return f;
}

namespace {

// Layer boundaries and each stage's share, a layer costing `layer` and the
// first and last stages `first` and `last` more. Remembered per argument
// set: the plan search prices a layout's memory millions of times over a
// few splits, and SplitLayers' dynamic programme is O(pp × layers²).
StageSplit Split(int layers, int pp, double layer, double first, double last) {
  using Key = std::tuple<int, int, double, double, double>;
  static std::mutex mu;
  static std::map<Key, StageSplit>* const known = new std::map<Key, StageSplit>();
  const Key key{layers, pp, layer, first, last};
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = known->find(key); it != known->end()) return it->second;
  }
  StageSplit split;
  split.bounds = parallel::SplitLayers(layers, pp, first / layer, last / layer);
  const double total = layers * layer + first + last;
  for (int s = 0; s < pp; ++s) {
    const double cost = (split.bounds[s + 1] - split.bounds[s]) * layer + (s == 0 ? first : 0) +
                        (s == pp - 1 ? last : 0);
    split.share.push_back(cost / total);
  }
  std::lock_guard<std::mutex> lock(mu);
  return known->emplace(key, std::move(split)).first->second;
}

}  // namespace

StageSplit LlmStages(const ModelConfig& config, int pp) {
  const LlmConfig& c = config.llm;
  return Split(c.layers, pp, static_cast<double>(LlmLayerWeights(c)), 0, 1.0 * c.dim * c.vocab);
}

StageSplit VitStages(const ModelConfig& config, int pp) {
  const VitConfig& v = config.vit;
  const double D = v.dim;
  const double projector = D * config.projector.hidden + config.projector.hidden * config.llm.dim;
  return Split(v.layers, pp, 4 * D * D + 2 * D * v.mlp_hidden, D * v.patch_dim(), projector);
}

}  // namespace loom
