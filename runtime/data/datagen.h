// loom-datagen's generator: WebDataset shards of procedurally drawn images
// and texts that describe them, so a model can learn from them with no
// outside data. Deterministic: sample i of (preset, seed) is always the same
// bytes, whatever the shard size or thread count.
//
// Every image shows 1-3 shapes of one colour and kind in one region of a
// gradient background; the text states count, colour, shape and region
// ("two red circles in the top left"), so a model that looks at the image
// can predict what one that does not cannot.
//
// Presets (heterogeneity is the point: image count, resolution and text
// length vary per sample):
//
//   caption      one image; long side lognormal (median 512 px, sigma 0.45,
//                96-2048), aspect ratio log-uniform in [1/2.5, 2.5]; 85% JPEG
//                15% PNG; text words lognormal (median 14, sigma 0.6, 4-120).
//                CC/LAION-like.
//   interleaved  0-8 images (uniform), long side lognormal (median 384,
//                sigma 0.35, 96-1024); paragraphs of filler text (median 30
//                words each, sigma 0.6) with each image followed by its
//                description. MMC4/OBELICS-like.
//   onevision    a mix: 35% single high-resolution image (long side median
//                1280, 512-2048, tiled into many tiles) with a description
//                and a question/answer; 25% multi-image (2-12 images, long
//                side median 448, 128-1024); 20% video-like (8-32 frames of
//                384x216, the shapes moving); 20% text-only (median 80
//                words, sigma 0.7, 10-300). LLaVA-OneVision-like.
//   chat         conversations (`messages`, trained through the job's chat
//                template, loss on the answers): 85% one image as caption
//                draws it with 1-4 questions its picture answers (what,
//                how many, what color, where, what shape); 15% text-only
//                turns of filler. LLaVA-665K-like.
//   generation   text → image mixed with understanding (a generator's
//                targets as `output_images`, "<output_image>" in the text):
//                50% a caption then its picture; 15% an image and its
//                caption, then the same shapes in another region; 35% as
//                caption. Output images: long side lognormal (median 256,
//                sigma 0.4, 64-1024), aspect ratio within 1.5, half PNG,
//                a plain dark background, shapes 0.3 of the shorter side,
//                their region shaded with their colour. MetaQuery/BLIP3-o-like.
#ifndef LOOM_RUNTIME_DATA_DATAGEN_H_
#define LOOM_RUNTIME_DATA_DATAGEN_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/data/shard.h"

namespace loom::data {

// The preset names: caption, interleaved, onevision, chat, generation.
const std::vector<std::string>& DatagenPresets();

struct GeneratedSample {
  std::string key;
  std::string text;                // with "<image>" markers (chat: as vicuna_v1 writes it)
  std::vector<TarMember> members;  // KEY.json, KEY.0.jpg, ...
};

// Sample `index` of `preset` under `seed`. INVALID_ARGUMENT for an unknown
// preset (naming the known ones).
absl::StatusOr<GeneratedSample> GenerateSample(const std::string& preset, uint64_t seed,
                                               int64_t index);

// Sample `index` without its pixels: its text and the size of each image, as
// GenerateSample would draw them (for planning at scales where drawing every
// image would take too long).
struct SampleOutline {
  std::string key;
  std::string text;
  std::vector<std::pair<int, int>> image_sizes;         // width, height
  std::vector<std::pair<int, int>> output_image_sizes;  // the generation preset's
};
absl::StatusOr<SampleOutline> OutlineSample(const std::string& preset, uint64_t seed,
                                            int64_t index);

// Texts only (no images drawn): `count` texts from the presets caption,
// interleaved, onevision and chat in turn, for training the tokenizer.
std::vector<std::string> GenerateTexts(uint64_t seed, int count);

struct DatagenOptions {
  std::string preset;
  int64_t samples = 0;
  uint64_t seed = 1;
  std::string out_dir;
  int samples_per_shard = 256;
  int threads = 2;
};

// Writes ceil(samples / samples_per_shard) shards OUT/PRESET-NNNNN.tar, each
// atomically. Returns the shard paths.
absl::StatusOr<std::vector<std::string>> WriteDataset(const DatagenOptions& options);

}  // namespace loom::data

#endif  // LOOM_RUNTIME_DATA_DATAGEN_H_
