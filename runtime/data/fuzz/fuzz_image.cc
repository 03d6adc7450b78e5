// libFuzzer target: the image decoders (PNG, JPEG, WebP, GIF, BMP) (and header peeking, and the
// DCT-scaled JPEG path) on arbitrary bytes.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "runtime/data/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  loom::data::DecodeLimits limits;
  limits.max_side = 4096;
  limits.max_pixels = 4 << 20;
  (void)loom::data::PeekImageSize(bytes);
  auto full = loom::data::DecodeImage(bytes, limits);
  if (full.ok() && full->rgb.size() != static_cast<size_t>(full->width) * full->height * 3) {
    __builtin_trap();
  }
  auto scaled = loom::data::DecodeImage(bytes, limits, 8, 8);
  if (scaled.ok() && full.ok() && scaled->width > full->width) __builtin_trap();
  if (full.ok() && full->width > 0 && full->height > 0) {
    loom::data::Image small = loom::data::Resize(*full, 7, 5);
    if (small.rgb.size() != 7 * 5 * 3) __builtin_trap();
  }
  return 0;
}
