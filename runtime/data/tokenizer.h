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
};

// Trains the BPE model on `texts` (any "<image>" markers in them are
// dropped) with at most `vocab_size` pieces; returns the serialized model.
// Deterministic: the same texts give the same model.
absl::StatusOr<std::string> TrainTokenizer(const std::vector<std::string>& texts, int vocab_size);

}  // namespace loom::data

#endif  // LOOM_RUNTIME_DATA_TOKENIZER_H_
