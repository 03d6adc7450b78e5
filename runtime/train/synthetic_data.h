// In-memory image/caption pairs a model can learn from, until the data
// service exists: each image is drawn procedurally (1–3 shapes of one colour
// and kind in one region of a dark tile) and its caption states the count,
// colour, shape and region. Deterministic: sample i of a seed is always the
// same.
//
// Token sequence of a sample: <bos>, tokens_per_tile image slots (-1), then
// "image of <count> <colour> <shape> <region>" and <eos>; the loss falls on
// the caption and <eos>. A model that uses the image can predict all four
// attributes; one that cannot (the shuffled control) only their frequencies.
//
// A model with a generator also gets text → image samples (every odd
// index): <bos>, the caption, the generator's query positions (-2), <eos>,
// and as the output image the caption's picture at the generator's size:
// its region tinted with its colour, one large shape of that colour in the
// region's middle (the count is not drawn). The caption fixes every pixel,
// so a trained generator can draw the colour, shape and region it is told.
#ifndef LOOM_RUNTIME_TRAIN_SYNTHETIC_DATA_H_
#define LOOM_RUNTIME_TRAIN_SYNTHETIC_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/model/config.h"
#include "runtime/model/model.h"

namespace loom {

class SyntheticCaptions {
 public:
  // `shuffle_images`: pair each caption with another sample's image (the
  // control run: the image carries no information about its caption).
  SyntheticCaptions(const ModelConfig& config, uint64_t seed, bool shuffle_images);

  // Sample `index` (any non-negative integer).
  Sample Get(int64_t index) const;

  // The caption words of sample `index` (for logs and tests).
  std::string Caption(int64_t index) const;

  // Words of the vocabulary; ids are positions. Fits any vocab >= size().
  static const std::vector<std::string>& Vocabulary();

 private:
  struct Attributes {
    int count, color, shape, region;
  };
  Attributes Draw(int64_t index) const;
  std::vector<float> Render(const Attributes& a, int64_t index, int size) const;
  std::vector<float> RenderOutput(const Attributes& a, int size) const;

  ModelConfig config_;
  uint64_t seed_;
  bool shuffle_;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_TRAIN_SYNTHETIC_DATA_H_
