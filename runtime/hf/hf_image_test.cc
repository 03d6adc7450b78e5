#include "runtime/hf/hf_image.h"

#include <string>

#include "gtest/gtest.h"

namespace loom::hf {
namespace {

constexpr char kClip[] = R"({"do_resize": true, "size": {"shortest_edge": 16}, "resample": 3,
  "do_center_crop": true, "crop_size": {"height": 16, "width": 16}, "do_rescale": true,
  "rescale_factor": 0.00392156862745098, "do_normalize": true,
  "image_mean": [0.5, 0.25, 0.125], "image_std": [0.5, 0.5, 0.25]})";

TEST(ImageProcessorTest, ClipResizesTheShortEdgeCropsTheCenterAndNormalises) {
  absl::StatusOr<ImageProcessor> p = ParseImageProcessor(kClip, "clip");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->shortest_edge, 16);
  EXPECT_EQ(p->filter, data::ResizeFilter::kBicubic);
  // A flat 40x20 image: resized to 32x16, cropped to 16x16; every pixel the same.
  data::Image img{40, 20, std::vector<uint8_t>(40 * 20 * 3)};
  for (size_t i = 0; i < img.rgb.size(); i += 3) img.rgb[i] = 255, img.rgb[i + 2] = 51;
  absl::StatusOr<std::vector<float>> px = ProcessImage(*p, img, 16);
  ASSERT_TRUE(px.ok()) << px.status();
  ASSERT_EQ(px->size(), 3u * 16 * 16);
  EXPECT_NEAR((*px)[0], (1.0 - 0.5) / 0.5, 1e-6);            // R = 255
  EXPECT_NEAR((*px)[256], (0.0 - 0.25) / 0.5, 1e-6);         // G = 0
  EXPECT_NEAR((*px)[512 + 17], (0.2 - 0.125) / 0.25, 1e-6);  // B = 51
  // The tower takes another size: named.
  absl::StatusOr<std::vector<float>> wrong = ProcessImage(*p, img, 24);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("16x16"), std::string::npos) << wrong.status();
}

TEST(ImageProcessorTest, WhatLoomWouldComputeDifferentlyIsRefusedByName) {
  struct Case {
    const char* json;
    const char* names;
  };
  for (const Case& c : {
           Case{R"({"do_resize": true, "size": 16, "resample": 1, "do_normalize": false})",
                "resample"},
           Case{R"({"do_resize": true, "size": 16, "do_pad": true, "do_normalize": false})",
                "do_pad"},
           Case{R"({"do_resize": true, "do_normalize": false})", "size"},
           Case{R"({"do_resize": false, "image_mean": [0.5, 0.5, 0.5], "image_std": [0, 1, 1]})",
                "image_std"},
           Case{R"({"do_resize": false, "image_mean": [0.5, 0.5], "image_std": [1, 1, 1]})",
                "image_mean"},
           Case{R"({"size": {"shortest_edge": 16, "longest_edge": 32}, "do_normalize": false})",
                "longest_edge"},
           Case{R"([1, 2])", "not a JSON object"},
       }) {
    absl::StatusOr<ImageProcessor> p = ParseImageProcessor(c.json, "cfg");
    ASSERT_FALSE(p.ok()) << c.json;
    EXPECT_NE(p.status().message().find(c.names), std::string::npos) << p.status();
  }
}

}  // namespace
}  // namespace loom::hf
