#include "runtime/data/datagen.h"

#include <array>
#include <cmath>
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

// The generation preset's pictures follow from their text: preprocessed
// as tiny-gen's generator sees them (16 x 16, [-1, 1]), the quarter the
// caption names is the brightest, and its colour is nearest the caption's.
TEST(DatagenTest, OutputPicturesFollowTheirText) {
  Preprocessor pre(PreprocessOptionsFor(*ModelConfigByName("tiny-gen")), &testing::TestTokenizer());
  const std::vector<std::pair<std::string, std::array<double, 3>>> colors = {
      {"red", {230, 40, 40}},     {"green", {40, 200, 60}},   {"blue", {50, 80, 230}},
      {"yellow", {230, 220, 40}}, {"white", {240, 240, 240}}, {"purple", {160, 60, 200}}};
  // Each region's 8 x 8 window of the 16 x 16 picture (x0, y0).
  const std::vector<std::pair<std::string, std::pair<int, int>>> regions = {
      {"top left", {0, 0}},
      {"top right", {8, 0}},
      {"bottom left", {0, 8}},
      {"bottom right", {8, 8}},
      {"center", {4, 4}}};
  int checked = 0;
  for (int i = 0; i < 80; ++i) {
    const GeneratedSample g = *GenerateSample("generation", 3, i);
    SampleFiles files;
    files.key = g.key;
    for (const TarMember& m : g.members) {
      std::string key, ext;
      ASSERT_TRUE(SplitMemberName(m.name, &key, &ext));
      files.files[ext] = m.bytes;
    }
    const Outcome o = pre.Process(files);
    ASSERT_TRUE(o.ok) << g.key << ": " << o.skip.detail;
    if (o.sample.sample.num_gen_images != 1) continue;
    // The picture's region: the last one the text names (an edit names the
    // input's first); its colour: the one colour word.
    std::string region, color;
    size_t last = 0;
    for (const auto& [name, xy] : regions) {
      const size_t at = g.text.rfind(name);
      if (at != std::string::npos && (region.empty() || at > last)) {
        region = name;
        last = at;
      }
    }
    for (const auto& [name, rgb] : colors) {
      if (g.text.find(" " + name + " ") != std::string::npos) color = name;
    }
    ASSERT_FALSE(region.empty() || color.empty()) << g.text;
    const std::vector<float>& px = o.sample.sample.gen_images;
    auto mean = [&](std::pair<int, int> xy) {  // 0-255 per channel
      std::array<double, 3> m{};
      for (int c = 0; c < 3; ++c) {
        for (int y = xy.second; y < xy.second + 8; ++y) {
          for (int x = xy.first; x < xy.first + 8; ++x) {
            m[c] += (px[(c * 16 + y) * 16 + x] + 1) * 127.5 / 64;
          }
        }
      }
      return m;
    };
    std::string brightest;
    double most = -1;
    std::array<double, 3> named{};
    for (const auto& [name, xy] : regions) {
      const std::array<double, 3> m = mean(xy);
      if (name == region) named = m;
      if (name != "center" && m[0] + m[1] + m[2] > most) {
        most = m[0] + m[1] + m[2];
        brightest = name;
      }
    }
    if (region != "center") {
      EXPECT_EQ(brightest, region) << g.text;
    }
    std::string nearest;
    double best = -2;
    for (const auto& [name, rgb] : colors) {
      const double dot = named[0] * rgb[0] + named[1] * rgb[1] + named[2] * rgb[2];
      const double cos =
          dot / std::sqrt((named[0] * named[0] + named[1] * named[1] + named[2] * named[2]) *
                          (rgb[0] * rgb[0] + rgb[1] * rgb[1] + rgb[2] * rgb[2]));
      if (cos > best) {
        best = cos;
        nearest = name;
      }
    }
    EXPECT_EQ(nearest, color) << g.text;
    ++checked;
  }
  EXPECT_GT(checked, 30);
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
