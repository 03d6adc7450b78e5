#include "runtime/hf/hf_image.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/base/file.h"
#include "runtime/hf/hf_params.h"

namespace loom::hf {
namespace {

// size / crop_size: {"shortest_edge": N}, {"height": H, "width": W}, or a
// bare N (older configs: a square).
absl::Status ParseSize(const Fields& f, const std::string& key, bool allow_shortest, int* shortest,
                       int* height, int* width) {
  const nlohmann::json& v = f.at(key);
  if (v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() < (1 << 16)) {
    *height = *width = v.get<int>();
    return absl::OkStatus();
  }
  if (!v.is_object()) return BadField(f.where(), key, "must be an object or a positive integer");
  const Fields s(v, f.where() + ": " + key);
  if (s.Has("shortest_edge")) {
    if (!allow_shortest) return BadField(f.where(), key, "shortest_edge is not supported here");
    if (s.Has("longest_edge")) {
      return BadField(f.where(), key + ".longest_edge", "is not supported (Loom keeps no cap)");
    }
    LOOM_HF_ASSIGN(*shortest, s.Int("shortest_edge"));
    return absl::OkStatus();
  }
  LOOM_HF_ASSIGN(*height, s.Int("height"));
  LOOM_HF_ASSIGN(*width, s.Int("width"));
  return absl::OkStatus();
}

absl::StatusOr<std::array<float, 3>> Triple(const Fields& f, const std::string& key) {
  const nlohmann::json& v = f.at(key);
  std::array<float, 3> out{};
  if (!v.is_array() || v.size() != 3) return BadField(f.where(), key, "must be 3 numbers");
  for (int c = 0; c < 3; ++c) {
    if (!v[c].is_number() || !std::isfinite(v[c].get<double>())) {
      return BadField(f.where(), key, "must be 3 finite numbers");
    }
    out[c] = v[c].get<float>();
  }
  return out;
}

}  // namespace

absl::StatusOr<ImageProcessor> ParseImageProcessor(const std::string& json,
                                                   const std::string& origin) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(origin + ": not a JSON object");
  }
  const Fields f(j, origin);
  ImageProcessor p;
  LOOM_HF_ASSIGN(p.resize, f.Bool("do_resize", true));
  if (p.resize) {
    if (!f.Has("size")) return BadField(origin, "size", "is required with do_resize");
    if (absl::Status s = ParseSize(f, "size", true, &p.shortest_edge, &p.height, &p.width); !s.ok())
      return s;
    int resample = 3;  // PIL.Image.BICUBIC, the CLIP and SigLIP processors' default
    if (f.Has("resample")) LOOM_HF_ASSIGN(resample, f.Int("resample", 0));
    if (resample == 2) {
      p.filter = data::ResizeFilter::kBilinear;
    } else if (resample != 3) {
      return BadField(origin, "resample",
                      absl::StrCat(resample, " is not supported (2 bilinear, 3 bicubic)"));
    }
  }
  bool crop = false;
  LOOM_HF_ASSIGN(crop, f.Bool("do_center_crop", false));
  if (crop) {
    if (!f.Has("crop_size"))
      return BadField(origin, "crop_size", "is required with do_center_crop");
    int unused = 0;
    if (absl::Status s = ParseSize(f, "crop_size", false, &unused, &p.crop_height, &p.crop_width);
        !s.ok())
      return s;
  }
  bool rescale = true;
  LOOM_HF_ASSIGN(rescale, f.Bool("do_rescale", true));
  if (rescale && f.Has("rescale_factor")) {
    double r = 0;
    LOOM_HF_ASSIGN(r, f.Number("rescale_factor"));
    p.rescale = static_cast<float>(r);
  } else if (!rescale) {
    p.rescale = 1.0f;
  }
  bool normalize = true;
  LOOM_HF_ASSIGN(normalize, f.Bool("do_normalize", true));
  if (normalize) {
    if (!f.Has("image_mean") || !f.Has("image_std")) {
      return BadField(origin, "image_mean", "image_mean and image_std are required to normalise");
    }
    LOOM_HF_ASSIGN(p.mean, Triple(f, "image_mean"));
    LOOM_HF_ASSIGN(p.std, Triple(f, "image_std"));
    for (float s : p.std) {
      if (!(s > 0)) return BadField(origin, "image_std", "must be positive");
    }
  }
  if (f.Has("do_pad") && f.at("do_pad").is_boolean() && f.at("do_pad").get<bool>()) {
    return BadField(origin, "do_pad", "padding to a square is not supported");
  }
  return p;
}

absl::StatusOr<ImageProcessor> ReadImageProcessor(const std::string& dir) {
  const std::string path = dir + "/preprocessor_config.json";
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return absl::NotFoundError(path + ": cannot be read (the image processor)");
  return ParseImageProcessor(*text, path);
}

absl::Status SetImageAspectRatio(const std::string& choice, ImageProcessor* p) {
  if (choice.empty() || choice == "crop") {
    p->pad_to_square = false;
  } else if (choice == "pad") {
    p->pad_to_square = true;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("image_aspect_ratio: \"", choice, "\" (known: crop, pad)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> ProcessImage(const ImageProcessor& p, const data::Image& source,
                                                int tile_size) {
  data::Image padded;
  if (p.pad_to_square) {
    std::array<uint8_t, 3> fill;
    for (int c = 0; c < 3; ++c) {
      fill[c] = static_cast<uint8_t>(std::clamp(static_cast<int>(p.mean[c] * 255.0f), 0, 255));
    }
    padded = data::PadToSquare(source, fill);
  }
  const data::Image& image = p.pad_to_square ? padded : source;
  data::Image img;  // what is cropped: `image` resized, or `image` itself
  if (p.resize) {
    int w = p.width, h = p.height;
    if (p.shortest_edge > 0) {  // transformers' get_resize_output_image_size
      const bool wide = image.width >= image.height;
      const int s = std::min(image.width, image.height), l = std::max(image.width, image.height);
      const int longer = static_cast<int>(static_cast<int64_t>(p.shortest_edge) * l / s);
      w = wide ? longer : p.shortest_edge;
      h = wide ? p.shortest_edge : longer;
    }
    img = data::Resize(image, w, h, p.filter);
  } else {
    img = image;
  }
  int top = 0, left = 0;
  if (p.crop_height > 0) {
    if (img.width < p.crop_width || img.height < p.crop_height) {
      return absl::InvalidArgumentError(
          absl::StrCat("a ", img.width, "x", img.height, " image is smaller than the crop"));
    }
    top = (img.height - p.crop_height) / 2;
    left = (img.width - p.crop_width) / 2;
  }
  const int out_w = p.crop_width > 0 ? p.crop_width : img.width;
  const int out_h = p.crop_height > 0 ? p.crop_height : img.height;
  if (out_w != tile_size || out_h != tile_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the image processor makes a ", out_w, "x", out_h, " image of this ", image.width, "x",
        image.height, " one; the tower takes ", tile_size, "x", tile_size));
  }
  const size_t plane = static_cast<size_t>(tile_size) * tile_size;
  std::vector<float> out(3 * plane);
  for (int y = 0; y < tile_size; ++y) {
    for (int x = 0; x < tile_size; ++x) {
      const uint8_t* px = &img.rgb[(static_cast<size_t>(top + y) * img.width + left + x) * 3];
      for (int c = 0; c < 3; ++c) {
        out[c * plane + static_cast<size_t>(y) * tile_size + x] =
            (px[c] * p.rescale - p.mean[c]) / p.std[c];
      }
    }
  }
  return out;
}

absl::StatusOr<std::vector<float>> PixelValuesOfImages(const std::string& dir,
                                                       const std::vector<std::string>& paths,
                                                       int tile_size,
                                                       const std::string& image_aspect_ratio) {
  absl::StatusOr<ImageProcessor> p = ReadImageProcessor(dir);
  if (!p.ok()) return p.status();
  if (absl::Status s = SetImageAspectRatio(image_aspect_ratio, &*p); !s.ok()) return s;
  std::vector<float> all;
  for (const std::string& path : paths) {
    absl::StatusOr<std::string> bytes = ReadFile(path);
    if (!bytes.ok()) return absl::NotFoundError(path + ": cannot be read");
    absl::StatusOr<data::Image> image = data::DecodeImage(*bytes, data::DecodeLimits());
    if (!image.ok()) {
      return absl::Status(image.status().code(),
                          absl::StrCat(path, ": ", image.status().message()));
    }
    absl::StatusOr<std::vector<float>> px = ProcessImage(*p, *image, tile_size);
    if (!px.ok())
      return absl::Status(px.status().code(), absl::StrCat(path, ": ", px.status().message()));
    all.insert(all.end(), px->begin(), px->end());
  }
  return all;
}

}  // namespace loom::hf
