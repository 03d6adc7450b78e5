#include "runtime/data/preprocess.h"

#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/base/file.h"
#include "runtime/base/test_paths.h"
#include "runtime/data/data_testing.h"

namespace loom::data {
namespace {

using testing::SampleJson;
using testing::TestJpeg;
using testing::TestPng;

PreprocessOptions Tiny() {
  PreprocessOptions o = PreprocessOptionsFor(*ModelConfigByName("tiny"));
  return o;
}

SampleFiles Files(const std::string& key, const std::string& json,
                  std::map<std::string, std::string> images = {}) {
  SampleFiles f;
  f.key = key;
  f.files = std::move(images);
  f.files["json"] = json;
  return f;
}

Outcome ProcessOne(const SampleFiles& f, PreprocessOptions o = Tiny()) {
  Preprocessor p(o, &testing::TestTokenizer());
  return p.Process(f);
}

TEST(TileGridTest, FollowsTheAspectRatio) {
  TileGrid g = ChooseTileGrid(1000, 1000, 12, 32);
  EXPECT_EQ(g.cols, g.rows);
  EXPECT_GE(g.cols, 2) << "a large square image uses more than one tile";
  g = ChooseTileGrid(1200, 400, 12, 32);
  EXPECT_EQ(g.cols, 3 * g.rows);
  g = ChooseTileGrid(400, 1200, 6, 32);
  EXPECT_EQ(g.rows, 3 * g.cols);
  g = ChooseTileGrid(20, 20, 12, 32);
  EXPECT_EQ(g.cols * g.rows, 1) << "a small image is not blown up into many tiles";
  g = ChooseTileGrid(5000, 100, 4, 32);
  EXPECT_EQ(g.cols, 4);
  EXPECT_EQ(g.rows, 1);
  EXPECT_EQ(TileCount({1, 1}, true), 1);
  EXPECT_EQ(TileCount({3, 2}, true), 7);
  EXPECT_EQ(TileCount({3, 2}, false), 6);
}

TEST(PreprocessTest, SingleImageSampleHasTilesTokensAndSlotsInPlace) {
  const Tokenizer& tok = testing::TestTokenizer();
  Outcome o = ProcessOne(Files("k", SampleJson("<image>\na picture of one red square.", {"0.jpg"}),
                               {{"0.jpg", TestJpeg(96, 64)}}));
  ASSERT_TRUE(o.ok) << o.skip.reason << ": " << o.skip.detail;
  const ProcessedSample& s = o.sample;
  ASSERT_EQ(s.images.size(), 1u);
  EXPECT_EQ(s.images[0].grid.cols, 3);
  EXPECT_EQ(s.images[0].grid.rows, 2);
  EXPECT_EQ(s.images[0].tiles, 7);  // 3x2 + thumbnail
  EXPECT_EQ(s.sample.num_tiles, 7);
  EXPECT_EQ(s.sample.tiles.size(), 7u * 3 * 32 * 32);
  EXPECT_EQ(s.image_tokens, 7 * 16);
  ASSERT_EQ(static_cast<int>(s.sample.tokens.size()), s.text_tokens + s.image_tokens);
  EXPECT_EQ(s.sample.tokens.front(), tok.bos_id());
  EXPECT_EQ(s.sample.tokens.back(), tok.eos_id());
  for (int i = 1; i <= s.image_tokens; ++i) ASSERT_EQ(s.sample.tokens[i], -1) << i;
  EXPECT_GE(s.sample.tokens[s.image_tokens + 1], 0);
  std::vector<int32_t> text(s.sample.tokens.begin() + 1 + s.image_tokens,
                            s.sample.tokens.end() - 1);
  EXPECT_EQ(tok.Decode(text), "a picture of one red square.");
  // Normalised: the red square's red channel is bright, the background dark.
  const float top_left_red = s.sample.tiles[0];
  const float bottom_right_red = s.sample.tiles[5 * 3 * 32 * 32];  // tile (row 1, col 2)
  EXPECT_GT(top_left_red, 1.0f);
  EXPECT_LT(bottom_right_red, 0.0f);
  for (float v : s.sample.tiles) ASSERT_TRUE(std::isfinite(v));
}

// Token caps (the job's parallel.encoder_max_tokens, llm_max_tokens): a
// sample over either is skipped as over_token_cap, naming its count; at the
// cap it passes. The 3x2 + thumbnail sample: 7 tiles of 16 ViT patches.
TEST(PreprocessTest, ASampleOverATokenCapIsSkipped) {
  const SampleFiles f = Files("k", SampleJson("<image>\na picture of one red square.", {"0.jpg"}),
                              {{"0.jpg", TestJpeg(96, 64)}});
  const Outcome whole = ProcessOne(f);
  ASSERT_TRUE(whole.ok) << whole.skip.detail;
  const int length = static_cast<int>(whole.sample.sample.tokens.size());
  ASSERT_EQ(Tiny().vit_tokens_per_tile, 16);
  PreprocessOptions o = Tiny();
  o.caps = {7 * 16, length};
  EXPECT_TRUE(ProcessOne(f, o).ok) << "a sample at the caps";
  o.caps = {7 * 16 - 1, 0};
  Outcome over = ProcessOne(f, o);
  EXPECT_FALSE(over.ok);
  EXPECT_EQ(over.skip.reason, "over_token_cap");
  EXPECT_NE(
      over.skip.detail.find("112 ViT tokens (7 tiles), above parallel.encoder_max_tokens 111"),
      std::string::npos)
      << over.skip.detail;
  o.caps = {0, length - 1};
  over = ProcessOne(f, o);
  EXPECT_EQ(over.skip.reason, "over_token_cap");
  EXPECT_NE(over.skip.detail.find(
                absl::StrCat(length, " LLM tokens, above parallel.llm_max_tokens ", length - 1)),
            std::string::npos)
      << over.skip.detail;
}

TEST(PreprocessTest, ImagesShareTheTileBudgetAndTextOnlyWorks) {
  std::map<std::string, std::string> imgs;
  std::string text;
  std::vector<std::string> names;
  for (int i = 0; i < 6; ++i) {
    names.push_back(std::to_string(i) + ".png");
    imgs[names.back()] = TestPng(200, 100);
    text += "<image> frame ";
  }
  Outcome o = ProcessOne(Files("v", SampleJson(text, names), imgs));
  ASSERT_TRUE(o.ok) << o.skip.reason;
  for (const ImageInfo& info : o.sample.images) {
    EXPECT_LE(info.grid.cols * info.grid.rows, 12 / 6);
  }
  Outcome t = ProcessOne(Files("t", SampleJson("only words here.", {})));
  ASSERT_TRUE(t.ok);
  EXPECT_EQ(t.sample.sample.num_tiles, 0);
  EXPECT_EQ(t.sample.image_tokens, 0);
}

struct BadCase {
  const char* name;
  SampleFiles files;
  const char* reason;
};

TEST(PreprocessTest, EveryBadInputIsSkippedWithItsReason) {
  PreprocessOptions o = Tiny();
  o.truncate = false;  // over-long samples are refused (the next tests truncate them)
  std::string long_text;
  for (int i = 0; i < 2000; ++i) long_text += "the shapes are all the same size. ";
  std::string many_images_text;
  std::map<std::string, std::string> many;
  std::vector<std::string> many_names;
  for (int i = 0; i < 80; ++i) {  // 80 images x 16 tokens > 1024
    many_names.push_back(std::to_string(i) + ".png");
    many[many_names.back()] = TestPng(32, 32);
    many_images_text += "<image>";
  }
  many_images_text += " frames";
  const std::string jpg = TestJpeg(64, 64);
  std::vector<BadCase> cases = {
      {"missing json", SampleFiles{"a", {{"0.png", TestPng(8, 8)}}}, "missing_json"},
      {"invalid utf-8", Files("b", "{\"text\": \"caf\xc3\x28\"}"), "invalid_utf8"},
      {"not json", Files("c", "{\"text\": "), "bad_json"},
      {"wrong type", Files("c2", "{\"text\": 5}"), "bad_json"},
      {"empty text", Files("d", SampleJson("", {})), "empty_text"},
      {"only markers", Files("d2", SampleJson("<image> ", {"0.png"}), {{"0.png", TestPng(8, 8)}}),
       "empty_text"},
      {"marker count",
       Files("e", SampleJson("<image> <image> two", {"0.png"}), {{"0.png", TestPng(8, 8)}}),
       "image_count_mismatch"},
      {"missing image", Files("f", SampleJson("<image> x", {"0.png"})), "missing_image"},
      {"zero-byte image", Files("g", SampleJson("<image> x", {"0.png"}), {{"0.png", ""}}),
       "empty_image"},
      {"corrupt image",
       Files("h", SampleJson("<image> x", {"0.jpg"}), {{"0.jpg", jpg.substr(0, jpg.size() / 2)}}),
       "corrupt_image"},
      {"garbage image",
       Files("h2", SampleJson("<image> x", {"0.png"}),
             {{"0.png", std::string("\x89PNG\r\n\x1a\n garbage")}}),
       "corrupt_image"},
      {"not an image", Files("i", SampleJson("<image> x", {"0.tif"}), {{"0.tif", "II*\0"}}),
       "unsupported_image"},
      {"huge png",
       Files("j", SampleJson("<image> x", {"0.png"}),
             {{"0.png", testing::PngClaiming(100000, 100000)}}),
       "image_too_large"},
      {"huge jpeg",
       Files("j2", SampleJson("<image> x", {"0.jpg"}),
             {{"0.jpg", testing::JpegClaiming(65000, 65000)}}),
       "image_too_large"},
      {"long text", Files("k", SampleJson(long_text, {})), "text_too_long"},
      {"long sequence", Files("l", SampleJson(many_images_text, many_names), many),
       "sequence_too_long"},
  };
  for (const BadCase& c : cases) {
    Outcome out = ProcessOne(c.files, o);
    EXPECT_FALSE(out.ok) << c.name;
    EXPECT_EQ(out.skip.reason, c.reason) << c.name << ": " << out.skip.detail;
    EXPECT_EQ(out.skip.key, c.files.key);
    EXPECT_FALSE(out.skip.detail.empty()) << c.name;
    EXPECT_NE(std::find(kSkipReasons.begin(), kSkipReasons.end(), out.skip.reason),
              kSkipReasons.end());
  }
}

TEST(PreprocessTest, Utf8Validation) {
  EXPECT_TRUE(IsValidUtf8("plain"));
  EXPECT_TRUE(IsValidUtf8("Zürich 東京 😀"));
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(IsValidUtf8("abc\xe2\x82"));       // cut short
}

TEST(PreprocessTest, TokenizerMustFitTheModelVocabulary) {
  ModelConfig c = *ModelConfigByName("tiny");
  EXPECT_TRUE(CheckTokenizerFits(testing::TestTokenizer(), c).ok());
  c.llm.vocab = 100;
  absl::Status s = CheckTokenizerFits(testing::TestTokenizer(), c);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("a vocabulary of 100"), std::string::npos) << s;
}

// A tokenizer.json directory: the 256 byte symbols, "aa" and "aaaa" (the
// longest token, 4 bytes), <s> and </s> (4 bytes): an id stands for at most
// 4 bytes of text.
std::unique_ptr<Tokenizer> FourBytesATokenTokenizer() {
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
  vocab["aa"] = 256;
  vocab["aaaa"] = 257;
  const nlohmann::json j = {
      {"added_tokens",
       {{{"id", 300}, {"content", "<s>"}, {"special", true}},
        {{"id", 301}, {"content", "</s>"}, {"special", true}}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a a", "aa aa"}}}}};
  const std::string dir = ::testing::TempDir() + "/four-bytes-a-token";
  std::filesystem::create_directories(dir);
  EXPECT_TRUE(WriteFileAtomically(dir + "/tokenizer.json", j.dump()).ok());
  EXPECT_TRUE(WriteFileAtomically(dir + "/tokenizer_config.json",
                                  R"({"bos_token": "<s>", "eos_token": "</s>"})")
                  .ok());
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(dir);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

// Issue 39: a text that cannot fit is refused from its byte count before it
// is tokenized (a multi-megabyte word held up the in-order loader), and the
// bound refuses nothing that fits.
TEST(PreprocessTest, TextTooLongIsRefusedBeforeItIsTokenized) {
  std::unique_ptr<Tokenizer> tok = FourBytesATokenTokenizer();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->max_text_bytes_per_token(), 4);
  EXPECT_EQ(testing::TestTokenizer().max_text_bytes_per_token(), 0);  // sentencepiece: no bound
  PreprocessOptions o = Tiny();
  o.max_seq = 64;  // <s>, 62 text tokens, </s>
  o.truncate = false;
  const Preprocessor p(o, tok.get());
  auto process = [&](const std::string& key, const std::string& text) {
    return p.Process(Files(key, SampleJson(text, {})));
  };
  // 4 MB of one word: at least 2^20 tokens, refused without tokenizing.
  Outcome big = process("big", std::string(4 << 20, 'a'));
  EXPECT_FALSE(big.ok);
  EXPECT_EQ(big.skip.key, "big");
  EXPECT_EQ(big.skip.reason, "text_too_long");
  EXPECT_EQ(big.skip.detail,
            "big: 4194304 bytes of text are at least 1048576 text tokens (one stands for at most "
            "4 bytes), not tokenized; the maximum sequence is 64");
  // 249 bytes: at least 63 text tokens, one too many.
  Outcome over = process("over", std::string(249, 'a'));
  EXPECT_EQ(over.skip.reason, "text_too_long");
  EXPECT_NE(over.skip.detail.find("not tokenized"), std::string::npos) << over.skip.detail;
  // 248 bytes may fit, and do: 62 "aaaa".
  Outcome fits = process("fits", std::string(248, 'a'));
  ASSERT_TRUE(fits.ok) << fits.skip.detail;
  EXPECT_EQ(fits.sample.text_tokens, 64);
  // 100 bytes of "b" may fit, so they are tokenized: 100 tokens do not.
  Outcome tokenized = process("b", std::string(100, 'b'));
  EXPECT_EQ(tokenized.skip.reason, "text_too_long");
  EXPECT_EQ(tokenized.skip.detail, "102 text tokens; the maximum sequence is 64");
}

// Issue 40: an over-long sample is cut to the maximum sequence, the text
// off the end and never through an image's slots; a cut sample has no </s>
// and counts its cut tokens. A multi-megabyte word is cut before it is
// tokenized.
TEST(PreprocessTest, OverLongSamplesAreTruncated) {
  std::unique_ptr<Tokenizer> tok = FourBytesATokenTokenizer();
  ASSERT_NE(tok, nullptr);
  PreprocessOptions o = Tiny();
  o.max_seq = 64;
  const Preprocessor p(o, tok.get());
  // 4 MB of one word: 64 ids kept, <s> first, no </s>.
  Outcome big = p.Process(Files("big", SampleJson(std::string(4 << 20, 'a'), {})));
  ASSERT_TRUE(big.ok) << big.skip.reason << ": " << big.skip.detail;
  const std::vector<int32_t>& t = big.sample.sample.tokens;
  ASSERT_EQ(t.size(), 64u);
  EXPECT_EQ(t.front(), tok->bos_id());
  EXPECT_NE(t.back(), tok->eos_id());
  EXPECT_GT(big.sample.truncated_tokens, 0);
  EXPECT_EQ(big.sample.text_tokens, 64);
  // One more token than fits: only </s> goes.
  Outcome one = p.Process(Files("one", SampleJson(std::string(252, 'a'), {})));
  ASSERT_TRUE(one.ok);
  EXPECT_EQ(one.sample.truncated_tokens, 1);
  EXPECT_EQ(one.sample.sample.tokens.size(), 64u);
  // An image that does not fit whole goes, with the text after it; the
  // text before it stays. Tiny's images are 16 tokens a tile.
  const std::string png = testing::TestPng(32, 32);
  Outcome img = p.Process(
      Files("img", SampleJson(std::string(200, 'a') + "<image>tail", {"0.png"}), {{"0.png", png}}));
  ASSERT_TRUE(img.ok) << img.skip.reason << ": " << img.skip.detail;
  EXPECT_TRUE(img.sample.images.empty());
  EXPECT_EQ(img.sample.sample.num_tiles, 0);
  EXPECT_EQ(img.sample.image_tokens, 0);
  for (int32_t id : img.sample.sample.tokens) EXPECT_GE(id, 0) << "an image slot was kept";
  EXPECT_EQ(img.sample.sample.tokens.size(), 51u);  // <s> + 50 ids; the image would pass 64
  // An image that fits stays whole.
  Outcome fits = p.Process(
      Files("fits", SampleJson("<image>" + std::string(400, 'a'), {"0.png"}), {{"0.png", png}}));
  ASSERT_TRUE(fits.ok) << fits.skip.reason << ": " << fits.skip.detail;
  EXPECT_EQ(fits.sample.images.size(), 1u);
  EXPECT_EQ(fits.sample.sample.tokens.size(), 64u);
  EXPECT_EQ(static_cast<int>(fits.sample.sample.tiles.size()),
            fits.sample.sample.num_tiles * 3 * o.tile_size * o.tile_size);
  // Nothing to train on within the maximum: still skipped.
  std::string images;
  std::vector<std::string> names;
  std::map<std::string, std::string> files;
  for (int i = 0; i < 5; ++i) {
    images += "<image>";
    names.push_back(std::to_string(i) + ".png");
    files[names.back()] = png;
  }
  Outcome none = p.Process(Files("none", SampleJson(images + "x", names), files));
  EXPECT_FALSE(none.ok);
  EXPECT_EQ(none.skip.reason, "sequence_too_long") << none.skip.detail;
}

}  // namespace
}  // namespace loom::data
