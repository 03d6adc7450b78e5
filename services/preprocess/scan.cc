#include "services/preprocess/scan.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "loom/data/v1/sample.pb.h"
#include "runtime/base/file.h"
#include "runtime/data/loader.h"

namespace loom {

absl::StatusOr<ScanSummary> RunScan(const ScanOptions& options) {
  if (options.shards.empty()) return absl::InvalidArgumentError("--shards is required");
  if (options.output.empty()) return absl::InvalidArgumentError("--output is required");
  absl::StatusOr<hf::PretrainedModel> model = hf::ResolveModel(options.model);
  if (!model.ok()) return model.status();
  absl::StatusOr<hf::DataPipeline> pipeline = hf::DataPipelineFor(
      *model, options.tokenizer, options.chat_template, options.image_aspect_ratio);
  if (!pipeline.ok()) return pipeline.status();
  // Every sample once: a mixture's sources one after another, weights aside.
  absl::StatusOr<std::vector<data::DataSource>> sources = data::ParseShardSources(options.shards);
  if (!sources.ok()) return sources.status();

  data::LoaderOptions lo;
  for (const data::DataSource& source : *sources) {
    lo.shards.insert(lo.shards.end(), source.shards.begin(), source.shards.end());
  }
  lo.shuffle = false;
  lo.epochs = 1;
  lo.threads = std::max(1, options.threads);
  lo.prefetch = 16 * lo.threads;
  lo.preprocess = std::move(pipeline->preprocess);
  lo.preprocess.caps = options.caps;
  const int gen_patches = lo.preprocess.gen_patches_per_image;
  ScanSummary summary;
  lo.on_skip = [&](const data::SkippedSample& s) { ++summary.skipped[s.reason]; };
  absl::StatusOr<std::unique_ptr<data::DataLoader>> loader =
      data::DataLoader::Open(lo, pipeline->tokenizer.get());
  if (!loader.ok()) return loader.status();

  std::string out;
  google::protobuf::util::JsonPrintOptions json;
  json.preserve_proto_field_names = true;
  json.always_print_primitive_fields = true;
  for (;;) {
    absl::StatusOr<data::ProcessedSample> s = (*loader)->Next();
    if (absl::IsOutOfRange(s.status())) break;
    if (!s.ok()) return s.status();
    const data::v1::ScanRecord record = data::ScanRecordOf(*s, gen_patches);
    std::string line;
    if (auto st = google::protobuf::util::MessageToJsonString(record, &line, json); !st.ok()) {
      return absl::InternalError(st.ToString());
    }
    absl::StrAppend(&out, line, "\n");
    ++summary.kept;
    summary.truncated += s->truncated_tokens > 0;
  }
  summary.read = summary.kept;
  for (const auto& [reason, n] : summary.skipped) summary.read += n;
  if (absl::Status st = WriteFileAtomically(options.output, out); !st.ok()) return st;
  return summary;
}

std::string FormatScanSummary(const ScanSummary& summary) {
  int64_t skipped = 0;
  std::string reasons;
  for (const auto& [reason, n] : summary.skipped) {
    skipped += n;
    absl::StrAppend(&reasons, reasons.empty() ? "" : ", ", reason, " ", n);
  }
  std::string out = absl::StrCat("read ", summary.read, ", kept ", summary.kept);
  if (summary.truncated > 0) absl::StrAppend(&out, " (truncated ", summary.truncated, ")");
  absl::StrAppend(&out, ", skipped ", skipped);
  if (!reasons.empty()) absl::StrAppend(&out, " (", reasons, ")");
  return out;
}

}  // namespace loom
