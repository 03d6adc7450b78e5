// The memory-model benchmark (not a test): what the memory model
// (runtime/model/memory.h) predicts each worker of a `loom up` job holds,
// against what it measured, side by side in one run.
//
// The vit10m-llm45m model (a 32,000-token vocabulary, so the logits are a
// real part of the LLM's memory) in three layouts, each at two microbatch
// sizes: short (one sample a microbatch, parallel.llm_max_tokens and
// encoder_max_tokens 1024: at most 1,024 tokens, 16 tiles) and long (two
// samples a microbatch, no cap: the longest samples, ~1,600 tokens and 25
// tiles, alone or in pairs): LLM DP 2 with the optimizer
// sharded (ZeRO-1), fp32; encoder and LLM TP 2 in bf16; encoder and LLM PP 2
// with four microbatches, fp32. Each worker logs, after its first iteration
// and at the end, its prediction at the largest microbatch (or bin) it ran
// and its measurement: on the CPU its peak resident set (VmHWM) over its
// resident set just before it built its modules, so the process itself
// (code, gRPC, UCX) is left out on both sides. Prints one row per worker and
// the largest error; exits 1 when a run gave no figure. With --device cuda
// (a GPU machine, scripts/gpu/check.sh memory) the workers predict what the
// device holds and measure their CUDA backend's peak.
//
//   bazel run -c opt //services/worker/bench:memory_bench
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "runtime/base/file.h"
#include "runtime/base/json_line.h"
#include "runtime/base/runfiles.h"
#include "services/common/subprocess.h"

ABSL_FLAG(std::string, work_dir, "/tmp/loom-memory-bench", "Data, runs and logs.");
ABSL_FLAG(std::string, model, "vit10m-llm45m", "The model config.");
ABSL_FLAG(int, steps, 2, "Iterations per run.");
ABSL_FLAG(std::string, device, "cpu",
          "Where both modules compute (device.encoder and device.llm): cpu, or cuda, where the "
          "measurement is each worker's backend peak (scripts/gpu/check.sh memory).");

namespace {

struct Layout {
  const char* name;
  const char* parallel;  // ParallelConfig fields, without the batch's
  const char* extra;     // other JobConfig fields
  int bins;              // llm_dp x microbatches
};

constexpr Layout kLayouts[] = {
    {"LLM DP 2, ZeRO-1, fp32", "encoder_dp: 1 llm_dp: 2 microbatches: 2",
     "optimizer { shard: true } precision: 'fp32'", 4},
    {"TP 2 (both), bf16", "encoder_dp: 1 encoder_tp: 2 llm_dp: 1 llm_tp: 2 microbatches: 2",
     "precision: 'bf16'", 2},
    {"PP 2 (both), 4 microbatches, fp32",
     "encoder_dp: 1 encoder_pp: 2 llm_dp: 1 llm_pp: 2 microbatches: 4", "precision: 'fp32'", 4},
    {"PP 2 (both), 4 microbatches, recompute none (encoder) / selective (LLM), bf16",
     "encoder_dp: 1 encoder_pp: 2 llm_dp: 1 llm_pp: 2 microbatches: 4",
     "precision: 'bf16' recompute { encoder: 'none' llm: 'selective' }", 4},
};

struct Row {
  std::string worker;
  double stage = 0, size = 0, predicted = 0, measured = 0, held = 0;
};

// The last "memory" line of each worker log under `logs`.
std::vector<Row> MemoryRows(const std::string& logs) {
  std::vector<Row> rows;
  std::error_code ec;
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(logs, ec)) {
    const std::string name = e.path().filename().string();
    if (absl::StrContains(name, "worker")) files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  for (const std::string& path : files) {
    absl::StatusOr<std::string> text = loom::ReadFile(path);
    if (!text.ok()) continue;
    Row row;
    bool found = false;
    for (absl::string_view line : absl::StrSplit(*text, '\n')) {
      if (!absl::StrContains(line, "\"msg\":\"memory\"")) continue;
      found = loom::JsonNumberField(line, "predicted_bytes", &row.predicted) &&
              loom::JsonNumberField(line, "measured_bytes", &row.measured) &&
              loom::JsonNumberField(line, "stage", &row.stage) &&
              loom::JsonNumberField(line, "max_tokens", &row.size);
      if (!loom::JsonNumberField(line, "held_bytes", &row.held)) row.held = row.measured;
    }
    if (!found) continue;
    row.worker = std::filesystem::path(path).stem().string();
    rows.push_back(row);
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  loom::ExportRunfilesDir();  // loom-up and the services it starts read their data here
  absl::ParseCommandLine(argc, argv);
  std::string tried, loom_up, bin_dir;
  if (!loom::FindLoomUp(&loom_up, &bin_dir, &tried)) {
    std::fprintf(stderr, "memory_bench: loom-up not found (%s); use bazel run\n", tried.c_str());
    return 1;
  }
  const std::string dir = absl::GetFlag(FLAGS_work_dir);
  (void)loom::MakeDirectories(dir);
  const std::string device = absl::GetFlag(FLAGS_device);
  std::printf(
      "memory_bench: %s on %s, predicted (runtime/model/memory.h) against measured (%s), "
      "per worker\n",
      absl::GetFlag(FLAGS_model).c_str(), device.c_str(),
      device == "cpu" ? "peak RSS over the RSS before the model"
                      : "the backend's peak of what buffers asked for; held: its allocator's "
                        "blocks at their peak");
  std::printf("  %-36s %-9s %-26s %5s %7s %12s %12s %8s %12s\n", "layout", "length", "worker",
              "stage", "size", "predicted", "measured", "error", "held");
  double worst = 0;
  int rows_seen = 0, runs = 0, within = 0;
  bool ok = true;
  for (const Layout& l : kLayouts) {
    for (const bool capped : {true, false}) {
      const int per_bin = capped ? 1 : 2, batch = l.bins * per_bin;
      const char* caps = capped ? " llm_max_tokens: 1024 encoder_max_tokens: 1024" : "";
      const std::string run = absl::StrCat(dir, "/run-", runs++), config = run + ".txtpb";
      std::error_code ec;
      std::filesystem::remove_all(run, ec);
      if (absl::Status s = loom::WriteFileAtomically(
              config,
              absl::StrCat("name: 'memory'\nmodel: '", absl::GetFlag(FLAGS_model), "'\nseed: 1\n",
                           "data { samples: 64 global_batch: ", batch, " generated_dir: '", dir,
                           "/data' }\nparallel { ", l.parallel, caps, " }\n", l.extra,
                           "\ndevice { encoder: '", device, "' llm: '", device, "' }\n"));
          !s.ok()) {
        std::fprintf(stderr, "memory_bench: %s\n", std::string(s.message()).c_str());
        return 1;
      }
      absl::StatusOr<std::unique_ptr<loom::Subprocess>> up = loom::Subprocess::Start(
          {loom_up, "--bin_dir=" + bin_dir, "--run_dir=" + run, "--config=" + config,
           absl::StrCat("--steps=", absl::GetFlag(FLAGS_steps))},
          run + "-loom-up.log");
      absl::StatusOr<int> status =
          up.ok() ? (*up)->Wait(absl::Minutes(20)) : absl::StatusOr<int>(up.status());
      const std::vector<Row> rows = MemoryRows(run + "/logs");
      if (!status.ok() || *status != 0 || rows.empty()) {
        std::fprintf(stderr,
                     "memory_bench: %s, batch %d: no figure (loom up %s); see %s-loom-up.log\n",
                     l.name, batch,
                     status.ok() ? absl::StrCat("exit status ", *status).c_str()
                                 : std::string(status.status().message()).c_str(),
                     run.c_str());
        ok = false;
        continue;
      }
      for (const Row& r : rows) {
        const double error = r.measured > 0 ? r.predicted / r.measured - 1 : NAN;
        std::printf("  %-36s %-9s %-26s %5.0f %7.0f %9.1f MiB %9.1f MiB %+7.1f%% %8.1f MiB\n",
                    l.name, capped ? "short" : "long", r.worker.c_str(), r.stage, r.size,
                    r.predicted / (1 << 20), r.measured / (1 << 20), 100 * error,
                    r.held / (1 << 20));
        if (!std::isfinite(error)) {
          ok = false;
          continue;
        }
        worst = std::max(worst, std::fabs(error));
        within += std::fabs(error) <= 0.15;
        ++rows_seen;
      }
    }
  }
  std::printf(
      "  size: the largest LLM microbatch in tokens, or encoder bin in tiles, the worker ran\n"
      "  %d workers in %d runs: largest |predicted / measured - 1| %.1f%%, %d within 15%%\n",
      rows_seen, runs, 100 * worst, within);
  if (!ok || rows_seen == 0) {
    std::fprintf(stderr, "memory_bench: some run gave no figure\n");
    return 1;
  }
  return 0;
}
