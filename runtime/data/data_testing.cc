#include "runtime/data/data_testing.h"

#include <cstdlib>

#include "runtime/base/log.h"

namespace loom::data::testing {

Image TestImage(int width, int height) {
  Image img;
  img.width = width;
  img.height = height;
  img.rgb.assign(static_cast<size_t>(width) * height * 3, 30);
  for (int y = 0; y < height / 2; ++y) {
    for (int x = 0; x < width / 2; ++x) {
      uint8_t* p = &img.rgb[(static_cast<size_t>(y) * width + x) * 3];
      p[0] = 230;
      p[1] = 40;
      p[2] = 40;
    }
  }
  return img;
}

std::string TestPng(int width, int height) { return *EncodePng(TestImage(width, height)); }
std::string TestJpeg(int width, int height) { return *EncodeJpeg(TestImage(width, height), 90); }

std::string SampleJson(const std::string& text, const std::vector<std::string>& images) {
  std::string json = "{\"text\": \"";
  for (char c : text) {
    if (c == '"' || c == '\\') json += '\\';
    if (c == '\n') {
      json += "\\n";
      continue;
    }
    json += c;
  }
  json += "\", \"images\": [";
  for (size_t i = 0; i < images.size(); ++i) {
    json += (i ? ", \"" : "\"") + images[i] + "\"";
  }
  return json + "]}";
}

std::vector<TarMember> SampleMembers(
    const std::string& key, const std::string& text,
    const std::vector<std::pair<std::string, std::string>>& images) {
  std::vector<std::string> exts;
  for (const auto& [ext, bytes] : images) exts.push_back(ext);
  std::vector<TarMember> out = {{key + ".json", SampleJson(text, exts)}};
  for (const auto& [ext, bytes] : images) out.push_back({key + "." + ext, bytes});
  return out;
}

namespace {
uint32_t Crc32(const std::string& bytes, size_t begin, size_t end) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = begin; i < end; ++i) {
    crc ^= static_cast<unsigned char>(bytes[i]);
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}
void PutBe32(std::string* s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) (*s)[at + i] = static_cast<char>((v >> (24 - 8 * i)) & 0xFF);
}
}  // namespace

std::string PngClaiming(uint32_t width, uint32_t height) {
  std::string png = TestPng(8, 8);
  // Signature (8), IHDR length (4), "IHDR" (4), width at 16, height at 20,
  // then 5 more bytes of IHDR and its CRC over type + data at 29.
  PutBe32(&png, 16, width);
  PutBe32(&png, 20, height);
  PutBe32(&png, 29, Crc32(png, 12, 29));
  return png;
}

std::string JpegClaiming(uint16_t width, uint16_t height) {
  std::string jpg = TestJpeg(16, 16);
  for (size_t i = 2; i + 8 < jpg.size(); ++i) {
    if (static_cast<unsigned char>(jpg[i]) == 0xFF &&
        static_cast<unsigned char>(jpg[i + 1]) == 0xC0) {
      // FFC0, length (2), precision (1), height (2), width (2).
      jpg[i + 5] = static_cast<char>(height >> 8);
      jpg[i + 6] = static_cast<char>(height & 0xFF);
      jpg[i + 7] = static_cast<char>(width >> 8);
      jpg[i + 8] = static_cast<char>(width & 0xFF);
      return jpg;
    }
  }
  LOOM_CHECK(false) << "no SOF0 in the test JPEG";
  return jpg;
}

const Tokenizer& TestTokenizer() {
  static const Tokenizer* t = [] {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
        Tokenizer::Load("runtime/data/tokenizer.model");
    LOOM_CHECK(tok.ok()) << tok.status().ToString();
    return tok->release();
  }();
  return *t;
}

}  // namespace loom::data::testing
