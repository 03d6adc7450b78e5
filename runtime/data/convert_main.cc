// loom-data: datasets as people download them, into Loom's shards.
//
//   loom-data convert --input llava_v1_5_mix665k.json --images DIR --out DIR
//                     [--name llava] [--samples_per_shard 1000]
//
// (runtime/data/convert.h): LLaVA JSON/JSONL and the messages format,
// multi-image and video records; skipped records are counted by reason,
// the first few printed. Exits 2 when it cannot run, 0 otherwise.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/clock.h"
#include "runtime/data/convert.h"

ABSL_FLAG(std::string, input, "", "convert: the JSON array or JSON lines file");
ABSL_FLAG(std::string, images, ".", "convert: the folder image paths are relative to");
ABSL_FLAG(std::string, out, "", "convert: where to write the shards");
ABSL_FLAG(std::string, name, "data", "convert: shards are OUT/NAME-00000.tar, ...");
ABSL_FLAG(int, samples_per_shard, 1000, "convert: samples per shard");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "loom-data convert --input FILE --images DIR --out DIR [--name N] [--samples_per_shard K]");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2 || std::string(args[1]) != "convert") {
    std::fprintf(stderr, "loom-data: one command: convert\n");
    return 2;
  }
  loom::data::ConvertOptions o;
  o.input = absl::GetFlag(FLAGS_input);
  o.images = absl::GetFlag(FLAGS_images);
  o.out = absl::GetFlag(FLAGS_out);
  o.name = absl::GetFlag(FLAGS_name);
  o.samples_per_shard = absl::GetFlag(FLAGS_samples_per_shard);
  const absl::Time start = absl::Now();
  o.progress = [start](int64_t read, int64_t written) {
    std::fprintf(stderr, "loom-data convert: %lld records read, %lld samples written (%.0f s)\n",
                 static_cast<long long>(read), static_cast<long long>(written),
                 absl::ToDoubleSeconds(absl::Now() - start));
  };
  absl::StatusOr<loom::data::ConvertSummary> s = loom::data::Convert(o);
  if (!s.ok()) {
    std::fprintf(stderr, "loom-data convert: %s\n", std::string(s.status().message()).c_str());
    return 2;
  }
  int64_t skipped = 0;
  std::string reasons;
  for (const auto& [reason, n] : s->skipped) {
    skipped += n;
    reasons += (reasons.empty() ? "" : ", ") + reason + " " + std::to_string(n);
  }
  std::printf("loom-data convert: read %lld, wrote %lld in %zu shards, skipped %lld%s\n",
              static_cast<long long>(s->read), static_cast<long long>(s->written), s->shards.size(),
              static_cast<long long>(skipped),
              reasons.empty() ? "" : (" (" + reasons + ")").c_str());
  for (const std::string& e : s->examples) std::printf("  skipped %s\n", e.c_str());
  return 0;
}
