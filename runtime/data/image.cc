#include "runtime/data/image.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
// clang-format off
#include <png.h>
#include <jpeglib.h>
#include <jerror.h>
#include <gif_lib.h>
#include <webp/decode.h>
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
  // With alpha (an alpha channel, or a palette or grey with tRNS): read as
  // RGBA and drop the alpha, as PIL's convert("RGB") does (libpng would
  // composite onto black).
  const bool alpha = (image.format & PNG_FORMAT_FLAG_ALPHA) != 0;
  image.format = alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB;
  Image out;
  out.width = static_cast<int>(image.width);
  out.height = static_cast<int>(image.height);
  const size_t n = static_cast<size_t>(out.width) * out.height;
  out.rgb.resize(n * (alpha ? 4 : 3));
  if (!png_image_finish_read(&image, /*background=*/nullptr, out.rgb.data(), /*row_stride=*/0,
                             /*colormap=*/nullptr)) {
    std::string msg = absl::StrCat("corrupt PNG: ", image.message);
    png_image_free(&image);
    return absl::InvalidArgumentError(msg);
  }
  if (alpha) {
    for (size_t i = 0; i < n; ++i) std::memmove(&out.rgb[3 * i], &out.rgb[4 * i], 3);
    out.rgb.resize(n * 3);
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

// Warnings decode as PIL decodes them: extraneous bytes before a marker, a
// corrupt segment libjpeg resynchronises after, are decoded through; a
// premature end of the data is an error (PIL: "image file is truncated").
void JpegEmitMessage(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) JpegErrorExit(cinfo);
}

// PIL's CMYK -> RGB (Convert.c cmyk2rgb) of Adobe's inverted CMYK, which PIL
// assumes for every CMYK JPEG ("CMYK;I"): with c = 255 - stored and
// nk = 255 - k, each channel is nk - round(c * nk / 255).
inline uint8_t CmykChannel(int stored_c, int stored_k) {
  const int c = 255 - stored_c, nk = stored_k;
  const int t = c * nk + 128;
  const int v = nk - (((t >> 8) + t) >> 8);
  return static_cast<uint8_t>(std::clamp(v, 0, 255));
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
  // CMYK and YCCK come out as CMYK, made RGB as PIL does; the rest (grey
  // included) as RGB.
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
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
  if (cinfo.output_components != (cmyk ? 4 : 3)) {
    std::snprintf(jerr.message, sizeof(jerr.message), "JPEG has %d output components",
                  cinfo.output_components);
    *error = jerr.message;
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  const size_t pixels = static_cast<size_t>(out->width) * out->height;
  out->rgb.resize(pixels * (cmyk ? 4 : 3));
  const int channels = cmyk ? 4 : 3;
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row =
        out->rgb.data() + static_cast<size_t>(cinfo.output_scanline) * out->width * channels;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  if (cmyk) {
    for (size_t i = 0; i < pixels; ++i) {
      const uint8_t* p = &out->rgb[4 * i];
      const uint8_t r = CmykChannel(p[0], p[3]), g = CmykChannel(p[1], p[3]),
                    b = CmykChannel(p[2], p[3]);
      out->rgb[3 * i] = r;
      out->rgb[3 * i + 1] = g;
      out->rgb[3 * i + 2] = b;
    }
    out->rgb.resize(pixels * 3);
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

// ---- WebP (libwebp: the still image; an animation is refused) ----

absl::StatusOr<ImageSize> PeekWebp(std::string_view bytes) {
  WebPBitstreamFeatures f;
  if (WebPGetFeatures(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &f) !=
      VP8_STATUS_OK) {
    return absl::InvalidArgumentError("corrupt WebP: no readable header");
  }
  if (f.has_animation) return absl::UnimplementedError("animated WebP");
  return ImageSize{f.width, f.height};
}

absl::StatusOr<Image> DecodeWebp(std::string_view bytes, const DecodeLimits& limits) {
  absl::StatusOr<ImageSize> size = PeekWebp(bytes);
  if (!size.ok()) return size.status();
  if (absl::Status s = CheckDecodeLimits(size->width, size->height, limits); !s.ok()) return s;
  Image out;
  out.width = size->width;
  out.height = size->height;
  out.rgb.resize(static_cast<size_t>(out.width) * out.height * 3);
  // RGB: an alpha channel is dropped, as PIL's convert("RGB") does.
  if (WebPDecodeRGBInto(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                        out.rgb.data(), out.rgb.size(), out.width * 3) == nullptr) {
    return absl::InvalidArgumentError("corrupt WebP: the image data does not decode");
  }
  return out;
}

// ---- GIF (giflib, record by record: the first image only) ----

struct GifSource {
  std::string_view bytes;
  size_t at = 0;
};

int GifRead(GifFileType* gif, GifByteType* buf, int n) {
  auto* src = static_cast<GifSource*>(gif->UserData);
  const size_t k = std::min<size_t>(static_cast<size_t>(n), src->bytes.size() - src->at);
  std::memcpy(buf, src->bytes.data() + src->at, k);
  src->at += k;
  return static_cast<int>(k);
}

// The first frame on the logical screen: the screen filled with the
// background colour, the frame's pixels at its offset (a transparent index
// keeps its palette colour, as PIL's convert("RGB") of the frame does).
absl::StatusOr<Image> DecodeGif(std::string_view bytes, const DecodeLimits& limits,
                                bool header_only) {
  GifSource src{bytes};
  int error = 0;
  GifFileType* gif = DGifOpen(&src, GifRead, &error);
  if (gif == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("corrupt GIF: ", GifErrorString(error)));
  }
  struct Closer {
    GifFileType* g;
    ~Closer() {
      int e = 0;
      DGifCloseFile(g, &e);
    }
  } closer{gif};
  auto corrupt = [&](const char* what) {
    return absl::InvalidArgumentError(
        absl::StrCat("corrupt GIF: ", what, ": ", GifErrorString(gif->Error)));
  };
  Image out;
  out.width = gif->SWidth;
  out.height = gif->SHeight;
  if (header_only) return out;
  if (absl::Status s = CheckDecodeLimits(out.width, out.height, limits); !s.ok()) return s;
  for (;;) {
    GifRecordType type;
    if (DGifGetRecordType(gif, &type) == GIF_ERROR) return corrupt("record");
    if (type == TERMINATE_RECORD_TYPE) return absl::InvalidArgumentError("GIF has no image");
    if (type == EXTENSION_RECORD_TYPE) {
      int code = 0;
      GifByteType* ext = nullptr;
      if (DGifGetExtension(gif, &code, &ext) == GIF_ERROR) return corrupt("extension");
      while (ext != nullptr) {
        if (DGifGetExtensionNext(gif, &ext) == GIF_ERROR) return corrupt("extension");
      }
      continue;
    }
    if (type != IMAGE_DESC_RECORD_TYPE) continue;
    if (DGifGetImageDesc(gif) == GIF_ERROR) return corrupt("image descriptor");
    const GifImageDesc& d = gif->Image;
    if (absl::Status s = CheckDecodeLimits(d.Width, d.Height, limits); !s.ok()) return s;
    const ColorMapObject* map = d.ColorMap != nullptr ? d.ColorMap : gif->SColorMap;
    if (map == nullptr) return absl::InvalidArgumentError("corrupt GIF: no colour map");
    std::vector<GifPixelType> frame(static_cast<size_t>(d.Width) * d.Height);
    if (d.Interlace) {
      static constexpr int kStart[] = {0, 4, 2, 1}, kStep[] = {8, 8, 4, 2};
      for (int pass = 0; pass < 4; ++pass) {
        for (int y = kStart[pass]; y < d.Height; y += kStep[pass]) {
          if (DGifGetLine(gif, &frame[static_cast<size_t>(y) * d.Width], d.Width) == GIF_ERROR) {
            return corrupt("image data");
          }
        }
      }
    } else {
      for (int y = 0; y < d.Height; ++y) {
        if (DGifGetLine(gif, &frame[static_cast<size_t>(y) * d.Width], d.Width) == GIF_ERROR) {
          return corrupt("image data");
        }
      }
    }
    auto colour = [&](int index, uint8_t* rgb) {
      const GifColorType c = index < map->ColorCount ? map->Colors[index] : GifColorType{0, 0, 0};
      rgb[0] = c.Red;
      rgb[1] = c.Green;
      rgb[2] = c.Blue;
    };
    out.rgb.resize(static_cast<size_t>(out.width) * out.height * 3);
    uint8_t background[3] = {0, 0, 0};
    if (gif->SColorMap != nullptr && gif->SBackGroundColor < gif->SColorMap->ColorCount) {
      const GifColorType c = gif->SColorMap->Colors[gif->SBackGroundColor];
      background[0] = c.Red;
      background[1] = c.Green;
      background[2] = c.Blue;
    }
    for (size_t i = 0; i < out.rgb.size(); i += 3) std::memcpy(&out.rgb[i], background, 3);
    for (int y = 0; y < d.Height; ++y) {
      const int sy = d.Top + y;
      if (sy < 0 || sy >= out.height) continue;
      for (int x = 0; x < d.Width; ++x) {
        const int sx = d.Left + x;
        if (sx < 0 || sx >= out.width) continue;
        colour(frame[static_cast<size_t>(y) * d.Width + x],
               &out.rgb[(static_cast<size_t>(sy) * out.width + sx) * 3]);
      }
    }
    return out;
  }
}

// ---- BMP (uncompressed: 1, 4, 8 bits with a palette; 24; 32 as BGRX) ----

uint32_t Le32(const unsigned char* p) {
  return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

absl::StatusOr<Image> DecodeBmp(std::string_view bytes, const DecodeLimits& limits,
                                bool header_only) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() < 14 + 40) return absl::InvalidArgumentError("corrupt BMP: header cut short");
  const uint32_t data_at = Le32(b + 10), dib = Le32(b + 14);
  if (dib < 12 || 14 + static_cast<size_t>(dib) > bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat("corrupt BMP: a ", dib, "-byte header"));
  }
  if (dib < 40) {  // OS/2's BITMAPCOREHEADER
    return absl::UnimplementedError(absl::StrCat("BMP with a ", dib, "-byte header"));
  }
  const int32_t width = static_cast<int32_t>(Le32(b + 18));
  const int32_t signed_height = static_cast<int32_t>(Le32(b + 22));
  const int bpp = b[28] | (b[29] << 8);
  const uint32_t compression = Le32(b + 30);
  const bool top_down = signed_height < 0;
  const int64_t height = top_down ? -static_cast<int64_t>(signed_height) : signed_height;
  Image out;
  out.width = width;
  out.height = static_cast<int>(std::min<int64_t>(height, 1 << 30));
  if (header_only) return out;
  if (absl::Status s = CheckDecodeLimits(width, height, limits); !s.ok()) return s;
  // BI_RGB; BI_BITFIELDS only with 32 bits in the usual B, G, R order.
  const bool bitfields_bgr = compression == 3 && bpp == 32 && dib >= 52 &&
                             Le32(b + 54) == 0x00ff0000u && Le32(b + 58) == 0x0000ff00u &&
                             Le32(b + 62) == 0x000000ffu;
  if (!(compression == 0 || bitfields_bgr) ||
      !(bpp == 1 || bpp == 4 || bpp == 8 || bpp == 24 || bpp == 32)) {
    return absl::UnimplementedError(
        absl::StrCat("BMP of ", bpp, " bits, compression ", compression));
  }
  std::vector<std::array<uint8_t, 3>> palette;
  if (bpp <= 8) {
    const uint32_t used = Le32(b + 46);
    const size_t n = used == 0 ? (size_t{1} << bpp) : std::min<size_t>(used, size_t{1} << bpp);
    const size_t at = 14 + dib;
    if (at + 4 * n > bytes.size()) return absl::InvalidArgumentError("corrupt BMP: palette");
    for (size_t i = 0; i < n; ++i) {
      palette.push_back({b[at + 4 * i + 2], b[at + 4 * i + 1], b[at + 4 * i]});
    }
  }
  const size_t stride = ((static_cast<size_t>(bpp) * width + 31) / 32) * 4;
  if (data_at > bytes.size() || (bytes.size() - data_at) / stride < static_cast<size_t>(height)) {
    return absl::InvalidArgumentError("corrupt BMP: pixel data cut short");
  }
  out.rgb.resize(static_cast<size_t>(width) * height * 3);
  for (int64_t y = 0; y < height; ++y) {
    const unsigned char* row = b + data_at + stride * (top_down ? y : height - 1 - y);
    uint8_t* dst = &out.rgb[static_cast<size_t>(y) * width * 3];
    for (int32_t x = 0; x < width; ++x, dst += 3) {
      if (bpp >= 24) {
        const unsigned char* p = row + static_cast<size_t>(x) * (bpp / 8);
        dst[0] = p[2];
        dst[1] = p[1];
        dst[2] = p[0];
        continue;
      }
      const size_t bit = static_cast<size_t>(x) * bpp;
      const int index = (row[bit / 8] >> (8 - bpp - bit % 8)) & ((1 << bpp) - 1);
      const std::array<uint8_t, 3> c =
          index < static_cast<int>(palette.size()) ? palette[index] : std::array<uint8_t, 3>{};
      std::memcpy(dst, c.data(), 3);
    }
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
  if (bytes.size() >= 12 && bytes.substr(0, 4) == "RIFF" && bytes.substr(8, 4) == "WEBP") {
    return ImageFormat::kWebp;
  }
  if (bytes.size() >= 6 && (bytes.substr(0, 6) == "GIF87a" || bytes.substr(0, 6) == "GIF89a")) {
    return ImageFormat::kGif;
  }
  if (bytes.size() >= 2 && bytes.substr(0, 2) == "BM") return ImageFormat::kBmp;
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
    case ImageFormat::kWebp:
      return DecodeWebp(bytes, limits);
    case ImageFormat::kGif:
      return DecodeGif(bytes, limits, /*header_only=*/false);
    case ImageFormat::kBmp:
      return DecodeBmp(bytes, limits, /*header_only=*/false);
    case ImageFormat::kUnknown:
      break;
  }
  return absl::UnimplementedError("not PNG, JPEG, WebP, GIF or BMP");
}

absl::StatusOr<ImageSize> PeekImageSize(std::string_view bytes) {
  if (bytes.empty()) return absl::InvalidArgumentError("empty image (0 bytes)");
  // The decoders' header-only read: the size, no pixels.
  auto size = [](const absl::StatusOr<Image>& header) -> absl::StatusOr<ImageSize> {
    if (!header.ok()) return header.status();
    return ImageSize{header->width, header->height};
  };
  switch (SniffImageFormat(bytes)) {
    case ImageFormat::kPng: {
      png_image image;
      absl::StatusOr<ImageSize> png = PeekPng(bytes, &image);
      if (png.ok()) png_image_free(&image);
      return png;
    }
    case ImageFormat::kJpeg:
      return size(DecodeJpeg(bytes, DecodeLimits{}, 0, 0, /*header_only=*/true));
    case ImageFormat::kWebp:
      return PeekWebp(bytes);
    case ImageFormat::kGif:
      return size(DecodeGif(bytes, DecodeLimits{}, /*header_only=*/true));
    case ImageFormat::kBmp:
      return size(DecodeBmp(bytes, DecodeLimits{}, /*header_only=*/true));
    case ImageFormat::kUnknown:
      break;
  }
  return absl::UnimplementedError("not PNG, JPEG, WebP, GIF or BMP");
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

Image PadToSquare(const Image& src, const std::array<uint8_t, 3>& fill) {
  if (src.width == src.height) return src;
  const int side = std::max(src.width, src.height);
  Image out;
  out.width = out.height = side;
  out.rgb.resize(static_cast<size_t>(side) * side * 3);
  for (size_t i = 0; i < out.rgb.size(); i += 3) {
    out.rgb[i] = fill[0];
    out.rgb[i + 1] = fill[1];
    out.rgb[i + 2] = fill[2];
  }
  const int left = (side - src.width) / 2, top = (side - src.height) / 2;
  for (int y = 0; y < src.height; ++y) {
    std::copy_n(&src.rgb[static_cast<size_t>(y) * src.width * 3],
                static_cast<size_t>(src.width) * 3,
                &out.rgb[(static_cast<size_t>(top + y) * side + left) * 3]);
  }
  return out;
}

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
