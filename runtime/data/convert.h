// loom-data convert: multimodal datasets as people download them, into
// Loom's WebDataset shards (runtime/data/shard.h). Each record becomes one
// sample with `messages` (loom.data.v1.SampleRecord, trained through the
// job's chat template: docs/data.md, "Conversations") and its images.
//
// The input is a JSON array or JSON lines; each record is recognised by its
// fields:
//   - LLaVA: {"id", "image" | "images", "conversations": [{"from":
//     "human" | "gpt" | "system", "value"}]} (LLaVA-Pretrain's captions,
//     LLaVA-665K's mix with text-only records, OneVision's multi-image);
//   - messages: {"messages": [{"role", "content"}], "images": [...]}, with
//     content a string or a list of {"type": "text", "text"} and
//     {"type": "image"} parts.
//   - text → image pairs: {"prompt", "image"}: a user message
//     of the prompt and an assistant message that is the "<output_image>"
//     it draws (the generator's target, SampleRecord.output_images;
//     MetaQuery's and BLIP3-o's pairs). A conversation or messages record
//     may also carry "output_image" | "output_images", one
//     "<output_image>" marker each in its messages.
// Video: "video" names a folder of frames (sorted by name) or lists frame
// files; the "<video>" marker (else the start of the first user message)
// becomes one "<image>" per frame. A record whose messages hold no
// "<image>" markers gets them before its first user message, as LLaVA's
// loaders do.
//
// Image paths are relative to the images folder and must stay inside it.
// A record that cannot become a sample (a missing or unreadable image, an
// image that is not PNG, JPEG, WebP, GIF or BMP, markers that do not match
// the images, no conversation) is skipped and counted by reason; nothing
// crashes or stops the conversion. Keys are the record's position
// (%09d, so ids with dots cannot split a WebDataset key); the record's id
// is kept in KEY.json's "id". The same input gives the same bytes.
#ifndef LOOM_RUNTIME_DATA_CONVERT_H_
#define LOOM_RUNTIME_DATA_CONVERT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::data {

struct ConvertOptions {
  std::string input;          // the JSON or JSONL file
  std::string images;         // the folder image paths are relative to
  std::string out;            // the shards' folder (created)
  std::string name = "data";  // shards are OUT/NAME-00000.tar, ...
  int samples_per_shard = 1000;
  int64_t max_image_bytes = 64LL << 20;
  // Called after every shard written and at the end (records read so far).
  std::function<void(int64_t read, int64_t written)> progress;
};

struct ConvertSummary {
  int64_t read = 0;
  int64_t written = 0;
  std::map<std::string, int64_t> skipped;  // reason -> records
  std::vector<std::string> examples;       // the first few skips, with their record
  std::vector<std::string> shards;
};

// Skip reasons: bad_record (neither format, a role it does not know, an
// empty conversation), missing_image, unreadable_image (empty, not an image
// Loom decodes, over max_image_bytes, or a path leaving the folder),
// image_count_mismatch.
absl::StatusOr<ConvertSummary> Convert(const ConvertOptions& options);

}  // namespace loom::data

#endif  // LOOM_RUNTIME_DATA_CONVERT_H_
