// Hugging Face tokenizer.json: byte-level BPE (the Llama 3, Qwen2 and GPT-2
// families) and sentencepiece-style BPE (Llama 2, Vicuna, Mistral: a
// Prepend("▁") + Replace(" ", "▁") normalizer or a Metaspace pre-tokenizer,
// characters as symbols, byte_fallback to <0xXX> tokens, unk_token with
// fuse_unk), beside the sentencepiece tokenizer of runtime/data/tokenizer.h.
//
// Encoding runs as the tokenizers library does for these models:
//   1. added tokens (special or not) are matched in the raw text first,
//      longest first at the leftmost position, and become their own ids;
//   2. the rest is normalized (none, or NFC through ICU);
//   3. pre-tokenized: `Split` with a regex (PCRE2 with Unicode properties,
//      so \p{L}, \p{N} and look-ahead work) and the "Isolated" behaviour, and
//      `ByteLevel` (its GPT-2 regex when use_regex, add_prefix_space), in the
//      order of a `Sequence`;
//   4. each piece's UTF-8 bytes mapped to GPT-2's printable byte alphabet and
//      merged by BPE: the lowest-ranked adjacent pair, every occurrence left
//      to right, until no pair has a rank (in O(n log n) for a piece of n
//      bytes, so a multi-megabyte word is no stall); with `ignore_merges` a
//      piece that is itself in the vocabulary is one token.
// Merges come in either JSON form ("a b" strings or ["a", "b"] pairs). The
// post-processor (BOS and the like) is left to the caller. Anything else --
// another model type, a normalizer or pre-tokenizer this does not implement,
// a vocabulary without all 256 byte symbols, a merge of unknown tokens -- is
// an error at load naming the field, never a silent difference.
#ifndef LOOM_RUNTIME_HF_BPE_TOKENIZER_H_
#define LOOM_RUNTIME_HF_BPE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::hf {

class BpeTokenizer {
 public:
  // tokenizer.json at `path`.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> Load(const std::string& path);
  // Its text; `where` names it in errors.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromJson(std::string_view json,
                                                                const std::string& where);
  ~BpeTokenizer();

  // Appends the ids of `text`; INVALID_ARGUMENT if it is not UTF-8. With
  // `ends`, also where each id ends in `text` (a byte offset; under an NFC
  // that changed a segment, its ids' ends are approximate inside it and
  // exact at its end). Thread-safe.
  absl::Status Encode(std::string_view text, std::vector<int32_t>* ids,
                      std::vector<size_t>* ends = nullptr) const;
  // Bytes of the ids (added tokens as their content; a sentencepiece-style
  // tokenizer's "▁" as a space and <0xXX> as its byte, with the leading
  // space its Prepend added); unknown ids are skipped.
  std::string Decode(const std::vector<int32_t>& ids) const;

  int vocab_size() const { return static_cast<int>(id_to_token_.size()); }
  // The most bytes of a text, as given to Encode, that one of its ids can
  // stand for: the longest vocabulary token's bytes (times NFC's largest
  // shrinking, 4, with the NFC normalizer) or the longest added token. A
  // text of N bytes therefore encodes to at least ceil(N / this) ids, a
  // bound a caller can check before spending the encoding.
  int64_t max_text_bytes_per_token() const { return max_text_bytes_per_token_; }
  std::optional<int32_t> TokenId(std::string_view token) const;
  // The byte length of the added token that Encode would match at `pos` of
  // `text` (the longest there), or 0.
  size_t AddedTokenAt(std::string_view text, size_t pos) const;

 private:
  struct Impl;
  BpeTokenizer();
  // Each appends ids and, in `lengths`, the bytes of the piece each stands for.
  void EncodePiece(std::string_view piece, std::vector<int32_t>* ids,
                   std::vector<int32_t>* lengths) const;
  void EncodeCharacters(std::string_view piece, std::vector<int32_t>* ids,
                        std::vector<int32_t>* lengths) const;
  void MergeSymbols(std::vector<int32_t> sym, const std::vector<int32_t>& bytes,
                    std::vector<int32_t>* ids, std::vector<int32_t>* lengths) const;

  std::unique_ptr<Impl> impl_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<std::pair<std::string, int32_t>> added_;  // longest content first
  std::vector<bool> is_added_;                          // by id
  bool ignore_merges_ = false;
  bool nfc_ = false;
  int64_t max_text_bytes_per_token_ = 1;
  std::string byte_symbol_[256];
  std::unordered_map<std::string, char> byte_of_symbol_;  // its inverse, for Decode
};

}  // namespace loom::hf

#endif  // LOOM_RUNTIME_HF_BPE_TOKENIZER_H_
