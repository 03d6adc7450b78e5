#include "runtime/model/model.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/log.h"

namespace loom {

namespace {
constexpr char kSampleMisfitPayload[] = "type.loom.dev/loom.SampleMisfit";
}  // namespace

absl::Status SampleMisfitError(const std::string& message) {
  absl::Status s = absl::FailedPreconditionError(message);
  s.SetPayload(kSampleMisfitPayload, absl::Cord("1"));
  return s;
}

bool IsSampleMisfit(const absl::Status& s) {
  return s.GetPayload(kSampleMisfitPayload).has_value();
}

absl::Status CheckSampleFits(const Sample& sample, int tile_size, bool tokens_only,
                             const ModelConfig& config, const std::string& key) {
  const int s = config.vit.tile_size;
  auto bad = [&](const std::string& what) {
    return SampleMisfitError(
        absl::StrCat("sample ", key, " from loom-preprocess does not fit model ", config.name, ": ",
                     what, " (is loom-preprocess running with --config=", config.name, "?)"));
  };
  if (sample.num_tiles < 0) return bad(absl::StrCat(sample.num_tiles, " tiles"));
  if (sample.num_tiles > 0 && tile_size != s) {
    return bad(absl::StrCat("tiles of ", tile_size, " px; the model takes ", s, " px tiles"));
  }
  const size_t want_floats = tokens_only ? 0 : static_cast<size_t>(sample.num_tiles) * 3 * s * s;
  if (sample.tiles.size() != want_floats) {
    return bad(absl::StrCat(sample.tiles.size(), " tile values for ", sample.num_tiles,
                            " tiles; want ", want_floats));
  }
  if (!sample.loss_mask.empty() && sample.loss_mask.size() != sample.tokens.size()) {
    return bad(
        absl::StrCat(sample.loss_mask.size(), " loss marks for ", sample.tokens.size(), " tokens"));
  }
  int64_t slots = 0;
  for (int32_t t : sample.tokens) {
    if (t == -1) {
      ++slots;
    } else if (t < 0 || t >= config.llm.vocab) {
      return bad(absl::StrCat("token id ", t, " outside the vocabulary of ", config.llm.vocab));
    }
  }
  const int64_t want_slots = static_cast<int64_t>(sample.num_tiles) * config.tokens_per_tile();
  if (slots != want_slots) {
    return bad(absl::StrCat(slots, " image-token slots for ", sample.num_tiles,
                            " tiles; the model has ", config.tokens_per_tile(), " per tile"));
  }
  if (static_cast<int64_t>(sample.tokens.size()) > config.llm.max_seq) {
    return bad(absl::StrCat(sample.tokens.size(), " tokens; the model's longest sequence is ",
                            config.llm.max_seq));
  }
  return absl::OkStatus();
}

namespace {

// Whether predicting token i of `s` carries loss.
bool IsTarget(const Sample& s, size_t i) {
  return s.tokens[i] >= 0 && (s.loss_mask.empty() || s.loss_mask[i] != 0);
}

}  // namespace

int64_t LossTokens(const Sample& s) {
  int64_t n = 0;
  for (size_t i = 1; i < s.tokens.size(); ++i) n += IsTarget(s, i);
  return n;
}

LlmBatch PackSamples(const std::vector<const Sample*>& samples) {
  LlmBatch b;
  b.cu_seqlens.push_back(0);
  for (const Sample* s : samples) {
    const int L = static_cast<int>(s->tokens.size());
    for (int i = 0; i < L; ++i) {
      b.tokens.push_back(s->tokens[i]);
      b.targets.push_back(i + 1 < L && IsTarget(*s, i + 1) ? s->tokens[i + 1] : -1);
      b.positions.push_back(i);
    }
    b.cu_seqlens.push_back(b.cu_seqlens.back() + L);
  }
  return b;
}

namespace {

// The single-process model has no TP group: its modules' calls cannot fail.
void NoGroup(const absl::Status& s) { LOOM_CHECK(s.ok()) << s.message(); }
kernels::LossSum NoGroup(absl::StatusOr<kernels::LossSum> loss) {
  NoGroup(loss.status());
  return *loss;
}

}  // namespace

LayerRange LlmStageLayers(const ModelConfig& config, int pp, int stage) {
  const std::vector<int> b = LlmStages(config, pp).bounds;
  return {b[stage], b[stage + 1]};
}

LayerRange VitStageLayers(const ModelConfig& config, int pp, int stage) {
  const std::vector<int> b = VitStages(config, pp).bounds;
  return {b[stage], b[stage + 1]};
}

MultimodalModel::MultimodalModel(const ModelConfig& config, Ops* ops)
    : config_(config),
      vit_(config.vit, nullptr, {}, ops),
      projector_(config, ops),
      llm_(config.llm, nullptr, {}, ops),
      ops_(ops),
      tiles_(ops->backend()),
      vit_out_(ops->backend()),
      image_emb_(ops->backend()) {}

void MultimodalModel::Place(Precision precision) {
  for (ParamSet* p : param_sets())
    p->Place(ops_->backend(), precision, /*optimizer_on_device=*/true);
}

void MultimodalModel::PushData() {
  for (ParamSet* p : param_sets()) p->PushState();
}

void MultimodalModel::PullState() {
  for (ParamSet* p : param_sets()) p->PullState();
}

void MultimodalModel::PullGrads() {
  for (ParamSet* p : param_sets()) p->PullGrads();
}

void MultimodalModel::Initialize(uint64_t seed) {
  vit_.params().Initialize(ModuleSeed(seed, Module::kEncoder));
  projector_.params().Initialize(ModuleSeed(seed, Module::kProjector));
  llm_.params().Initialize(ModuleSeed(seed, Module::kLlm));
}

void MultimodalModel::Freeze(const Frozen& frozen) {
  frozen_ = frozen;
  for (Module m : {Module::kEncoder, Module::kProjector, Module::kLlm}) {
    if (frozen.module(m)) param_sets()[static_cast<int>(m)]->Freeze();
  }
}

void MultimodalModel::ZeroGrad() {
  for (ParamSet* p : param_sets()) p->ZeroGrad();
}

void MultimodalModel::Forward(const std::vector<const Sample*>& mb) {
  const int S = config_.vit.tile_size, tile_floats = 3 * S * S, Dl = config_.llm.dim;
  host_tiles_.clear();
  num_tiles_ = 0;
  for (const Sample* s : mb) {
    LOOM_CHECK(static_cast<int>(s->tiles.size()) == s->num_tiles * tile_floats)
        << "sample tiles do not match num_tiles";
    host_tiles_.insert(host_tiles_.end(), s->tiles.begin(), s->tiles.end());
    num_tiles_ += s->num_tiles;
  }
  tiles_.CopyFromHost(host_tiles_.data(), host_tiles_.size());
  batch_ = PackSamples(mb);
  const int image_tokens = num_tiles_ * config_.tokens_per_tile();
  LOOM_CHECK(batch_.image_positions() == image_tokens)
      << "image slots (" << batch_.image_positions() << ") != tiles x tokens per tile ("
      << image_tokens << ")";
  image_emb_.resize(static_cast<size_t>(image_tokens) * Dl);
  if (num_tiles_ > 0) {
    vit_out_.resize(static_cast<size_t>(num_tiles_) * config_.vit.patches_per_tile() *
                    config_.vit.dim);
    NoGroup(vit_.Forward(tiles_.data(), num_tiles_, vit_out_.data()));
    projector_.Forward(vit_out_.data(), num_tiles_, image_emb_.data());
  }
  NoGroup(llm_.Forward(batch_, image_emb_.data()));
}

kernels::LossSum MultimodalModel::ForwardBackward(const std::vector<const Sample*>& mb,
                                                  float grad_scale) {
  Forward(mb);
  const bool encoder_backward = num_tiles_ > 0 && !frozen_.encoder_side();
  Buffer<float> dimage(ops_->backend());
  dimage.Zeros(encoder_backward ? image_emb_.size() : 0);
  kernels::LossSum loss =
      NoGroup(llm_.Backward(grad_scale, encoder_backward ? dimage.data() : nullptr));
  if (encoder_backward) {
    Buffer<float> dvit(ops_->backend());
    dvit.Zeros(frozen_.vision ? 0 : vit_out_.size());
    projector_.Backward(dimage.data(), frozen_.vision ? nullptr : dvit.data());
    if (!frozen_.vision) NoGroup(vit_.Backward(dvit.data()));
  }
  return loss;
}

kernels::LossSum MultimodalModel::Evaluate(const std::vector<const Sample*>& mb) {
  Forward(mb);
  return NoGroup(llm_.Loss());
}

}  // namespace loom
