#include "runtime/train/synthetic_data.h"

#include <algorithm>
#include <random>

#include "runtime/base/log.h"
#include "runtime/base/rng.h"

namespace loom {
namespace {

constexpr const char* kCounts[] = {"one", "two", "three"};
constexpr const char* kColors[] = {"red", "green", "blue", "yellow", "white", "purple"};
constexpr const char* kShapes[] = {"square", "circle", "cross"};
constexpr const char* kRegions[] = {"left", "right", "top", "bottom"};
constexpr float kRgb[][3] = {{230, 40, 40},  {40, 200, 60},   {50, 80, 230},
                             {230, 220, 40}, {240, 240, 240}, {160, 60, 200}};

int WordId(const std::string& w) {
  const auto& v = SyntheticCaptions::Vocabulary();
  return static_cast<int>(std::find(v.begin(), v.end(), w) - v.begin());
}

}  // namespace

const std::vector<std::string>& SyntheticCaptions::Vocabulary() {
  static const auto* v = [] {
    auto* w = new std::vector<std::string>{"<pad>", "<bos>", "<eos>", "image", "of"};
    for (const char* s : kCounts) w->push_back(s);
    for (const char* s : kColors) w->push_back(s);
    for (const char* s : kShapes) w->push_back(s);
    for (const char* s : kRegions) w->push_back(s);
    return w;
  }();
  return *v;
}

SyntheticCaptions::SyntheticCaptions(const ModelConfig& config, uint64_t seed, bool shuffle_images)
    : config_(config), seed_(seed), shuffle_(shuffle_images) {
  LOOM_CHECK(config.llm.vocab >= static_cast<int>(Vocabulary().size()))
      << "vocab too small for the synthetic captions";
}

SyntheticCaptions::Attributes SyntheticCaptions::Draw(int64_t index) const {
  std::mt19937_64 rng(MixSeed(seed_, index, 1));
  Attributes a;
  a.count = static_cast<int>(rng() % 3);
  a.color = static_cast<int>(rng() % 6);
  a.shape = static_cast<int>(rng() % 3);
  a.region = static_cast<int>(rng() % 4);
  return a;
}

std::vector<float> SyntheticCaptions::Render(const Attributes& a, int64_t index, int size) const {
  const int S = size;
  std::vector<float> rgb(3 * S * S);
  std::mt19937_64 rng(MixSeed(seed_, index, 2));
  auto unit = [&] { return static_cast<float>(rng() % 10000) / 10000.0f; };
  // Dark, slightly noisy background.
  for (float& p : rgb) p = 20.0f + 20.0f * unit();
  // The region the shapes go in: a half of the tile.
  int x0 = 0, y0 = 0, x1 = S, y1 = S;
  switch (a.region) {
    case 0:
      x1 = S / 2;
      break;
    case 1:
      x0 = S / 2;
      break;
    case 2:
      y1 = S / 2;
      break;
    default:
      y0 = S / 2;
      break;
  }
  const int r = std::max(2, S / 10);
  for (int k = 0; k <= a.count; ++k) {
    const int cx = x0 + r + static_cast<int>(unit() * std::max(1, x1 - x0 - 2 * r));
    const int cy = y0 + r + static_cast<int>(unit() * std::max(1, y1 - y0 - 2 * r));
    for (int y = cy - r; y <= cy + r; ++y) {
      for (int x = cx - r; x <= cx + r; ++x) {
        if (x < 0 || y < 0 || x >= S || y >= S) continue;
        const int dx = x - cx, dy = y - cy;
        bool in = false;
        switch (a.shape) {
          case 0:
            in = true;
            break;  // square
          case 1:
            in = dx * dx + dy * dy <= r * r;
            break;  // circle
          default:
            in = std::abs(dx) <= r / 3 || std::abs(dy) <= r / 3;  // cross
        }
        if (!in) continue;
        for (int c = 0; c < 3; ++c) rgb[(c * S + y) * S + x] = kRgb[a.color][c];
      }
    }
  }
  for (float& p : rgb) p = (p / 255.0f - 0.5f) / 0.5f;  // normalise to [-1, 1]
  return rgb;
}

std::vector<float> SyntheticCaptions::RenderOutput(const Attributes& a, int size) const {
  const int S = size;
  std::vector<float> rgb(3 * S * S, 20.0f);
  int x0 = 0, y0 = 0, x1 = S, y1 = S;
  if (a.region == 0) x1 = S / 2;
  if (a.region == 1) x0 = S / 2;
  if (a.region == 2) y1 = S / 2;
  if (a.region == 3) y0 = S / 2;
  const int cx = (x0 + x1) / 2, cy = (y0 + y1) / 2, r = std::max(2, S / 4);
  for (int y = y0; y < y1; ++y) {
    for (int x = x0; x < x1; ++x) {
      const int dx = x - cx, dy = y - cy;
      const bool in = a.shape == 0   ? std::abs(dx) <= r && std::abs(dy) <= r
                      : a.shape == 1 ? dx * dx + dy * dy <= r * r
                                     : (std::abs(dx) <= r / 3 && std::abs(dy) <= r) ||
                                           (std::abs(dy) <= r / 3 && std::abs(dx) <= r);
      for (int c = 0; c < 3; ++c) {
        rgb[(c * S + y) * S + x] = in ? kRgb[a.color][c] : 0.35f * kRgb[a.color][c];
      }
    }
  }
  for (float& p : rgb) p = (p / 255.0f - 0.5f) / 0.5f;
  return rgb;
}

std::string SyntheticCaptions::Caption(int64_t index) const {
  const Attributes a = Draw(index);
  return std::string("image of ") + kCounts[a.count] + " " + kColors[a.color] + " " +
         kShapes[a.shape] + " " + kRegions[a.region];
}

Sample SyntheticCaptions::Get(int64_t index) const {
  const Attributes a = Draw(index);
  // The control pairs this caption with the image of another, unrelated sample.
  const int64_t image_index =
      shuffle_ ? static_cast<int64_t>(MixSeed(seed_, index, 3) >> 1) : index;
  Sample s;
  s.id = static_cast<uint64_t>(index);
  if (config_.has_generator() && index % 2 == 1) {  // text → image
    s.tokens.push_back(WordId("<bos>"));
    for (const char* w : {"image", "of", kCounts[a.count], kColors[a.color], kShapes[a.shape],
                          kRegions[a.region]}) {
      s.tokens.push_back(WordId(w));
    }
    for (int q = 0; q < config_.llm.gen_queries; ++q) s.tokens.push_back(kQueryToken);
    s.tokens.push_back(WordId("<eos>"));
    s.num_gen_images = 1;
    s.gen_images = RenderOutput(a, config_.generator.denoiser.tile_size);
    return s;
  }
  s.num_tiles = 1;
  s.tiles = Render(Draw(image_index), image_index, config_.vit.tile_size);
  s.tokens.push_back(WordId("<bos>"));
  for (int i = 0; i < config_.tokens_per_tile(); ++i) s.tokens.push_back(-1);
  for (const char* w : {"image", "of", kCounts[a.count], kColors[a.color], kShapes[a.shape],
                        kRegions[a.region], "<eos>"}) {
    s.tokens.push_back(WordId(w));
  }
  return s;
}

}  // namespace loom
