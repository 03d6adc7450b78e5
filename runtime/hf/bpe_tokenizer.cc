#include "runtime/hf/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <queue>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/base/file.h"

namespace loom::hf {
namespace {

using nlohmann::json;

// GPT-2's pattern, what ByteLevel splits with when use_regex is true.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string Utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return out;
}

// Length of the UTF-8 sequence starting with byte `c` (1 for a stray byte).
int Utf8Length(unsigned char c) {
  if (c >= 0xf0) return 4;
  if (c >= 0xe0) return 3;
  if (c >= 0xc0) return 2;
  return 1;
}

// Well-formed UTF-8: no stray continuation bytes, overlong forms,
// surrogates or code points past U+10FFFF.
bool IsUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xc2 && c <= 0xdf) {
      n = 1;
      cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      n = 2;
      cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    for (int k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

// Two symbols as one key.
uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// Code points in UTF-8 `s`: a token's bytes (each byte one symbol).
int64_t CodePoints(std::string_view s) {
  int64_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

// NFC makes a text at most this many times shorter in UTF-8 bytes. Measured
// with Python's unicodedata (Unicode 14) over every code point alone and every
// composed character made from the longest input that decomposes to it:
// 3.5 at worst (U+0390, 2 bytes, from 7). U+212A KELVIN SIGN (3 bytes)
// becomes "K" (1), Hangul L, V and T jamo (9) one syllable (3). 4 leaves a
// margin for later Unicode versions.
constexpr int64_t kNfcMaxShrink = 4;

// U+2581 LOWER ONE EIGHTH BLOCK: sentencepiece's space.
constexpr char kMeta[] = "\xe2\x96\x81";

absl::Status Bad(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

}  // namespace

// What needs a library handle: the pre-tokenizer's regexes, ICU's NFC.
struct BpeTokenizer::Impl {
  std::vector<pcre2_code*> splits;  // applied in order, "Isolated"
  bool add_prefix_space = false;
  const icu::Normalizer2* nfc = nullptr;
  // BPE over symbol indices (each a distinct vocabulary string): a merge's
  // rank and the symbol it makes, by PairKey(left, right).
  struct Merge {
    int rank;
    int32_t result;
  };
  std::unordered_map<uint64_t, Merge> merges;
  std::vector<int32_t> symbol_id;  // vocabulary id by symbol index
  int32_t byte_symbol[256] = {};   // symbol index of each byte
  // Sentencepiece-style (Llama 2, Mistral): characters, not bytes, with
  // spaces as U+2581 and "▁" before each text (Prepend, or Metaspace's
  // prepend_scheme: always, or first for a text at the input's start).
  bool metaspace = false;
  enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
  bool split_metaspace = false;                          // Metaspace split: a piece per "▁word"
  std::unordered_map<std::string, int32_t> char_symbol;  // vocabulary string -> symbol
  int32_t byte_token[256];                               // <0xXX>'s symbol (byte_fallback), or -1
  bool byte_fallback = false;
  int32_t unk_symbol = -1;
  bool fuse_unk = false;
  ~Impl() {
    for (pcre2_code* c : splits) pcre2_code_free(c);
  }
};

BpeTokenizer::BpeTokenizer() : impl_(std::make_unique<Impl>()) {
  std::fill(std::begin(impl_->byte_token), std::end(impl_->byte_token), -1);
}
BpeTokenizer::~BpeTokenizer() = default;

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Load(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  return FromJson(*text, path);
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromJson(std::string_view text,
                                                                     const std::string& where) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Bad(where, "not a JSON object");
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());

  // model
  auto model = j.find("model");
  if (model == j.end() || !model->is_object()) return Bad(where, "no \"model\" object");
  if (model->value("type", std::string()) != "BPE") {
    return Bad(where, absl::StrCat("model.type ", model->value("type", json()).dump(),
                                   " is not supported (BPE only)"));
  }
  for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto f = model->find(field);
    if (f != model->end() && !f->is_null() && !(f->is_string() && f->get<std::string>().empty())) {
      return Bad(where, absl::StrCat("model.", field, " is not supported"));
    }
  }
  t->impl_->byte_fallback = model->value("byte_fallback", false);
  t->impl_->fuse_unk = model->value("fuse_unk", false);
  t->ignore_merges_ = model->value("ignore_merges", false);
  auto vocab = model->find("vocab");
  if (vocab == model->end() || !vocab->is_object()) return Bad(where, "no model.vocab object");
  int32_t max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 ||
        it->get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return Bad(where,
                 absl::StrCat("model.vocab[", json(it.key()).dump(), "] is not a non-negative id"));
    }
    t->vocab_[it.key()] = it->get<int32_t>();
    max_id = std::max(max_id, it->get<int32_t>());
  }
  std::unordered_map<std::string_view, int32_t> symbol;  // vocabulary string -> symbol index
  for (const auto& [token, id] : t->vocab_) {
    symbol[token] = static_cast<int32_t>(t->impl_->symbol_id.size());
    t->impl_->symbol_id.push_back(id);
    t->max_text_bytes_per_token_ = std::max(t->max_text_bytes_per_token_, CodePoints(token));
  }
  // added tokens (their ids may lie past the vocabulary)
  auto added = j.find("added_tokens");
  if (added != j.end() && !added->is_null()) {
    if (!added->is_array()) return Bad(where, "added_tokens is not an array");
    for (const json& a : *added) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string() ||
          a["content"].get<std::string>().empty()) {
        return Bad(where, absl::StrCat("added_tokens entry ", a.dump(), " lacks an id or content"));
      }
      const int32_t id = a["id"].get<int32_t>();
      if (id < 0) return Bad(where, absl::StrCat("added token ", a.dump(), " has a negative id"));
      t->added_.push_back({a["content"].get<std::string>(), id});
      max_id = std::max(max_id, id);
    }
  }
  std::sort(t->added_.begin(), t->added_.end(), [](const auto& x, const auto& y) {
    return x.first.size() != y.first.size() ? x.first.size() > y.first.size() : x.first < y.first;
  });
  t->id_to_token_.assign(static_cast<size_t>(max_id + 1), "");
  t->is_added_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id] : t->vocab_) t->id_to_token_[id] = token;
  for (const auto& [content, id] : t->added_) {
    t->id_to_token_[id] = content;
    t->is_added_[id] = true;
  }
  // merges, in either form
  auto merges = model->find("merges");
  if (merges == model->end() || !merges->is_array()) return Bad(where, "no model.merges array");
  int rank = 0;
  for (const json& m : *merges) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ', 1);
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return Bad(where, absl::StrCat("merge ", m.dump(), " is not \"a b\""));
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return Bad(where, absl::StrCat("merge ", m.dump(), " is neither \"a b\" nor [\"a\", \"b\"]"));
    }
    if (!t->vocab_.count(a) || !t->vocab_.count(b) || !t->vocab_.count(a + b)) {
      return Bad(where, absl::StrCat("merge ", m.dump(), " has a token not in the vocabulary"));
    }
    t->impl_->merges.emplace(
        PairKey(symbol.at(a), symbol.at(b)),
        Impl::Merge{rank++, symbol.at(a + b)});  // the first of duplicates counts
  }

  // normalizer: none or NFC (alone or in a Sequence)
  auto normalizer = j.find("normalizer");
  if (normalizer != j.end() && !normalizer->is_null()) {
    std::vector<json> parts = {*normalizer};
    if (normalizer->value("type", std::string()) == "Sequence") {
      parts = normalizer->value("normalizers", std::vector<json>());
    }
    // Sentencepiece's legacy form: Prepend("▁") then Replace(" ", "▁").
    const bool legacy = parts.size() == 2 && parts[0].value("type", std::string()) == "Prepend" &&
                        parts[0].value("prepend", std::string()) == kMeta &&
                        parts[1].value("type", std::string()) == "Replace" &&
                        parts[1].value("pattern", json()).value("String", std::string()) == " " &&
                        parts[1].value("content", std::string()) == kMeta;
    if (legacy) {
      t->impl_->metaspace = true;
      parts.clear();
    }
    for (const json& n : parts) {
      if (n.value("type", std::string()) != "NFC") {
        return Bad(where, absl::StrCat("normalizer ", n.dump(),
                                       " is not supported (NFC, or Prepend(\"▁\") with "
                                       "Replace(\" \", \"▁\"))"));
      }
      t->nfc_ = true;
    }
  }
  if (t->nfc_) {
    UErrorCode err = U_ZERO_ERROR;
    t->impl_->nfc = icu::Normalizer2::getNFCInstance(err);
    if (U_FAILURE(err)) return absl::InternalError(absl::StrCat("ICU NFC: ", u_errorName(err)));
  }

  // pre-tokenizer
  auto compile = [&](const std::string& pattern) -> absl::Status {
    int code = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &code, &offset, nullptr);
    if (re == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(code, msg, sizeof(msg));
      return Bad(where, absl::StrCat("pre_tokenizer regex ", json(pattern).dump(), " at offset ",
                                     offset, ": ", reinterpret_cast<const char*>(msg)));
    }
    t->impl_->splits.push_back(re);
    return absl::OkStatus();
  };
  auto pre = j.find("pre_tokenizer");
  if (pre != j.end() && pre->is_object() && pre->value("type", std::string()) == "Metaspace" &&
      !t->impl_->metaspace) {
    if (pre->value("replacement", std::string()) != kMeta) {
      return Bad(where, "pre_tokenizer Metaspace: only the replacement \"▁\" is supported");
    }
    const std::string scheme = pre->value("prepend_scheme", std::string("always"));
    const bool add_prefix = pre->value("add_prefix_space", true);
    t->impl_->metaspace = true;
    t->impl_->prepend = !add_prefix || scheme == "never" ? Impl::Prepend::kNever
                        : scheme == "first"              ? Impl::Prepend::kFirst
                                                         : Impl::Prepend::kAlways;
    t->impl_->split_metaspace = pre->value("split", true);
  }
  if (t->impl_->metaspace) {
    if (t->nfc_) return Bad(where, "NFC with a sentencepiece-style tokenizer is not supported");
    if (pre != j.end() && !pre->is_null() && pre->value("type", std::string()) != "Metaspace") {
      return Bad(where, absl::StrCat("pre_tokenizer ", pre->dump(),
                                     " is not supported with a sentencepiece-style normalizer"));
    }
    for (const auto& [token, index] : symbol) t->impl_->char_symbol[std::string(token)] = index;
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      auto it = symbol.find(name);
      if (it != symbol.end()) t->impl_->byte_token[b] = it->second;
    }
    const std::string unk = model->value("unk_token", json()).is_string()
                                ? model->value("unk_token", std::string())
                                : std::string();
    if (auto it = symbol.find(unk); !unk.empty() && it != symbol.end()) {
      t->impl_->unk_symbol = it->second;
    }
    // A token stands for at most its own bytes of text ("▁", 3 bytes, for
    // one space; a byte token for one byte).
    t->max_text_bytes_per_token_ = 1;
    for (const auto& [token, id] : t->vocab_) {
      t->max_text_bytes_per_token_ =
          std::max(t->max_text_bytes_per_token_, static_cast<int64_t>(token.size()));
    }
    for (const auto& [content, id] : t->added_) {
      t->max_text_bytes_per_token_ =
          std::max(t->max_text_bytes_per_token_, static_cast<int64_t>(content.size()));
    }
    return t;
  }
  if (pre == j.end() || !pre->is_object()) {
    return Bad(where, "no pre_tokenizer (byte-level BPE needs ByteLevel)");
  }
  std::vector<json> steps = {*pre};
  if (pre->value("type", std::string()) == "Sequence") {
    steps = pre->value("pretokenizers", std::vector<json>());
  }
  bool byte_level = false;
  for (const json& s : steps) {
    const std::string type = s.value("type", std::string());
    if (type == "Split" && !byte_level) {
      const json pattern = s.value("pattern", json());
      if (s.value("behavior", std::string()) != "Isolated" || s.value("invert", false)) {
        return Bad(where,
                   absl::StrCat("pre_tokenizer ", s.dump(),
                                ": only the Isolated behaviour, not inverted, is supported"));
      }
      std::string regex;
      if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
        regex = pattern["Regex"].get<std::string>();
      } else if (pattern.contains("String") && pattern["String"].is_string()) {
        for (char c : pattern["String"].get<std::string>()) {  // literal
          if (!std::isalnum(static_cast<unsigned char>(c))) regex += '\\';
          regex += c;
        }
      } else {
        return Bad(where, absl::StrCat("pre_tokenizer ", s.dump(), ": no pattern"));
      }
      if (absl::Status st = compile(regex); !st.ok()) return st;
    } else if (type == "ByteLevel" && !byte_level) {
      byte_level = true;
      t->impl_->add_prefix_space = s.value("add_prefix_space", false);
      if (s.value("use_regex", true)) {
        if (absl::Status st = compile(kGpt2Pattern); !st.ok()) return st;
      }
    } else {
      return Bad(where, absl::StrCat("pre_tokenizer ", s.dump(),
                                     " is not supported (Split with a regex, then ByteLevel)"));
    }
  }
  if (!byte_level) return Bad(where, "the pre_tokenizer has no ByteLevel step");

  // GPT-2's byte alphabet: printable bytes stand for themselves, the others
  // for 256, 257, ... in byte order.
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    t->byte_symbol_[b] = Utf8(printable ? b : next++);
    t->byte_of_symbol_[t->byte_symbol_[b]] = static_cast<char>(b);
    if (!t->vocab_.count(t->byte_symbol_[b])) {
      return Bad(where, absl::StrCat("model.vocab lacks the symbol of byte ", b, " (",
                                     json(t->byte_symbol_[b]).dump(), ")"));
    }
    t->impl_->byte_symbol[b] = symbol.at(t->byte_symbol_[b]);
  }
  // Every id stands for the bytes of its symbols after normalization (each
  // symbol one byte), or for an added token's content as given.
  if (t->nfc_) t->max_text_bytes_per_token_ *= kNfcMaxShrink;
  for (const auto& [content, id] : t->added_) {
    t->max_text_bytes_per_token_ =
        std::max(t->max_text_bytes_per_token_, static_cast<int64_t>(content.size()));
  }
  return t;
}

std::optional<int32_t> BpeTokenizer::TokenId(std::string_view token) const {
  for (const auto& [content, id] : added_) {
    if (content == token) return id;
  }
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

// BPE as GPT-2's encoder.py defines it: in rounds, the lowest-ranked
// adjacent pair and every occurrence of it, left to right (in "a a a" the
// pair "a a" once), until no pair has a rank. Rescanning the piece each round
// is O(n^2) on a long word; this finds each round's occurrences instead:
//
//   - the symbols are a linked list over their first byte's position;
//   - a min-heap holds (rank, position) for every adjacent pair with a rank,
//     and entries go stale as their pair changes (checked when popped);
//   - a round pops every entry of the lowest valid rank r, which come out
//     left to right, and merges each that still holds r's pair. A merge
//     never makes another occurrence of r's pair (its result differs from
//     either side), so these are exactly the occurrences a left-to-right
//     scan merges, and an entry whose left symbol the previous merge took
//     (the middle "a" above) is skipped as stale;
//   - only then are the pairs beside each merge pushed, so a pair a round
//     makes waits for the next round even when its rank is lower.
//
// Each merge pushes at most two entries: O(n log n) for n bytes, the same
// ids (runtime/hf/bpe_tokenizer_test.cc checks them against the rounds).
void BpeTokenizer::EncodePiece(std::string_view piece, std::vector<int32_t>* ids,
                               std::vector<int32_t>* lengths) const {
  if (ignore_merges_) {
    std::string whole;
    for (unsigned char c : piece) whole += byte_symbol_[c];
    auto it = vocab_.find(whole);
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      lengths->push_back(static_cast<int32_t>(piece.size()));
      return;
    }
  }
  std::vector<int32_t> sym(piece.size()), bytes(piece.size(), 1);
  for (size_t i = 0; i < piece.size(); ++i) {
    sym[i] = impl_->byte_symbol[static_cast<unsigned char>(piece[i])];
  }
  MergeSymbols(std::move(sym), bytes, ids, lengths);
}

// A sentencepiece-style piece ("▁" for spaces, already in place): each
// character its vocabulary symbol, else its bytes' <0xXX> tokens
// (byte_fallback), else <unk> (one for a run of them with fuse_unk); then
// the merges.
void BpeTokenizer::EncodeCharacters(std::string_view piece, std::vector<int32_t>* ids,
                                    std::vector<int32_t>* lengths) const {
  std::vector<int32_t> sym, bytes;
  for (size_t i = 0; i < piece.size();) {
    const size_t n =
        std::min<size_t>(Utf8Length(static_cast<unsigned char>(piece[i])), piece.size() - i);
    const std::string ch(piece.substr(i, n));
    i += n;
    if (auto it = impl_->char_symbol.find(ch); it != impl_->char_symbol.end()) {
      sym.push_back(it->second);
      bytes.push_back(static_cast<int32_t>(n));
      continue;
    }
    bool fallback = impl_->byte_fallback;
    for (unsigned char c : ch) fallback = fallback && impl_->byte_token[c] >= 0;
    if (fallback) {
      for (unsigned char c : ch) {
        sym.push_back(impl_->byte_token[c]);
        bytes.push_back(1);
      }
      continue;
    }
    if (impl_->fuse_unk && !sym.empty() && sym.back() == impl_->unk_symbol) {
      bytes.back() += static_cast<int32_t>(n);
      continue;
    }
    sym.push_back(impl_->unk_symbol);
    bytes.push_back(static_cast<int32_t>(n));
  }
  MergeSymbols(std::move(sym), bytes, ids, lengths);
}

void BpeTokenizer::MergeSymbols(std::vector<int32_t> sym, const std::vector<int32_t>& bytes,
                                std::vector<int32_t>* ids, std::vector<int32_t>* lengths) const {
  const int32_t n = static_cast<int32_t>(sym.size());
  std::vector<int32_t> next(n), prev(n);  // by position; next n, prev -1: none
  std::vector<bool> gone(n, false);       // merged into the symbol before it
  for (int32_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i] = i - 1;
  }
  auto merge_at = [&](int32_t i) -> const Impl::Merge* {
    if (i < 0 || next[i] >= n) return nullptr;
    auto m = impl_->merges.find(PairKey(sym[i], sym[next[i]]));
    return m == impl_->merges.end() ? nullptr : &m->second;
  };
  // (rank << 32 | position), smallest first: rank, then left to right.
  std::vector<uint64_t> entries;
  auto entry = [](int rank, int32_t i) { return static_cast<uint64_t>(rank) << 32 | i; };
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const Impl::Merge* m = merge_at(i)) entries.push_back(entry(m->rank, i));
  }
  std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<uint64_t>> heap(
      std::greater<uint64_t>(), std::move(entries));
  std::vector<int32_t> round, merged;
  while (!heap.empty()) {
    const int rank = static_cast<int>(heap.top() >> 32);
    const int32_t at = static_cast<int32_t>(heap.top() & 0xffffffffu);
    const Impl::Merge* m = gone[at] ? nullptr : merge_at(at);
    if (m == nullptr || m->rank != rank) {  // stale
      heap.pop();
      continue;
    }
    const int32_t a = sym[at], b = sym[next[at]], result = m->result;
    round.clear();
    while (!heap.empty() && static_cast<int>(heap.top() >> 32) == rank) {
      round.push_back(static_cast<int32_t>(heap.top() & 0xffffffffu));
      heap.pop();
    }
    merged.clear();
    for (int32_t i : round) {
      if (gone[i] || next[i] >= n || sym[i] != a || sym[next[i]] != b) continue;
      const int32_t j = next[i];
      sym[i] = result;
      gone[j] = true;
      next[i] = next[j];
      if (next[j] < n) prev[next[j]] = i;
      merged.push_back(i);
    }
    for (int32_t i : merged) {
      for (int32_t k : {prev[i], i}) {
        if (const Impl::Merge* pm = merge_at(k)) heap.push(entry(pm->rank, k));
      }
    }
  }
  for (int32_t i = 0; i < n; i = next[i]) {
    // <unk> where the vocabulary has none is -1: Encode refuses it.
    ids->push_back(sym[i] < 0 ? -1 : impl_->symbol_id[sym[i]]);
    int32_t len = 0;
    for (int32_t k = i; k < next[i]; ++k) len += bytes[k];
    lengths->push_back(len);
  }
}

absl::Status BpeTokenizer::Encode(std::string_view text, std::vector<int32_t>* ids,
                                  std::vector<size_t>* ends) const {
  if (!IsUtf8(text)) return absl::InvalidArgumentError("tokenizer: the text is not UTF-8");
  // 1. Added tokens, leftmost first, longest there.
  struct Segment {
    std::string_view text;
    size_t at;   // offset in `text`
    int32_t id;  // -1: plain text
  };
  std::vector<Segment> segments;
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const size_t len = AddedTokenAt(text, i);
    if (len == 0) {
      ++i;
      continue;
    }
    if (i > start) segments.push_back({text.substr(start, i - start), start, -1});
    segments.push_back({text.substr(i, len), i, *TokenId(text.substr(i, len))});
    i += len;
    start = i;
  }
  if (start < text.size()) segments.push_back({text.substr(start), start, -1});

  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(nullptr,
                                                                         &pcre2_match_data_free);
  std::vector<int32_t> lengths;  // each new id's bytes in the normalized segment
  for (const Segment& seg : segments) {
    if (seg.id >= 0) {
      ids->push_back(seg.id);
      if (ends != nullptr) ends->push_back(seg.at + seg.text.size());
      continue;
    }
    const size_t first = ids->size();
    lengths.clear();
    // `to_text[k]`: where byte k of the normalized segment comes from in
    // `text` (its size + 1 entries); empty where normalization changed the
    // text in a way bytes cannot follow (NFC).
    std::vector<size_t> to_text;
    if (impl_->metaspace) {
      // 2. "▁" first (Prepend; Metaspace's scheme) and spaces as "▁".
      std::string s;
      const bool prepend = impl_->prepend == Impl::Prepend::kAlways ||
                           (impl_->prepend == Impl::Prepend::kFirst && seg.at == 0);
      if (prepend) {
        s += kMeta;
        to_text.assign(3, seg.at);
      }
      for (size_t k = 0; k < seg.text.size(); ++k) {
        if (seg.text[k] == ' ') {
          s += kMeta;
          to_text.insert(to_text.end(), 3, seg.at + k);
        } else {
          s += seg.text[k];
          to_text.push_back(seg.at + k);
        }
      }
      to_text.push_back(seg.at + seg.text.size());
      // 3. One piece, or (Metaspace split) a piece per "▁word".
      size_t p = 0;
      while (p < s.size()) {
        size_t q = s.size();
        if (impl_->split_metaspace) {
          q = s.find(kMeta, p + 1);
          if (q == std::string::npos) q = s.size();
        }
        EncodeCharacters(std::string_view(s).substr(p, q - p), ids, &lengths);
        p = q;
      }
    } else {
      // 2. Normalize.
      std::string s(seg.text);
      if (nfc_) {
        UErrorCode err = U_ZERO_ERROR;
        const icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
        icu::UnicodeString n = impl_->nfc->normalize(u, err);
        if (U_FAILURE(err)) {
          return absl::InvalidArgumentError(absl::StrCat("NFC: ", u_errorName(err)));
        }
        s.clear();
        n.toUTF8String(s);
      }
      const bool same = s == seg.text;
      if (impl_->add_prefix_space && !s.empty() && s[0] != ' ') s.insert(s.begin(), ' ');
      if (same) {
        if (s.size() > seg.text.size()) to_text.push_back(seg.at);  // the prefix space
        for (size_t k = 0; k <= seg.text.size(); ++k) to_text.push_back(seg.at + k);
      }
      // 3. Pre-tokenize: each regex splits every piece, matches and the gaps
      // between them each a piece.
      std::vector<std::string> pieces = {s};
      for (pcre2_code* re : impl_->splits) {
        md.reset(pcre2_match_data_create_from_pattern(re, nullptr));
        std::vector<std::string> out;
        for (const std::string& p : pieces) {
          const auto* subject = reinterpret_cast<PCRE2_SPTR>(p.data());
          size_t at = 0, gap = 0;
          while (at <= p.size()) {
            const int rc =
                pcre2_match(re, subject, p.size(), at, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
              PCRE2_UCHAR msg[256];
              pcre2_get_error_message(rc, msg, sizeof(msg));
              return absl::InvalidArgumentError(absl::StrCat(
                  "tokenizer: the text cannot be split: ", reinterpret_cast<const char*>(msg)));
            }
            const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
            const size_t b = ov[0], e = ov[1];
            if (e == b) {  // an empty match: step over one character
              if (b >= p.size()) break;
              at = b + Utf8Length(static_cast<unsigned char>(p[b]));
              continue;
            }
            if (b > gap) out.push_back(p.substr(gap, b - gap));
            out.push_back(p.substr(b, e - b));
            gap = at = e;
          }
          if (gap < p.size()) out.push_back(p.substr(gap));
        }
        pieces = std::move(out);
      }
      // 4. BPE per piece.
      for (const std::string& p : pieces) EncodePiece(p, ids, &lengths);
    }
    for (size_t k = first; k < ids->size(); ++k) {
      if ((*ids)[k] < 0) {
        return absl::InvalidArgumentError(
            "tokenizer: a character is not in the vocabulary, which has no unk_token");
      }
    }
    if (ends == nullptr) continue;
    // Where each id ends in `text`.
    size_t at = 0;
    for (size_t k = 0; k < lengths.size(); ++k) {
      at += static_cast<size_t>(lengths[k]);
      const size_t end = to_text.empty() ? seg.at + std::min(at, seg.text.size())
                                         : to_text[std::min(at, to_text.size() - 1)];
      ends->push_back(k + 1 == lengths.size() ? seg.at + seg.text.size() : end);
    }
  }
  return absl::OkStatus();
}

size_t BpeTokenizer::AddedTokenAt(std::string_view text, size_t pos) const {
  for (const auto& [content, id] : added_) {
    if (text.compare(pos, content.size(), content) == 0) return content.size();
  }
  return 0;
}

std::string BpeTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= static_cast<int32_t>(id_to_token_.size())) continue;
    const std::string& token = id_to_token_[id];
    if (is_added_[id]) {
      out += token;
      continue;
    }
    if (impl_->metaspace) {  // "▁" as a space, <0xXX> as its byte
      unsigned int byte = 0;
      if (token.size() == 6 && std::sscanf(token.c_str(), "<0x%2X>", &byte) == 1) {
        out += static_cast<char>(byte);
        continue;
      }
      for (size_t k = 0; k < token.size();) {
        if (token.compare(k, 3, kMeta) == 0) {
          out += ' ';
          k += 3;
        } else {
          out += token[k++];
        }
      }
      continue;
    }
    for (size_t i = 0; i < token.size();) {
      const int n = Utf8Length(static_cast<unsigned char>(token[i]));
      auto it = byte_of_symbol_.find(token.substr(i, n));
      if (it != byte_of_symbol_.end()) out += it->second;
      i += n;
    }
  }
  return out;
}

}  // namespace loom::hf
