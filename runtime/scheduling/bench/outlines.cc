#include "runtime/scheduling/bench/outlines.h"

#include <algorithm>

#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "runtime/data/datagen.h"
#include "runtime/data/preprocess.h"
#include "runtime/scheduling/schedule.h"

namespace loom::sched {
namespace {

// Measures an outline as loom-preprocess would; false where it would skip the
// sample (too long, or an output image for a model without a generator).
bool Measure(const data::SampleOutline& o, const data::Tokenizer& tok,
             const data::PreprocessOptions& p, SampleShape* s) {
  *s = {};
  s->text_tokens = 2;
  s->output_images = static_cast<int>(o.output_image_sizes.size());
  if (s->output_images > 0 && p.gen_image_size <= 0) return false;
  s->query_tokens = s->output_images * p.gen_queries;
  const std::string text = absl::StrReplaceAll(
      o.text,
      {{absl::string_view(data::kOutputImageMarker.data(), data::kOutputImageMarker.size()), ""}});
  for (absl::string_view piece : absl::StrSplit(text, "<image>")) {
    if (piece.empty()) continue;
    std::vector<int32_t> ids;
    if (!tok.Encode(std::string_view(piece.data(), piece.size()), &ids).ok()) return false;
    s->text_tokens += static_cast<int>(ids.size());
  }
  const int n = static_cast<int>(o.image_sizes.size());
  const int per_image = n == 0 ? 0 : std::max(1, p.max_tiles / n);
  for (auto [w, h] : o.image_sizes) {
    const int tiles =
        data::TileCount(data::ChooseTileGrid(w, h, per_image, p.tile_size), p.thumbnail);
    s->tiles += tiles;
    s->image_tokens += tiles * p.tokens_per_tile;
  }
  return s->length() <= p.max_seq;
}

}  // namespace

std::vector<int> CsvInts(const std::string& csv) {
  std::vector<int> out;
  for (absl::string_view s : absl::StrSplit(csv, ',')) out.push_back(std::stoi(std::string(s)));
  return out;
}

absl::StatusOr<MeasuredBatch> MeasureOutlines(const std::string& preset, uint64_t seed, int samples,
                                              const ModelConfig& model,
                                              const data::Tokenizer& tokenizer) {
  const data::PreprocessOptions popts = data::PreprocessOptionsFor(model);
  MeasuredBatch out;
  for (int64_t i = 0; static_cast<int>(out.shapes.size()) < samples; ++i) {
    absl::StatusOr<data::SampleOutline> o = data::OutlineSample(preset, seed, i);
    if (!o.ok()) return o.status();
    SampleShape s;
    if (!Measure(*o, tokenizer, popts, &s)) continue;
    out.keys.push_back(o->key);
    out.shapes.push_back(s);
  }
  return out;
}

absl::StatusOr<SimulationResult> SimulatePlan(const MeasuredBatch& batch,
                                              const scheduler::v1::Plan& plan,
                                              const std::string& algorithm) {
  const CostModel costs(plan.costs());
  const std::vector<SampleLoad> loads =
      costs.Loads(batch.shapes, plan.costs().transfer_per_image_token());
  PredictedIteration predicted;
  absl::StatusOr<scheduler::v1::Assignment> a =
      AssignForPlan(plan, batch.keys, loads, algorithm, 10, &predicted);
  if (!a.ok()) return a.status();
  return SimulateIteration(predicted.bins, SimulationOptionsFor(plan));
}

}  // namespace loom::sched
