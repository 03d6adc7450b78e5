// The text tokenizer: Loom's sentencepiece BPE model (Debian
// libsentencepiece), or a Hugging Face model's tokenizer.json (byte-level
// BPE, runtime/hf/bpe_tokenizer.h).
//
// Loom's model: ids 0-4 are fixed: <unk> 0, <s> 1 (begin of sample), </s> 2
// (end of sample), <pad> 3, <image> 4. <image> is reserved so that text never
// encodes to it: the pipeline splits texts at "<image>" and puts image-token
// slots there itself. The model is trained on loom-datagen's text by
// TrainTokenizer (the `loom-tokenizer` binary; Bazel builds
// //runtime/data:tokenizer_model as a setup step).
//
// A Hugging Face directory (`Load(DIR)`, DIR holding tokenizer.json): the
// begin and end of a sample are tokenizer_config.json's bos_token (none when
// it is null or absent, as Qwen2's; none when add_bos_token is false) and
// eos_token (required), each a string or {"content": ...} naming a token of
// tokenizer.json; <image> is the tokenizer's "<image>" token if it has one
// (the pipeline puts image slots, not this id, in samples); no pad id.
#ifndef LOOM_RUNTIME_DATA_TOKENIZER_H_
#define LOOM_RUNTIME_DATA_TOKENIZER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::hf {
class BpeTokenizer;
}

namespace loom::data {

namespace spm {
class Model;
}

inline constexpr std::string_view kImageMarker = "<image>";
// Where an output image goes (a generator's target; SampleRecord.output_images).
inline constexpr std::string_view kOutputImageMarker = "<output_image>";

class Tokenizer {
 public:
  // `path` "" loads the model built with the binary
  // (//runtime/data:tokenizer_model, found in its runfiles or beside it); a
  // directory loads its tokenizer.json and tokenizer_config.json.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHuggingFace(const std::string& dir);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromSerialized(std::string_view model);
  ~Tokenizer();

  // Appends the ids of `text` (no <s>/</s>). Thread-safe.
  absl::Status Encode(std::string_view text, std::vector<int32_t>* ids) const;

  // A byte range [begin, end) of a text.
  struct Span {
    size_t begin = 0;
    size_t end = 0;
  };
  // Appends the ids of a rendered chat `text`, and for each id a mark: 1
  // when a byte it stands for lies in one of `spans` (the loss spans of
  // runtime/data/chat_template.h). Special tokens' text in `text`
  // ("<|eot_id|>", Loom's "<s>" and "</s>") becomes their ids.
  //   - tokenizer.json: the ids are exactly Encode's of the whole text, so
  //     they equal transformers' for the rendered template; where each id
  //     ends in the text (BpeTokenizer::Encode) places it.
  //   - Loom's sentencepiece model: encoded span by span, specials apart
  //     (sentencepiece normalizes whitespace, so bytes cannot place its
  //     ids); the same text always gives the same ids.
  absl::Status EncodeMarked(std::string_view text, const std::vector<Span>& spans,
                            std::vector<int32_t>* ids, std::vector<uint8_t>* marks) const;
  // The byte length of the special token whose text begins at `pos` of
  // `text` (an added token of tokenizer.json; Loom's <s> or </s>), or 0.
  size_t SpecialTokenAt(std::string_view text, size_t pos) const;
  // The chat template a Hugging Face directory ships: tokenizer_config.json's
  // chat_template (a string, or the "default" of a list of named ones),
  // else chat_template.jinja, else chat_template.json's; "" if none (and
  // for Loom's model).
  const std::string& chat_template() const { return chat_template_; }
  // A chat template's token variables: bos_token, eos_token, unk_token and
  // pad_token, those the tokenizer has.
  const std::map<std::string, std::string>& special_tokens() const { return special_tokens_; }
  std::string Decode(const std::vector<int32_t>& ids) const;

  int vocab_size() const;
  // The most bytes of a text one id of Encode can stand for, so that a text
  // of N bytes is at least ceil(N / this) ids: checked before encoding a
  // long text (hf::BpeTokenizer::max_text_bytes_per_token). 0 when there is
  // no such bound: sentencepiece's normalizer drops runs of whitespace, so
  // its ids can stand for any number of bytes (its BPE is O(n log n) in any
  // case).
  int64_t max_text_bytes_per_token() const;
  int bos_id() const { return bos_; }  // -1: samples start without one
  int eos_id() const { return eos_; }
  int pad_id() const { return pad_; }
  int image_id() const { return image_; }

 private:
  explicit Tokenizer(std::unique_ptr<spm::Model> model);
  explicit Tokenizer(std::unique_ptr<hf::BpeTokenizer> bpe);
  std::unique_ptr<spm::Model> model_;  // or
  std::unique_ptr<hf::BpeTokenizer> bpe_;
  int bos_ = 1, eos_ = 2, pad_ = 3, image_ = 4;
  std::string chat_template_;
  std::map<std::string, std::string> special_tokens_ = {
      {"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}, {"pad_token", "<pad>"}};
};

// Trains the BPE model on `texts` (any "<image>" markers in them are
// dropped) with at most `vocab_size` pieces; returns the serialized model.
// Deterministic: the same texts give the same model.
absl::StatusOr<std::string> TrainTokenizer(const std::vector<std::string>& texts, int vocab_size);

}  // namespace loom::data

#endif  // LOOM_RUNTIME_DATA_TOKENIZER_H_
