#include "runtime/data/tokenizer.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "runtime/base/file.h"
#include "runtime/base/runfiles.h"
#include "runtime/data/spm_glue.h"

namespace loom::data {

Tokenizer::Tokenizer(std::unique_ptr<spm::Model> model) : model_(std::move(model)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromSerialized(std::string_view model) {
  std::string error;
  std::unique_ptr<spm::Model> m = spm::Model::Load(model, &error);
  if (m == nullptr) return absl::InvalidArgumentError(absl::StrCat("tokenizer model: ", error));
  const int image = m->PieceToId(std::string(kImageMarker));
  if (m->unk_id() != 0 || m->bos_id() != 1 || m->eos_id() != 2 || m->pad_id() != 3 || image != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer model: expected <unk> 0, <s> 1, </s> 2, <pad> 3, <image> 4; got ",
                     m->unk_id(), ", ", m->bos_id(), ", ", m->eos_id(), ", ", m->pad_id(), ", ",
                     image, " (train it with loom-tokenizer)"));
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(m)));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& given) {
  std::string path = given;
  if (path.empty()) {
    std::string tried;
    path = FindRunfile("runtime/data/tokenizer.model", &tried);
    if (path.empty()) {
      return absl::NotFoundError(absl::StrCat("no tokenizer model beside the binary (tried", tried,
                                              "); pass --tokenizer"));
    }
  }
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = FromSerialized(*bytes);
  if (!t.ok())
    return absl::Status(t.status().code(), absl::StrCat(path, ": ", t.status().message()));
  return t;
}

absl::Status Tokenizer::Encode(std::string_view text, std::vector<int32_t>* ids) const {
  std::vector<int> out;
  std::string error;
  if (!model_->Encode(text, &out, &error)) {
    return absl::InvalidArgumentError(absl::StrCat("tokenize: ", error));
  }
  ids->insert(ids->end(), out.begin(), out.end());
  return absl::OkStatus();
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  return model_->Decode(std::vector<int>(ids.begin(), ids.end()));
}

int Tokenizer::vocab_size() const { return model_->vocab_size(); }

absl::StatusOr<std::string> TrainTokenizer(const std::vector<std::string>& texts, int vocab_size) {
  if (vocab_size < 16) return absl::InvalidArgumentError("tokenizer vocab_size must be >= 16");
  std::vector<std::string> sentences;
  sentences.reserve(texts.size());
  for (const std::string& t : texts) {
    sentences.push_back(absl::StrReplaceAll(t, {{std::string(kImageMarker), " "}}));
  }
  const std::string args = absl::StrCat(
      "--model_type=bpe --vocab_size=", vocab_size,
      " --hard_vocab_limit=false --character_coverage=1.0 --num_threads=1"
      " --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=3 --user_defined_symbols=<image>"
      " --shuffle_input_sentence=false --input_sentence_size=0 --max_sentence_length=65536"
      " --minloglevel=2");
  std::string model, error;
  if (!spm::Train(sentences, args, &model, &error)) {
    return absl::InternalError(absl::StrCat("tokenizer training: ", error));
  }
  return model;
}

}  // namespace loom::data
