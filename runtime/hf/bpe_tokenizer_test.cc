#include "runtime/hf/bpe_tokenizer.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace loom::hf {
namespace {

// The 256 byte symbols (GPT-2's alphabet), "Ġ" + "a" merged, one special.
nlohmann::json Minimal() {
  nlohmann::json vocab = nlohmann::json::object();
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const int cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xc0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3f));
    }
    vocab[s] = b;
  }
  vocab
      ["\xc4\xa0"
       "a"] = 256;  // "Ġa"
  return {{"added_tokens", {{{"id", 300}, {"content", "<s>"}, {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"\xc4\xa0 a"}}}}};
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

// What it does not implement is an error naming the field, not a silent
// difference.
TEST(BpeTokenizerTest, UnsupportedTokenizersAreClearErrors) {
  nlohmann::json j = Minimal();
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(LoadError(j).find("model.type \"WordPiece\" is not supported"), std::string::npos);
  j = Minimal();
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_NE(LoadError(j).find("is not supported (NFC only)"), std::string::npos);
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

}  // namespace
}  // namespace loom::hf
