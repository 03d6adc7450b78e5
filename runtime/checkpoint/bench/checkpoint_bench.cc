// checkpoint_bench: saving and loading a model's checkpoint (weights and
// AdamW state, every module) against `dd` moving the same number of bytes to
// and from the same disk, side by side in one run, and the peak memory each
// takes beyond the model's own against the checkpoint's size.
//
//   bazel run -c opt //runtime/checkpoint/bench:checkpoint_bench -- --dir /var/tmp/ckpt
//
// Module by module (so the largest, not the sum, must fit in memory): the
// module is built (its gradients released: a checkpoint holds none) and
// filled with incompressible values; dd writes as many such bytes (from a
// cached 256 MiB file, fed to it repeatedly; with conv=fsync) and
// SaveModuleCheckpoint writes it (both end with an fsync); both files are
// dropped from the page cache, then `dd of=/dev/null` reads dd's file and
// LoadModuleCheckpoint reads the checkpoint into the zeroed module, whose
// values are checked. --rounds rounds, alternating which goes first; each
// figure is the median. Peak extra memory: the process's VmHWM (reset through
// /proc/self/clear_refs) over its resident size before each operation.
// Exits non-zero when it measured nothing or a load did not restore the
// module.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/marshalling.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/file.h"
#include "runtime/base/stats.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/model/config.h"
#include "runtime/model/llm.h"
#include "runtime/model/projector.h"
#include "runtime/model/vit.h"

ABSL_FLAG(std::string, config, "vit300m-llm1b", "Model config.");
ABSL_FLAG(std::vector<std::string>, modules,
          std::vector<std::string>({"encoder", "projector", "llm"}), "Modules to measure.");
ABSL_FLAG(int, rounds, 4, "Rounds per module (each figure is the median).");
ABSL_FLAG(std::string, dir, "/var/tmp/loom-checkpoint-bench",
          "Folder on the disk to measure (emptied of the bench's files after).");

namespace {

using Clock = std::chrono::steady_clock;
using loom::Median;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A /proc/self/status field in bytes (kB there).
int64_t StatusBytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::atoll(line.c_str() + std::strlen(field)) * 1024;
  }
  return -1;
}

// The resident size now, after resetting the peak (VmHWM) to it.
int64_t ResetPeak() {
  std::ofstream("/proc/self/clear_refs") << "5";
  return StatusBytes("VmRSS:");
}

int64_t FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  return in ? static_cast<int64_t>(in.tellg()) : -1;
}

// Drops `path` from the page cache (written back first), so the next read
// comes from the disk.
void Evict(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

// Wall seconds of a shell command; < 0 if it failed.
double TimeCommand(const std::string& command) {
  const auto t0 = Clock::now();
  if (std::system(command.c_str()) != 0) {
    std::fprintf(stderr, "checkpoint_bench: failed: %s\n", command.c_str());
    return -1;
  }
  return Seconds(t0);
}

struct Figures {
  int64_t bytes = 0;
  double save = 0, dd_write = 0, load = 0, dd_read = 0;
  int64_t save_extra = 0, load_extra = 0;  // peak, bytes
};

double Mibps(int64_t bytes, double s) { return bytes / s / (1 << 20); }

void Print(const char* name, const Figures& f) {
  std::printf(
      "%-10s %7.2f GiB  save %6.0f MiB/s  dd %6.0f MiB/s  ratio %.2f  |  load %6.0f MiB/s  dd "
      "%6.0f "
      "MiB/s  ratio %.2f  |  peak extra: save %.2f%%  load %.2f%% of the checkpoint\n",
      name, f.bytes / double(1 << 30), Mibps(f.bytes, f.save), Mibps(f.bytes, f.dd_write),
      f.dd_write / f.save, Mibps(f.bytes, f.load), Mibps(f.bytes, f.dd_read), f.dd_read / f.load,
      100.0 * f.save_extra / f.bytes, 100.0 * f.load_extra / f.bytes);
}

// Element i of array a: what a load must bring back, and incompressible
// (a disk that compresses or skips zeros would flatter either side): a
// splitmix64 hash of (a, i) as a float in [1, 2) with random low bits.
float Value(int a, int64_t i) {
  uint64_t z = static_cast<uint64_t>(i) * 3 + a + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  const uint32_t bits = 0x3F800000u | static_cast<uint32_t>(z & 0x7FFFFF);
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// dd's input: kSourceBytes of the same kind of bytes, written once and kept
// in the page cache, fed to dd as many times as the checkpoint needs.
constexpr int64_t kSourceBytes = int64_t{256} << 20;

bool WriteSource(const std::string& path) {
  std::vector<float> v(kSourceBytes / sizeof(float));
  for (size_t i = 0; i < v.size(); ++i) v[i] = Value(7, static_cast<int64_t>(i));
  return loom::WriteFileAtomically(
             path, std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)))
      .ok();
}

// Peak bytes above `base` since the last ResetPeak (RSS may also shrink).
int64_t ExtraSince(int64_t base) { return std::max<int64_t>(0, StatusBytes("VmHWM:") - base); }

bool Measure(const char* module, loom::ParamSet& p, const std::string& dir,
             const std::string& source, int rounds, Figures* f) {
  p.grads().clear();  // a checkpoint holds no gradients: free them for the model's weights
  p.grads().shrink_to_fit();
  std::vector<float>* arrays[3] = {&p.data(), &p.adam_m(), &p.adam_v()};
  auto fill = [&] {
    for (int a = 0; a < 3; ++a) {
      for (int64_t i = 0; i < p.size(); ++i) (*arrays[a])[i] = Value(a, i);
    }
    p.step() = 1000;
  };
  const std::string part = absl::StrCat(dir, "/", loom::ModulePartName(module, 0));
  const std::string manifest = loom::ModuleManifestPath(dir, module);
  const std::string dd = absl::StrCat(dir, "/dd-", module);
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "checkpoint_bench: %s: %s\n", module, what.c_str());
    for (const std::string& path : {dd, part, manifest}) std::remove(path.c_str());
    return false;
  };
  // Rounds alternate which goes first, so drift in the disk's speed hits
  // both alike; each figure is the median.
  std::vector<double> save, dd_write, load, dd_read;
  fill();
  for (int r = 0; r < rounds; ++r) {
    absl::Status s;
    // Both write new files into the space the last round freed (this
    // machine's virtual disk rewrites blocks it already holds several times
    // faster than it allocates new ones: a rewritten file would flatter).
    for (const std::string& path : {dd, part, manifest}) std::remove(path.c_str());
    sync();
    for (int turn = 0; turn < 2; ++turn) {
      if ((turn + r) % 2 == 0) {
        // The checkpoint's size: 3 arrays of floats, a header and a block
        // table (known once the first round wrote it; before, the arrays).
        const int64_t bytes =
            f->bytes > 0 ? f->bytes : 3 * p.size() * static_cast<int64_t>(sizeof(float));
        std::string cat = "cat";
        for (int64_t n = 0; n < bytes; n += kSourceBytes) absl::StrAppend(&cat, " ", source);
        dd_write.push_back(
            TimeCommand(absl::StrCat(cat, " | dd of=", dd, " bs=4M count=", bytes,
                                     " iflag=fullblock,count_bytes conv=fsync", " status=none")));
        if (dd_write.back() < 0) return fail("dd failed");
      } else {
        const int64_t base = ResetPeak();
        const auto t0 = Clock::now();
        s = loom::SaveModuleCheckpoint(p, module, dir);
        save.push_back(Seconds(t0));
        f->save_extra = std::max(f->save_extra, ExtraSince(base));
        if (!s.ok()) return fail(std::string(s.message()));
        f->bytes = FileBytes(part) + FileBytes(manifest);
      }
    }
    for (std::vector<float>* v : arrays) std::fill(v->begin(), v->end(), 0.0f);
    p.step() = 0;
    for (const std::string& path : {dd, part, manifest}) Evict(path);
    for (int turn = 0; turn < 2; ++turn) {
      if ((turn + r) % 2 == 0) {
        dd_read.push_back(
            TimeCommand(absl::StrCat("dd if=", dd, " of=/dev/null bs=4M status=none")));
        if (dd_read.back() < 0) return fail("dd failed");
      } else {
        const int64_t base = ResetPeak();
        const auto t0 = Clock::now();
        s = loom::LoadModuleCheckpoint(dir, module, &p);
        load.push_back(Seconds(t0));
        f->load_extra = std::max(f->load_extra, ExtraSince(base));
        if (!s.ok()) return fail(std::string(s.message()));
      }
    }
    for (int a = 0; a < 3; ++a) {
      for (int64_t i = 0; i < p.size(); ++i) {
        if ((*arrays[a])[i] != Value(a, i)) {
          return fail(absl::StrCat("the load did not restore array ", a, " element ", i));
        }
      }
    }
    if (p.step() != 1000) return fail("the load did not restore the step");
    std::printf("  %s round %d: save %.2f s, dd %.2f s; load %.2f s, dd %.2f s\n", module, r + 1,
                save.back(), dd_write.back(), load.back(), dd_read.back());
    std::fflush(stdout);
  }
  for (const std::string& path : {dd, part, manifest}) std::remove(path.c_str());
  f->save = Median(save);
  f->dd_write = Median(dd_write);
  f->load = Median(load);
  f->dd_read = Median(dd_read);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<loom::ModelConfig> config = loom::ModelConfigByName(absl::GetFlag(FLAGS_config));
  if (!config.ok()) {
    std::fprintf(stderr, "checkpoint_bench: --config: %s\n",
                 std::string(config.status().message()).c_str());
    return 1;
  }
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  if (rounds < 1) {
    std::fprintf(stderr, "checkpoint_bench: --rounds must be >= 1\n");
    return 1;
  }
  if (absl::Status s = loom::MakeDirectories(dir); !s.ok()) {
    std::fprintf(stderr, "checkpoint_bench: --dir: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  if (ResetPeak() < 0 || StatusBytes("VmHWM:") < 0) {
    std::fprintf(stderr, "checkpoint_bench: no /proc/self/status to measure memory with\n");
    return 1;
  }
  const std::string source = dir + "/dd-source";
  if (!WriteSource(source)) {
    std::fprintf(stderr, "checkpoint_bench: cannot write dd's input %s\n", source.c_str());
    return 1;
  }
  std::printf(
      "checkpoint_bench: %s into %s (dd: as many incompressible bytes, same disk, fsync'd; reads "
      "cold)\n",
      config->name.c_str(), dir.c_str());
  Figures total;
  auto add = [&](const char* module, loom::ParamSet& p) {
    Figures f;
    if (!Measure(module, p, dir, source, rounds, &f)) return false;
    Print(module, f);
    total.bytes += f.bytes;
    total.save += f.save;
    total.dd_write += f.dd_write;
    total.load += f.load;
    total.dd_read += f.dd_read;
    total.save_extra = std::max(total.save_extra, f.save_extra);
    total.load_extra = std::max(total.load_extra, f.load_extra);
    return true;
  };
  bool ok = true;
  for (const std::string& m : absl::GetFlag(FLAGS_modules)) {
    if (!ok) break;
    if (m == "encoder") {
      auto vit = std::make_unique<loom::VitEncoder>(config->vit);
      ok = add("encoder", vit->params());
    } else if (m == "projector") {
      loom::Projector projector(*config);
      ok = add("projector", projector.params());
    } else if (m == "llm") {
      auto llm = std::make_unique<loom::Llm>(config->llm);
      ok = add("llm", llm->params());
    } else {
      std::fprintf(stderr, "checkpoint_bench: --modules: no module '%s'\n", m.c_str());
      return 1;
    }
  }
  std::remove(source.c_str());
  if (!ok || total.bytes <= 0) {
    std::fprintf(stderr, "checkpoint_bench: measured nothing\n");
    return 1;
  }
  Print("model", total);
  return 0;
}
