// The text tokenizer: a sentencepiece BPE model (Debian libsentencepiece).
//
// Ids 0-4 are fixed: <unk> 0, <s> 1 (begin of sample), </s> 2 (end of
// sample), <pad> 3, <image> 4. <image> is reserved so that text never
// encodes to it: the pipeline splits texts at "<image>" and puts image-token
// slots there itself. The model is trained on loom-datagen's text by
// TrainTokenizer (the `loom-tokenizer` binary; Bazel builds
// //runtime/data:tokenizer_model as a setup step).
#ifndef LOOM_RUNTIME_DATA_TOKENIZER_H_
#define LOOM_RUNTIME_DATA_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::data {

namespace spm {
class Model;
}

inline constexpr std::string_view kImageMarker = "<image>";

class Tokenizer {
 public:
  // `path` "" loads the model built with the binary
  // (//runtime/data:tokenizer_model, found in its runfiles or beside it).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromSerialized(std::string_view model);
  ~Tokenizer();

  // Appends the ids of `text` (no <s>/</s>). Thread-safe.
  absl::Status Encode(std::string_view text, std::vector<int32_t>* ids) const;
  std::string Decode(const std::vector<int32_t>& ids) const;

  int vocab_size() const;
  int bos_id() const { return bos_; }
  int eos_id() const { return eos_; }
  int pad_id() const { return pad_; }
  int image_id() const { return image_; }

 private:
  explicit Tokenizer(std::unique_ptr<spm::Model> model);
  std::unique_ptr<spm::Model> model_;
  int bos_ = 1, eos_ = 2, pad_ = 3, image_ = 4;
};

// Trains the BPE model on `texts` (any "<image>" markers in them are
// dropped) with at most `vocab_size` pieces; returns the serialized model.
// Deterministic: the same texts give the same model.
absl::StatusOr<std::string> TrainTokenizer(const std::vector<std::string>& texts, int vocab_size);

}  // namespace loom::data

#endif  // LOOM_RUNTIME_DATA_TOKENIZER_H_
