#include "runtime/data/tokenizer.h"

#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"
#include "runtime/base/file.h"
#include "runtime/base/runfiles.h"
#include "runtime/data/spm_glue.h"
#include "runtime/hf/bpe_tokenizer.h"

namespace loom::data {

Tokenizer::Tokenizer(std::unique_ptr<spm::Model> model) : model_(std::move(model)) {}
Tokenizer::Tokenizer(std::unique_ptr<hf::BpeTokenizer> bpe) : bpe_(std::move(bpe)) {}
Tokenizer::~Tokenizer() = default;

namespace {

// tokenizer_config.json's `key`: a token's content (a string or an
// AddedToken object), or nullopt when null or absent.
absl::StatusOr<std::optional<std::string>> SpecialToken(const nlohmann::json& config,
                                                        const std::string& key,
                                                        const std::string& where) {
  if (!config.contains(key) || config[key].is_null()) return std::optional<std::string>();
  const nlohmann::json& v = config[key];
  if (v.is_string()) return std::optional<std::string>(v.get<std::string>());
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return std::optional<std::string>(v["content"].get<std::string>());
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": ", key, ": a token string or {\"content\": ...}, got ", v.dump()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::LoadHuggingFace(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<hf::BpeTokenizer>> bpe =
      hf::BpeTokenizer::Load(dir + "/tokenizer.json");
  if (!bpe.ok()) return bpe.status();
  const std::string where = dir + "/tokenizer_config.json";
  absl::StatusOr<std::string> text = ReadFile(where);
  if (!text.ok()) {
    return absl::NotFoundError(
        absl::StrCat(where, ": cannot be read (it names the tokens that begin and end a sample)"));
  }
  const nlohmann::json config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return absl::InvalidArgumentError(where + ": not a JSON object");
  auto id_of = [&](const std::string& key, bool required) -> absl::StatusOr<int> {
    absl::StatusOr<std::optional<std::string>> token = SpecialToken(config, key, where);
    if (!token.ok()) return token.status();
    if (!token->has_value()) {
      if (!required) return -1;
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", key, ": missing (required: it ends every sample)"));
    }
    std::optional<int32_t> id = (*bpe)->TokenId(**token);
    if (!id) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", key, ": \"", **token, "\" is not a token of tokenizer.json"));
    }
    return *id;
  };
  absl::StatusOr<int> bos = id_of("bos_token", false);
  if (!bos.ok()) return bos.status();
  absl::StatusOr<int> eos = id_of("eos_token", true);
  if (!eos.ok()) return eos.status();
  if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean() &&
      !config["add_bos_token"].get<bool>()) {
    *bos = -1;
  }
  const std::optional<int32_t> image = (*bpe)->TokenId(std::string(kImageMarker));
  std::unique_ptr<Tokenizer> t(new Tokenizer(std::move(*bpe)));
  t->bos_ = *bos;
  t->eos_ = *eos;
  t->pad_ = -1;
  t->image_ = image.value_or(-1);
  return t;
}

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
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) return LoadHuggingFace(path);
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = FromSerialized(*bytes);
  if (!t.ok())
    return absl::Status(t.status().code(), absl::StrCat(path, ": ", t.status().message()));
  return t;
}

absl::Status Tokenizer::Encode(std::string_view text, std::vector<int32_t>* ids) const {
  if (bpe_ != nullptr) return bpe_->Encode(text, ids);
  std::vector<int> out;
  std::string error;
  if (!model_->Encode(text, &out, &error)) {
    return absl::InvalidArgumentError(absl::StrCat("tokenize: ", error));
  }
  ids->insert(ids->end(), out.begin(), out.end());
  return absl::OkStatus();
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  if (bpe_ != nullptr) return bpe_->Decode(ids);
  return model_->Decode(std::vector<int>(ids.begin(), ids.end()));
}

int Tokenizer::vocab_size() const {
  return bpe_ != nullptr ? bpe_->vocab_size() : model_->vocab_size();
}

int64_t Tokenizer::max_text_bytes_per_token() const {
  return bpe_ != nullptr ? bpe_->max_text_bytes_per_token() : 0;
}

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
