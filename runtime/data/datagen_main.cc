// loom-datagen: writes WebDataset shards of generated multimodal samples.
//
//   loom-datagen --preset onevision --samples 1000 --seed 1 --out data/onevision
#include <cstdio>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_join.h"
#include "runtime/data/datagen.h"

ABSL_FLAG(std::string, preset, "", "caption, interleaved or onevision.");
ABSL_FLAG(int64_t, samples, 0, "Samples to write.");
ABSL_FLAG(uint64_t, seed, 1, "Seed: the same seed writes the same bytes.");
ABSL_FLAG(std::string, out, "", "Output folder (created if missing).");
ABSL_FLAG(int, samples_per_shard, 256, "Samples per tar shard.");
ABSL_FLAG(int, threads, 0, "Writer threads (0: one per core).");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "loom-datagen --preset NAME --samples N --seed S --out DIR\nPresets: " +
      absl::StrJoin(loom::data::DatagenPresets(), ", "));
  absl::ParseCommandLine(argc, argv);
  loom::data::DatagenOptions o;
  o.preset = absl::GetFlag(FLAGS_preset);
  o.samples = absl::GetFlag(FLAGS_samples);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.out_dir = absl::GetFlag(FLAGS_out);
  o.samples_per_shard = absl::GetFlag(FLAGS_samples_per_shard);
  o.threads = absl::GetFlag(FLAGS_threads) > 0
                  ? absl::GetFlag(FLAGS_threads)
                  : static_cast<int>(std::thread::hardware_concurrency());
  if (o.out_dir.empty()) {
    std::fprintf(stderr, "loom-datagen: --out is required\n");
    return 2;
  }
  absl::StatusOr<std::vector<std::string>> shards = loom::data::WriteDataset(o);
  if (!shards.ok()) {
    std::fprintf(stderr, "loom-datagen: %s\n", std::string(shards.status().message()).c_str());
    return 2;
  }
  std::printf("loom-datagen: wrote %lld %s samples in %zu shards to %s\n",
              static_cast<long long>(o.samples), o.preset.c_str(), shards->size(),
              o.out_dir.c_str());
  return 0;
}
