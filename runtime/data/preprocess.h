// The preprocessing of one sample: KEY.json and its images in, the model's
// tensors and the scheduler's metadata out.
//
//   1. KEY.json: valid UTF-8, protobuf-JSON SampleRecord, a non-empty text
//      with one "<image>" marker per listed image, every listed image present.
//   2. Text: <s> (if the tokenizer has one), the BPE ids of each text
//      piece, an image's slots at its marker, </s>; every text token after
//      the first carries loss. A conversation (`messages`) is instead the
//      chat template's text, tokenized as it stands (the template puts the
//      <s> and the turns' end tokens), with loss on the assistant turns
//      only (Sample::loss_mask). A text whose bytes cannot fit the maximum
//      sequence (Tokenizer::max_text_bytes_per_token) is refused before it
//      is tokenized.
//   3. Images: the header gives the size; the tile grid (cols x rows <=
//      max tiles, the aspect ratio closest to the image's; ties go to the
//      larger grid when the image has the pixels for it) is chosen before a
//      pixel is decoded, so an over-long sample is refused cheaply and a JPEG
//      decodes with DCT scaling straight to about the size it is resized to.
//      The image is resized to (cols*S, rows*S) and cut into tiles; a grid
//      of more than one tile adds a thumbnail (the whole image at S x S).
//      A sample of n images gives each at most max(1, max_tiles / n) tiles
//      (as InternVL does), so video frames are one tile each. With
//      `image_to_tile` (a Hugging Face image processor) each image is
//      instead one tile, made of the whole image by that function.
//   4. Tiles are normalised per channel, (x/255 - mean) / std (CLIP's).
//   5. Output images (SampleRecord.output_images, a generator's targets):
//      each "<output_image>" marker becomes the model's gen_queries query
//      positions (kQueryToken), and its picture the largest centred square,
//      resized to the generator's side and scaled to [-1, 1]
//      (Sample::gen_images). A model without a generator skips such a
//      sample (no_generator); truncation never cuts through the queries.
//
// A sample that fails any check is skipped with a reason (kSkipReasons);
// nothing here throws, aborts or allocates what a header merely claims.
#ifndef LOOM_RUNTIME_DATA_PREPROCESS_H_
#define LOOM_RUNTIME_DATA_PREPROCESS_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loom/data/v1/sample.pb.h"
#include "runtime/data/chat_template.h"
#include "runtime/data/image.h"
#include "runtime/data/shard.h"
#include "runtime/data/tokenizer.h"
#include "runtime/model/config.h"
#include "runtime/model/model.h"

namespace loom::data {

// Label values of loom_preprocess_samples_skipped_total{reason}.
inline constexpr std::array<std::string_view, 17> kSkipReasons = {
    "truncated_tar",         // the tar ends or breaks inside the sample
    "member_too_large",      // a member over ShardLimits
    "missing_json",          // no KEY.json
    "invalid_utf8",          // KEY.json is not UTF-8
    "bad_json",              // KEY.json is not a SampleRecord
    "empty_text",            // no text besides image markers
    "image_count_mismatch",  // markers != listed images (or output images)
    "missing_image",         // a listed image is not in the tar
    "empty_image",           // a zero-byte image
    "corrupt_image",         // undecodable or truncated image data
    "unsupported_image",     // not PNG, JPEG, WebP, GIF or BMP; an animated WebP
    "image_too_large",       // header claims more than DecodeLimits
    "text_too_long",         // text tokens alone exceed the maximum sequence (truncate off)
    "sequence_too_long",     // text + image tokens exceed it (truncate off), or nothing
                             // to train on is left within it
    "bad_conversation",      // messages the chat template refuses, or text and messages both
    "over_token_cap",        // more ViT or LLM tokens than a microbatch's cap (TokenCaps)
    "no_generator",          // an output image, and the model has no generator
};

// A microbatch's token caps (the job's parallel.encoder_max_tokens and
// llm_max_tokens; 0: none): a sample over one cannot go in any microbatch.
struct TokenCaps {
  int encoder = 0;  // ViT tokens: tiles x patches per tile
  int llm = 0;      // the packed sequence: text + image tokens
};

struct PreprocessOptions {
  int tile_size = 32;
  int tokens_per_tile = 16;
  int max_tiles = 12;  // per sample; thumbnail not counted
  bool thumbnail = true;
  int max_seq = 1024;            // text + image tokens, <s> and </s> included
  int vit_tokens_per_tile = 16;  // the ViT's patches per tile (the encoder's token cap)
  TokenCaps caps;                // a sample over one is skipped as over_token_cap
  // The generator's output images (ModelConfig::generator): the side each
  // becomes, the LLM's query positions per image, and the generator's
  // patches per image (for scan). gen_image_size 0: the model has no
  // generator.
  int gen_image_size = 0;
  int gen_queries = 0;
  int gen_patches_per_image = 0;
  // A sample longer than max_seq is cut to it (the text off the end, never
  // through an image's slots: an image that does not fit whole goes, with
  // everything after it; no </s> after a cut) instead of skipped as
  // text_too_long or sequence_too_long. Still skipped: a sample with
  // nothing to train on in its first max_seq tokens.
  bool truncate = true;
  DecodeLimits decode;
  ShardLimits shard;
  std::array<float, 3> mean = {0.48145466f, 0.4578275f, 0.40821073f};
  std::array<float, 3> std = {0.26862954f, 0.26130258f, 0.27577711f};
  // Set: every image becomes one tile, this function's (3, S, S) floats of
  // the whole decoded image, in place of the tile grid, the thumbnail and
  // the normalisation above (a Hugging Face image processor, as LLaVA's
  // models take images: runtime/hf/hf_image.h). Thread-safe.
  std::function<absl::StatusOr<std::vector<float>>(const Image&)> image_to_tile;
  // Renders samples that carry `messages` (runtime/data/chat_template.h);
  // unset, the tokenizer's own template, else vicuna_v1 (and when the
  // tokenizer's own does not parse, such samples are skipped as
  // bad_conversation).
  std::shared_ptr<const ChatTemplate> chat;
};

// Tile size, tokens per tile and maximum sequence from the model config.
PreprocessOptions PreprocessOptionsFor(const ModelConfig& config);

// FAILED_PRECONDITION, naming both sizes, when the tokenizer's ids do not all
// fit the model's vocabulary (the embedding would be read out of bounds).
absl::Status CheckTokenizerFits(const Tokenizer& tokenizer, const ModelConfig& config);

struct TileGrid {
  int cols = 1;
  int rows = 1;
};
TileGrid ChooseTileGrid(int width, int height, int max_tiles, int tile_size);
// Tiles a grid becomes: cols*rows, plus the thumbnail when there is more than one.
int TileCount(const TileGrid& grid, bool thumbnail);

struct ImageInfo {
  int width = 0;  // as stored
  int height = 0;
  TileGrid grid;
  int tiles = 0;
};

struct ProcessedSample {
  std::string key;
  std::vector<ImageInfo> images;
  std::vector<ImageInfo> output_images;  // as stored; tiles 1
  int image_tokens = 0;
  int query_tokens = 0;  // the generator's query positions of every output image
  int text_tokens = 0;
  int loss_tokens = 0;       // LossTokens(sample)
  int truncated_tokens = 0;  // cut off the end to fit max_seq (PreprocessOptions::truncate)
  Sample sample;             // tiles (empty when processed metadata-only) and tokens
};

struct SkippedSample {
  std::string key;
  std::string reason;  // one of kSkipReasons
  std::string detail;
};

struct Outcome {
  bool ok = false;
  ProcessedSample sample;
  SkippedSample skip;
};

class Preprocessor {
 public:
  // `tokenizer` is not owned and must outlive this.
  Preprocessor(PreprocessOptions options, const Tokenizer* tokenizer);

  // Thread-safe. With `decode_pixels` false, images are checked only as far
  // as their headers (no tiles are produced).
  Outcome Process(const SampleFiles& files, bool decode_pixels = true) const;

  const PreprocessOptions& options() const { return options_; }

 private:
  PreprocessOptions options_;
  const Tokenizer* tokenizer_;
};

bool IsValidUtf8(std::string_view s);

// What loom-preprocess tells the scheduler of a kept sample (scan's line):
// tiles per image, token counts, the generator's patches per output image
// (PreprocessOptions::gen_patches_per_image) and the query positions.
data::v1::ScanRecord ScanRecordOf(const ProcessedSample& s, int gen_patches_per_image);

}  // namespace loom::data

#endif  // LOOM_RUNTIME_DATA_PREPROCESS_H_
