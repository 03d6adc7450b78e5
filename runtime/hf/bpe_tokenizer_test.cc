#include "runtime/hf/bpe_tokenizer.h"

#include <filesystem>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/base/file.h"
#include "runtime/base/test_paths.h"
#include "runtime/data/tokenizer.h"

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

}  // namespace
}  // namespace loom::hf
