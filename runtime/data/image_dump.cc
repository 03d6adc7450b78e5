// image_dump FILE: decodes FILE as the data pipeline does (DecodeImage) and
// writes "WIDTH HEIGHT\n" and the RGB bytes to stdout; exit 2 and the error
// on stderr when it does not decode. The reference test compares it with
// PIL (image_reference_test.py).
#include <cstdio>
#include <string>

#include "runtime/base/file.h"
#include "runtime/data/image.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: image_dump FILE\n");
    return 2;
  }
  absl::StatusOr<std::string> bytes = loom::ReadFile(argv[1]);
  if (!bytes.ok()) {
    std::fprintf(stderr, "%s\n", std::string(bytes.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<loom::data::Image> image = loom::data::DecodeImage(*bytes, {});
  if (!image.ok()) {
    std::fprintf(stderr, "%s: %s\n", absl::StatusCodeToString(image.status().code()).c_str(),
                 std::string(image.status().message()).c_str());
    return 2;
  }
  std::printf("%d %d\n", image->width, image->height);
  std::fwrite(image->rgb.data(), 1, image->rgb.size(), stdout);
  return 0;
}
