#include "services/common/job.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <system_error>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "runtime/base/file.h"
#include "runtime/data/datagen.h"
#include "runtime/hf/hf_image.h"
#include "runtime/model/config.h"
#include "runtime/model/generator.h"
#include "runtime/model/ops.h"
#include "runtime/model/precision.h"
#include "runtime/scheduling/assign.h"
#include "runtime/train/lr_schedule.h"

namespace loom {
namespace {

template <typename T>
void Default(T* field, T value) {
  if (*field == T{}) *field = value;
}

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status AtLeast(const std::string& field, int64_t value, int64_t min) {
  if (value >= min) return absl::OkStatus();
  return Bad(field, absl::StrCat("must be >= ", min, ", got ", value));
}

// A named config with a generator (Hugging Face models have none).
bool ModelHasGenerator(const job::v1::JobConfig& job) {
  if (JobModelSource(job).pretrained()) return false;
  absl::StatusOr<ModelConfig> m = ModelConfigByName(job.model());
  return m.ok() && m->has_generator();
}

bool Contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Collects the text-format parser's first error with its line and column.
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (error.empty())
      error = absl::StrCat("line ", line + 1, " column ", column + 1, ": ", message);
  }
  std::string error;
};

}  // namespace

void ApplyJobDefaults(const std::string& run_dir, job::v1::JobConfig* job) {
  Default<std::string>(job->mutable_name(), "loom");
  if (!JobModelSource(*job).pretrained()) Default<std::string>(job->mutable_model(), "tiny");
  if (job->seed() == 0) job->set_seed(1);
  Default<std::string>(job->mutable_algorithm(), "loom");
  job::v1::DataConfig* d = job->mutable_data();
  Default<std::string>(d->mutable_preset(), "onevision");
  if (d->samples() == 0) d->set_samples(512);
  if (d->generated_dir().empty())
    d->set_generated_dir(absl::StrCat(run_dir, "/data/", d->preset()));
  if (d->global_batch() == 0) d->set_global_batch(16);
  if (d->threads() == 0) d->set_threads(2);
  job::v1::ParallelConfig* p = job->mutable_parallel();
  if (p->encoder_dp() == 0) p->set_encoder_dp(2);
  if (p->llm_dp() == 0) p->set_llm_dp(2);
  if (p->microbatches() == 0) p->set_microbatches(2);
  if (p->encoder_tp() == 0) p->set_encoder_tp(1);
  if (p->llm_tp() == 0) p->set_llm_tp(1);
  if (p->encoder_pp() == 0) p->set_encoder_pp(1);
  if (p->llm_pp() == 0) p->set_llm_pp(1);
  if (ModelHasGenerator(*job)) {
    if (p->generator_dp() == 0) p->set_generator_dp(1);
    if (p->generator_tp() == 0) p->set_generator_tp(1);
    if (p->generator_pp() == 0) p->set_generator_pp(1);
    if (!job->train().has_generation_weight()) job->mutable_train()->set_generation_weight(1.0);
  }
  job::v1::TrainConfig* t = job->mutable_train();
  if (!t->has_lr()) t->set_lr(1e-3);
  if (!t->has_warmup_steps() && !t->has_warmup_ratio()) t->set_warmup_steps(10);
  if (t->lr_schedule() == job::v1::LR_SCHEDULE_UNSPECIFIED) {
    t->set_lr_schedule(job::v1::LR_SCHEDULE_CONSTANT);
  }
  if (!t->has_min_lr()) t->set_min_lr(0.0);
  if (!t->has_eps()) t->set_eps(1e-8);
  if (!t->has_clip_norm()) t->set_clip_norm(1.0);
  if (!t->has_weight_decay()) t->set_weight_decay(0.0);
  if (!t->has_beta1()) t->set_beta1(0.9);
  if (!t->has_beta2()) t->set_beta2(0.95);
  if (t->weight_decay_scope() == job::v1::WEIGHT_DECAY_SCOPE_UNSPECIFIED) {
    t->set_weight_decay_scope(job::v1::WEIGHT_DECAY_MATRICES);
  }
  if (!t->has_max_skipped_steps()) t->set_max_skipped_steps(10);
  job::v1::CheckpointConfig* c = job->mutable_checkpoint();
  if (c->dir().empty()) c->set_dir(absl::StrCat(run_dir, "/checkpoints"));
  job::v1::RecoveryConfig* r = job->mutable_recovery();
  if (r->lease_seconds() == 0) r->set_lease_seconds(10);
  if (r->stall_floor_seconds() == 0) r->set_stall_floor_seconds(300);
  if (r->stall_factor() == 0) r->set_stall_factor(10);
  job::v1::DeviceConfig* dev = job->mutable_device();
  Default<std::string>(dev->mutable_encoder(), "cpu");
  Default<std::string>(dev->mutable_llm(), "cpu");
  Default<std::string>(dev->mutable_collectives(), "host");
  Default<std::string>(job->mutable_precision(), "fp32");
  Default<std::string>(job->mutable_recompute()->mutable_encoder(), "full");
  Default<std::string>(job->mutable_recompute()->mutable_llm(), "full");
}

absl::Status ValidateJob(const job::v1::JobConfig& job) {
  absl::StatusOr<hf::PretrainedModel> model = JobModel(job);
  if (!model.ok()) return model.status();
  if (!Contains(sched::AlgorithmNames(), job.algorithm())) {
    return Bad("algorithm", absl::StrCat("unknown algorithm \"", job.algorithm(), "\" (known: ",
                                         absl::StrJoin(sched::AlgorithmNames(), ", "), ")"));
  }
  const job::v1::DataConfig& d = job.data();
  if (!d.shards().empty() && d.sources_size() > 0) {
    return Bad("data.sources", "a mixture in place of data.shards: set one, not both");
  }
  for (int i = 0; i < d.sources_size(); ++i) {
    const job::v1::DataSource& src = d.sources(i);
    const std::string field = absl::StrCat("data.sources[", i, "]");
    if (src.shards().empty() || absl::StrContains(src.shards(), ",")) {
      return Bad(field + ".shards", "a glob without \",\"");
    }
    if (src.has_weight() && !(std::isfinite(src.weight()) && src.weight() > 0)) {
      return Bad(field + ".weight",
                 absl::StrCat("must be a finite number > 0, got ", src.weight()));
    }
  }
  if (const std::string& r = d.image_aspect_ratio(); !r.empty() && r != "crop") {
    hf::ImageProcessor checked;
    if (absl::Status a = hf::SetImageAspectRatio(r, &checked); !a.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("data.", a.message()));
    }
    if (!JobModelSource(job).pretrained()) {
      return Bad("data.image_aspect_ratio",
                 "pad is for a Hugging Face image processor (hf); Loom's own models tile "
                 "each image dynamically");
    }
  }
  if (const job::v1::ValidationConfig& v = d.validation(); !v.shards().empty()) {
    if (v.every() < 1)
      return Bad("data.validation.every", "steps between validations: must be >= 1");
    if (v.samples() < std::max(d.global_batch(), 1)) {
      return Bad("data.validation.samples",
                 absl::StrCat(v.samples(), ": at least one global batch (data.global_batch ",
                              d.global_batch(), ")"));
    }
  } else if (v.every() != 0 || v.samples() != 0) {
    return Bad("data.validation.shards", "missing: the held-out set's shards (a glob)");
  }
  if (JobShards(job).empty() && !Contains(data::DatagenPresets(), d.preset())) {
    return Bad("data.preset", absl::StrCat("unknown preset \"", d.preset(), "\" (known: ",
                                           absl::StrJoin(data::DatagenPresets(), ", "), ")"));
  }
  absl::Status s = AtLeast("data.samples", d.samples(), 1);
  if (s.ok()) s = AtLeast("data.global_batch", d.global_batch(), 1);
  if (s.ok()) s = AtLeast("data.threads", d.threads(), 1);
  const job::v1::ParallelConfig& p = job.parallel();
  if (s.ok()) s = AtLeast("parallel.encoder_dp", p.encoder_dp(), 1);
  if (s.ok()) s = AtLeast("parallel.llm_dp", p.llm_dp(), 1);
  if (s.ok()) s = AtLeast("parallel.microbatches", p.microbatches(), 1);
  if (s.ok()) s = AtLeast("parallel.encoder_max_tokens", p.encoder_max_tokens(), 0);
  if (s.ok()) s = AtLeast("parallel.llm_max_tokens", p.llm_max_tokens(), 0);
  if (!s.ok()) return s;
  if (absl::Status tp = ValidateModelParallel(model->config, p.encoder_tp(), p.encoder_pp(),
                                              p.llm_tp(), p.llm_pp());
      !tp.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("parallel.", tp.message()));
  }
  if (p.colocate()) {
    const int encoder_ranks = p.encoder_tp() * p.encoder_pp() * p.encoder_dp();
    const int first_stage = p.llm_tp() * p.llm_dp();
    if (encoder_ranks != first_stage) {
      return Bad(
          "parallel.colocate",
          absl::StrCat("the encoder's ", encoder_ranks,
                       " ranks (encoder_tp × encoder_pp × encoder_dp) must equal the ", first_stage,
                       " GPUs of the LLM's first stage (llm_tp × llm_dp) they run on"));
    }
  }
  const int64_t bins = static_cast<int64_t>(p.llm_dp()) * p.microbatches();
  if (d.global_batch() < bins) {
    return Bad("data.global_batch", absl::StrCat(d.global_batch(),
                                                 " samples cannot fill parallel.llm_dp × "
                                                 "parallel.microbatches = ",
                                                 bins, " microbatches"));
  }
  const job::v1::TrainConfig& t = job.train();
  if (s.ok()) s = AtLeast("train.steps", t.steps(), 0);
  if (s.ok() && t.has_epochs()) {
    if (t.steps() > 0) return Bad("train.epochs", "in place of train.steps: set one, not both");
    if (!(std::isfinite(t.epochs()) && t.epochs() > 0)) {
      return Bad("train.epochs", absl::StrCat("must be a finite number > 0, got ", t.epochs()));
    }
  }
  if (s.ok()) s = AtLeast("train.warmup_steps", t.warmup_steps(), 0);
  if (s.ok()) s = AtLeast("train.max_skipped_steps", t.max_skipped_steps(), 0);
  if (!s.ok()) return s;
  if (!(t.lr() > 0 && t.lr() < 1))
    return Bad("train.lr", absl::StrCat("must be in (0, 1), got ", t.lr()));
  if (!(t.clip_norm() >= 0)) return Bad("train.clip_norm", "must be >= 0 (0: no clipping)");
  if (!(t.weight_decay() >= 0 && t.weight_decay() < 1)) {
    return Bad("train.weight_decay", "must be in [0, 1)");
  }
  if (!job::v1::WeightDecayScope_IsValid(t.weight_decay_scope())) {
    return Bad("train.weight_decay_scope",
               absl::StrCat("unknown scope ", t.weight_decay_scope(),
                            " (known: WEIGHT_DECAY_MATRICES, WEIGHT_DECAY_ALL)"));
  }
  if (!(t.beta1() >= 0 && t.beta1() < 1)) return Bad("train.beta1", "must be in [0, 1)");
  if (!(t.beta2() >= 0 && t.beta2() < 1)) return Bad("train.beta2", "must be in [0, 1)");
  if (!(t.eps() > 0 && t.eps() < 1)) return Bad("train.eps", "must be in (0, 1)");
  if (t.has_warmup_ratio()) {
    if (t.has_warmup_steps()) {
      return Bad("train.warmup_ratio", "set warmup_steps or warmup_ratio, not both");
    }
    if (!(t.warmup_ratio() >= 0 && t.warmup_ratio() < 1)) {
      return Bad("train.warmup_ratio", absl::StrCat("must be in [0, 1), got ", t.warmup_ratio()));
    }
    if (t.steps() <= 0 && !t.has_epochs()) {
      return Bad("train.warmup_ratio", "a share of train.steps: set steps or epochs");
    }
  }
  if (!job::v1::LrSchedule_IsValid(t.lr_schedule())) {
    return Bad(
        "train.lr_schedule",
        absl::StrCat("unknown schedule ", t.lr_schedule(),
                     " (known: LR_SCHEDULE_CONSTANT, LR_SCHEDULE_COSINE, LR_SCHEDULE_LINEAR)"));
  }
  if (!(t.min_lr() >= 0 && t.min_lr() <= t.lr())) {
    return Bad("train.min_lr", absl::StrCat("must be in [0, lr = ", t.lr(), "], got ", t.min_lr()));
  }
  for (const auto& [name, has, lr] :
       {std::tuple<const char*, bool, double>{"train.encoder_lr", t.has_encoder_lr(),
                                              t.encoder_lr()},
        {"train.projector_lr", t.has_projector_lr(), t.projector_lr()},
        {"train.llm_lr", t.has_llm_lr(), t.llm_lr()},
        {"train.generator_lr", t.has_generator_lr(), t.generator_lr()}}) {
    if (has && !(lr > 0 && lr < 1)) return Bad(name, absl::StrCat("must be in (0, 1), got ", lr));
  }
  LrScheduleOptions schedule = JobTrainOptions(job).Schedule();
  if (t.has_epochs()) schedule.total_steps = 1;  // epochs give at least one step, or are refused
  if (absl::Status l = ValidateLrSchedule(schedule); !l.ok()) {
    return Bad("train.lr_schedule", std::string(l.message()));
  }
  if (!model->config.has_generator() && (p.generator_dp() != 0 || p.generator_tp() != 0 ||
                                         p.generator_pp() != 0 || job.freeze().generator())) {
    return Bad("parallel.generator_dp",
               absl::StrCat("model \"", model->config.name,
                            "\" has no generator: leave generator_dp, generator_tp, "
                            "generator_pp and freeze.generator unset"));
  }
  if (model->config.has_generator()) {
    if (s = AtLeast("parallel.generator_dp", p.generator_dp(), 1); !s.ok()) return s;
    const VitConfig& g = model->config.generator.denoiser;
    if (p.generator_pp() < 1 || p.generator_pp() > std::max(1, g.layers)) {
      return Bad("parallel.generator_pp",
                 absl::StrCat("must be in [1, ", std::max(1, g.layers),
                              "] (the generator's blocks), got ", p.generator_pp()));
    }
    if (p.generator_tp() < 1 || g.heads % p.generator_tp() != 0 ||
        g.mlp_hidden % p.generator_tp() != 0) {
      return Bad("parallel.generator_tp",
                 absl::StrCat(p.generator_tp(), " does not divide the generator's ", g.heads,
                              " heads and ", g.mlp_hidden, " MLP units"));
    }
    if (p.colocate()) {
      return Bad("parallel.colocate", "not with a generator (its ranks are its own)");
    }
    if (!(t.generation_weight() >= 0 && std::isfinite(t.generation_weight()))) {
      return Bad("train.generation_weight",
                 absl::StrCat("must be a finite number >= 0, got ", t.generation_weight()));
    }
  }
  if (absl::Status m = CheckJobMemory(job, model->config); !m.ok()) return m;
  if (const std::string& init = job.init().checkpoint(); !init.empty()) {
    const int sets = model->config.has_generator() ? 5 : kModelModules;
    for (int i = 0; i < sets; ++i) {
      const char* module = kCheckpointSets[i];
      const std::string path = absl::StrCat(init, "/", module, ".ckpt");
      std::error_code error;
      if (!std::filesystem::is_regular_file(path, error)) {
        return Bad("init.checkpoint", absl::StrCat("no ", module, ".ckpt in ", init,
                                                   " (a checkpoint step folder: .../step-N)"));
      }
    }
  }
  if (const Frozen f = JobFrozen(job); f.all() && (!model->config.has_generator() || f.generator)) {
    return Bad("freeze", model->config.has_generator()
                             ? "vision, projector, llm and generator are all frozen: nothing "
                               "would train"
                             : "vision, projector and llm are all frozen: nothing would train");
  }
  if (absl::Status c = AtLeast("checkpoint.every", job.checkpoint().every(), 0); !c.ok()) return c;
  const double lease = job.recovery().lease_seconds();
  if (!(lease >= 0.5 && lease <= 3600)) {
    return Bad("recovery.lease_seconds",
               absl::StrCat("must be in [0.5, 3600] seconds, got ", lease));
  }
  const double floor = job.recovery().stall_floor_seconds();
  if (!(floor >= 0.5 && floor <= 86400)) {
    return Bad("recovery.stall_floor_seconds",
               absl::StrCat("must be in [0.5, 86400] seconds, got ", floor));
  }
  const double factor = job.recovery().stall_factor();
  if (!(factor >= 1 && factor <= 1000)) {
    return Bad("recovery.stall_factor", absl::StrCat("must be in [1, 1000], got ", factor));
  }
  if (const int cap = job.recovery().max_restarts(); cap < 0 || cap > 1000) {
    return Bad("recovery.max_restarts", absl::StrCat("must be in [0, 1000], got ", cap));
  }
  for (const bool enc : {true, false}) {
    absl::StatusOr<int> device = ParseDevice(JobDevice(job, enc));
    if (!device.ok()) {
      return Bad(enc ? "device.encoder" : "device.llm", std::string(device.status().message()));
    }
  }
  if (const std::string& c = job.device().collectives(); c != "host" && c != "nccl") {
    return Bad("device.collectives", absl::StrCat("want host or nccl, got \"", c, "\""));
  }
  if (job.device().collectives() == "nccl" && job.device().encoder() == "cpu" &&
      job.device().llm() == "cpu") {
    return Bad("device.collectives", "nccl reduces device memory: no module is on cuda");
  }
  if (absl::StatusOr<Precision> p = ParsePrecision(job.precision()); !p.ok()) {
    return Bad("precision", std::string(p.status().message()));
  }
  if (absl::StatusOr<Recompute> r = ParseRecompute(job.recompute().encoder()); !r.ok()) {
    return Bad("recompute.encoder", std::string(r.status().message()));
  }
  if (absl::StatusOr<Recompute> r = ParseRecompute(job.recompute().llm()); !r.ok()) {
    return Bad("recompute.llm", std::string(r.status().message()));
  }
  return absl::OkStatus();
}

hf::ModelSource JobModelSource(const job::v1::JobConfig& job) {
  hf::ModelSource s;
  s.config = job.model();
  s.llava = job.hf().llava();
  s.llm_from = job.hf().llm_from();
  s.vision_from = job.hf().vision_from();
  if (job.hf().has_vision_feature_layer()) {
    s.vision_feature_layer = job.hf().vision_feature_layer();
  }
  return s;
}

absl::StatusOr<hf::PretrainedModel> JobModel(const job::v1::JobConfig& job) {
  const hf::ModelSource source = JobModelSource(job);
  if (source.pretrained() && !job.model().empty()) {
    return Bad("model", absl::StrCat("\"", job.model(),
                                     "\" and hf both set: the model is one or the other"));
  }
  if (!source.pretrained() && !ModelConfigByName(job.model()).ok()) {
    return Bad("model", absl::StrCat("unknown model config \"", job.model(),
                                     "\" (known: ", absl::StrJoin(ModelConfigNames(), ", "), ")"));
  }
  absl::StatusOr<hf::PretrainedModel> m = hf::ResolveModel(source);
  if (!m.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source.pretrained() ? "hf." : "model: ", m.status().message()));
  }
  return m;
}

const std::string& JobDevice(const job::v1::JobConfig& job, bool encoder) {
  return encoder ? job.device().encoder() : job.device().llm();
}

Frozen JobFrozen(const job::v1::JobConfig& job) {
  Frozen f;
  f.vision = job.freeze().vision();
  f.projector = job.freeze().projector();
  f.llm = job.freeze().llm();
  f.generator = job.freeze().generator();
  return f;
}

bool JobModuleOnGpu(const job::v1::JobConfig& job, bool encoder) {
  return !absl::StartsWith(JobDevice(job, encoder), "cpu");
}

MemoryEstimate JobStageMemory(const job::v1::JobConfig& job, const ModelConfig& model, bool encoder,
                              int stage, int64_t tokens, int64_t image_tokens, int64_t tiles,
                              int bins, int64_t kept_tiles) {
  const job::v1::ParallelConfig& p = job.parallel();
  const Frozen frozen = JobFrozen(job);
  const int dp = encoder ? p.encoder_dp() : p.llm_dp();
  StageMemoryOptions o;
  o.precision = ParsePrecision(job.precision()).value_or(Precision::kFp32);
  o.tp = std::max(1, encoder ? p.encoder_tp() : p.llm_tp());
  o.optimizer_shards = job.optimizer().shard() ? std::max(1, dp) : 1;
  o.dp = std::max(1, dp);
  o.recompute = ParseRecompute(encoder ? job.recompute().encoder() : job.recompute().llm())
                    .value_or(Recompute::kFull);
  o.sequence_parallel = p.sequence_parallel();
  o.device = JobModuleOnGpu(job, encoder);
  // As the workers place it (services/worker/training_worker.cc).
  o.optimizer_on_device = o.device && (job.device().collectives() == "nccl" || dp <= 1);
  if (encoder) {
    o.frozen = frozen.vision;
    o.projector_frozen = frozen.projector;
    const LayerRange r = VitStageLayers(model, std::max(1, p.encoder_pp()), stage);
    return EncoderStageMemory(model, r.first, r.last, tiles, bins, o, kept_tiles);
  }
  o.frozen = frozen.llm;
  const int pp = std::max(1, p.llm_pp());
  // 1F1B over the encoder's stages and the LLM's keeps stages - s
  // microbatches in flight at combined stage s.
  const int stages = std::max(1, p.encoder_pp()) + pp;
  o.in_flight =
      std::min(std::max(1, p.microbatches()), stages - (std::max(1, p.encoder_pp()) + stage));
  const LayerRange r = LlmStageLayers(model, pp, stage);
  return LlmStageMemory(model.llm, r.first, r.last, tokens, image_tokens, o);
}

MemoryEstimate JobGeneratorMemory(const job::v1::JobConfig& job, const ModelConfig& model,
                                  int64_t images, int bins, int stage) {
  const job::v1::ParallelConfig& p = job.parallel();
  const ModelConfig g = DenoiserAsEncoder(model);
  StageMemoryOptions o;
  o.precision = ParsePrecision(job.precision()).value_or(Precision::kFp32);
  o.tp = std::max(1, p.generator_tp());
  o.dp = std::max(1, p.generator_dp());
  o.optimizer_shards = job.optimizer().shard() ? o.dp : 1;
  o.frozen = job.freeze().generator();
  o.projector_frozen = true;
  o.device = JobModuleOnGpu(job, /*encoder=*/false);
  o.optimizer_on_device = o.device && (job.device().collectives() == "nccl" || o.dp <= 1);
  const int pp = std::max(1, p.generator_pp());
  MemoryEstimate most;
  for (int k = stage < 0 ? 0 : stage; k < (stage < 0 ? pp : stage + 1); ++k) {
    const LayerRange r = GeneratorStageLayers(model.generator, pp, k);
    const MemoryEstimate e = EncoderStageMemory(g, r.first, r.last, images, bins, o, images);
    if (e.total() > most.total()) most = e;
  }
  return most;
}

absl::Status CheckJobMemory(const job::v1::JobConfig& job, const ModelConfig& model) {
  const double gib = job.device().memory_gib();
  if (gib == 0) return absl::OkStatus();
  if (!(std::isfinite(gib) && gib > 0)) {
    return Bad("device.memory_gib", absl::StrCat("must be a number of GiB > 0, got ", gib));
  }
  const job::v1::ParallelConfig& p = job.parallel();
  if (p.llm_max_tokens() <= 0 || p.encoder_max_tokens() <= 0) {
    return Bad("device.memory_gib",
               "the memory check sizes microbatches by parallel.llm_max_tokens and "
               "parallel.encoder_max_tokens: set both");
  }
  const int64_t limit = static_cast<int64_t>(gib * (1ll << 30));
  const int64_t tokens = p.llm_max_tokens();
  const int64_t tiles = std::max<int64_t>(1, p.encoder_max_tokens() / model.vit.patches_per_tile());
  const int64_t image_tokens = std::min(tokens, tiles * model.tokens_per_tile());
  // The assignment spreads the LLM replicas' bins over the encoder replicas.
  const int64_t all_bins = int64_t{p.llm_dp()} * p.microbatches();
  const int bins = static_cast<int>((all_bins + p.encoder_dp() - 1) / p.encoder_dp());
  // Colocated, every encoder rank shares a GPU with a first-stage LLM rank.
  const int64_t shared =
      p.colocate() ? JobStageMemory(job, model, false, 0, tokens, image_tokens, tiles, bins).total()
                   : 0;
  for (bool encoder : {true, false}) {
    const int pp = std::max(1, encoder ? p.encoder_pp() : p.llm_pp());
    for (int stage = 0; stage < pp; ++stage) {
      const MemoryEstimate e =
          JobStageMemory(job, model, encoder, stage, tokens, image_tokens, tiles, bins);
      const int64_t need = e.total() + (encoder ? shared : 0);
      if (need <= limit) continue;
      const LayerRange r =
          encoder ? VitStageLayers(model, pp, stage) : LlmStageLayers(model, pp, stage);
      return absl::ResourceExhaustedError(absl::StrFormat(
          "device.memory_gib: the %s's pipeline stage %d of %d (layers [%d, %d))%s needs %.2f "
          "GiB per device at %s, more than the %.2f GiB of a device (%s)",
          encoder ? "encoder" : "LLM", stage, pp, r.first, r.last,
          encoder && shared > 0 ? " with the LLM's first stage beside it (parallel.colocate)" : "",
          static_cast<double>(need) / (1ll << 30),
          encoder ? absl::StrCat(tiles, " tiles a bin (parallel.encoder_max_tokens)")
                  : absl::StrCat(tokens, " tokens a microbatch (parallel.llm_max_tokens)"),
          gib, e.ToString()));
    }
  }
  if (model.has_generator()) {
    // A bin's query positions are within its LLM tokens: at most
    // llm_max_tokens / queries output images.
    const int64_t images = std::max<int64_t>(1, tokens / std::max(1, model.llm.gen_queries));
    const MemoryEstimate e = JobGeneratorMemory(job, model, images, /*bins=*/1);
    if (e.total() > limit) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "device.memory_gib: a generator rank needs %.2f GiB per device at %d output images a "
          "bin (parallel.llm_max_tokens / %d queries), more than the %.2f GiB of a device (%s)",
          static_cast<double>(e.total()) / (1ll << 30), images, model.llm.gen_queries, gib,
          e.ToString()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<job::v1::JobConfig> ParseJobConfig(const std::string& text,
                                                  const std::string& origin) {
  job::v1::JobConfig job;
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '{') {
    google::protobuf::util::JsonParseOptions options;
    options.ignore_unknown_fields = false;
    auto status = google::protobuf::util::JsonStringToMessage(text, &job, options);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ": invalid job config (JSON): ", std::string(status.message())));
    }
    return job;
  }
  google::protobuf::TextFormat::Parser parser;
  FirstError errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &job)) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": invalid job config (text format): ", errors.error));
  }
  return job;
}

absl::StatusOr<job::v1::JobConfig> LoadJobConfig(const std::string& path,
                                                 const std::string& run_dir) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<job::v1::JobConfig> job = ParseJobConfig(*text, path);
  if (!job.ok()) return job.status();
  ApplyJobDefaults(run_dir, &*job);
  if (absl::Status s = ValidateJob(*job); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  return job;
}

std::string JobToJson(const job::v1::JobConfig& job) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(job, &out, options);
  return out;
}

int ValidationBatches(const job::v1::JobConfig& job) {
  const job::v1::ValidationConfig& v = job.data().validation();
  if (v.shards().empty() || job.data().global_batch() < 1) return 0;
  return v.samples() / job.data().global_batch();
}

std::string JobShards(const job::v1::JobConfig& job) {
  const job::v1::DataConfig& d = job.data();
  if (d.sources_size() == 0) return d.shards();
  std::vector<std::string> parts;
  for (const job::v1::DataSource& src : d.sources()) {
    parts.push_back(absl::StrCat(src.shards(), "=", src.has_weight() ? src.weight() : 1.0));
  }
  return absl::StrJoin(parts, ",");
}

namespace {
// The data a run reads: its globs (a mixture's weights may change on resume).
std::string DataIdentity(const job::v1::DataConfig& d) {
  if (d.sources_size() == 0) {
    return d.shards().empty() ? absl::StrCat(d.preset(), ":", d.samples()) : d.shards();
  }
  std::vector<std::string> globs;
  for (const job::v1::DataSource& src : d.sources()) globs.push_back(src.shards());
  return absl::StrJoin(globs, ",");
}
}  // namespace

std::string JobCheckpointIdentity(const job::v1::JobConfig& job) {
  const job::v1::DataConfig& d = job.data();
  return absl::StrCat(
      "model=", JobModelSource(job).Describe(), " seed=", job.seed(),
      " global_batch=", d.global_batch(), " data=", DataIdentity(d),
      job.init().checkpoint().empty() ? "" : absl::StrCat(" init=", job.init().checkpoint()));
}

TrainOptions JobTrainOptions(const job::v1::JobConfig& job) {
  const job::v1::TrainConfig& t = job.train();
  TrainOptions o;
  o.adam.lr = static_cast<float>(t.lr());
  o.adam.beta1 = static_cast<float>(t.beta1());
  o.adam.beta2 = static_cast<float>(t.beta2());
  o.adam.eps = static_cast<float>(t.has_eps() ? t.eps() : 1e-8);
  o.adam.weight_decay = static_cast<float>(t.weight_decay());
  // UNSPECIFIED (a job not through ApplyJobDefaults) is the default rule.
  o.weight_decay_scope = t.weight_decay_scope() == job::v1::WEIGHT_DECAY_ALL
                             ? WeightDecayScope::kAll
                             : WeightDecayScope::kMatrices;
  o.warmup_steps = t.has_warmup_ratio()
                       ? static_cast<int>(WarmupStepsFromRatio(t.warmup_ratio(), t.steps()))
                       : t.warmup_steps();
  o.clip_norm = t.clip_norm();
  o.lr_schedule = t.lr_schedule() == job::v1::LR_SCHEDULE_COSINE   ? LrSchedule::kCosine
                  : t.lr_schedule() == job::v1::LR_SCHEDULE_LINEAR ? LrSchedule::kLinear
                                                                   : LrSchedule::kConstant;
  o.total_steps = t.steps();
  o.min_lr = t.min_lr();
  o.encoder_lr = t.encoder_lr();
  o.projector_lr = t.projector_lr();
  o.llm_lr = t.llm_lr();
  o.generator_lr = t.generator_lr();
  o.generation_weight = t.has_generation_weight() ? t.generation_weight() : 1.0;
  return o;
}

}  // namespace loom
