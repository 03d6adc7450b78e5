#include "runtime/data/tokenizer.h"

#include <algorithm>
#include <cstring>
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

// The chat template a Hugging Face directory ships (Tokenizer::chat_template).
absl::StatusOr<std::string> ChatTemplateOf(const std::string& dir, const nlohmann::json& config) {
  const std::string where = dir + "/tokenizer_config.json: chat_template";
  if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    const nlohmann::json& c = config["chat_template"];
    if (c.is_string()) return c.get<std::string>();
    if (c.is_array()) {
      for (const nlohmann::json& e : c) {
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
            e["template"].is_string()) {
          return e["template"].get<std::string>();
        }
      }
      return absl::InvalidArgumentError(where + ": a list without a \"default\" template");
    }
    return absl::InvalidArgumentError(where + ": a string or a list of {name, template}");
  }
  std::error_code ec;
  if (std::filesystem::exists(dir + "/chat_template.jinja", ec)) {
    return ReadFile(dir + "/chat_template.jinja");
  }
  if (std::filesystem::exists(dir + "/chat_template.json", ec)) {
    absl::StatusOr<std::string> text = ReadFile(dir + "/chat_template.json");
    if (!text.ok()) return text.status();
    const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("chat_template") || !j["chat_template"].is_string()) {
      return absl::InvalidArgumentError(dir + "/chat_template.json: no \"chat_template\" string");
    }
    return j["chat_template"].get<std::string>();
  }
  return std::string();
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
  t->special_tokens_.clear();
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    absl::StatusOr<std::optional<std::string>> token = SpecialToken(config, key, where);
    if (token.ok() && token->has_value()) t->special_tokens_[key] = **token;
  }
  absl::StatusOr<std::string> chat = ChatTemplateOf(dir, config);
  if (!chat.ok()) return chat.status();
  t->chat_template_ = *chat;
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

size_t Tokenizer::SpecialTokenAt(std::string_view text, size_t pos) const {
  if (bpe_ != nullptr) return bpe_->AddedTokenAt(text, pos);
  for (const char* special : {"</s>", "<s>"}) {
    const size_t n = std::strlen(special);
    if (text.compare(pos, n, special) == 0) return n;
  }
  return 0;
}

absl::Status Tokenizer::EncodeMarked(std::string_view text, const std::vector<Span>& spans,
                                     std::vector<int32_t>* ids, std::vector<uint8_t>* marks) const {
  auto marked = [&](size_t b, size_t e) {
    for (const Span& s : spans) {
      if (b < s.end && s.begin < e) return true;
    }
    return false;
  };
  if (bpe_ != nullptr) {
    std::vector<size_t> ends;
    if (absl::Status s = bpe_->Encode(text, ids, &ends); !s.ok()) return s;
    size_t at = 0;
    for (size_t k = 0; k < ends.size(); ++k) {
      // An id that stands for no byte of its own (a prepended "▁") goes
      // with the next.
      marks->push_back(marked(at, std::max(ends[k], at + 1)) ? 1 : 0);
      at = ends[k];
    }
    return absl::OkStatus();
  }
  // Span by span: cut at every span edge and, for sentencepiece, around
  // each special token's text.
  std::vector<size_t> cuts = {0, text.size()};
  for (const Span& s : spans) {
    cuts.push_back(std::min(s.begin, text.size()));
    cuts.push_back(std::min(s.end, text.size()));
  }
  if (bpe_ == nullptr) {
    for (size_t i = 0; i < text.size(); ++i) {
      if (const size_t n = SpecialTokenAt(text, i); n > 0) {
        cuts.push_back(i);
        cuts.push_back(i + n);
        i += n - 1;
      }
    }
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    const std::string_view piece = text.substr(cuts[k], cuts[k + 1] - cuts[k]);
    if (bpe_ == nullptr && piece == "<s>") {
      ids->push_back(bos_);
    } else if (bpe_ == nullptr && piece == "</s>") {
      ids->push_back(eos_);
    } else if (absl::Status s = Encode(piece, ids); !s.ok()) {
      return s;
    }
    marks->resize(ids->size(), marked(cuts[k], cuts[k + 1]) ? 1 : 0);
  }
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
