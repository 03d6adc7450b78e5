// loom-preprocess: the data-preprocessing service, and its offline scan.
//
//   loom-preprocess --shards 'data/*.tar' --global_batch 16 [--grpc_port ...]
//   loom-preprocess scan --shards 'data/*.tar' --output scan.jsonl
#include <cstdio>

#include "absl/flags/flag.h"
#include "runtime/base/file.h"
#include "runtime/base/log.h"
#include "runtime/hf/model_flags.h"
#include "services/common/init.h"
#include "services/common/job_end.h"
#include "services/preprocess/preprocess_service.h"
#include "services/preprocess/scan.h"

ABSL_FLAG(std::string, shards, "",
          "WebDataset shards, a glob (quote it): 'data/*.tar'; or a mixture "
          "'a/*.tar=3,b/*.tar=1' (each draw from a source with probability weight / sum; scan "
          "reads every source once).");
ABSL_FLAG(std::string, output, "", "scan: where to write the JSON lines.");
ABSL_FLAG(std::string, tokenizer, "",
          "sentencepiece model or tokenizer.json directory (default: the model's own: Loom's, "
          "or the Hugging Face directory's).");
ABSL_FLAG(std::string, chat_template, "",
          "How conversations (samples with `messages`) become text: a template name (plain, "
          "vicuna_v1, chatml, llama3) or a Jinja file; default: the tokenizer's own "
          "chat_template, else vicuna_v1.");
ABSL_FLAG(std::string, image_aspect_ratio, "",
          "A Hugging Face image processor's images: crop (its own resize and crop) or pad "
          "(LLaVA-1.5's: a square filled with the mean colour first).");
ABSL_FLAG(std::string, config, "tiny",
          "Loom model config: tile size, tokens per tile, max sequence (or --llava, or "
          "--llm_from + --vision_from).");
ABSL_FLAG(int, encoder_max_tokens, 0,
          "Skip a sample with more ViT tokens (tiles x patches per tile) than this, the job's "
          "parallel.encoder_max_tokens (0: no cap).");
ABSL_FLAG(int, llm_max_tokens, 0,
          "Skip a sample with more LLM tokens (its packed length) than this, the job's "
          "parallel.llm_max_tokens (0: no cap).");
ABSL_FLAG(uint64_t, seed, 1, "Shuffle seed.");
ABSL_FLAG(int, global_batch, 16, "Samples per global batch (iteration).");
ABSL_FLAG(int, threads, 2, "Decode/tile/tokenize threads.");
ABSL_FLAG(int, prefetch, 64, "Samples preprocessed ahead of the batches asked for.");
ABSL_FLAG(int, retained_batches, 16,
          "Global batches kept (and built ahead) for the scheduler and the workers: the "
          "window of iterations GetBatch, FetchSamples and GetCursor answer for.");
ABSL_FLAG(std::string, validation_shards, "",
          "A held-out set (a glob): its first --validation_batches x --global_batch samples, "
          "read in order, are the validation batches (the job's data.validation).");
ABSL_FLAG(int, validation_batches, 0, "Batches in a validation pass (with --validation_shards).");
ABSL_FLAG(int64_t, start_iteration, 0,
          "Resume: the first batch served is this iteration, starting at --cursor.");
ABSL_FLAG(std::string, cursor, "",
          "Resume: the data cursor a checkpoint saved (DIR/step-N/data_cursor.binpb).");

int main(int argc, char** argv) {
  std::vector<std::string> args = loom::InitService(
      argc, argv, "loom-preprocess",
      "loom-preprocess: the data-preprocessing service.\n"
      "  loom-preprocess --shards GLOB [--global_batch N --seed S] [--config NAME | --llava DIR "
      "| --llm_from DIR --vision_from DIR]\n"
      "  loom-preprocess scan --shards GLOB --output FILE\n"
      "Flags: --host --grpc_port --metrics_port --shutdown_deadline --log_level --tokenizer "
      "--chat_template --image_aspect_ratio --encoder_max_tokens --llm_max_tokens "
      "--threads --prefetch --retained_batches --start_iteration --cursor --validation_shards "
      "--validation_batches");
  if (args.size() > 1 && args[1] == "scan") {
    loom::ScanOptions o;
    o.shards = absl::GetFlag(FLAGS_shards);
    o.output = absl::GetFlag(FLAGS_output);
    o.tokenizer = absl::GetFlag(FLAGS_tokenizer);
    o.chat_template = absl::GetFlag(FLAGS_chat_template);
    o.image_aspect_ratio = absl::GetFlag(FLAGS_image_aspect_ratio);
    o.caps = {absl::GetFlag(FLAGS_encoder_max_tokens), absl::GetFlag(FLAGS_llm_max_tokens)};
    o.model = loom::hf::ModelSourceFromFlags(absl::GetFlag(FLAGS_config));
    o.threads = absl::GetFlag(FLAGS_threads);
    absl::StatusOr<loom::ScanSummary> summary = loom::RunScan(o);
    if (!summary.ok()) {
      std::fprintf(stderr, "loom-preprocess scan: %s\n",
                   std::string(summary.status().message()).c_str());
      return 2;
    }
    std::printf("loom-preprocess scan: %s\n", loom::FormatScanSummary(*summary).c_str());
    return 0;
  }
  if (args.size() > 1) {
    std::fprintf(stderr, "loom-preprocess: unknown command \"%s\" (known: scan)\n",
                 args[1].c_str());
    return 2;
  }
  loom::Chassis chassis(
      loom::ChassisOptionsFromFlags("loom-preprocess", loom::common::v1::ROLE_PREPROCESS, 0));
  loom::PreprocessServiceOptions o;
  o.shards = absl::GetFlag(FLAGS_shards);
  o.tokenizer = absl::GetFlag(FLAGS_tokenizer);
  o.chat_template = absl::GetFlag(FLAGS_chat_template);
  o.image_aspect_ratio = absl::GetFlag(FLAGS_image_aspect_ratio);
  o.caps = {absl::GetFlag(FLAGS_encoder_max_tokens), absl::GetFlag(FLAGS_llm_max_tokens)};
  o.model = loom::hf::ModelSourceFromFlags(absl::GetFlag(FLAGS_config));
  o.seed = absl::GetFlag(FLAGS_seed);
  o.global_batch = absl::GetFlag(FLAGS_global_batch);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.prefetch = absl::GetFlag(FLAGS_prefetch);
  o.retained_batches = absl::GetFlag(FLAGS_retained_batches);
  o.validation_shards = absl::GetFlag(FLAGS_validation_shards);
  o.validation_batches = absl::GetFlag(FLAGS_validation_batches);
  o.start_iteration = absl::GetFlag(FLAGS_start_iteration);
  o.exit_on_job_end = absl::GetFlag(FLAGS_exit_on_job_end);
  if (o.start_iteration < 0 || (o.start_iteration > 0) != !absl::GetFlag(FLAGS_cursor).empty()) {
    std::fprintf(stderr, "loom-preprocess: --start_iteration > 0 and --cursor go together\n");
    return 2;
  }
  if (o.start_iteration > 0) {
    absl::StatusOr<std::string> bytes = loom::ReadFile(absl::GetFlag(FLAGS_cursor));
    if (!bytes.ok() || !o.cursor.ParseFromString(*bytes)) {
      std::fprintf(stderr, "loom-preprocess: --cursor: cannot read a data cursor from %s\n",
                   absl::GetFlag(FLAGS_cursor).c_str());
      return 2;
    }
  }
  absl::StatusOr<std::unique_ptr<loom::PreprocessServiceImpl>> service =
      loom::PreprocessServiceImpl::Create(&chassis, o);
  if (!service.ok()) {
    LOOM_LOG(ERROR).With("error", std::string(service.status().message())) << "cannot start";
    std::fprintf(stderr, "loom-preprocess: %s\n", std::string(service.status().message()).c_str());
    return 1;
  }
  chassis.AddService(service->get(), loom::data::v1::PreprocessService::service_full_name());
  return loom::JobEndExitStatus(chassis.ServeUntilSignal());
}
