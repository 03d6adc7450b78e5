// Images: decoding PNG, JPEG, WebP, GIF and BMP (libpng, libjpeg-turbo,
// libwebp, giflib, and a BMP reader here) to RGB as PIL's
// Image.open(f).convert("RGB") does - grey and palette images expanded, an
// alpha channel dropped, CMYK JPEG converted by PIL's formula, a GIF's first
// frame, a still WebP - PNG and JPEG encoding (for loom-datagen), and the
// resize that tiling is built on.
//
// Decoding never trusts a header: the claimed size is checked against
// DecodeLimits before any pixel buffer is allocated, and every decoder
// error (truncated data, bad Huffman code, CRC mismatch) becomes a Status,
// never an abort or a longjmp out of the caller. libjpeg's recoverable
// warnings (extraneous bytes before a marker, a corrupt segment it
// resynchronises after) decode through, as PIL decodes them; a premature
// end of the data is an error, as PIL's "image file is truncated".
//
// Errors, by code, so the pipeline can name a skip reason:
//   INVALID_ARGUMENT    empty, corrupt or truncated data
//   RESOURCE_EXHAUSTED  the header claims more pixels than the limits allow
//   UNIMPLEMENTED       another format, an animated WebP, a compressed or
//                       16-bit BMP
#ifndef LOOM_RUNTIME_DATA_IMAGE_H_
#define LOOM_RUNTIME_DATA_IMAGE_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::data {

// 8-bit RGB, row-major, 3 bytes per pixel, no row padding.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;
};

struct DecodeLimits {
  int max_side = 16384;             // either dimension
  int64_t max_pixels = 64LL << 20;  // width * height
};

// OK, INVALID_ARGUMENT for a non-positive size, or RESOURCE_EXHAUSTED when
// width x height is over `limits` (the message names both).
absl::Status CheckDecodeLimits(int64_t width, int64_t height, const DecodeLimits& limits);

enum class ImageFormat { kUnknown, kPng, kJpeg, kWebp, kGif, kBmp };

// From the leading magic bytes.
ImageFormat SniffImageFormat(std::string_view bytes);

// `min_width`/`min_height`: the smallest size the caller will resize to. A
// JPEG is then decoded with libjpeg's DCT scaling (1/2, 1/4, 1/8) to the
// smallest scale still at least that large; 0 decodes at full size. The
// returned Image has the decoded (possibly reduced) size.
absl::StatusOr<Image> DecodeImage(std::string_view bytes, const DecodeLimits& limits,
                                  int min_width = 0, int min_height = 0);

// The size a header claims, without decoding pixels.
struct ImageSize {
  int width = 0;
  int height = 0;
};
absl::StatusOr<ImageSize> PeekImageSize(std::string_view bytes);

absl::StatusOr<std::string> EncodePng(const Image& image);
absl::StatusOr<std::string> EncodeJpeg(const Image& image, int quality);

// Resamples `src` to width x height with a triangle (bilinear) or Keys
// cubic (a = -0.5, bicubic) filter whose support widens with the scale
// factor when shrinking, so downscaling averages every source pixel
// (antialiased, as PIL's BILINEAR and BICUBIC do). Bicubic rounds and clips
// to 8 bits between its horizontal and vertical passes as PIL does (the
// cubic overshoots); bilinear keeps floats there, where PIL rounds, so a
// value may differ from PIL's by one.
enum class ResizeFilter { kBilinear, kBicubic };
Image Resize(const Image& src, int width, int height,
             ResizeFilter filter = ResizeFilter::kBilinear);

// LLaVA-1.5's image_aspect_ratio "pad" (its expand2square): a square of the
// longer side filled with `fill`, the image pasted centred (offset rounded
// down). A square image is returned as it is.
Image PadToSquare(const Image& src, const std::array<uint8_t, 3>& fill);

}  // namespace loom::data

#endif  // LOOM_RUNTIME_DATA_IMAGE_H_
