// The image processors of LLaVA's vision towers, from a Hugging Face
// directory's preprocessor_config.json: CLIPImageProcessor (resize so the
// shorter side is size.shortest_edge, keeping the aspect ratio, then a
// center crop to crop_size) and SiglipImageProcessor (resize to
// size.height x size.width); then rescale (1/255) and normalise per channel
// with image_mean and image_std, channels first. `loom-model logits --image`
// and `loom-model pixels` run it.
//
// Resampling is PIL's filter (resample 2 bilinear, 3 bicubic: runtime/data
// image.h Resize, antialiased when shrinking): bicubic equals PIL's, bilinear
// may put a pixel one level of 255 off (the golden test holds both to PIL
// within kImageProcessorVsPil). Any other resample, padding, or a field Loom
// would compute differently is an error naming it.
#ifndef LOOM_RUNTIME_HF_HF_IMAGE_H_
#define LOOM_RUNTIME_HF_HF_IMAGE_H_

#include <array>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/data/image.h"

namespace loom::hf {

struct ImageProcessor {
  int shortest_edge = 0;  // > 0: resize the shorter side to this (CLIP)
  int height = 0;         // shortest_edge 0: resize to height x width (SigLIP)
  int width = 0;
  int crop_height = 0;  // > 0: center crop after the resize
  int crop_width = 0;
  data::ResizeFilter filter = data::ResizeFilter::kBicubic;
  bool resize = true;
  float rescale = 1.0f / 255.0f;
  std::array<float, 3> mean = {0, 0, 0};
  std::array<float, 3> std = {1, 1, 1};
  // LLaVA-1.5's image_aspect_ratio "pad": first a square, filled with the
  // mean colour (int(mean x 255), as LLaVA computes it).
  bool pad_to_square = false;
};

// A job's data.image_aspect_ratio: "" or "crop" (the processor's own
// resize and crop) or "pad"; sets `p`. INVALID_ARGUMENT for anything else.
absl::Status SetImageAspectRatio(const std::string& choice, ImageProcessor* p);

// `json` is preprocessor_config.json's text; `origin` names it in errors.
absl::StatusOr<ImageProcessor> ParseImageProcessor(const std::string& json,
                                                   const std::string& origin);
absl::StatusOr<ImageProcessor> ReadImageProcessor(const std::string& dir);

// One image -> (3, S, S) floats. FAILED_PRECONDITION when the processor
// makes anything but S x S of it (S: the tower's tile_size).
absl::StatusOr<std::vector<float>> ProcessImage(const ImageProcessor& p, const data::Image& image,
                                                int tile_size);

// Image files (PNG, JPEG, WebP, GIF, BMP: DecodeImage) -> pixel_values (N, 3, S, S) as DIR's
// processor makes them.
// `image_aspect_ratio` as SetImageAspectRatio takes it.
absl::StatusOr<std::vector<float>> PixelValuesOfImages(const std::string& dir,
                                                       const std::vector<std::string>& paths,
                                                       int tile_size,
                                                       const std::string& image_aspect_ratio = "");

}  // namespace loom::hf

#endif  // LOOM_RUNTIME_HF_HF_IMAGE_H_
