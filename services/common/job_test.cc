#include "services/common/job.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/model/config.h"
#include "runtime/model/precision.h"

namespace loom {
namespace {

absl::Status ParseAndCheck(const std::string& text) {
  absl::StatusOr<job::v1::JobConfig> job = ParseJobConfig(text, "job.cfg");
  if (!job.ok()) return job.status();
  ApplyJobDefaults("/run", &*job);
  return ValidateJob(*job);
}

TEST(JobConfig, DefaultsAreTheDocumentedOnes) {
  absl::StatusOr<job::v1::JobConfig> job = ParseJobConfig("", "empty");
  ASSERT_TRUE(job.ok());
  ApplyJobDefaults("/run", &*job);
  EXPECT_TRUE(ValidateJob(*job).ok());
  EXPECT_EQ(job->model(), "tiny");
  EXPECT_EQ(job->algorithm(), "loom");
  EXPECT_EQ(job->data().preset(), "onevision");
  EXPECT_EQ(job->data().generated_dir(), "/run/data/onevision");
  EXPECT_EQ(job->parallel().encoder_dp(), 2);
  EXPECT_EQ(job->parallel().llm_dp(), 2);
  EXPECT_EQ(job->parallel().encoder_tp(), 1);
  EXPECT_EQ(job->parallel().llm_tp(), 1);
  EXPECT_EQ(job->checkpoint().dir(), "/run/checkpoints");
  EXPECT_DOUBLE_EQ(job->train().clip_norm(), 1.0);
  EXPECT_EQ(job->train().weight_decay_scope(), job::v1::WEIGHT_DECAY_MATRICES);
  EXPECT_EQ(job->device().encoder(), "cpu");
  EXPECT_EQ(job->device().llm(), "cpu");
  EXPECT_EQ(job->device().collectives(), "host");
  EXPECT_EQ(job->recompute().encoder(), "full");
  EXPECT_EQ(job->recompute().llm(), "full");
}

TEST(JobConfig, DevicesAreChosenPerModule) {
  // Only syntax is checked here (no GPU is needed to validate a job): each
  // worker opens its module's device when it joins.
  EXPECT_TRUE(ParseAndCheck("device { encoder: 'cpu' llm: 'cuda' }").ok());
  EXPECT_TRUE(ParseAndCheck("device { encoder: 'cuda:1' llm: 'cuda:0' }").ok());
  EXPECT_TRUE(ParseAndCheck("device { llm: 'cuda' } parallel { llm_tp: 2 }").ok());
  EXPECT_TRUE(ParseAndCheck("device { llm: 'cuda' collectives: 'nccl' }").ok());
}

TEST(JobConfig, JsonAndTextGiveTheSameJob) {
  absl::StatusOr<job::v1::JobConfig> a = ParseJobConfig(
      R"({"model": "tiny", "parallel": {"encoder_dp": 1, "llmDp": 3},
          "train": {"clip_norm": 0}, "algorithm": "sequential"})",
      "a.json");
  absl::StatusOr<job::v1::JobConfig> b = ParseJobConfig(
      "model: 'tiny'\nparallel { encoder_dp: 1 llm_dp: 3 }\ntrain { clip_norm: 0 }\n"
      "algorithm: 'sequential'\n",
      "b.txtpb");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->SerializeAsString(), b->SerializeAsString());
  ApplyJobDefaults("/run", &*a);
  EXPECT_EQ(a->train().clip_norm(), 0.0);  // an explicit 0 is kept: no clipping
}

TEST(JobConfig, WeightDecayScopeByName) {
  absl::StatusOr<job::v1::JobConfig> a =
      ParseJobConfig(R"({"train": {"weight_decay_scope": "WEIGHT_DECAY_ALL"}})", "a.json");
  absl::StatusOr<job::v1::JobConfig> b =
      ParseJobConfig("train { weight_decay_scope: WEIGHT_DECAY_ALL }", "b.txtpb");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ApplyJobDefaults("/run", &*a);
  EXPECT_EQ(a->train().weight_decay_scope(), job::v1::WEIGHT_DECAY_ALL);  // kept
  EXPECT_TRUE(ValidateJob(*a).ok());
  EXPECT_EQ(b->train().weight_decay_scope(), job::v1::WEIGHT_DECAY_ALL);
  EXPECT_FALSE(ParseJobConfig("train { weight_decay_scope: NORMS }", "c.txtpb").ok());
}

// The recipe's fields reach the optimizer's options: LLaVA-1.5's stage 2
// (cosine, warmup_ratio 0.03, the tower at a fifth of the rest).
TEST(JobConfig, TheRecipeReachesTheOptimizer) {
  absl::StatusOr<job::v1::JobConfig> job = ParseJobConfig(
      R"({"train": {"steps": 1000, "lr": 2e-5, "lr_schedule": "LR_SCHEDULE_COSINE",
          "warmup_ratio": 0.03, "min_lr": 1e-6, "eps": 1e-6, "encoder_lr": 4e-6}})",
      "job.json");
  ASSERT_TRUE(job.ok()) << job.status();
  ApplyJobDefaults("/run", &*job);
  ASSERT_TRUE(ValidateJob(*job).ok()) << ValidateJob(*job);
  const TrainOptions o = JobTrainOptions(*job);
  EXPECT_EQ(o.lr_schedule, LrSchedule::kCosine);
  EXPECT_EQ(o.warmup_steps, 30);
  EXPECT_EQ(o.total_steps, 1000);
  EXPECT_FLOAT_EQ(o.adam.eps, 1e-6f);
  EXPECT_DOUBLE_EQ(o.PeakLr(Module::kEncoder), 4e-6);
  EXPECT_FLOAT_EQ(o.PeakLr(Module::kProjector), 2e-5f);
  EXPECT_FLOAT_EQ(o.PeakLr(Module::kLlm), 2e-5f);
  EXPECT_NEAR(o.Schedule().min_ratio, 0.05, 1e-6);
  // The defaults: constant after a 10-step warm-up, eps 1e-8.
  absl::StatusOr<job::v1::JobConfig> plain = ParseJobConfig("", "empty");
  ApplyJobDefaults("/run", &*plain);
  EXPECT_EQ(plain->train().lr_schedule(), job::v1::LR_SCHEDULE_CONSTANT);
  EXPECT_EQ(JobTrainOptions(*plain).warmup_steps, 10);
  EXPECT_FLOAT_EQ(JobTrainOptions(*plain).adam.eps, 1e-8f);
}

TEST(JobConfig, EpochsAndMixturesAreAccepted) {
  EXPECT_TRUE(ParseAndCheck("train { epochs: 1.5 lr_schedule: LR_SCHEDULE_COSINE "
                            "warmup_ratio: 0.03 }")
                  .ok());
  absl::StatusOr<job::v1::JobConfig> job = ParseJobConfig(
      "data { sources { shards: '/d/a-*.tar' weight: 3 } sources { shards: '/d/b-*.tar' } }", "t");
  ASSERT_TRUE(job.ok()) << job.status();
  ApplyJobDefaults("/run", &*job);
  EXPECT_TRUE(ValidateJob(*job).ok());
  // loom-preprocess's --shards: the mixture spelled as runtime/data/loader.h reads it.
  EXPECT_EQ(JobShards(*job), "/d/a-*.tar=3,/d/b-*.tar=1");
  EXPECT_EQ(ValidationBatches(*job), 0);
  job->mutable_data()->mutable_validation()->set_shards("/d/val-*.tar");
  job->mutable_data()->mutable_validation()->set_every(100);
  job->mutable_data()->mutable_validation()->set_samples(40);  // 2 whole batches of 16
  EXPECT_TRUE(ValidateJob(*job).ok());
  EXPECT_EQ(ValidationBatches(*job), 2);
  // A resume may change the weights, not the datasets.
  job::v1::JobConfig reweighed = *job;
  reweighed.mutable_data()->mutable_sources(0)->set_weight(1);
  EXPECT_EQ(JobCheckpointIdentity(reweighed), JobCheckpointIdentity(*job));
  job::v1::JobConfig other = *job;
  other.mutable_data()->mutable_sources(1)->set_shards("/d/c-*.tar");
  EXPECT_NE(JobCheckpointIdentity(other), JobCheckpointIdentity(*job));
}

TEST(JobConfig, UnknownFieldsAreNamed) {
  absl::Status s = ParseAndCheck(R"({"data": {"shard": "x/*.tar"}})");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("shard"), std::string::npos) << s;
  s = ParseAndCheck("parallel { llm_ranks: 2 }");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("llm_ranks"), std::string::npos) << s;
  EXPECT_NE(s.message().find("line 1"), std::string::npos) << s;
  s = ParseAndCheck(R"({"train": {"steps": "many"}})");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("steps"), std::string::npos) << s;
}

TEST(JobConfig, InvalidValuesAreNamed) {
  struct Case {
    const char* text;
    const char* field;
  };
  for (const Case& c : {
           Case{"model: 'huge'", "model"},
           Case{"model: 'tiny-gen' parallel { generator_pp: 9 }",
                "parallel.generator_pp: must be in [1, "},
           Case{"model: 'tiny-gen' parallel { generator_tp: 3 }",
                "parallel.generator_tp: 3 does not divide the generator's"},
           Case{"model: 'tiny-gen' parallel { colocate: true encoder_dp: 2 llm_dp: 2 }",
                "parallel.colocate: not with a generator"},
           Case{"model: 'tiny-gen' train { generation_weight: -1 }",
                "train.generation_weight: must be a finite number >= 0"},
           Case{"model: 'tiny-gen' freeze { vision: true projector: true llm: true generator: "
                "true }",
                "freeze: vision, projector, llm and generator are all frozen"},
           Case{"parallel { generator_dp: 2 }",
                "parallel.generator_dp: model \"tiny\" has no generator"},
           Case{"algorithm: 'magic'", "algorithm"},
           Case{"model: 'tiny' hf { llava: '/models/llava' }", "model: \"tiny\" and hf both set"},
           Case{"hf { llava: '/nonexistent/llava' }", "hf.llava: /nonexistent/llava/config.json"},
           Case{"hf { llm_from: '/models/llama' }", "hf.vision_from: missing"},
           Case{"hf { llava: '/models/llava' llm_from: '/models/llama' }",
                "hf.llava: one LLaVA directory, or llm_from and vision_from, not both"},
           Case{"hf { llava: '/models/llava' vision_feature_layer: -1 }",
                "hf.vision_feature_layer: only with llm_from + vision_from"},
           Case{"hf { llm_from: '/nonexistent/llm' vision_from: '/nonexistent/clip' }",
                "hf.llm_from: /nonexistent/llm/config.json"},
           Case{"data { preset: 'nope' }", "data.preset"},
           Case{"parallel { llm_dp: -1 }", "parallel.llm_dp"},
           Case{"parallel { encoder_dp: -2 }", "parallel.encoder_dp"},
           Case{"parallel { llm_tp: -1 }", "parallel.llm_tp"},
           Case{"parallel { llm_pp: 3 }", "parallel.llm_pp: 3 stages for the LLM's 2 layers"},
           Case{"parallel { encoder_pp: -1 }", "parallel.encoder_pp"},
           Case{"parallel { llm_max_tokens: -1 }", "parallel.llm_max_tokens"},
           Case{"parallel { encoder_max_tokens: -16 }", "parallel.encoder_max_tokens"},
           Case{"parallel { llm_tp: 3 }", "parallel.llm_tp: 3 does not divide the LLM heads (4)"},
           Case{"parallel { encoder_tp: 8 }",
                "parallel.encoder_tp: 8 does not divide the ViT heads"},
           Case{"model: 'vit300m-llm7b' parallel { llm_tp: 64 }",
                "parallel.llm_tp: 64 does not divide the LLM heads (32)"},
           Case{"data { global_batch: 3 } parallel { llm_dp: 2 microbatches: 2 }",
                "data.global_batch"},
           Case{"train { lr: 5 }", "train.lr"},
           Case{"init { checkpoint: '/nonexistent/step-5' }",
                "init.checkpoint: no encoder.ckpt in /nonexistent/step-5"},
           Case{"freeze { vision: true projector: true llm: true }",
                "freeze: vision, projector and llm are all frozen"},
           Case{"train { clip_norm: -1 }", "train.clip_norm"},
           Case{"train { steps: -4 }", "train.steps"},
           Case{"train { weight_decay_scope: 7 }", "train.weight_decay_scope: unknown scope 7"},
           Case{"train { lr_schedule: LR_SCHEDULE_COSINE }",
                "train.lr_schedule: a cosine decay ends at the last step: it needs a step count"},
           Case{"train { steps: 10 lr_schedule: 9 }", "train.lr_schedule: unknown schedule 9"},
           Case{"train { steps: 10 lr: 0.001 min_lr: 0.01 }",
                "train.min_lr: must be in [0, lr = 0.001], got 0.01"},
           Case{"train { steps: 10 warmup_ratio: 0.1 warmup_steps: 3 }",
                "train.warmup_ratio: set warmup_steps or warmup_ratio, not both"},
           Case{"train { warmup_ratio: 0.1 }", "train.warmup_ratio: a share of train.steps"},
           Case{"train { steps: 10 epochs: 2 }",
                "train.epochs: in place of train.steps: set one, not both"},
           Case{"data { validation { shards: '/v/*.tar' } }",
                "data.validation.every: steps between validations: must be >= 1"},
           Case{"data { validation { shards: '/v/*.tar' every: 5 samples: 3 } }",
                "data.validation.samples: 3: at least one global batch (data.global_batch 16)"},
           Case{"data { validation { every: 5 } }", "data.validation.shards: missing"},
           Case{"data { image_aspect_ratio: 'squash' }",
                "data.image_aspect_ratio: \"squash\" (known: crop, pad)"},
           Case{"data { image_aspect_ratio: 'pad' }",
                "data.image_aspect_ratio: pad is for a Hugging Face image processor"},
           Case{"train { epochs: -1 }", "train.epochs: must be a finite number > 0, got -1"},
           Case{"train { epochs: inf }", "train.epochs: must be a finite number > 0, got inf"},
           Case{"data { shards: '/d/*.tar' sources { shards: '/e/*.tar' } }",
                "data.sources: a mixture in place of data.shards: set one, not both"},
           Case{"data { sources { shards: '/e/*.tar' weight: 0 } }",
                "data.sources[0].weight: must be a finite number > 0, got 0"},
           Case{"data { sources { shards: '/e/*.tar' } sources { shards: '/a/*.tar,/b/*.tar' } }",
                "data.sources[1].shards: a glob without \",\""},
           Case{"train { steps: 10 warmup_ratio: 1.5 }", "train.warmup_ratio: must be in [0, 1)"},
           Case{"train { eps: 0 }", "train.eps: must be in (0, 1)"},
           Case{"train { encoder_lr: 2 }", "train.encoder_lr: must be in (0, 1), got 2"},
           Case{"checkpoint { every: -1 }", "checkpoint.every"},
           Case{"recovery { lease_seconds: 0.1 }",
                "recovery.lease_seconds: must be in [0.5, 3600] seconds, got 0.1"},
           Case{"recovery { lease_seconds: -3 }", "recovery.lease_seconds"},
           Case{"recovery { stall_floor_seconds: 0.1 }",
                "recovery.stall_floor_seconds: must be in [0.5, 86400] seconds, got 0.1"},
           Case{"recovery { stall_factor: 0.5 }",
                "recovery.stall_factor: must be in [1, 1000], got 0.5"},
           Case{"recovery { max_restarts: -1 }",
                "recovery.max_restarts: must be in [0, 1000], got -1"},
           Case{"device { llm: 'gpu' }", "device.llm: want cpu, cuda or cuda:N"},
           Case{"device { encoder: 'cuda:-1' }", "device.encoder: want cpu, cuda or cuda:N"},
           Case{"device { encoder: 'cuda:x' }", "device.encoder: want cpu, cuda or cuda:N"},
           Case{"device { llm: 'cuda' collectives: 'mpi' }",
                "device.collectives: want host or nccl, got \"mpi\""},
           Case{"device { collectives: 'nccl' }",
                "device.collectives: nccl reduces device memory: no module is on cuda"},
           Case{"precision: 'fp16'", "precision: want fp32 or bf16, got \"fp16\""},
           Case{"recompute { llm: 'some' }",
                "recompute.llm: want full, none or selective, got \"some\""},
           Case{"recompute { encoder: 'all' }",
                "recompute.encoder: want full, none or selective, got \"all\""},
       }) {
    absl::Status s = ParseAndCheck(c.text);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_EQ(s.message().rfind(c.field, 0), 0u) << c.text << " -> " << s;
  }
}

// device.memory_gib checks every stage of both modules against the memory
// model at the token caps: a 7B LLM whole on one 80 GiB GPU is refused,
// naming the module, the stage and the figures; split over TP 4 x PP 2 with
// the optimizer sharded over DP 4 in bf16 it fits.
TEST(JobConfig, AJobThatDoesNotFitItsDevicesIsRefused) {
  const std::string base =
      "model: 'vit300m-llm7b' data { global_batch: 64 } device { llm: 'cuda' encoder: 'cuda' "
      "memory_gib: 80 } parallel { llm_max_tokens: 4096 encoder_max_tokens: 4608 ";
  absl::Status whole = ParseAndCheck(base + "llm_dp: 1 encoder_dp: 1 }");
  EXPECT_EQ(whole.code(), absl::StatusCode::kResourceExhausted) << whole;
  EXPECT_NE(whole.message().find("device.memory_gib: the LLM's pipeline stage 0 of 1"),
            std::string::npos)
      << whole;
  EXPECT_NE(whole.message().find("4096 tokens a microbatch"), std::string::npos) << whole;
  EXPECT_NE(whole.message().find("AdamW moments"), std::string::npos) << whole;
  absl::Status split = ParseAndCheck(base +
                                     "llm_dp: 4 llm_tp: 4 llm_pp: 2 microbatches: 8 "
                                     "encoder_dp: 2 } precision: 'bf16' optimizer { shard: true }");
  EXPECT_TRUE(split.ok()) << split;
  // The same job on a 16 GiB device: the LLM still fits, the encoder's
  // bins at the cap still fit; at 4 GiB nothing does.
  absl::Status small = ParseAndCheck(
      "model: 'vit300m-llm7b' data { global_batch: 64 } device { llm: 'cuda' encoder: 'cuda' "
      "memory_gib: 4 } parallel { llm_max_tokens: 4096 encoder_max_tokens: 4608 llm_dp: 4 "
      "llm_tp: 4 llm_pp: 2 microbatches: 8 encoder_dp: 2 } precision: 'bf16' "
      "optimizer { shard: true }");
  EXPECT_EQ(small.code(), absl::StatusCode::kResourceExhausted) << small;
  // Without both caps the check has no microbatch size to check.
  absl::Status uncapped =
      ParseAndCheck("model: 'vit300m-llm7b' data { global_batch: 64 } device { memory_gib: 80 }");
  EXPECT_EQ(uncapped.code(), absl::StatusCode::kInvalidArgument) << uncapped;
  EXPECT_NE(uncapped.message().find("parallel.llm_max_tokens"), std::string::npos) << uncapped;
  EXPECT_EQ(ParseAndCheck("device { memory_gib: -1 }").code(), absl::StatusCode::kInvalidArgument);
}

// The generator's ranks are checked too, at the most output images a bin
// can hold (llm_max_tokens / queries): the 7B job that fits 16 GiB above
// does not with vit300m-llm7b-gen's 448M-parameter denoiser on one GPU a
// replica, and fits 80 GiB.
TEST(JobConfig, AGeneratorThatDoesNotFitIsRefused) {
  auto job = [](int gib) {
    return absl::StrCat(
        "model: 'vit300m-llm7b-gen' data { global_batch: 64 } device { llm: 'cuda' encoder: "
        "'cuda' memory_gib: ",
        gib,
        " } parallel { llm_max_tokens: 4096 encoder_max_tokens: 4608 llm_dp: 4 llm_tp: 4 "
        "llm_pp: 2 microbatches: 8 encoder_dp: 2 } precision: 'bf16' optimizer { shard: true }");
  };
  absl::Status small = ParseAndCheck(job(16));
  EXPECT_EQ(small.code(), absl::StatusCode::kResourceExhausted) << small;
  EXPECT_NE(small.message().find("device.memory_gib: a generator rank needs"), std::string::npos)
      << small;
  EXPECT_NE(small.message().find("at 64 output images a bin"), std::string::npos) << small;
  absl::Status big = ParseAndCheck(job(80));
  EXPECT_TRUE(big.ok()) << big;
}

// The memory check prices the recompute choice: keeping the in-flight
// microbatches' activations (none) takes more than full on the first LLM
// stage of 1F1B, selective less than none; a device that holds the job
// under full refuses it under none, naming the stage.
TEST(JobConfig, TheMemoryCheckPricesTheRecomputeChoice) {
  const std::string base =
      "model: 'vit300m-llm7b' data { global_batch: 64 } "
      "parallel { llm_max_tokens: 4096 encoder_max_tokens: 4608 llm_dp: 4 llm_tp: 4 llm_pp: 2 "
      "microbatches: 8 encoder_dp: 2 } precision: 'bf16' optimizer { shard: true } ";
  absl::StatusOr<ModelConfig> model = ModelConfigByName("vit300m-llm7b");
  ASSERT_TRUE(model.ok());
  int64_t need[3];
  for (Recompute r : {Recompute::kFull, Recompute::kNone, Recompute::kSelective}) {
    absl::StatusOr<job::v1::JobConfig> job = ParseJobConfig(
        base + absl::StrCat("device { llm: 'cuda' encoder: 'cuda' } recompute { llm: '",
                            RecomputeName(r), "' }"),
        "job.cfg");
    ASSERT_TRUE(job.ok()) << job.status();
    ApplyJobDefaults("/run", &*job);
    need[static_cast<int>(r)] =
        JobStageMemory(*job, *model, /*encoder=*/false, 0, 4096, 576, 8, 16).total();
  }
  const int64_t full = need[static_cast<int>(Recompute::kFull)],
                none = need[static_cast<int>(Recompute::kNone)],
                selective = need[static_cast<int>(Recompute::kSelective)];
  EXPECT_LT(full, selective);
  EXPECT_LT(selective, none);
  const double gib = static_cast<double>(full + none) / 2 / (1ll << 30);
  const std::string device =
      absl::StrCat("device { llm: 'cuda' encoder: 'cuda' memory_gib: ", gib, " } ");
  EXPECT_TRUE(ParseAndCheck(base + device).ok());
  absl::Status s = ParseAndCheck(base + device + "recompute { llm: 'none' }");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("the LLM's pipeline stage 0 of 2"), std::string::npos) << s;
}

// Sequence parallelism (parallel.sequence_parallel): the memory check
// prices each TP rank's stream and norm rows at 1/TP, so a device between
// the two needs holds the job with it and refuses it without.
TEST(JobConfig, TheMemoryCheckCountsSequenceParallelism) {
  const std::string base =
      "model: 'vit300m-llm7b' data { global_batch: 64 } precision: 'bf16' "
      "recompute { llm: 'none' encoder: 'none' } "
      "parallel { llm_max_tokens: 16384 encoder_max_tokens: 4608 llm_dp: 2 llm_tp: 8 "
      "encoder_tp: 4 encoder_dp: 2 microbatches: 4 ";
  absl::StatusOr<ModelConfig> model = ModelConfigByName("vit300m-llm7b");
  ASSERT_TRUE(model.ok());
  const int64_t tiles = 4608 / model->vit.patches_per_tile();
  const int64_t image_tokens = std::min<int64_t>(16384, tiles * model->tokens_per_tile());
  int64_t need[2] = {0, 0};
  for (bool sp : {false, true}) {
    absl::StatusOr<job::v1::JobConfig> job = ParseJobConfig(
        base + (sp ? "sequence_parallel: true " : "") + "} device { llm: 'cuda' encoder: 'cuda' }",
        "job.cfg");
    ASSERT_TRUE(job.ok()) << job.status();
    ApplyJobDefaults("/run", &*job);
    for (bool encoder : {false, true}) {
      need[sp] =
          std::max(need[sp],
                   JobStageMemory(*job, *model, encoder, 0, 16384, image_tokens, tiles, 4).total());
    }
  }
  ASSERT_LT(need[1], need[0]);
  const std::string device =
      absl::StrCat("} device { llm: 'cuda' encoder: 'cuda' memory_gib: ",
                   static_cast<double>(need[0] + need[1]) / 2 / (1ll << 30), " }");
  EXPECT_TRUE(ParseAndCheck(base + "sequence_parallel: true " + device).ok());
  absl::Status s = ParseAndCheck(base + device);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

// Colocated (parallel.colocate): the encoder's ranks must be the LLM's
// first-stage GPUs, and each such GPU holds an encoder rank beside an LLM
// rank: a device that holds either alone refuses the two together.
TEST(JobConfig, AColocatedJobFitsBothModulesOnTheFirstStagesDevices) {
  const std::string base =
      "model: 'vit300m-llm7b' data { global_batch: 64 } precision: 'bf16' "
      "optimizer { shard: true } parallel { llm_max_tokens: 4096 encoder_max_tokens: 4608 "
      "llm_dp: 4 llm_tp: 4 llm_pp: 2 microbatches: 8 encoder_tp: 4 encoder_dp: 4 ";
  absl::StatusOr<ModelConfig> model = ModelConfigByName("vit300m-llm7b");
  ASSERT_TRUE(model.ok());
  absl::StatusOr<job::v1::JobConfig> job =
      ParseJobConfig(base + "} device { llm: 'cuda' encoder: 'cuda' }", "job.cfg");
  ASSERT_TRUE(job.ok()) << job.status();
  ApplyJobDefaults("/run", &*job);
  // As CheckJobMemory sizes a microbatch and a bin at the caps.
  const int64_t tiles = 4608 / model->vit.patches_per_tile();
  const int64_t image_tokens = std::min<int64_t>(4096, tiles * model->tokens_per_tile());
  const int64_t encoder =
      JobStageMemory(*job, *model, true, 0, 4096, image_tokens, tiles, 8).total();
  int64_t alone = encoder;
  for (int stage : {0, 1}) {
    alone = std::max(
        alone, JobStageMemory(*job, *model, false, stage, 4096, image_tokens, tiles, 8).total());
  }
  const int64_t first =
      JobStageMemory(*job, *model, false, 0, 4096, image_tokens, tiles, 8).total();
  ASSERT_GT(encoder + first, alone);
  const std::string device =
      absl::StrCat("device { llm: 'cuda' encoder: 'cuda' memory_gib: ",
                   static_cast<double>(alone + encoder + first) / 2 / (1ll << 30), " } ");
  EXPECT_TRUE(ParseAndCheck(base + "} " + device).ok());
  absl::Status s = ParseAndCheck(base + "colocate: true } " + device);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("with the LLM's first stage beside it (parallel.colocate)"),
            std::string::npos)
      << s;
  // 16 encoder ranks for a first stage of 4 x 4: right; 8 are not.
  absl::Status wrong =
      ParseAndCheck("model: 'tiny' parallel { llm_dp: 2 llm_tp: 2 encoder_dp: 2 colocate: true }");
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument) << wrong;
  EXPECT_NE(wrong.message().find("parallel.colocate: the encoder's 2 ranks"), std::string::npos)
      << wrong;
  EXPECT_TRUE(
      ParseAndCheck("model: 'tiny' parallel { llm_dp: 2 llm_tp: 2 encoder_dp: 4 colocate: true }")
          .ok());
}

}  // namespace
}  // namespace loom
