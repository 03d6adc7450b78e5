#include "runtime/hf/bpe_tokenizer.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string_view>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/base/file.h"
#include "runtime/base/test_paths.h"
#include "runtime/data/tokenizer.h"

namespace loom::hf {
namespace {

// GPT-2's symbol of byte `b`: printable bytes stand for themselves, the
// others for 256, 257, ... in byte order.
std::string ByteSymbol(int b) {
  int next = 256, cp = b;
  for (int x = 0; x <= b; ++x) {
    const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
    cp = printable ? x : next++;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

std::string Symbols(std::string_view bytes) {
  std::string s;
  for (unsigned char c : bytes) s += ByteSymbol(c);
  return s;
}

// The 256 byte symbols (GPT-2's alphabet), "Ġ" + "a" merged, one special.
nlohmann::json Minimal() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteSymbol(b)] = b;
  vocab
      ["\xc4\xa0"
       "a"] = 256;  // "Ġa"
  return {{"added_tokens", {{{"id", 300}, {"content", "<s>"}, {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"\xc4\xa0 a"}}}}};
}

// A byte-level BPE built in the test: the 256 byte symbols and the merges
// given, in the order given (ranks need not be consistent: a merge may use a
// token only a later merge makes, as the loader allows).
struct TestBpe {
  nlohmann::json vocab = nlohmann::json::object();
  int32_t next_id = 256;
  std::vector<std::pair<std::string, std::string>> merges;

  TestBpe() {
    for (int b = 0; b < 256; ++b) vocab[ByteSymbol(b)] = b;
  }
  // Merges two tokens (byte symbols or earlier merges' results).
  void Merge(const std::string& a, const std::string& b) {
    if (!vocab.contains(a + b)) vocab[a + b] = next_id++;
    merges.push_back({a, b});
  }
  // `use_regex` false: the whole text is one piece.
  nlohmann::json Json(bool use_regex) const {
    nlohmann::json m = nlohmann::json::array();
    for (const auto& [a, b] : merges) m.push_back({a, b});
    return {{"normalizer", nullptr},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"use_regex", use_regex}}},
            {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
  }
  std::unique_ptr<BpeTokenizer> Load(bool use_regex) const {
    auto t = BpeTokenizer::FromJson(Json(use_regex).dump(), "test.json");
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }
};

// BPE as GPT-2's encoder.py does it, the reference the tokenizer was written
// as: the lowest-ranked adjacent pair, every occurrence of it left to right,
// again until no pair has a rank. O(n) a round, and up to n rounds.
std::vector<int32_t> ReferenceBpe(const TestBpe& t, std::string_view piece) {
  std::map<std::pair<std::string, std::string>, int> rank;
  for (size_t i = 0; i < t.merges.size(); ++i) rank.emplace(t.merges[i], static_cast<int>(i));
  std::vector<std::string> symbols;
  for (unsigned char c : piece) symbols.push_back(ByteSymbol(c));
  while (symbols.size() > 1) {
    int best = std::numeric_limits<int>::max();
    size_t at = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto r = rank.find({symbols[i], symbols[i + 1]});
      if (r != rank.end() && r->second < best) {
        best = r->second;
        at = i;
      }
    }
    if (best == std::numeric_limits<int>::max()) break;
    const std::string a = symbols[at], b = symbols[at + 1];
    std::vector<std::string> merged;
    for (size_t i = 0; i < symbols.size(); ++i) {
      if (i + 1 < symbols.size() && symbols[i] == a && symbols[i + 1] == b) {
        merged.push_back(a + b);
        ++i;
      } else {
        merged.push_back(symbols[i]);
      }
    }
    symbols = std::move(merged);
  }
  std::vector<int32_t> ids;
  for (const std::string& s : symbols) ids.push_back(t.vocab.at(s).get<int32_t>());
  return ids;
}

// `count` random merges of tokens drawn from `pool` (which grows with each
// result of at most `max_symbols` symbols); a token in `pool` may be merged
// with itself.
void RandomMerges(std::mt19937* rng, int count, size_t max_symbols, std::vector<std::string>* pool,
                  TestBpe* t) {
  for (int k = 0; k < count; ++k) {
    const std::string a = (*pool)[(*rng)() % pool->size()];
    const std::string b = (*pool)[(*rng)() % pool->size()];
    t->Merge(a, b);
    // Symbols of printable ASCII and 2-byte code points: count code points.
    size_t n = 0;
    for (char c : a + b) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
    if (n <= max_symbols) pool->push_back(a + b);
  }
}

std::string LoadError(const nlohmann::json& j) {
  auto t = BpeTokenizer::FromJson(j.dump(), "tok.json");
  EXPECT_FALSE(t.ok());
  return t.ok() ? "" : std::string(t.status().message());
}

TEST(BpeTokenizerTest, EncodesDecodesAndFindsSpecials) {
  auto t = BpeTokenizer::FromJson(Minimal().dump(), "tok.json");
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<int32_t> ids;
  ASSERT_TRUE((*t)->Encode("<s>b a", &ids).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{300, 'b', 256}));  // " a" merged
  EXPECT_EQ((*t)->Decode(ids), "<s>b a");
  EXPECT_EQ((*t)->vocab_size(), 301);
  EXPECT_EQ((*t)->TokenId("<s>"), 300);
  EXPECT_FALSE((*t)->TokenId("nope").has_value());
  ids.clear();
  const absl::Status bad = (*t)->Encode("ok \xff\xfe", &ids);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("not UTF-8"), absl::string_view::npos);
  EXPECT_FALSE((*t)->Encode("\xed\xa0\x80", &ids).ok());  // a surrogate
  EXPECT_FALSE((*t)->Encode("\xc0\xaf", &ids).ok());      // overlong
}

// Sentencepiece-style tokenizer.json (Llama 2, Mistral): characters as
// symbols, "▁" for spaces and before each text, byte_fallback for the
// characters the vocabulary lacks, the ends of ids in the input. The real
// Llama 2 file is checked against transformers.js in
// tokenize_reference_test; this covers both spellings of the "▁".
TEST(BpeTokenizerTest, SentencepieceStyle) {
  const std::string meta = "\xe2\x96\x81";
  nlohmann::json vocab = {{"<unk>", 0}, {"<s>", 1},      {"</s>", 2}, {meta, 3},       {"a", 4},
                          {"b", 5},     {meta + "a", 6}, {"ab", 7},   {meta + "ab", 8}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 9 + b;
  }
  nlohmann::json legacy = {
      {"added_tokens", {{{"id", 1}, {"content", "<s>"}, {"special", true}}}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", meta}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", meta}}}}}},
      {"pre_tokenizer", nullptr},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", {meta + " a", "a b", meta + "a b"}},
        {"unk_token", "<unk>"},
        {"byte_fallback", true}}}};
  auto t = BpeTokenizer::FromJson(legacy.dump(), "tok.json");
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<int32_t> ids;
  std::vector<size_t> ends;
  // "▁ab", "▁", "a", then "é" as its two bytes; after <s> a "▁" again.
  ASSERT_TRUE((*t)->Encode("ab  a\xc3\xa9<s>b", &ids, &ends).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{8, 3, 6, 9 + 0xc3, 9 + 0xa9, 1, 3, 5}));
  EXPECT_EQ(ends, (std::vector<size_t>{2, 3, 5, 6, 7, 10, 10, 11}));
  EXPECT_EQ((*t)->Decode(ids), " ab  a\xc3\xa9<s> b");
  // Metaspace with prepend_scheme "first": no "▁" after an added token.
  nlohmann::json metaspace = legacy;
  metaspace["normalizer"] = nullptr;
  metaspace["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", meta}, {"prepend_scheme", "first"}, {"split", false}};
  t = BpeTokenizer::FromJson(metaspace.dump(), "tok.json");
  ASSERT_TRUE(t.ok()) << t.status();
  ids.clear();
  ASSERT_TRUE((*t)->Encode("ab<s>b", &ids).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{8, 1, 5}));
  // Without byte_fallback or an unk_token, an unknown character is an error.
  metaspace["model"]["byte_fallback"] = false;
  metaspace["model"].erase("unk_token");
  t = BpeTokenizer::FromJson(metaspace.dump(), "tok.json");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE((*t)->Encode("\xc3\xa9", &ids).ok());
}

// What it does not implement is an error naming the field, not a silent
// difference.
TEST(BpeTokenizerTest, UnsupportedTokenizersAreClearErrors) {
  nlohmann::json j = Minimal();
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(LoadError(j).find("model.type \"WordPiece\" is not supported"), std::string::npos);
  j = Minimal();
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_NE(LoadError(j).find("is not supported (NFC, or Prepend"), std::string::npos);
  j = Minimal();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_NE(LoadError(j).find("Whitespace"), std::string::npos);
  j = Minimal();
  j["model"]["vocab"].erase("A");
  EXPECT_NE(LoadError(j).find("lacks the symbol of byte 65"), std::string::npos);
  j = Minimal();
  j["model"]["merges"] = {"x y z"};
  EXPECT_NE(LoadError(j).find("is not \"a b\""), std::string::npos);
  j = Minimal();
  j["model"]["merges"] = nlohmann::json::array({nlohmann::json::array({"a", "b"})});  // no "ab"
  EXPECT_NE(LoadError(j).find("not in the vocabulary"), std::string::npos);
  j = Minimal();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}},
        {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  EXPECT_NE(LoadError(j).find("pre_tokenizer regex \"(unclosed\""), std::string::npos);
  EXPECT_NE(LoadError(nlohmann::json::array()).find("tok.json: not a JSON object"),
            std::string::npos);
}

// The data pipeline's tokenizer on a Hugging Face directory: the tokens
// that begin and end a sample from tokenizer_config.json.
TEST(BpeTokenizerTest, DataTokenizerTakesBosAndEosFromTokenizerConfig) {
  const std::string dir = testing::TempPath("hf-tokenizer");
  std::filesystem::create_directories(dir);
  nlohmann::json j = Minimal();
  j["added_tokens"].push_back({{"id", 301}, {"content", "</s>"}, {"special", true}});
  ASSERT_TRUE(WriteFileAtomically(dir + "/tokenizer.json", j.dump()).ok());
  auto load = [&](const std::string& config) {
    EXPECT_TRUE(WriteFileAtomically(dir + "/tokenizer_config.json", config).ok());
    return data::Tokenizer::Load(dir);
  };
  auto t = load(R"({"bos_token": "<s>", "eos_token": {"content": "</s>"}})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->bos_id(), 300);
  EXPECT_EQ((*t)->eos_id(), 301);
  EXPECT_EQ((*t)->image_id(), -1);  // no <image> token
  EXPECT_EQ((*t)->vocab_size(), 302);
  std::vector<int32_t> ids;
  ASSERT_TRUE((*t)->Encode("b a", &ids).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{'b', 256}));
  // Qwen2 has no BOS; add_bos_token false drops one.
  t = load(R"({"bos_token": null, "eos_token": "</s>"})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->bos_id(), -1);
  t = load(R"({"bos_token": "<s>", "add_bos_token": false, "eos_token": "</s>"})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->bos_id(), -1);
  for (const auto& [config, error] : std::vector<std::pair<std::string, std::string>>{
           {R"({"bos_token": "<s>"})", "eos_token: missing"},
           {R"({"eos_token": "<|eot|>"})", "eos_token: \"<|eot|>\" is not a token"},
           {R"({"eos_token": 7})", "eos_token: a token string"},
           {"[1]", "not a JSON object"},
       }) {
    t = load(config);
    ASSERT_FALSE(t.ok()) << config;
    EXPECT_NE(t.status().message().find(error), absl::string_view::npos) << t.status();
  }
  std::filesystem::remove(dir + "/tokenizer_config.json");
  EXPECT_EQ(data::Tokenizer::Load(dir).status().code(), absl::StatusCode::kNotFound);
}

// The tokenizer's BPE gives the reference's ids on random merge tables
// (ranks in order and shuffled, duplicates, a token merged with itself) and
// random texts.
TEST(BpeTokenizerTest, BpeEqualsTheRoundByRoundReference) {
  std::mt19937 rng(39);
  const std::vector<std::string> units = {"a", "b", "c", "\xc3\xa9"};  // é: two byte symbols
  int compared = 0;
  for (int trial = 0; trial < 300; ++trial) {
    TestBpe t;
    std::vector<std::string> pool = {"a", "b", "c", Symbols("\xc3"), Symbols("\xa9")};
    RandomMerges(&rng, 1 + static_cast<int>(rng() % 40), 10, &pool, &t);
    if (trial % 2 == 1) std::shuffle(t.merges.begin(), t.merges.end(), rng);
    if (trial % 4 == 3) t.merges.push_back(t.merges[rng() % t.merges.size()]);  // a duplicate
    std::unique_ptr<BpeTokenizer> tok = t.Load(/*use_regex=*/false);
    ASSERT_NE(tok, nullptr);
    for (int k = 0; k < 30; ++k) {
      std::string text;
      const int n = static_cast<int>(rng() % 80);
      for (int i = 0; i < n; ++i) text += units[rng() % units.size()];
      std::vector<int32_t> ids;
      ASSERT_TRUE(tok->Encode(text, &ids).ok());
      ASSERT_EQ(ids, ReferenceBpe(t, text)) << "trial " << trial << " text \"" << text << "\"";
      ++compared;
    }
  }
  EXPECT_EQ(compared, 300 * 30);
}

// A multi-megabyte word from `blocks` (each ending in a unit no merge
// touches, so no pair across blocks ever has a rank and each block merges as
// it would alone): its ids are each block's reference ids in turn. Many
// distinct merges apply, so the round-by-round algorithm would rescan the
// whole word once for each of them.
void ExpectBigWordEqualsItsBlocks(const TestBpe& t, const std::vector<std::string>& blocks,
                                  size_t bytes, std::mt19937* rng) {
  std::unique_ptr<BpeTokenizer> tok = t.Load(/*use_regex=*/true);  // GPT-2's regex: one word
  ASSERT_NE(tok, nullptr);
  std::vector<std::vector<int32_t>> block_ids;
  for (const std::string& b : blocks) block_ids.push_back(ReferenceBpe(t, b));
  std::string word;
  std::vector<int32_t> expected;
  while (word.size() < bytes) {
    const size_t i = (*rng)() % blocks.size();
    word += blocks[i];
    expected.insert(expected.end(), block_ids[i].begin(), block_ids[i].end());
  }
  std::vector<int32_t> ids;
  ASSERT_TRUE(tok->Encode(word, &ids).ok());
  ASSERT_EQ(ids.size(), expected.size());
  EXPECT_TRUE(ids == expected);
}

// Issue 39: a multi-megabyte word is encoded in O(n log n), not O(n^2)
// (before, this test ran past its timeout). Results are checked, never
// timings.
TEST(BpeTokenizerTest, MultiMegabyteWordsEncodeExactly) {
  std::mt19937 rng(7);
  {  // 4 MB of letters: 3,000 random merges over a..y, blocks ending in "z"
    TestBpe t;
    std::vector<std::string> pool;
    for (char c = 'a'; c < 'z'; ++c) pool.push_back(std::string(1, c));
    RandomMerges(&rng, 3000, 16, &pool, &t);
    std::vector<std::string> blocks;
    for (int i = 0; i < 64; ++i) {
      std::string b;
      for (int n = 1 + static_cast<int>(rng() % 40); n > 0; --n)
        b += static_cast<char>('a' + rng() % 25);
      blocks.push_back(b + "z");
    }
    ExpectBigWordEqualsItsBlocks(t, blocks, 4 << 20, &rng);
  }
  {  // 2 MB of CJK: each character's bytes merged, then random merges of
     // characters; blocks end in 一, whose bytes no merge joins
    const std::vector<std::string> chars = {"你", "好", "世", "界", "中", "文", "字", "词"};
    TestBpe t;
    std::vector<std::string> pool;
    for (const std::string& c : chars) {
      t.Merge(Symbols(c.substr(0, 1)), Symbols(c.substr(1, 1)));
      t.Merge(Symbols(c.substr(0, 2)), Symbols(c.substr(2, 1)));
      pool.push_back(Symbols(c));
    }
    RandomMerges(&rng, 2000, 12, &pool, &t);
    std::vector<std::string> blocks;
    for (int i = 0; i < 64; ++i) {
      std::string b;
      for (int n = 1 + static_cast<int>(rng() % 20); n > 0; --n) b += chars[rng() % chars.size()];
      blocks.push_back(b + "一");
    }
    ExpectBigWordEqualsItsBlocks(t, blocks, 2 << 20, &rng);
  }
  {  // 4 MB of "a": merges to 16 a's, so 2^22 / 16 tokens of them
    TestBpe t;
    for (std::string s = "a"; s.size() < 16; s += s) t.Merge(s, s);
    std::unique_ptr<BpeTokenizer> tok = t.Load(/*use_regex=*/true);
    ASSERT_NE(tok, nullptr);
    std::vector<int32_t> ids;
    ASSERT_TRUE(tok->Encode(std::string(4 << 20, 'a'), &ids).ok());
    EXPECT_EQ(ids, std::vector<int32_t>((4 << 20) / 16, *tok->TokenId(std::string(16, 'a'))));
    ids.clear();  // an odd length leaves the reference's remainder
    ASSERT_TRUE(tok->Encode(std::string(1000003, 'a'), &ids).ok());
    std::vector<int32_t> expected(1000003 / 16 - 1, *tok->TokenId(std::string(16, 'a')));
    for (int32_t id : ReferenceBpe(t, std::string(1000003 % 16 + 16, 'a'))) expected.push_back(id);
    EXPECT_EQ(ids.size(), expected.size());
    EXPECT_TRUE(ids == expected);
  }
}

}  // namespace
}  // namespace loom::hf
