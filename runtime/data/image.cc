#include "runtime/data/image.h"

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
// clang-format off
#include <png.h>
#include <jpeglib.h>
// clang-format on

namespace loom::data {

absl::Status CheckDecodeLimits(int64_t width, int64_t height, const DecodeLimits& limits) {
  if (width <= 0 || height <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("image size ", width, "x", height));
  }
  if (width > limits.max_side || height > limits.max_side || width * height > limits.max_pixels) {
    return absl::ResourceExhaustedError(absl::StrCat("image header claims ", width, "x", height,
                                                     " pixels; limits are ", limits.max_side,
                                                     " a side and ", limits.max_pixels, " in all"));
  }
  return absl::OkStatus();
}

namespace {

// ---- PNG (libpng's simplified API: errors come back as a message) ----

absl::StatusOr<ImageSize> PeekPng(std::string_view bytes, png_image* image) {
  std::memset(image, 0, sizeof(*image));
  image->version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(image, bytes.data(), bytes.size())) {
    std::string msg = absl::StrCat("corrupt PNG: ", image->message);
    png_image_free(image);
    return absl::InvalidArgumentError(msg);
  }
  return ImageSize{static_cast<int>(image->width), static_cast<int>(image->height)};
}

absl::StatusOr<Image> DecodePng(std::string_view bytes, const DecodeLimits& limits) {
  png_image image;
  absl::StatusOr<ImageSize> size = PeekPng(bytes, &image);
  if (!size.ok()) return size.status();
  if (absl::Status s = CheckDecodeLimits(image.width, image.height, limits); !s.ok()) {
    png_image_free(&image);
    return s;
  }
  image.format = PNG_FORMAT_RGB;
  Image out;
  out.width = static_cast<int>(image.width);
  out.height = static_cast<int>(image.height);
  out.rgb.resize(static_cast<size_t>(out.width) * out.height * 3);
  if (!png_image_finish_read(&image, /*background=*/nullptr, out.rgb.data(), /*row_stride=*/0,
                             /*colormap=*/nullptr)) {
    std::string msg = absl::StrCat("corrupt PNG: ", image.message);
    png_image_free(&image);
    return absl::InvalidArgumentError(msg);
  }
  return out;
}

// ---- JPEG (libjpeg: errors longjmp back to the frame that set them) ----

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void JpegErrorExit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  cinfo->err->format_message(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings (a premature end of data, a corrupt segment) make the image
// unusable for training: turn them into errors as well.
void JpegEmitMessage(j_common_ptr cinfo, int level) {
  if (level < 0) JpegErrorExit(cinfo);
}

// The decode itself, with no C++ object whose destructor a longjmp could
// skip: `out` lives in the caller's frame.
bool DecodeJpegInto(std::string_view bytes, const DecodeLimits& limits, int min_width,
                    int min_height, bool header_only, Image* out, std::string* error,
                    bool* too_large) {
  jpeg_decompress_struct cinfo;
  JpegError jerr;
  cinfo.err = jpeg_std_error(&jerr.mgr);
  jerr.mgr.error_exit = JpegErrorExit;
  jerr.mgr.emit_message = JpegEmitMessage;
  jerr.message[0] = '\0';
  if (setjmp(jerr.jump)) {
    *error = jerr.message;
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  out->width = static_cast<int>(cinfo.image_width);
  out->height = static_cast<int>(cinfo.image_height);
  if (header_only) {
    jpeg_destroy_decompress(&cinfo);
    return true;
  }
  if (!CheckDecodeLimits(cinfo.image_width, cinfo.image_height, limits).ok()) {
    *too_large = true;
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  cinfo.out_color_space = JCS_RGB;
  cinfo.scale_num = 1;
  cinfo.scale_denom = 1;
  for (int denom : {8, 4, 2}) {
    if (min_width > 0 && min_height > 0 &&
        static_cast<int64_t>(cinfo.image_width) >= static_cast<int64_t>(min_width) * denom &&
        static_cast<int64_t>(cinfo.image_height) >= static_cast<int64_t>(min_height) * denom) {
      cinfo.scale_denom = denom;
      break;
    }
  }
  jpeg_start_decompress(&cinfo);
  out->width = static_cast<int>(cinfo.output_width);
  out->height = static_cast<int>(cinfo.output_height);
  if (cinfo.output_components != 3) {
    std::snprintf(jerr.message, sizeof(jerr.message), "JPEG has %d output components",
                  cinfo.output_components);
    *error = jerr.message;
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  out->rgb.resize(static_cast<size_t>(out->width) * out->height * 3);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out->rgb.data() + static_cast<size_t>(cinfo.output_scanline) * out->width * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

absl::StatusOr<Image> DecodeJpeg(std::string_view bytes, const DecodeLimits& limits, int min_width,
                                 int min_height, bool header_only) {
  Image out;
  std::string error;
  bool too_large = false;
  if (!DecodeJpegInto(bytes, limits, min_width, min_height, header_only, &out, &error,
                      &too_large)) {
    if (too_large) return CheckDecodeLimits(out.width, out.height, limits);
    return absl::InvalidArgumentError(absl::StrCat("corrupt JPEG: ", error));
  }
  return out;
}

}  // namespace

ImageFormat SniffImageFormat(std::string_view bytes) {
  static constexpr unsigned char kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPng, 8) == 0) return ImageFormat::kPng;
  if (bytes.size() >= 3 && static_cast<unsigned char>(bytes[0]) == 0xff &&
      static_cast<unsigned char>(bytes[1]) == 0xd8 &&
      static_cast<unsigned char>(bytes[2]) == 0xff) {
    return ImageFormat::kJpeg;
  }
  return ImageFormat::kUnknown;
}

absl::StatusOr<Image> DecodeImage(std::string_view bytes, const DecodeLimits& limits, int min_width,
                                  int min_height) {
  if (bytes.empty()) return absl::InvalidArgumentError("empty image (0 bytes)");
  switch (SniffImageFormat(bytes)) {
    case ImageFormat::kPng:
      return DecodePng(bytes, limits);
    case ImageFormat::kJpeg:
      return DecodeJpeg(bytes, limits, min_width, min_height, /*header_only=*/false);
    case ImageFormat::kUnknown:
      break;
  }
  return absl::UnimplementedError("neither PNG nor JPEG");
}

absl::StatusOr<ImageSize> PeekImageSize(std::string_view bytes) {
  if (bytes.empty()) return absl::InvalidArgumentError("empty image (0 bytes)");
  switch (SniffImageFormat(bytes)) {
    case ImageFormat::kPng: {
      png_image image;
      absl::StatusOr<ImageSize> size = PeekPng(bytes, &image);
      if (size.ok()) png_image_free(&image);
      return size;
    }
    case ImageFormat::kJpeg: {
      absl::StatusOr<Image> header = DecodeJpeg(bytes, DecodeLimits{}, 0, 0, true);
      if (!header.ok()) return header.status();
      return ImageSize{header->width, header->height};
    }
    case ImageFormat::kUnknown:
      break;
  }
  return absl::UnimplementedError("neither PNG nor JPEG");
}

absl::StatusOr<std::string> EncodePng(const Image& image) {
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.width);
  png.height = static_cast<png_uint_32>(image.height);
  png.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&png, nullptr, &size, 0, image.rgb.data(), 0, nullptr)) {
    return absl::InternalError(absl::StrCat("PNG encode: ", png.message));
  }
  std::string out(size, '\0');
  if (!png_image_write_to_memory(&png, out.data(), &size, 0, image.rgb.data(), 0, nullptr)) {
    return absl::InternalError(absl::StrCat("PNG encode: ", png.message));
  }
  out.resize(size);
  return out;
}

namespace {
bool EncodeJpegInto(const Image& image, int quality, unsigned char** buffer, unsigned long* size,
                    std::string* error) {
  jpeg_compress_struct cinfo;
  JpegError jerr;
  cinfo.err = jpeg_std_error(&jerr.mgr);
  jerr.mgr.error_exit = JpegErrorExit;
  if (setjmp(jerr.jump)) {
    *error = jerr.message;
    jpeg_destroy_compress(&cinfo);
    return false;
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, buffer, size);
  cinfo.image_width = static_cast<JDIMENSION>(image.width);
  cinfo.image_height = static_cast<JDIMENSION>(image.height);
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<unsigned char*>(image.rgb.data()) +
                   static_cast<size_t>(cinfo.next_scanline) * image.width * 3;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  return true;
}
}  // namespace

absl::StatusOr<std::string> EncodeJpeg(const Image& image, int quality) {
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  std::string error;
  bool ok = EncodeJpegInto(image, quality, &buffer, &size, &error);
  std::string out = ok ? std::string(reinterpret_cast<char*>(buffer), size) : std::string();
  std::free(buffer);
  if (!ok) return absl::InternalError(absl::StrCat("JPEG encode: ", error));
  return out;
}

namespace {

// Per output coordinate: the first source index and normalised weights.
struct Coefficients {
  int taps = 0;
  std::vector<int> start;
  std::vector<float> weights;  // out * taps
};

// The filters as PIL defines them: a triangle of support 1, and Keys' cubic
// (a = -0.5) of support 2.
double Filter(ResizeFilter f, double x) {
  x = std::abs(x);
  if (f == ResizeFilter::kBilinear) return std::max(0.0, 1.0 - x);
  constexpr double a = -0.5;
  if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
  return 0;
}

Coefficients Precompute(int in, int out, ResizeFilter filter) {
  Coefficients c;
  const double scale = static_cast<double>(in) / out;
  const double widen = std::max(scale, 1.0);  // the filter stretched when shrinking
  const double support = (filter == ResizeFilter::kBilinear ? 1.0 : 2.0) * widen;
  c.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.start.resize(out);
  c.weights.assign(static_cast<size_t>(out) * c.taps, 0.0f);
  for (int o = 0; o < out; ++o) {
    const double center = (o + 0.5) * scale;
    int lo = std::max(0, static_cast<int>(center - support + 0.5));
    int hi = std::min(in, static_cast<int>(center + support + 0.5));
    if (hi - lo > c.taps) hi = lo + c.taps;
    double sum = 0;
    float* w = &c.weights[static_cast<size_t>(o) * c.taps];
    for (int i = lo; i < hi; ++i) {
      const double v = Filter(filter, (i + 0.5 - center) / widen);
      w[i - lo] = static_cast<float>(v);
      sum += v;
    }
    if (sum != 0) {
      for (int i = 0; i < hi - lo; ++i) w[i] = static_cast<float>(w[i] / sum);
    } else {
      w[0] = 1.0f;  // degenerate: nearest
    }
    c.start[o] = std::min(lo, in - 1);
  }
  return c;
}

}  // namespace

Image Resize(const Image& src, int width, int height, ResizeFilter filter) {
  Image dst;
  dst.width = width;
  dst.height = height;
  dst.rgb.resize(static_cast<size_t>(width) * height * 3);
  if (src.width == width && src.height == height) {
    dst.rgb = src.rgb;
    return dst;
  }
  const Coefficients cx = Precompute(src.width, width, filter);
  const Coefficients cy = Precompute(src.height, height, filter);
  // Horizontal pass over every source row into floats, then vertical.
  std::vector<float> tmp(static_cast<size_t>(src.height) * width * 3);
  for (int y = 0; y < src.height; ++y) {
    const uint8_t* row = &src.rgb[static_cast<size_t>(y) * src.width * 3];
    float* t = &tmp[static_cast<size_t>(y) * width * 3];
    for (int x = 0; x < width; ++x) {
      const float* w = &cx.weights[static_cast<size_t>(x) * cx.taps];
      const int s0 = cx.start[x], n = std::min(cx.taps, src.width - s0);
      float r = 0, g = 0, b = 0;
      for (int k = 0; k < n; ++k) {
        const uint8_t* p = row + (s0 + k) * 3;
        r += w[k] * p[0];
        g += w[k] * p[1];
        b += w[k] * p[2];
      }
      if (filter == ResizeFilter::kBicubic) {
        // As PIL: the cubic overshoots, and PIL keeps 8 bits between passes.
        auto to8 = [](float v) { return std::clamp(std::nearbyint(v), 0.0f, 255.0f); };
        r = to8(r);
        g = to8(g);
        b = to8(b);
      }
      t[x * 3] = r;
      t[x * 3 + 1] = g;
      t[x * 3 + 2] = b;
    }
  }
  std::vector<float> acc(static_cast<size_t>(width) * 3);
  for (int y = 0; y < height; ++y) {
    const float* w = &cy.weights[static_cast<size_t>(y) * cy.taps];
    const int s0 = cy.start[y], n = std::min(cy.taps, src.height - s0);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int k = 0; k < n; ++k) {
      if (w[k] == 0.0f) continue;
      const float* t = &tmp[static_cast<size_t>(s0 + k) * width * 3];
      for (int i = 0; i < width * 3; ++i) acc[i] += w[k] * t[i];
    }
    uint8_t* out = &dst.rgb[static_cast<size_t>(y) * width * 3];
    for (int i = 0; i < width * 3; ++i) {
      out[i] = static_cast<uint8_t>(std::clamp(std::lround(acc[i]), 0L, 255L));
    }
  }
  return dst;
}

}  // namespace loom::data
