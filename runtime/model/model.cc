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
  int64_t slots = 0, queries = 0;
  for (int32_t t : sample.tokens) {
    if (t == kImageToken) {
      ++slots;
    } else if (t == kQueryToken) {
      if (!config.has_generator()) return bad("query positions (-2); the model has no generator");
      ++queries;
    } else if (t < 0 || t >= config.llm.vocab) {
      return bad(absl::StrCat("token id ", t, " outside the vocabulary of ", config.llm.vocab));
    }
  }
  const int64_t want_slots = static_cast<int64_t>(sample.num_tiles) * config.tokens_per_tile();
  if (slots != want_slots) {
    return bad(absl::StrCat(slots, " image-token slots for ", sample.num_tiles,
                            " tiles; the model has ", config.tokens_per_tile(), " per tile"));
  }
  if (sample.num_gen_images < 0) return bad(absl::StrCat(sample.num_gen_images, " output images"));
  if (!config.has_generator() && (sample.num_gen_images > 0 || !sample.gen_images.empty())) {
    return bad(absl::StrCat(sample.num_gen_images, " output images; the model has no generator"));
  }
  if (config.has_generator()) {
    const int64_t want = static_cast<int64_t>(sample.num_gen_images) * config.llm.gen_queries;
    if (queries != want) {
      return bad(absl::StrCat(queries, " query positions for ", sample.num_gen_images,
                              " output images; the model has ", config.llm.gen_queries,
                              " per image"));
    }
    // Carried or not: only a generator rank receives the pictures.
    const size_t floats = static_cast<size_t>(sample.num_gen_images) * config.generator.pixels();
    if (!sample.gen_images.empty() && sample.gen_images.size() != floats) {
      return bad(absl::StrCat(sample.gen_images.size(), " output image values for ",
                              sample.num_gen_images, " images; want ", floats));
    }
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
      image_emb_(ops->backend()) {
  if (config.has_generator()) gen_ = std::make_unique<Generator>(config.generator, nullptr, ops);
}

namespace {

// Every parameter set a model can have, in param_sets()'s order: its
// module and checkpoint name. The last two only with a generator.
constexpr struct {
  Module module;
  const char* name;
} kParamSets[] = {{Module::kEncoder, kCheckpointSets[0]},
                  {Module::kProjector, kCheckpointSets[1]},
                  {Module::kLlm, kCheckpointSets[2]},
                  {Module::kGenerator, kCheckpointSets[3]},
                  {Module::kGenerator, kCheckpointSets[4]}};

}  // namespace

std::vector<ParamSet*> MultimodalModel::param_sets() {
  std::vector<ParamSet*> sets = {&vit_.params(), &projector_.params(), &llm_.params()};
  if (gen_ != nullptr) sets.insert(sets.end(), {&gen_->params(), &gen_->denoiser_params()});
  return sets;
}

std::vector<Module> MultimodalModel::param_set_modules() const {
  std::vector<Module> m;
  for (size_t i = 0; i < (gen_ != nullptr ? 5 : 3); ++i) m.push_back(kParamSets[i].module);
  return m;
}

std::vector<std::string> MultimodalModel::param_set_names() const {
  std::vector<std::string> n;
  for (size_t i = 0; i < (gen_ != nullptr ? 5 : 3); ++i) n.push_back(kParamSets[i].name);
  return n;
}

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
  if (gen_ != nullptr) {  // one stream: the two sets' names differ
    gen_->params().Initialize(ModuleSeed(seed, Module::kGenerator));
    gen_->denoiser_params().Initialize(ModuleSeed(seed, Module::kGenerator));
  }
}

void MultimodalModel::Freeze(const Frozen& frozen) {
  frozen_ = frozen;
  const std::vector<ParamSet*> sets = param_sets();
  const std::vector<Module> modules = param_set_modules();
  for (size_t i = 0; i < sets.size(); ++i) {
    if (frozen.module(modules[i])) sets[i]->Freeze();
  }
}

void MultimodalModel::ZeroGrad() {
  for (ParamSet* p : param_sets()) p->ZeroGrad();
}

void MultimodalModel::ForwardUnderstanding(const std::vector<const Sample*>& mb) {
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

void MultimodalModel::Forward(const std::vector<const Sample*>& mb) {
  ForwardUnderstanding(mb);
  // The output images after the LLM, their draws from each sample's id.
  gen_loss_sum_ = 0;
  absl::StatusOr<GeneratorBatch> b =
      GenerationBatch(mb, config_.generator.pixels(), draw_seed_, draw_step_);
  LOOM_CHECK(b.ok()) << b.status();
  gen_batch_ = *std::move(b);
  LOOM_CHECK(gen_batch_.N == 0 || gen_ != nullptr)
      << "output images but the model has no generator";
  LOOM_CHECK(batch_.query_positions() == gen_batch_.N * config_.llm.gen_queries)
      << "query positions (" << batch_.query_positions() << ") != output images x queries ("
      << gen_batch_.N << " x " << config_.llm.gen_queries << ")";
  if (gen_batch_.N > 0) {
    NoGroup(gen_->Forward(gen_batch_, llm_.query_states().data()));
    gen_loss_sum_ = gen_->LossSum();
  }
}

absl::StatusOr<GeneratorBatch> GenerationBatch(const std::vector<const Sample*>& samples,
                                               int pixels, uint64_t seed, int64_t step) {
  GeneratorBatch batch;
  for (size_t k = 0; k < samples.size(); ++k) {
    const Sample& s = *samples[k];
    if (s.num_gen_images == 0) continue;
    if (s.gen_images.size() != static_cast<size_t>(s.num_gen_images) * pixels) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample ", k, " (id ", s.id, ") holds ", s.gen_images.size(),
                       " output image values for ", s.num_gen_images, " images"));
    }
    batch.images.insert(batch.images.end(), s.gen_images.begin(), s.gen_images.end());
    for (int j = 0; j < s.num_gen_images; ++j) {
      GenerationDraw d = DrawGeneration(seed, step, s.id, j, pixels);
      batch.t.push_back(d.t);
      batch.noise.insert(batch.noise.end(), d.noise.begin(), d.noise.end());
    }
    batch.N += s.num_gen_images;
  }
  return batch;
}

kernels::LossSum MultimodalModel::ForwardBackward(const std::vector<const Sample*>& mb,
                                                  float grad_scale, float generation_scale) {
  Forward(mb);
  const bool encoder_backward = num_tiles_ > 0 && !frozen_.encoder_side();
  // The generator first: its conditions' gradient joins the LLM's at the
  // query rows (wanted where anything before the generator trains).
  Buffer<float> dquery(ops_->backend());
  const bool upstream = !frozen_.llm || !frozen_.encoder_side();
  if (gen_batch_.N > 0 && (upstream || !frozen_.generator)) {
    dquery.Zeros(upstream ? llm_.query_states().size() : 0);
    NoGroup(gen_->Backward(generation_scale, upstream ? dquery.data() : nullptr));
  }
  Buffer<float> dimage(ops_->backend());
  dimage.Zeros(encoder_backward ? image_emb_.size() : 0);
  kernels::LossSum loss =
      NoGroup(llm_.Backward(grad_scale, encoder_backward ? dimage.data() : nullptr, nullptr,
                            nullptr, dquery.empty() ? nullptr : dquery.data()));
  if (encoder_backward) {
    Buffer<float> dvit(ops_->backend());
    dvit.Zeros(frozen_.vision ? 0 : vit_out_.size());
    projector_.Backward(dimage.data(), frozen_.vision ? nullptr : dvit.data());
    if (!frozen_.vision) NoGroup(vit_.Backward(dvit.data()));
  }
  return loss;
}

absl::StatusOr<std::vector<float>> MultimodalModel::GenerateImages(const Sample& prompt,
                                                                   int euler_steps, uint64_t seed) {
  if (gen_ == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", config_.name, " has no generator to draw images with"));
  }
  const int Q = config_.llm.gen_queries;
  int queries = 0;
  for (int32_t t : prompt.tokens) queries += t == kQueryToken;
  if (queries == 0 || queries % Q != 0 || prompt.num_gen_images != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a prompt to draw from has ", Q, " query positions (", kQueryToken,
                     ") per image and no output images; this one has ", queries, " and ",
                     prompt.num_gen_images));
  }
  Sample as_trained = prompt;  // checked as a sample with those images to draw
  as_trained.num_gen_images = queries / Q;
  as_trained.gen_images.assign(static_cast<size_t>(queries / Q) * config_.generator.pixels(), 0.0f);
  if (absl::Status s = CheckSampleFits(as_trained, config_.vit.tile_size, false, config_, "prompt");
      !s.ok()) {
    return s;
  }
  ForwardUnderstanding({&prompt});
  return gen_->Sample(llm_.query_states().data(), queries / Q, euler_steps, seed);
}

kernels::LossSum MultimodalModel::Evaluate(const std::vector<const Sample*>& mb) {
  Forward(mb);
  return NoGroup(llm_.Loss());
}

}  // namespace loom
