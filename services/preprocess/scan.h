// `loom-preprocess scan`: the offline pass over a dataset.
//
//   loom-preprocess scan --shards 'data/*.tar' --output scan.jsonl
//
// Runs every sample through the same pipeline the service uses (decode,
// tile, tokenize) in shard order, writes one JSON line per kept sample,
//   {"key":"caption-00000001","images":[7],"image_tokens":112,"text_tokens":23}
// (loom.data.v1.ScanRecord), and prints how many samples were read, kept
// and skipped, by reason.
#ifndef LOOM_SERVICES_PREPROCESS_SCAN_H_
#define LOOM_SERVICES_PREPROCESS_SCAN_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/hf/pretrained.h"

namespace loom {

struct ScanOptions {
  std::string shards;              // glob
  std::string output;              // JSON lines, written atomically
  std::string tokenizer;           // "" for the model's own
  std::string chat_template;       // "" for the tokenizer's own (runtime/data/chat_template.h)
  std::string image_aspect_ratio;  // "", crop or pad (hf::DataPipelineFor)
  data::TokenCaps caps;            // samples over them are skipped (over_token_cap)
  hf::ModelSource model;
  int threads = 2;
};

struct ScanSummary {
  int64_t read = 0;
  int64_t kept = 0;
  int64_t truncated = 0;                   // kept, cut to the maximum sequence
  std::map<std::string, int64_t> skipped;  // reason -> samples
};

absl::StatusOr<ScanSummary> RunScan(const ScanOptions& options);

// "read 40, kept 38, skipped 2 (corrupt_image 1, empty_text 1)", and
// ", truncated N" after kept when some were cut to the maximum sequence.
std::string FormatScanSummary(const ScanSummary& summary);

}  // namespace loom

#endif  // LOOM_SERVICES_PREPROCESS_SCAN_H_
