// Preprocessing throughput: decode + tile + tokenize of every sample of the
// given shards on one thread (samples per second per core), timed over
// `--rounds` passes with the bytes already in memory. Also writes, for the
// PIL reference (pil_bench.py), every image member with the resize targets
// Loom used, so both sides decode and resize the same images to the same
// sizes.
#include <chrono>
#include <cstdio>
#include <fstream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "runtime/data/loader.h"

ABSL_FLAG(std::string, shards, "", "Shard glob.");
ABSL_FLAG(std::string, plan, "", "Where to write the PIL plan (JSON lines).");
ABSL_FLAG(int, rounds, 3, "Timed passes; the best is reported.");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto tokenizer = loom::data::Tokenizer::Load("");
  auto paths = loom::data::ExpandShardGlob(absl::GetFlag(FLAGS_shards));
  if (!tokenizer.ok() || !paths.ok()) {
    std::fprintf(stderr, "preprocess_bench: %s\n",
                 (!tokenizer.ok() ? tokenizer.status() : paths.status()).ToString().c_str());
    return 1;
  }
  const loom::data::PreprocessOptions options =
      loom::data::PreprocessOptionsFor(*loom::ModelConfigByName("tiny"));
  loom::data::Preprocessor pre(options, tokenizer->get());
  std::vector<std::pair<std::string, loom::data::SampleFiles>> samples;  // shard, files
  for (const std::string& path : *paths) {
    auto index = loom::data::IndexShard(path, options.shard);
    for (const auto& ref : index->samples) {
      samples.push_back({path, *loom::data::ReadSample(path, ref, options.shard)});
    }
  }
  double best = 0;
  int64_t kept = 0;
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    kept = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& [path, files] : samples) kept += pre.Process(files).ok ? 1 : 0;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, samples.size() / s);
  }
  std::ofstream plan(absl::GetFlag(FLAGS_plan));
  for (const auto& [path, files] : samples) {
    loom::data::Outcome o = pre.Process(files, /*decode_pixels=*/false);
    if (!o.ok) continue;
    for (const auto& entry : files.files) {
      const std::string& ext = entry.first;
      if (ext == "json") continue;
      // loom-datagen names image i "i.png" or "i.jpg": the index prefix is its place.
      const int idx = std::atoi(ext.c_str());
      if (idx < 0 || idx >= static_cast<int>(o.sample.images.size())) continue;
      const loom::data::ImageInfo& info = o.sample.images[idx];
      plan << "{\"shard\":\"" << path << "\",\"member\":\"" << files.key << "." << ext
           << "\",\"sizes\":[[" << info.grid.cols * options.tile_size << ","
           << info.grid.rows * options.tile_size << "]";
      if (info.tiles > info.grid.cols * info.grid.rows) {
        plan << ",[" << options.tile_size << "," << options.tile_size << "]";
      }
      plan << "]}\n";
    }
  }
  std::printf("loom: %zu samples (%lld kept), %.1f samples/s on one core\n", samples.size(),
              static_cast<long long>(kept), best);
  std::printf("LOOM_SAMPLES_PER_SEC %.3f\n", best);
  return 0;
}
