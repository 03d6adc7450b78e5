#include "runtime/data/preprocess.h"

#include <algorithm>
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

// KEY.json with text, images and output images.
std::string GenJson(const std::string& text, const std::vector<std::string>& images,
                    const std::vector<std::string>& outputs) {
  nlohmann::json j;
  j["text"] = text;
  j["images"] = images;
  j["output_images"] = outputs;
  return j.dump();
}

// 48 x 32: the left 8 columns red, the rest green left of x = 24, blue right
// of it. Its centred square (x 8-39) has no red.
std::string SplitPicture() {
  Image img;
  img.width = 48;
  img.height = 32;
  img.rgb.resize(48 * 32 * 3);
  for (int y = 0; y < 32; ++y) {
    for (int x = 0; x < 48; ++x) {
      uint8_t* p = &img.rgb[(y * 48 + x) * 3];
      p[x < 8 ? 0 : x < 24 ? 1 : 2] = 255;
    }
  }
  return *EncodePng(img);
}

PreprocessOptions TinyGen() { return PreprocessOptionsFor(*ModelConfigByName("tiny-gen")); }

TEST(PreprocessTest, AnOutputImageBecomesQueriesAndTheGeneratorsPixels) {
  const Tokenizer& tok = testing::TestTokenizer();
  const PreprocessOptions o = TinyGen();
  ASSERT_EQ(o.gen_image_size, 16);
  ASSERT_GT(o.gen_queries, 0);
  const int Q = o.gen_queries, S = o.gen_image_size;
  Outcome r = ProcessOne(
      Files("k", GenJson("a picture of one red square. <output_image>", {}, {"out0.png"}),
            {{"out0.png", SplitPicture()}}),
      o);
  ASSERT_TRUE(r.ok) << r.skip.reason << ": " << r.skip.detail;
  const Sample& s = r.sample.sample;
  ASSERT_EQ(r.sample.output_images.size(), 1u);
  EXPECT_EQ(r.sample.output_images[0].width, 48);
  EXPECT_EQ(r.sample.query_tokens, Q);
  EXPECT_EQ(r.sample.image_tokens, 0);
  ASSERT_EQ(static_cast<int>(s.tokens.size()), r.sample.text_tokens + Q);
  EXPECT_EQ(s.tokens.front(), tok.bos_id());
  EXPECT_EQ(s.tokens.back(), tok.eos_id());
  for (int q = 0; q < Q; ++q) EXPECT_EQ(s.tokens[s.tokens.size() - 2 - q], kQueryToken);
  std::vector<int32_t> text(s.tokens.begin() + 1, s.tokens.end() - 1 - Q), expect;
  ASSERT_TRUE(tok.Encode("a picture of one red square. ", &expect).ok());
  EXPECT_EQ(text, expect);
  // No query is a target: the text's positions predict text, the last
  // query predicts </s>, and the last text token predicts nothing.
  EXPECT_EQ(r.sample.loss_tokens, LossTokens(s));
  EXPECT_EQ(r.sample.loss_tokens, static_cast<int>(text.size()) + 1);
  // The centred square, S x S, in [-1, 1]: green on the left, blue on the
  // right, no red (the cropped-off columns).
  ASSERT_EQ(s.num_gen_images, 1);
  ASSERT_EQ(static_cast<int>(s.gen_images.size()), 3 * S * S);
  auto px = [&](int c, int y, int x) { return s.gen_images[(c * S + y) * S + x]; };
  for (int y = 0; y < S; ++y) {
    for (int x = 0; x < S; ++x) EXPECT_LT(px(0, y, x), -0.99f) << x << "," << y;
    EXPECT_GT(px(1, y, 0), 0.99f);
    EXPECT_LT(px(2, y, 0), -0.99f);
    EXPECT_GT(px(2, y, S - 1), 0.99f);
    EXPECT_LT(px(1, y, S - 1), -0.99f);
  }
  // Metadata only: the same tokens, no pixels.
  Preprocessor meta(o, &tok);
  Outcome m = meta.Process(Files("k", GenJson("a picture. <output_image>", {}, {"out0.png"}),
                                 {{"out0.png", SplitPicture()}}),
                           /*decode_pixels=*/false);
  ASSERT_TRUE(m.ok);
  EXPECT_EQ(m.sample.query_tokens, Q);
  EXPECT_TRUE(m.sample.sample.gen_images.empty());
}

TEST(PreprocessTest, OutputImagesInterleaveWithInputImagesAndConversations) {
  const PreprocessOptions o = TinyGen();
  const int Q = o.gen_queries;
  const std::string png = testing::TestPng(32, 32);
  Outcome r = ProcessOne(
      Files("k",
            GenJson("<image>\na red square. the same in the top left: <output_image> done.",
                    {"0.png"}, {"out0.png"}),
            {{"0.png", png}, {"out0.png", SplitPicture()}}),
      o);
  ASSERT_TRUE(r.ok) << r.skip.reason << ": " << r.skip.detail;
  const std::vector<int32_t>& t = r.sample.sample.tokens;
  // <s>, the image's slots, text, the queries, text, </s>.
  const int slots = r.sample.image_tokens;
  ASSERT_GT(slots, 0);
  for (int i = 1; i <= slots; ++i) ASSERT_EQ(t[i], -1) << i;
  const auto first_query = std::find(t.begin(), t.end(), kQueryToken) - t.begin();
  ASSERT_GT(first_query, slots + 1);
  for (int q = 0; q < Q; ++q) EXPECT_EQ(t[first_query + q], kQueryToken);
  EXPECT_GE(t[first_query + Q], 0) << "text after the queries";
  EXPECT_EQ(std::count(t.begin(), t.end(), kQueryToken), Q);
  EXPECT_EQ(r.sample.sample.num_tiles, 1);
  EXPECT_EQ(r.sample.sample.num_gen_images, 1);
  // A conversation: the assistant's answer is the picture; its queries
  // carry no loss, the turn's end does.
  nlohmann::json chat;
  chat["messages"] = {{{"role", "user"}, {"content", "draw one red square."}},
                      {{"role", "assistant"}, {"content", "<output_image>"}}};
  chat["output_images"] = {"out0.png"};
  Outcome c = ProcessOne(Files("c", chat.dump(), {{"out0.png", SplitPicture()}}), o);
  ASSERT_TRUE(c.ok) << c.skip.reason << ": " << c.skip.detail;
  const Sample& cs = c.sample.sample;
  ASSERT_EQ(cs.loss_mask.size(), cs.tokens.size());
  int queries = 0;
  for (size_t i = 0; i < cs.tokens.size(); ++i) {
    if (cs.tokens[i] != kQueryToken) continue;
    ++queries;
    EXPECT_EQ(cs.loss_mask[i], 0);
  }
  EXPECT_EQ(queries, Q);
  EXPECT_GT(c.sample.loss_tokens, 0);
}

TEST(PreprocessTest, BadOutputImagesAreSkippedWithTheirReason) {
  const PreprocessOptions o = TinyGen();
  const std::string png = SplitPicture();
  auto reason = [&](const std::string& json, std::map<std::string, std::string> images,
                    PreprocessOptions opt) {
    Outcome r = ProcessOne(Files("k", json, std::move(images)), opt);
    EXPECT_FALSE(r.ok);
    return r.skip.reason + ": " + r.skip.detail;
  };
  EXPECT_EQ(reason(GenJson("draw. <output_image>", {}, {}), {}, o),
            "image_count_mismatch: 1 <output_image> markers, 0 output images listed");
  EXPECT_EQ(reason(GenJson("draw.", {}, {"out0.png"}), {{"out0.png", png}}, o),
            "image_count_mismatch: 0 <output_image> markers, 1 output images listed");
  EXPECT_EQ(reason(GenJson("draw. <output_image>", {}, {"out0.png"}), {}, o),
            "missing_image: k.out0.png not found");
  EXPECT_EQ(reason(GenJson("draw. <output_image>", {}, {"out0.png"}), {{"out0.png", ""}}, o),
            "empty_image: k.out0.png has 0 bytes");
  EXPECT_EQ(reason(GenJson("draw. <output_image>", {}, {"out0.png"}),
                   {{"out0.png", png.substr(0, 20)}}, o)
                .substr(0, 14),
            "corrupt_image:");
  // The same sample for a model without a generator.
  EXPECT_EQ(reason(GenJson("draw. <output_image>", {}, {"out0.png"}), {{"out0.png", png}}, Tiny()),
            "no_generator: 1 output images, and the model has no generator");
}

TEST(PreprocessTest, TruncationNeverCutsThroughAnOutputImagesQueries) {
  std::unique_ptr<Tokenizer> tok = FourBytesATokenTokenizer();
  ASSERT_NE(tok, nullptr);
  PreprocessOptions o = TinyGen();
  o.max_seq = 64;
  const int Q = o.gen_queries;
  const Preprocessor p(o, tok.get());
  const std::map<std::string, std::string> out = {{"out0.png", SplitPicture()}};
  // <s> + 60 ids fill 61; 4 queries would pass 64: the output image goes
  // with everything after it.
  Outcome gone = p.Process(
      Files("gone", GenJson(std::string(240, 'a') + "<output_image>tail", {}, {"out0.png"}), out));
  ASSERT_TRUE(gone.ok) << gone.skip.reason << ": " << gone.skip.detail;
  EXPECT_TRUE(gone.sample.output_images.empty());
  EXPECT_EQ(gone.sample.query_tokens, 0);
  EXPECT_EQ(gone.sample.sample.num_gen_images, 0);
  EXPECT_TRUE(gone.sample.sample.gen_images.empty());
  EXPECT_EQ(
      std::count(gone.sample.sample.tokens.begin(), gone.sample.sample.tokens.end(), kQueryToken),
      0);
  // <s> + 59 ids + the queries are exactly 64: kept whole, the tail cut.
  Outcome kept = p.Process(
      Files("kept", GenJson(std::string(236, 'a') + "<output_image>tail", {}, {"out0.png"}), out));
  ASSERT_TRUE(kept.ok) << kept.skip.reason << ": " << kept.skip.detail;
  EXPECT_EQ(kept.sample.sample.tokens.size(), 64u);
  EXPECT_EQ(kept.sample.query_tokens, Q);
  EXPECT_EQ(kept.sample.sample.num_gen_images, 1);
  EXPECT_GT(kept.sample.truncated_tokens, 0);
  for (int q = 1; q <= Q; ++q) {
    EXPECT_EQ(kept.sample.sample.tokens[64 - q], kQueryToken);
  }
}

}  // namespace
}  // namespace loom::data
