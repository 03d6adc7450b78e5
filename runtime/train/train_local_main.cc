// loom-train-local: trains the multimodal model in one process and prints
// one JSON line per step:
//   {"step":1,"loss":3.21,"samples":16,"tokens":384,"step_seconds":0.05}
//
//   loom-train-local --config tiny --steps 200 --seed 1
//   loom-train-local --config tiny-gen --steps 200   # with a generator: text → image too
//   loom-train-local --config tiny --steps 200 --seed 1 --shuffle_images   # control
//   loom-train-local --config tiny --steps 200 --shards 'data/onevision/*.tar'
//   loom-train-local --config tiny --steps 200 --freeze vision,llm     # the projector alone
//   loom-train-local --config tiny --init_checkpoint ckpt/step-200 --freeze vision   # then the
//   rest
//   loom-train-local --llava DIR --shards 'data/*.tar' --freeze vision,llm   # Hugging Face
//   loom-train-local --llm_from LLM_DIR --vision_from CLIP_DIR --shards ... --freeze vision,llm
//
// Without --shards the data is the in-memory SyntheticCaptions; with it,
// samples come from WebDataset shards through the preprocessing pipeline
// (runtime/data), shuffled by --seed, and checkpoints also hold the data
// cursor (step-N/data_cursor.binpb) so a resumed run continues with exactly
// the next sample.
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "runtime/backends/cuda/cuda_ops.h"
#include "runtime/base/file.h"
#include "runtime/base/json_line.h"
#include "runtime/base/open_files.h"
#include "runtime/data/loader.h"
#include "runtime/hf/model_flags.h"
#include "runtime/hf/pretrained.h"
#include "runtime/model/config.h"
#include "runtime/model/model.h"
#include "runtime/train/synthetic_data.h"
#include "runtime/train/train_checkpoint.h"
#include "runtime/train/trainer.h"
#include "runtime/train/weight_decay.h"

ABSL_FLAG(std::string, config, "tiny",
          "Model config: tiny, tiny-deep, tiny-gen (with a generator), vit10m-llm45m, "
          "vit300m-llm1b, vit300m-llm7b, vit300m-llm70b.");
ABSL_FLAG(int, steps, 100, "Train until this many optimizer steps have been taken.");
ABSL_FLAG(double, epochs, 0,
          "With --shards, in place of --steps: train floor(epochs x samples / --batch_size) "
          "steps, the samples of every source together (0: --steps).");
ABSL_FLAG(std::string, device, "cpu",
          "Where the layers run: cpu, or cuda / cuda:N (a GPU; the optimizer steps on the host "
          "copies of the weights for now).");
ABSL_FLAG(std::string, precision, "fp32",
          "fp32, or bf16: bf16 mixed precision (bf16 GEMM operands and stored activations, fp32 "
          "masters, AdamW state, norms and loss; runtime/model/precision.h).");
ABSL_FLAG(std::string, encoder_recompute, "full",
          "full, none or selective (runtime/model/precision.h Recompute): selective computes "
          "the ViT's LayerNorm and GELU outputs again in backward (one process has no pipeline, "
          "so full and none keep every activation alike).");
ABSL_FLAG(std::string, llm_recompute, "full",
          "full, none or selective: as --encoder_recompute, for the LLM's RMSNorm and SwiGLU "
          "outputs.");
ABSL_FLAG(uint64_t, seed, 1, "Seed for the weights and the data.");
ABSL_FLAG(bool, shuffle_images, false,
          "Pair each caption with another sample's image (the control run).");
ABSL_FLAG(int, batch_size, 16, "Samples per global batch.");
ABSL_FLAG(int, microbatches, 2, "Microbatches per global batch.");
ABSL_FLAG(double, lr, 1e-3, "Peak AdamW learning rate.");
ABSL_FLAG(int, warmup_steps, 10, "Linear learning-rate warm-up steps.");
ABSL_FLAG(double, warmup_ratio, -1,
          "The warm-up as a share of --steps (ceil(ratio x steps)), in place of --warmup_steps "
          "(the job config's train.warmup_ratio); < 0: unset.");
ABSL_FLAG(std::string, lr_schedule, "constant",
          "After the warm-up: constant, cosine or linear (a decay to --min_lr at --steps; "
          "runtime/train/lr_schedule.h).");
ABSL_FLAG(double, min_lr, 0, "Where a decay ends (<= --lr).");
ABSL_FLAG(double, adam_eps, 1e-8, "AdamW's epsilon.");
ABSL_FLAG(double, encoder_lr, 0, "The vision encoder's peak learning rate (0: --lr).");
ABSL_FLAG(double, projector_lr, 0, "The projector's peak learning rate (0: --lr).");
ABSL_FLAG(double, llm_lr, 0, "The LLM's peak learning rate (0: --lr).");
ABSL_FLAG(double, clip_norm, 1.0, "Global gradient-norm clip; <= 0 disables.");
ABSL_FLAG(int, max_skipped_steps, 10,
          "Steps with a non-finite loss or gradient norm are skipped (no optimizer step) up to "
          "this many times; the next one ends the run: \"loss diverged at step N\" (the job "
          "config's train.max_skipped_steps).");
ABSL_FLAG(double, weight_decay, 0.0, "AdamW decoupled weight decay.");
ABSL_FLAG(std::string, weight_decay_scope, "matrices",
          "Which tensors --weight_decay shrinks: matrices (the weight matrices; never norms, "
          "biases or embeddings) or all (runtime/train/weight_decay.h).");
ABSL_FLAG(std::string, checkpoint_dir, "", "Folder for checkpoints (DIR/step-N/...).");
ABSL_FLAG(int, checkpoint_every, 0, "Save a checkpoint every K steps (0: never).");
ABSL_FLAG(bool, resume, false, "Continue from the last complete checkpoint in --checkpoint_dir.");
ABSL_FLAG(std::string, shards, "",
          "Train from these WebDataset shards instead: a glob, or a mixture "
          "'GLOB=WEIGHT,GLOB=WEIGHT' (each draw from a source with probability weight / sum).");
ABSL_FLAG(std::string, tokenizer, "",
          "sentencepiece model or tokenizer.json directory for --shards (default: the model's "
          "own).");
ABSL_FLAG(int, data_threads, 2, "Preprocessing threads for --shards.");
ABSL_FLAG(std::string, chat_template, "",
          "How conversations in --shards become text: plain, vicuna_v1, chatml, llama3 or a "
          "Jinja file (default: the tokenizer's own chat_template, else vicuna_v1).");
ABSL_FLAG(std::string, validation_shards, "",
          "A held-out set (a glob): its first --validation_samples samples, in whole batches of "
          "--batch_size and read in order, give a validation loss every --validation_every "
          "steps (the job config's data.validation).");
ABSL_FLAG(int, validation_samples, 0, "Samples in the held-out set (whole batches).");
ABSL_FLAG(int, validation_every, 0, "Steps between validation losses.");
ABSL_FLAG(std::string, image_aspect_ratio, "",
          "A Hugging Face image processor's images: crop (its own) or pad (LLaVA-1.5's square "
          "padding with the mean colour first).");
ABSL_FLAG(std::string, init_checkpoint, "",
          "Start from the weights of this checkpoint step folder (DIR/step-N) instead of the "
          "seed's, with fresh optimizer state (LLaVA's stage 2 from stage 1).");
ABSL_FLAG(std::string, freeze, "",
          "Modules that do not train, comma-separated: vision, projector, llm, and generator in a "
          "model with one (LLaVA's stage 1: vision,llm; MetaQuery's: vision,projector,llm).");
ABSL_FLAG(double, generation_weight, 1.0,
          "A model with a generator: λ in loss = LM loss + λ · generation loss.");
ABSL_FLAG(double, generator_lr, 0, "The generator's peak learning rate (0: --lr's).");

namespace {
int Fail(const std::string& what) {
  std::fprintf(stderr, "loom-train-local: %s\n", what.c_str());
  return 1;
}
std::string CursorPath(const std::string& dir, int64_t step) {
  return loom::StepDir(dir, step) + "/" + loom::kDataCursorFile;
}
}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("loom-train-local: single-process multimodal training.");
  absl::ParseCommandLine(argc, argv);
  loom::RaiseOpenFileLimit();  // as every Loom service does (InitService)
  const loom::hf::ModelSource source = loom::hf::ModelSourceFromFlags(absl::GetFlag(FLAGS_config));
  absl::StatusOr<loom::hf::PretrainedModel> pretrained = loom::hf::ResolveModel(source);
  if (!pretrained.ok()) {
    return Fail((source.pretrained() ? "--" : "--config: ") +
                std::string(pretrained.status().message()));
  }
  const loom::ModelConfig* config = &pretrained->config;
  int steps = absl::GetFlag(FLAGS_steps);
  const int batch = absl::GetFlag(FLAGS_batch_size);
  const double epochs = absl::GetFlag(FLAGS_epochs);
  if (!(epochs >= 0) || (epochs > 0 && absl::GetFlag(FLAGS_shards).empty())) {
    return Fail("--epochs: a number >= 0, and it needs --shards");
  }
  if (steps < 0 || batch < 1 || absl::GetFlag(FLAGS_microbatches) < 1) {
    std::fprintf(stderr,
                 "loom-train-local: --steps >= 0, --batch_size >= 1, --microbatches >= 1\n");
    return 1;
  }
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  absl::StatusOr<loom::Frozen> frozen =
      loom::ParseFrozen(absl::GetFlag(FLAGS_freeze), config->has_generator());
  if (!frozen.ok()) return Fail("--freeze: " + std::string(frozen.status().message()));
  std::unique_ptr<loom::Ops> gpu;
  const std::string device = absl::GetFlag(FLAGS_device);
  absl::StatusOr<loom::Ops*> ops = loom::OpsForDevice(device, &gpu);
  if (!ops.ok()) return Fail("--device " + device + ": " + std::string(ops.status().message()));
  absl::StatusOr<loom::Precision> precision = loom::ParsePrecision(absl::GetFlag(FLAGS_precision));
  if (!precision.ok()) return Fail("--precision: " + std::string(precision.status().message()));
  absl::StatusOr<loom::Recompute> encoder_recompute =
      loom::ParseRecompute(absl::GetFlag(FLAGS_encoder_recompute));
  if (!encoder_recompute.ok()) {
    return Fail("--encoder_recompute: " + std::string(encoder_recompute.status().message()));
  }
  absl::StatusOr<loom::Recompute> llm_recompute =
      loom::ParseRecompute(absl::GetFlag(FLAGS_llm_recompute));
  if (!llm_recompute.ok()) {
    return Fail("--llm_recompute: " + std::string(llm_recompute.status().message()));
  }
  loom::MultimodalModel model(*config, *ops);
  model.vit().set_recompute(*encoder_recompute);
  model.llm().set_recompute(*llm_recompute);
  model.Initialize(seed);
  if (absl::Status s = loom::hf::LoadPretrainedWeights(*pretrained, &model); !s.ok()) {
    return Fail("--" + std::string(s.message()));
  }
  if (const std::string init = absl::GetFlag(FLAGS_init_checkpoint); !init.empty()) {
    absl::Status s = loom::LoadTrainingWeights(model, init);
    if (!s.ok()) return Fail("--init_checkpoint: " + std::string(s.message()));
  }
  model.Freeze(*frozen);
  model.Place(*precision);  // the weights as set so far (a resume below pushes its own)
  loom::SyntheticCaptions data(*config, seed, absl::GetFlag(FLAGS_shuffle_images));
  const std::string shards = absl::GetFlag(FLAGS_shards);
  std::unique_ptr<loom::data::Tokenizer> tokenizer;
  std::unique_ptr<loom::data::DataLoader> loader;
  loom::data::LoaderOptions lo;  // the held-out set's loader reads as this one does
  if (!shards.empty()) {
    if (absl::GetFlag(FLAGS_shuffle_images)) {
      return Fail("--shuffle_images is for the synthetic data; it cannot be used with --shards");
    }
    absl::StatusOr<loom::hf::DataPipeline> pipeline = loom::hf::DataPipelineFor(
        *pretrained, absl::GetFlag(FLAGS_tokenizer), absl::GetFlag(FLAGS_chat_template),
        absl::GetFlag(FLAGS_image_aspect_ratio));
    if (!pipeline.ok()) {
      return Fail("--tokenizer, --chat_template: " + std::string(pipeline.status().message()));
    }
    tokenizer = std::move(pipeline->tokenizer);
    absl::StatusOr<std::vector<loom::data::DataSource>> sources =
        loom::data::ParseShardSources(shards);
    if (!sources.ok()) return Fail("--shards: " + std::string(sources.status().message()));
    lo.sources = *std::move(sources);
    lo.seed = seed;
    lo.threads = std::max(1, absl::GetFlag(FLAGS_data_threads));
    lo.preprocess = std::move(pipeline->preprocess);
    absl::StatusOr<std::unique_ptr<loom::data::DataLoader>> l =
        loom::data::DataLoader::Open(lo, tokenizer.get());
    if (!l.ok()) return Fail("--shards: " + std::string(l.status().message()));
    loader = std::move(*l);
    if (epochs > 0) {
      absl::StatusOr<int64_t> s =
          loom::data::StepsForEpochs(epochs, loader->dataset_samples(), batch);
      if (!s.ok()) return Fail("--epochs: " + std::string(s.status().message()));
      steps = static_cast<int>(*s);
      std::fprintf(stderr,
                   "loom-train-local: %g epochs of %lld samples in batches of %d: %d steps\n",
                   epochs, static_cast<long long>(loader->dataset_samples()), batch, steps);
    }
  }
  // The held-out set: read again from its start at every validation.
  std::unique_ptr<loom::data::DataLoader> validation;
  loom::data::v1::DataCursor validation_start;
  const int validation_batches = absl::GetFlag(FLAGS_validation_samples) / batch;
  const int validation_every = absl::GetFlag(FLAGS_validation_every);
  if (const std::string v = absl::GetFlag(FLAGS_validation_shards); !v.empty()) {
    if (loader == nullptr) return Fail("--validation_shards needs --shards");
    if (validation_batches < 1 || validation_every < 1) {
      return Fail(
          "--validation_shards: --validation_samples >= --batch_size and "
          "--validation_every >= 1");
    }
    absl::StatusOr<std::vector<std::string>> paths = loom::data::ExpandShardGlob(v);
    if (!paths.ok()) return Fail("--validation_shards: " + std::string(paths.status().message()));
    loom::data::LoaderOptions vo;
    vo.shards = *paths;
    vo.shuffle = false;
    vo.epochs = 1;  // never wraps around
    vo.threads = 1;
    vo.prefetch = batch;
    vo.preprocess = lo.preprocess;
    absl::StatusOr<std::unique_ptr<loom::data::DataLoader>> l =
        loom::data::DataLoader::Open(vo, tokenizer.get());
    if (!l.ok()) return Fail("--validation_shards: " + std::string(l.status().message()));
    if ((*l)->dataset_samples() < static_cast<int64_t>(validation_batches) * batch) {
      return Fail(absl::StrCat("--validation_shards: ", (*l)->dataset_samples(),
                               " samples, fewer than --validation_samples ",
                               validation_batches * batch));
    }
    validation = std::move(*l);
    validation_start = validation->Cursor();
  }
  loom::TrainOptions options;
  options.microbatches = absl::GetFlag(FLAGS_microbatches);
  options.adam.lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
  options.adam.weight_decay = static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
  absl::StatusOr<loom::WeightDecayScope> scope =
      loom::ParseWeightDecayScope(absl::GetFlag(FLAGS_weight_decay_scope));
  if (!scope.ok()) return Fail("--weight_decay_scope: " + std::string(scope.status().message()));
  options.weight_decay_scope = *scope;
  options.warmup_steps =
      absl::GetFlag(FLAGS_warmup_ratio) >= 0
          ? static_cast<int>(loom::WarmupStepsFromRatio(absl::GetFlag(FLAGS_warmup_ratio), steps))
          : absl::GetFlag(FLAGS_warmup_steps);
  options.clip_norm = absl::GetFlag(FLAGS_clip_norm);
  absl::StatusOr<loom::LrSchedule> schedule =
      loom::ParseLrSchedule(absl::GetFlag(FLAGS_lr_schedule));
  if (!schedule.ok()) return Fail("--lr_schedule: " + std::string(schedule.status().message()));
  options.lr_schedule = *schedule;
  options.total_steps = steps;
  options.min_lr = absl::GetFlag(FLAGS_min_lr);
  options.adam.eps = static_cast<float>(absl::GetFlag(FLAGS_adam_eps));
  options.encoder_lr = absl::GetFlag(FLAGS_encoder_lr);
  options.projector_lr = absl::GetFlag(FLAGS_projector_lr);
  options.llm_lr = absl::GetFlag(FLAGS_llm_lr);
  options.generator_lr = absl::GetFlag(FLAGS_generator_lr);
  options.generation_weight = absl::GetFlag(FLAGS_generation_weight);
  options.seed = seed;
  if (!(options.generation_weight >= 0)) return Fail("--generation_weight: must be >= 0");
  if (absl::Status l = loom::ValidateLrSchedule(options.Schedule()); !l.ok()) {
    return Fail("--lr_schedule: " + std::string(l.message()));
  }
  loom::LocalTrainer trainer(&model, options);
  const std::string ckpt_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  const int every = absl::GetFlag(FLAGS_checkpoint_every);
  if ((every > 0 || absl::GetFlag(FLAGS_resume)) && ckpt_dir.empty()) {
    std::fprintf(stderr,
                 "loom-train-local: --checkpoint_every and --resume need --checkpoint_dir\n");
    return 1;
  }
  // What a resume must not change (the batch split may).
  const std::string identity = absl::StrCat(
      "trainer=loom-train-local model=", source.Describe(), " seed=", absl::GetFlag(FLAGS_seed),
      " global_batch=", batch,
      " data=", absl::GetFlag(FLAGS_shards).empty() ? "synthetic" : absl::GetFlag(FLAGS_shards),
      absl::GetFlag(FLAGS_init_checkpoint).empty()
          ? ""
          : absl::StrCat(" init=", absl::GetFlag(FLAGS_init_checkpoint)));
  loom::CheckpointRun run;
  int first_step = 0;
  if (!ckpt_dir.empty() && !absl::GetFlag(FLAGS_resume)) {
    absl::StatusOr<loom::CheckpointRun> r = loom::StartCheckpointRun(ckpt_dir, identity);
    if (!r.ok()) return Fail("--checkpoint_dir: " + std::string(r.status().message()));
    run = *r;
  }
  if (absl::GetFlag(FLAGS_resume)) {
    absl::StatusOr<loom::CheckpointRun> r = loom::ReadCheckpointRun(ckpt_dir);
    absl::StatusOr<int64_t> latest =
        r.ok() ? loom::ResumableStep(ckpt_dir, identity) : absl::StatusOr<int64_t>(r.status());
    absl::Status loaded =
        latest.ok() ? loom::LoadTrainingCheckpoint(model, *latest, ckpt_dir) : latest.status();
    if (r.ok()) run = *r;
    if (!loaded.ok()) {
      std::fprintf(stderr, "loom-train-local: --resume: %s\n",
                   std::string(loaded.message()).c_str());
      return 1;
    }
    model.PushData();
    first_step = static_cast<int>(*latest);
    if (loader != nullptr) {
      absl::StatusOr<std::string> bytes = loom::ReadFile(CursorPath(ckpt_dir, first_step));
      loom::data::v1::DataCursor cursor;
      if (!bytes.ok() || !cursor.ParseFromString(*bytes)) {
        return Fail("--resume: checkpoint step " + std::to_string(first_step) +
                    " has no data cursor (was it written without --shards?)");
      }
      if (absl::Status r = loader->Restore(cursor); !r.ok()) {
        return Fail("--resume: " + std::string(r.message()));
      }
    }
    trainer.set_steps_taken(first_step);
    std::fprintf(stderr, "loom-train-local: resumed from step %d\n", first_step);
  }

  int skipped = 0;
  for (int s = first_step; s < steps; ++s) {
    std::vector<loom::Sample> global_batch;
    for (int i = 0; i < batch; ++i) {
      if (loader == nullptr) {
        global_batch.push_back(data.Get(static_cast<int64_t>(s) * batch + i));
        continue;
      }
      absl::StatusOr<loom::data::ProcessedSample> sample = loader->Next();
      if (!sample.ok()) return Fail("data: " + std::string(sample.status().message()));
      global_batch.push_back(std::move(sample->sample));
    }
    loom::StepStats st = trainer.Step(global_batch);
    std::string held_out;
    if (validation != nullptr && st.step % validation_every == 0) {
      if (absl::Status r = validation->Restore(validation_start); !r.ok()) {
        return Fail("validation: " + std::string(r.message()));
      }
      double sum = 0, generation_sum = 0;
      int64_t tokens = 0, images = 0;
      for (int b = 0; b < validation_batches; ++b) {
        std::vector<loom::Sample> vb;
        for (int i = 0; i < batch; ++i) {
          absl::StatusOr<loom::data::ProcessedSample> sample = validation->Next();
          if (!sample.ok())
            return Fail("validation data: " + std::string(sample.status().message()));
          vb.push_back(std::move(sample->sample));
        }
        const loom::LocalTrainer::Evaluation e = trainer.Evaluate(vb);
        sum += e.loss_sum;
        tokens += e.loss_tokens;
        generation_sum += e.generation_loss_sum;
        images += e.generation_images;
      }
      held_out = absl::StrCat(",\"validation_loss\":", loom::JsonNumber(sum / tokens, 6),
                              ",\"validation_loss_tokens\":", tokens);
      if (images > 0) {  // the held-out output images' mean flow loss (draws of step 0)
        absl::StrAppend(&held_out, ",\"validation_generation_loss\":",
                        loom::JsonNumber(generation_sum / static_cast<double>(images), 6),
                        ",\"validation_output_images\":", images);
      }
    }
    const std::string generation =
        config->has_generator()
            ? absl::StrCat(",\"generation_loss\":", loom::JsonNumber(st.generation_loss, 6),
                           ",\"output_images\":", st.generation_images)
            : "";
    std::printf(
        "{\"step\":%lld,\"loss\":%s%s,\"samples\":%lld,\"tokens\":%lld,\"step_seconds\":%.4f,"
        "\"grad_norm\":%s,\"lr\":%.6g%s%s}\n",
        static_cast<long long>(st.step), loom::JsonNumber(st.loss, 6).c_str(), generation.c_str(),
        static_cast<long long>(st.samples), static_cast<long long>(st.tokens), st.seconds,
        loom::JsonNumber(st.grad_norm, 4).c_str(), st.lr, st.skipped ? ",\"skipped\":true" : "",
        held_out.c_str());
    std::fflush(stdout);
    if (st.skipped && ++skipped > absl::GetFlag(FLAGS_max_skipped_steps)) {
      return Fail(absl::StrCat("loss diverged at step ", st.step, ": ", skipped,
                               " steps with a non-finite loss or gradient norm "
                               "(--max_skipped_steps ",
                               absl::GetFlag(FLAGS_max_skipped_steps), ")"));
    }
    if (every > 0 && st.step % every == 0) {
      std::vector<std::pair<std::string, std::string>> extra;
      if (loader != nullptr)
        extra.push_back({loom::kDataCursorFile, loader->Cursor().SerializeAsString()});
      absl::Status c = loom::SaveTrainingCheckpoint(model, st.step, ckpt_dir, run, extra);
      if (!c.ok()) {
        std::fprintf(stderr, "loom-train-local: checkpoint: %s\n",
                     std::string(c.message()).c_str());
        return 1;
      }
    }
  }
  return 0;
}
