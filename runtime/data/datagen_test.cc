#include "runtime/data/datagen.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/data/data_testing.h"
#include "runtime/data/preprocess.h"

namespace loom::data {
namespace {

TEST(DatagenTest, SameSeedSameBytesAndUnknownPresetNamed) {
  for (const std::string& preset : DatagenPresets()) {
    absl::StatusOr<GeneratedSample> a = GenerateSample(preset, 5, 17);
    absl::StatusOr<GeneratedSample> b = GenerateSample(preset, 5, 17);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_EQ(a->members.size(), b->members.size());
    for (size_t i = 0; i < a->members.size(); ++i) {
      EXPECT_EQ(a->members[i].name, b->members[i].name);
      EXPECT_EQ(a->members[i].bytes, b->members[i].bytes);
    }
    EXPECT_NE(GenerateSample(preset, 6, 17)->text, a->text) << preset << ": another seed";
  }
  absl::StatusOr<GeneratedSample> bad = GenerateSample("laion", 1, 0);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("onevision"), std::string::npos);
}

// Every generated sample passes preprocessing, and each preset has the
// heterogeneity its documentation promises.
TEST(DatagenTest, PresetsAreHeterogeneousAndValid) {
  Preprocessor tiny(PreprocessOptionsFor(*ModelConfigByName("tiny")), &testing::TestTokenizer());
  // The generation preset's output images need a model with a generator.
  Preprocessor tiny_gen(PreprocessOptionsFor(*ModelConfigByName("tiny-gen")),
                        &testing::TestTokenizer());
  std::map<std::string, std::map<std::string, int>> kinds;
  std::map<std::string, std::pair<int, int>> image_range;  // min, max images
  std::map<std::string, int> kept;
  const int n = 60;
  for (const std::string& preset : DatagenPresets()) {
    image_range[preset] = {1000, -1};
    for (int i = 0; i < n; ++i) {
      GeneratedSample g = *GenerateSample(preset, 1, i);
      SampleFiles files;
      files.key = g.key;
      for (const TarMember& m : g.members) {
        std::string key, ext;
        ASSERT_TRUE(SplitMemberName(m.name, &key, &ext));
        EXPECT_EQ(key, g.key);
        files.files[ext] = m.bytes;
      }
      const Preprocessor& pre = preset == "generation" ? tiny_gen : tiny;
      Outcome o = pre.Process(files, /*decode_pixels=*/true);
      if (o.ok) ++kept[preset];
      const int outputs = static_cast<int>(o.sample.output_images.size());
      if (!o.ok) {
        EXPECT_TRUE(o.skip.reason == "sequence_too_long" || o.skip.reason == "text_too_long")
            << preset << " " << g.key << ": " << o.skip.reason << " " << o.skip.detail;
        continue;
      }
      const int images = static_cast<int>(o.sample.images.size());
      image_range[preset].first = std::min(image_range[preset].first, images);
      image_range[preset].second = std::max(image_range[preset].second, images);
      int tiles = 0;
      for (const ImageInfo& info : o.sample.images) tiles = std::max(tiles, info.tiles);
      kinds[preset][tiles > 1 ? "tiled" : "untiled"]++;
      kinds[preset][absl::StrCat(images, " in ", outputs, " out")]++;
      EXPECT_EQ(o.sample.sample.num_gen_images, outputs);
      for (float v : o.sample.sample.gen_images) ASSERT_TRUE(v >= -1 && v <= 1) << v;
      if (preset == "generation" && outputs > 0) {
        // A text → image sample is not understood by a model without a generator.
        EXPECT_EQ(tiny.Process(files, /*decode_pixels=*/false).skip.reason, "no_generator");
      }
    }
  }
  EXPECT_EQ(kinds["caption"]["1 in 0 out"], kept["caption"]);
  EXPECT_GT(kinds["generation"]["0 in 1 out"], n / 3);  // text → image
  EXPECT_GT(kinds["generation"]["1 in 1 out"], 2);      // the same shapes elsewhere
  EXPECT_GT(kinds["generation"]["1 in 0 out"], n / 6);  // understanding
  EXPECT_EQ(kinds["generation"]["0 in 1 out"] + kinds["generation"]["1 in 1 out"] +
                kinds["generation"]["1 in 0 out"],
            kept["generation"]);
  EXPECT_EQ(image_range["caption"], std::make_pair(1, 1));
  EXPECT_EQ(image_range["interleaved"].first, 0);
  EXPECT_GE(image_range["interleaved"].second, 6);
  EXPECT_EQ(image_range["onevision"].first, 0);          // text-only samples
  EXPECT_GE(image_range["onevision"].second, 12);        // video frames
  EXPECT_GT(kinds["onevision"]["tiled"], 5);             // high-resolution singles
  EXPECT_EQ(image_range["chat"], std::make_pair(0, 1));  // text-only and one image
  for (const auto& [preset, k] : kept) EXPECT_GE(k, n * 9 / 10) << preset;
}

}  // namespace
}  // namespace loom::data

namespace loom::data {
namespace {

// The outline is the sample without pixels: same key, text and image sizes.
TEST(DatagenTest, OutlineMatchesTheGeneratedSample) {
  for (const std::string& preset : DatagenPresets()) {
    for (int64_t index : {0, 3, 11, 40}) {
      absl::StatusOr<GeneratedSample> full = GenerateSample(preset, 9, index);
      absl::StatusOr<SampleOutline> outline = OutlineSample(preset, 9, index);
      ASSERT_TRUE(full.ok() && outline.ok());
      EXPECT_EQ(outline->key, full->key);
      EXPECT_EQ(outline->text, full->text);
      // Members: KEY.json, the images, the output images.
      std::vector<std::pair<int, int>> sizes = outline->image_sizes;
      sizes.insert(sizes.end(), outline->output_image_sizes.begin(),
                   outline->output_image_sizes.end());
      ASSERT_EQ(sizes.size() + 1, full->members.size());
      for (size_t i = 0; i < sizes.size(); ++i) {
        absl::StatusOr<ImageSize> size = PeekImageSize(full->members[i + 1].bytes);
        ASSERT_TRUE(size.ok());
        EXPECT_EQ(sizes[i].first, size->width);
        EXPECT_EQ(sizes[i].second, size->height);
      }
    }
  }
  EXPECT_FALSE(OutlineSample("nope", 1, 0).ok());
}

}  // namespace
}  // namespace loom::data
