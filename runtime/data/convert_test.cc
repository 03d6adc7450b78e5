#include "runtime/data/convert.h"

#include <filesystem>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/base/file.h"
#include "runtime/base/test_paths.h"
#include "runtime/data/chat_template.h"
#include "runtime/data/data_testing.h"
#include "runtime/data/preprocess.h"
#include "runtime/data/shard.h"

namespace loom::data {
namespace {

namespace fs = std::filesystem;

void Put(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  ASSERT_TRUE(WriteFileAtomically(path, bytes).ok()) << path;
}

std::string Seed(const std::string& name) {
  absl::StatusOr<std::string> b =
      ReadFile(loom::testing::RunfilePath("runtime/data/fuzz/regressions/image/" + name));
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *b : "";
}

// Every sample of the shards, preprocessed with the vicuna_v1 template.
std::vector<Outcome> Preprocessed(const std::vector<std::string>& shards,
                                  const std::string& config = "tiny") {
  PreprocessOptions o = PreprocessOptionsFor(*ModelConfigByName(config));
  o.chat = *ChatTemplate::Resolve("vicuna_v1", &testing::TestTokenizer());
  Preprocessor p(o, &testing::TestTokenizer());
  std::vector<Outcome> out;
  for (const std::string& path : shards) {
    absl::StatusOr<ShardIndex> index = IndexShard(path, ShardLimits{});
    EXPECT_TRUE(index.ok()) << index.status();
    if (!index.ok()) continue;
    EXPECT_TRUE(index->broken.empty());
    for (const SampleRef& ref : index->samples) {
      absl::StatusOr<SampleFiles> files = ReadSample(path, ref, ShardLimits{});
      EXPECT_TRUE(files.ok()) << files.status();
      if (files.ok()) out.push_back(p.Process(*files));
    }
  }
  return out;
}

class ConvertTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = loom::testing::TempPath("convert");
    fs::remove_all(root_);
    const std::string img = root_ + "/images";
    Put(img + "/a.png", testing::TestPng(64, 48));
    Put(img + "/b.jpg", testing::TestJpeg(80, 60));
    Put(img + "/coco/shared.jpg", testing::TestJpeg(50, 70));
    Put(img + "/anim.gif", Seed("seed-interlaced.gif"));
    Put(img + "/w.webp", Seed("seed-lossy.webp"));
    Put(img + "/cmyk.jpg", Seed("seed-cmyk.jpg"));
    Put(img + "/broken.jpg", "not a jpeg at all");
    for (int f = 0; f < 3; ++f)
      Put(img + "/frames/" + std::to_string(f) + ".jpg", testing::TestJpeg(48, 27));
    Put(root_ + "/secret.png", testing::TestPng(8, 8));
  }

  std::string root_;
};

nlohmann::json Llava(const std::string& id, nlohmann::json image,
                     std::vector<std::pair<std::string, std::string>> turns) {
  nlohmann::json r = {{"id", id}};
  if (!image.is_null()) r[image.is_array() ? "images" : "image"] = image;
  r["conversations"] = nlohmann::json::array();
  for (auto& [from, value] : turns)
    r["conversations"].push_back({{"from", from}, {"value", value}});
  return r;
}

TEST_F(ConvertTest, LlavaJsonBecomesShardsThatTrain) {
  const nlohmann::json records = {
      Llava("000000.jpg.1", "a.png",
            {{"human", "<image>\nwhat is it?"},
             {"gpt", "a square."},
             {"human", "where?"},
             {"gpt", "top left."}}),
      Llava("text.only", nullptr, {{"human", "hi"}, {"gpt", "hello."}}),
      Llava("multi", {"b.jpg", "coco/shared.jpg"},
            {{"human", "<image> and <image>: same?"}, {"gpt", "no."}}),
      Llava("gif", "anim.gif", {{"human", "describe it."}, {"gpt", "shapes."}}),
      Llava("webp", "w.webp", {{"human", "<image>\ncolor?"}, {"gpt", "red."}}),
      Llava("cmyk", "cmyk.jpg", {{"human", "<image>\ncolor?"}, {"gpt", "blue."}}),
      Llava("missing", "nope.jpg", {{"human", "<image>\nx?"}, {"gpt", "y."}}),
      Llava("shared.2", "coco/shared.jpg", {{"human", "<image>\nagain?"}, {"gpt", "yes."}}),
      Llava("broken", "broken.jpg", {{"human", "<image>\nx?"}, {"gpt", "y."}}),
      Llava("robot", nullptr, {{"robot", "beep"}}),
      Llava("escape", "../secret.png", {{"human", "<image>\nx?"}, {"gpt", "y."}}),
      {{"id", "video"},
       {"video", "frames"},
       {"conversations",
        {{{"from", "human"}, {"value", "<video>\nwhat moves?"}},
         {{"from", "gpt"}, {"value", "circles."}}}}},
      Llava("mismatch", "a.png", {{"human", "<image><image>"}, {"gpt", "x."}}),
  };
  Put(root_ + "/llava.json", records.dump(2));
  ConvertOptions o;
  o.input = root_ + "/llava.json";
  o.images = root_ + "/images";
  o.out = root_ + "/out";
  o.name = "llava";
  o.samples_per_shard = 3;
  int progress = 0;
  o.progress = [&](int64_t, int64_t) { ++progress; };
  absl::StatusOr<ConvertSummary> s = Convert(o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->read, 13);
  EXPECT_EQ(s->written, 8);
  EXPECT_EQ(s->skipped, (std::map<std::string, int64_t>{{"bad_record", 1},
                                                        {"image_count_mismatch", 1},
                                                        {"missing_image", 1},
                                                        {"unreadable_image", 2}}));
  EXPECT_EQ(s->shards.size(), 3u) << "8 samples, 3 a shard";
  EXPECT_GE(progress, 3);
  ASSERT_FALSE(s->examples.empty());
  EXPECT_NE(s->examples[0].find("missing"), std::string::npos) << s->examples[0];

  // Every written sample preprocesses: images decode, markers match, the
  // chat template renders, answers carry loss.
  const std::vector<Outcome> out = Preprocessed(s->shards);
  ASSERT_EQ(out.size(), 8u);
  int images = 0;
  for (const Outcome& x : out) {
    EXPECT_TRUE(x.ok) << x.skip.key << ": " << x.skip.reason << ": " << x.skip.detail;
    EXPECT_GT(x.sample.loss_tokens, 0);
    images += static_cast<int>(x.sample.images.size());
  }
  EXPECT_EQ(images, 1 + 0 + 2 + 1 + 1 + 1 + 1 + 3);
  // Keys are positions; the id, dots and all, is kept.
  absl::StatusOr<ShardIndex> first = IndexShard(s->shards[0], ShardLimits{});
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->samples[0].key, "000000000");
  absl::StatusOr<SampleFiles> f = ReadSample(s->shards[0], first->samples[0], ShardLimits{});
  ASSERT_TRUE(f.ok());
  const nlohmann::json j = nlohmann::json::parse(f->files.at("json"));
  EXPECT_EQ(j["id"], "000000.jpg.1");
  EXPECT_EQ(j["messages"][2]["content"], "where?");
  EXPECT_EQ(f->files.count("0.png"), 1u);

  // The same input gives the same bytes.
  o.out = root_ + "/again";
  absl::StatusOr<ConvertSummary> again = Convert(o);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->shards.size(), s->shards.size());
  for (size_t i = 0; i < s->shards.size(); ++i) {
    EXPECT_EQ(*ReadFile(s->shards[i]), *ReadFile(again->shards[i])) << i;
  }
}

TEST_F(ConvertTest, MessagesJsonLines) {
  Put(root_ + "/m.jsonl",
      R"({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is it?"}]}, {"role": "assistant", "content": "a square."}], "images": ["a.png"]})"
      "\n\n"
      R"({"messages": [{"role": "system", "content": "be brief."}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello."}]})"
      "\n"
      "{not json\n"
      R"({"messages": [{"role": "user", "content": [{"type": "audio"}]}]})"
      "\n");
  ConvertOptions o;
  o.input = root_ + "/m.jsonl";
  o.images = root_ + "/images";
  o.out = root_ + "/m";
  absl::StatusOr<ConvertSummary> s = Convert(o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->read, 4);
  EXPECT_EQ(s->written, 2);
  EXPECT_EQ(s->skipped.at("bad_record"), 2);
  const std::vector<Outcome> out = Preprocessed(s->shards);
  ASSERT_EQ(out.size(), 2u);
  for (const Outcome& x : out) EXPECT_TRUE(x.ok) << x.skip.reason << ": " << x.skip.detail;
  EXPECT_EQ(out[0].sample.images.size(), 1u);

  o.input = root_ + "/none.json";
  EXPECT_EQ(Convert(o).status().code(), absl::StatusCode::kNotFound);
}

// Text → image pairs (MetaQuery's, BLIP3-o's) become a prompt and the
// output image the answer draws; a conversation can name output images too.
TEST_F(ConvertTest, TextToImagePairs) {
  Put(root_ + "/t2i.jsonl",
      R"({"prompt": "two red circles.", "image": "a.png"})"
      "\n"
      R"({"prompt": "a square.", "image": "b.jpg", "id": 7})"
      "\n"
      R"({"messages": [{"role": "user", "content": "<image>\nthe same, bigger."}, {"role": "assistant", "content": "<output_image>"}], "images": ["a.png"], "output_images": ["b.jpg"]})"
      "\n"
      R"({"prompt": "no picture."})"
      "\n"
      R"({"prompt": "two pictures.", "image": ["a.png", "b.jpg"]})"
      "\n"
      R"({"prompt": "gone.", "image": "nope.png"})"
      "\n"
      R"({"caption": "an image to caption, not to draw.", "image": "a.png"})"
      "\n"
      R"({"messages": [{"role": "user", "content": "draw."}, {"role": "assistant", "content": "<output_image><output_image>"}], "output_image": "a.png"})"
      "\n");
  ConvertOptions o;
  o.input = root_ + "/t2i.jsonl";
  o.images = root_ + "/images";
  o.out = root_ + "/t2i";
  absl::StatusOr<ConvertSummary> s = Convert(o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->read, 8);
  EXPECT_EQ(s->written, 3);
  EXPECT_EQ(s->skipped.at("bad_record"), 3);  // no picture, two pictures, a caption
  EXPECT_EQ(s->skipped.at("missing_image"), 1);
  EXPECT_EQ(s->skipped.at("image_count_mismatch"), 1);
  // The first record as written: the prompt, the marker, the output image.
  absl::StatusOr<ShardIndex> index = IndexShard(s->shards[0], ShardLimits{});
  ASSERT_TRUE(index.ok());
  absl::StatusOr<SampleFiles> first = ReadSample(s->shards[0], index->samples[0], ShardLimits{});
  ASSERT_TRUE(first.ok());
  const nlohmann::json j = nlohmann::json::parse(first->files.at("json"));
  EXPECT_EQ(j["messages"][0]["content"], "two red circles.");
  EXPECT_EQ(j["messages"][1]["content"], "<output_image>");
  EXPECT_EQ(j["output_images"], nlohmann::json::array({"out0.png"}));
  EXPECT_FALSE(j.contains("images") && !j["images"].empty());
  EXPECT_EQ(first->files.count("out0.png"), 1u);
  // They train a model with a generator: one output image each, the third
  // an input image too.
  const std::vector<Outcome> out = Preprocessed(s->shards, "tiny-gen");
  ASSERT_EQ(out.size(), 3u);
  for (const Outcome& x : out) {
    ASSERT_TRUE(x.ok) << x.skip.reason << ": " << x.skip.detail;
    EXPECT_EQ(x.sample.sample.num_gen_images, 1);
  }
  EXPECT_EQ(out[2].sample.images.size(), 1u);
  // A model without one skips them, by name.
  for (const Outcome& x : Preprocessed(s->shards)) EXPECT_EQ(x.skip.reason, "no_generator");
}

}  // namespace
}  // namespace loom::data
