#include "runtime/data/image.h"

#include "gtest/gtest.h"
#include "runtime/data/data_testing.h"

namespace loom::data {
namespace {

using testing::JpegClaiming;
using testing::PngClaiming;
using testing::TestImage;

TEST(ImageTest, PngRoundTripIsExact) {
  Image img = TestImage(37, 21);
  absl::StatusOr<Image> back = DecodeImage(*EncodePng(img), DecodeLimits{});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->width, 37);
  EXPECT_EQ(back->height, 21);
  EXPECT_EQ(back->rgb, img.rgb);
}

TEST(ImageTest, JpegRoundTripIsClose) {
  Image img = TestImage(64, 48);
  absl::StatusOr<Image> back = DecodeImage(*EncodeJpeg(img, 95), DecodeLimits{});
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->rgb.size(), img.rgb.size());
  // Away from the square's edge, JPEG at quality 95 keeps flat colours.
  const size_t center = (static_cast<size_t>(8) * 64 + 8) * 3;
  EXPECT_NEAR(back->rgb[center], 230, 6);
  EXPECT_NEAR(back->rgb[center + 1], 40, 6);
}

TEST(ImageTest, JpegDctScalingDecodesSmallerButNotBelowTheTarget) {
  std::string jpg = *EncodeJpeg(TestImage(800, 600), 90);
  absl::StatusOr<Image> img = DecodeImage(jpg, DecodeLimits{}, 100, 70);
  ASSERT_TRUE(img.ok());
  EXPECT_EQ(img->width, 100);  // 1/8
  EXPECT_EQ(img->height, 75);
  img = DecodeImage(jpg, DecodeLimits{}, 300, 200);
  ASSERT_TRUE(img.ok());
  EXPECT_EQ(img->width, 400);  // 1/2: 1/4 would be 200 < 300
}

TEST(ImageTest, EmptyAndUnknownAndCorrupt) {
  EXPECT_EQ(DecodeImage("", DecodeLimits{}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeImage("II*\0 a TIFF", DecodeLimits{}).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(DecodeImage("GIF89a....", DecodeLimits{}).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "a GIF cut short is corrupt";
  EXPECT_EQ(DecodeImage(std::string("RIFF\x10\0\0\0WEBPVP8 ", 16), DecodeLimits{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeImage("BM" + std::string(60, '\0'), DecodeLimits{}).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "a BMP of size 0x0";
  std::string png = testing::TestPng(32, 32);
  png[png.size() / 2] ^= 0x55;  // breaks the IDAT CRC or the deflate stream
  EXPECT_EQ(DecodeImage(png, DecodeLimits{}).status().code(), absl::StatusCode::kInvalidArgument);
  std::string jpg = testing::TestJpeg(64, 64);
  EXPECT_EQ(DecodeImage(jpg.substr(0, jpg.size() / 2), DecodeLimits{}).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "a truncated JPEG is corrupt, not silently grey";
  EXPECT_EQ(DecodeImage(png.substr(0, 40), DecodeLimits{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ImageTest, HugeHeadersAreRefusedBeforeAllocating) {
  absl::StatusOr<Image> png = DecodeImage(PngClaiming(100000, 100000), DecodeLimits{});
  EXPECT_EQ(png.status().code(), absl::StatusCode::kResourceExhausted) << png.status();
  EXPECT_NE(png.status().message().find("100000x100000"), std::string::npos);
  absl::StatusOr<Image> jpg = DecodeImage(JpegClaiming(65000, 65000), DecodeLimits{});
  EXPECT_EQ(jpg.status().code(), absl::StatusCode::kResourceExhausted) << jpg.status();
  absl::StatusOr<ImageSize> size = PeekImageSize(PngClaiming(100000, 100000));
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(size->width, 100000);
}

TEST(ImageTest, ResizeKeepsFlatColourAndAveragesWhenShrinking) {
  Image flat;
  flat.width = 50;
  flat.height = 30;
  flat.rgb.assign(50 * 30 * 3, 77);
  Image r = Resize(flat, 13, 7);
  for (uint8_t v : r.rgb) ASSERT_EQ(v, 77);
  Image check;
  check.width = 2;
  check.height = 2;
  check.rgb = {0, 0, 0, 200, 200, 200, 200, 200, 200, 0, 0, 0};
  Image one = Resize(check, 1, 1);
  EXPECT_EQ(one.rgb[0], 100);
  Image up = Resize(check, 8, 8);
  EXPECT_EQ(up.width, 8);
  EXPECT_LE(up.rgb[0], 60);       // near the black corner
  EXPECT_GE(up.rgb[7 * 3], 140);  // near the grey one
}

}  // namespace
}  // namespace loom::data
