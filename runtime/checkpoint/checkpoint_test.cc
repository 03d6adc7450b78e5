#include "runtime/checkpoint/checkpoint.h"

#include <sys/resource.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/base/file.h"
#include "runtime/base/test_paths.h"

namespace loom {
namespace {

// A module with every kind of TP split; `rows` makes it large enough to
// span several checksum blocks.
ParamSet Make(TpShard shard = {}, int extra = 0, int64_t rows = 8, int first = 0, int last = 3) {
  ParamSet p(shard);
  if (first == 0) p.Add("embed.weight", {rows, 4}, Init::kNormal, 0.5f, Split::kRows);
  for (int l = first; l < last; ++l) {
    p.Add(absl::StrCat("blocks.", l, ".qkv.weight"), {12, 4}, Init::kNormal, 0.5f, Split::kQkvRows);
    p.Add(absl::StrCat("blocks.", l, ".proj.weight"), {4, 4}, Init::kNormal, 0.5f, Split::kCols);
    p.Add(absl::StrCat("blocks.", l, ".norm.weight"), {4}, Init::kOnes);
  }
  if (last == 3) p.Add("head.bias", {4 + extra}, Init::kOnes);
  p.Finalize();
  p.Initialize(3);
  return p;
}

// Distinct AdamW state, so a mix-up between the three arrays shows.
void FillAdam(ParamSet* p) {
  for (size_t i = 0; i < p->adam_m().size(); ++i) {
    p->adam_m()[i] = 0.1f * i;
    p->adam_v()[i] = 0.2f * i + 1;
  }
}

std::string Dir(const std::string& name) {
  const std::string dir = testing::TempPath(name);
  EXPECT_TRUE(MakeDirectories(dir).ok());
  return dir;
}

std::string Slurp(const std::string& path) {
  std::stringstream ss;
  ss << std::ifstream(path, std::ios::binary).rdbuf();
  return ss.str();
}

void Spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(CheckpointTest, RoundTripsWeightsOptimizerStateAndStep) {
  ParamSet a = Make();
  FillAdam(&a);
  a.step() = 17;
  const std::string dir = Dir("rt");
  ASSERT_TRUE(SaveModuleCheckpoint(a, "encoder", dir).ok());
  ParamSet b = Make();
  b.Initialize(99);  // different weights, to be overwritten
  absl::Status s = LoadModuleCheckpoint(dir, "encoder", &b);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(b.data(), a.data());
  EXPECT_EQ(b.adam_m(), a.adam_m());
  EXPECT_EQ(b.adam_v(), a.adam_v());
  EXPECT_EQ(b.step(), 17);
  for (const char* f : {"/encoder.ckpt.tmp", "/encoder.part-0.tmp"}) {
    EXPECT_FALSE(std::ifstream(dir + f).good()) << "temp file left behind: " << f;
  }
}

// Parts cut across tensors (as DP × TP ranks write them) load into any TP
// shard of any pipeline stage: a checkpoint saved under one layout loads
// under another.
TEST(CheckpointTest, PartsSavedUnderOneLayoutLoadUnderAnother) {
  ParamSet a = Make();
  FillAdam(&a);
  a.step() = 5;
  const std::string dir = Dir("sharded");
  std::vector<std::string> names;
  for (int k = 0; k < 5; ++k) {  // 5 parts: every boundary inside a tensor
    const auto [begin, end] = PartRange(a.size(), k, 5);
    names.push_back(ModulePartName("llm", k));
    ASSERT_TRUE(CheckpointPart::View(a, begin, end).Write("llm", dir + "/" + names.back()).ok());
  }
  ASSERT_TRUE(WriteModuleManifest(dir, "llm", 5, names).ok());
  for (int tp : {1, 2}) {
    for (auto [first, last] : {std::pair{0, 3}, std::pair{0, 1}, std::pair{1, 3}}) {
      const bool whole = first == 0 && last == 3;
      for (int r = 0; r < tp; ++r) {
        ParamSet want = Make({r, tp}, 0, 8, first, last);
        want.SliceFromMaster(a);
        ParamSet got = Make({r, tp}, 0, 8, first, last);
        absl::Status s = LoadModuleCheckpoint(dir, "llm", &got, whole);
        ASSERT_TRUE(s.ok()) << s << " tp " << tp << " rank " << r << " layers " << first << ".."
                            << last;
        EXPECT_EQ(got.data(), want.data());
        EXPECT_EQ(got.adam_m(), want.adam_m());
        EXPECT_EQ(got.adam_v(), want.adam_v());
        EXPECT_EQ(got.step(), 5);
      }
    }
  }
  // A stage is not the whole module: loading it as such is refused.
  ParamSet stage = Make({}, 0, 8, 1, 3);
  absl::Status s = LoadModuleCheckpoint(dir, "llm", &stage, /*whole_module=*/true);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // A part missing from the folder is named.
  std::remove((dir + "/" + names[2]).c_str());
  ParamSet c = Make();
  s = LoadModuleCheckpoint(dir, "llm", &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find(names[2]), absl::string_view::npos) << s;
}

// A sharded optimizer (ZeRO-1) over 3 DP ranks: each rank holds its chunk's
// moments (taken from a whole set), writes the parts within that chunk
// without a gather (one part per rank, or two, as DP x TP ranks cut them),
// and the checkpoint loads into unsharded sets and into other shards under
// other TP degrees. The moments of TP slices added into the master, each DP
// rank its chunk's, sum to the whole.
TEST(CheckpointTest, AShardedOptimizerWritesItsChunksAndLoadsUnderAnyLayout) {
  ParamSet a = Make();
  FillAdam(&a);
  a.step() = 4;
  constexpr int kRanks = 3;
  for (int per_rank : {1, 2}) {
    const std::string dir = Dir(absl::StrCat("zero-", per_rank));
    std::vector<std::string> names;
    for (int d = 0; d < kRanks; ++d) {
      ParamSet s = Make();
      s.ShardOptimizer(d, kRanks);
      s.SliceFromMaster(a);
      const auto [ob, oe] = ChunkRange(a.size(), d, kRanks);
      ASSERT_EQ(s.optimizer_begin(), ob);
      ASSERT_EQ(s.optimizer_state_bytes(), (oe - ob) * 8);
      for (int64_t i = ob; i < oe; ++i) ASSERT_EQ(s.adam_v()[i - ob], a.adam_v()[i]) << i;
      for (int t = 0; t < per_rank; ++t) {
        const int index = d * per_rank + t;
        const auto [begin, end] = PartRange(a.size(), index, kRanks * per_rank);
        names.push_back(ModulePartName("llm", index));
        ASSERT_TRUE(
            CheckpointPart::View(s, begin, end).Write("llm", dir + "/" + names.back()).ok());
      }
    }
    ASSERT_TRUE(WriteModuleManifest(dir, "llm", 4, names).ok());
    for (int tp : {1, 2}) {
      for (int dp : {1, 2}) {
        for (int r = 0; r < tp; ++r) {
          for (int d = 0; d < dp; ++d) {
            ParamSet want = Make({r, tp});
            want.SliceFromMaster(a);
            ParamSet got = Make({r, tp});
            got.ShardOptimizer(d, dp);
            absl::Status st = LoadModuleCheckpoint(dir, "llm", &got);
            ASSERT_TRUE(st.ok()) << st;
            EXPECT_EQ(got.data(), want.data());
            const int64_t ob = got.optimizer_begin();
            ASSERT_EQ(got.adam_m().size(), static_cast<size_t>(got.optimizer_end() - ob));
            for (size_t k = 0; k < got.adam_m().size(); ++k) {
              ASSERT_EQ(got.adam_m()[k], want.adam_m()[ob + k]) << "tp " << tp << " dp " << dp;
              ASSERT_EQ(got.adam_v()[k], want.adam_v()[ob + k]) << "tp " << tp << " dp " << dp;
            }
            EXPECT_EQ(got.step(), 4);
          }
        }
      }
    }
  }
  // TP 2 x DP 2, sharded: the TP sum of each DP rank's contributions, then
  // the moments' sum over the DP ranks, is the whole module.
  std::vector<float> m(a.size(), 0.0f);
  for (int d = 0; d < 2; ++d) {
    ParamSet master = a.MasterLayout();
    for (int t = 0; t < 2; ++t) {
      ParamSet s = Make({t, 2});
      s.ShardOptimizer(d, 2);
      s.SliceFromMaster(a);
      s.AddToMaster(&master);
    }
    EXPECT_EQ(master.data(), a.data()) << "DP rank " << d << "'s weights";
    for (int64_t i = 0; i < a.size(); ++i) m[i] += master.adam_m()[i];
  }
  EXPECT_EQ(m, a.adam_m());
}

// TP slices written without a gather (issue 42 item 8): the rank at (d, t)
// of DP x TP, its optimizer sharded or not, writes DP chunk d of its own TP
// slice, as a worker does. The parts hold every element once (each its
// rank's share, no more), a row-parallel weight's slice is one strided
// entry (format version 3), and the checkpoint loads as the whole module,
// into other TP degrees, other pipeline stages and other optimizer shards;
// from the manifest's contents and from the parts' headers alike.
TEST(CheckpointTest, TpSlicesAreWrittenWithoutAGatherAndLoadUnderAnyLayout) {
  constexpr int64_t kRows = 16;
  ParamSet a = Make({}, 0, kRows);
  FillAdam(&a);
  a.step() = 6;
  for (int tp : {2, 4}) {
    for (int dp : {1, 3}) {
      for (bool sharded : {false, true}) {
        const std::string label = absl::StrCat("tp ", tp, " dp ", dp, " sharded ", sharded);
        const std::string dir = Dir(absl::StrCat("tp-", tp, "-", dp, "-", sharded));
        std::vector<std::string> names;
        std::vector<std::vector<CheckpointPart::Entry>> contents;
        int64_t written = 0;
        for (int d = 0; d < dp; ++d) {
          for (int t = 0; t < tp; ++t) {
            ParamSet s = Make({t, tp}, 0, kRows);
            if (sharded) s.ShardOptimizer(d, dp);
            s.SliceFromMaster(a);
            const auto [begin, end] = PartRange(s.size(), d, dp);
            const CheckpointPart part = CheckpointPart::Snapshot(s, begin, end);
            EXPECT_LE(part.elements(), end - begin) << label;
            EXPECT_EQ(part.owned_bytes(), 3 * part.elements() * 4) << label;
            written += part.elements();
            for (const CheckpointPart::Entry& e : part.entries()) {
              // The whole slice of blocks.0.proj.weight ({4, 4}, columns
              // split): one run per row.
              if (dp == 1 && e.name == "blocks.0.proj.weight") {
                EXPECT_EQ(e.count, 4) << label;
                EXPECT_EQ(e.hi - e.lo, 4 / tp) << label;
                EXPECT_EQ(e.stride, 4) << label;
              }
            }
            names.push_back(ModulePartName("llm", d * tp + t));
            ASSERT_TRUE(part.Write("llm", dir + "/" + names.back()).ok()) << label;
            EXPECT_EQ(Slurp(dir + "/" + names.back())[8], 3) << label;  // the version
            contents.push_back(part.entries());
          }
        }
        EXPECT_EQ(written, a.size()) << label;
        // Half the cases plan from the contents, half from the headers.
        if (sharded) {
          ASSERT_TRUE(WriteModuleManifest(dir, "llm", 6, names, contents).ok());
          EXPECT_NE(Slurp(dir + "/llm.ckpt").find("\"version\": 3"), std::string::npos);
        } else {
          ASSERT_TRUE(WriteModuleManifest(dir, "llm", 6, names).ok());
        }
        for (int load_tp : {1, 2, 4}) {
          for (auto [first, last] : {std::pair{0, 3}, std::pair{1, 3}}) {
            for (int load_dp : {1, 2}) {
              for (int r = 0; r < load_tp; ++r) {
                for (int d = 0; d < load_dp; ++d) {
                  ParamSet want = Make({r, load_tp}, 0, kRows, first, last);
                  want.SliceFromMaster(a);
                  ParamSet got = Make({r, load_tp}, 0, kRows, first, last);
                  got.ShardOptimizer(d, load_dp);
                  absl::Status st = LoadModuleCheckpoint(dir, "llm", &got, first == 0);
                  ASSERT_TRUE(st.ok()) << st << " " << label << " into tp " << load_tp;
                  EXPECT_EQ(got.data(), want.data()) << label << " into tp " << load_tp;
                  const int64_t ob = got.optimizer_begin();
                  for (size_t k = 0; k < got.adam_m().size(); ++k) {
                    ASSERT_EQ(got.adam_m()[k], want.adam_m()[ob + k]) << label;
                    ASSERT_EQ(got.adam_v()[k], want.adam_v()[ob + k]) << label;
                  }
                  EXPECT_EQ(got.step(), 6);
                }
              }
            }
          }
        }
      }
    }
  }
  // A TP 1 part has no strided entry and keeps version 2, which builds
  // before version 3 read.
  const std::string dir = Dir("v2");
  ASSERT_TRUE(SaveModuleCheckpoint(a, "llm", dir).ok());
  EXPECT_EQ(Slurp(dir + "/" + ModulePartName("llm", 0))[8], 2);
  EXPECT_NE(Slurp(dir + "/llm.ckpt").find("\"version\": 2"), std::string::npos);
}

// A strided entry whose runs overlap or leave the tensor is refused, naming
// the tensor.
TEST(CheckpointTest, RejectsStridedRunsThatOverlapOrLeaveTheTensor) {
  ParamSet a = Make();
  const std::string dir = Dir("strided");
  std::vector<CheckpointPart::Entry> entries;
  std::vector<std::string> names;
  for (int t = 0; t < 2; ++t) {
    ParamSet s = Make({t, 2});
    s.SliceFromMaster(a);
    const CheckpointPart part = CheckpointPart::View(s, 0, s.size());
    names.push_back(ModulePartName("llm", t));
    ASSERT_TRUE(part.Write("llm", dir + "/" + names.back()).ok());
  }
  ASSERT_TRUE(WriteModuleManifest(dir, "llm", 0, names).ok());
  ASSERT_TRUE(DescribeModuleParts(dir, "llm").ok());
  const std::string good = Slurp(dir + "/llm.ckpt");
  const std::string run = "\"count\":4,\"hi\":2,\"lo\":0,\"shape\":[4,4],\"stride\":4";
  ASSERT_NE(good.find(run), std::string::npos) << good;
  for (const char* bad : {"\"count\":4,\"hi\":2,\"lo\":0,\"shape\":[4,4],\"stride\":1",
                          "\"count\":5,\"hi\":2,\"lo\":0,\"shape\":[4,4],\"stride\":4"}) {
    std::string text = good;
    text.replace(text.find(run), run.size(), bad);
    Spit(dir + "/llm.ckpt", text);
    ParamSet b = Make();
    absl::Status s = LoadModuleCheckpoint(dir, "llm", &b);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find("blocks.0.proj.weight"), absl::string_view::npos) << s;
  }
}

// A snapshot is written as it was taken, whatever the set does after.
TEST(CheckpointTest, ASnapshotIsWrittenAsTakenWhileTheSetTrainsOn) {
  ParamSet a = Make();
  FillAdam(&a);
  a.step() = 3;
  const ParamSet taken = a.MasterLayout();
  CheckpointPart snap = CheckpointPart::Snapshot(a, 0, a.size());
  EXPECT_EQ(snap.owned_bytes(), 3 * a.size() * static_cast<int64_t>(sizeof(float)));
  const std::vector<float> w = a.data(), m = a.adam_m(), v = a.adam_v();
  for (float& x : a.data()) x += 1;  // training goes on
  for (float& x : a.adam_m()) x += 1;
  a.step() = 4;
  const std::string dir = Dir("snap");
  ASSERT_TRUE(snap.Write("llm", dir + "/" + ModulePartName("llm", 0)).ok());
  ASSERT_TRUE(WriteModuleManifest(dir, "llm", snap.step(), {ModulePartName("llm", 0)}).ok());
  ParamSet b = Make();
  ASSERT_TRUE(LoadModuleCheckpoint(dir, "llm", &b).ok());
  EXPECT_EQ(b.data(), w);
  EXPECT_EQ(b.adam_m(), m);
  EXPECT_EQ(b.adam_v(), v);
  EXPECT_EQ(b.step(), 3);
}

TEST(CheckpointTest, RejectsTheWrongModuleOrShapeNamingIt) {
  ParamSet a = Make();
  const std::string dir = Dir("m");
  ASSERT_TRUE(SaveModuleCheckpoint(a, "encoder", dir).ok());
  ParamSet b = Make();
  absl::Status s = LoadModuleCheckpoint(dir, "llm", &b);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;  // no llm.ckpt
  Spit(dir + "/llm.ckpt", Slurp(dir + "/encoder.ckpt"));
  s = LoadModuleCheckpoint(dir, "llm", &b);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'encoder'"), absl::string_view::npos) << s;
  ParamSet c = Make({}, /*extra=*/1);
  s = LoadModuleCheckpoint(dir, "encoder", &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("head.bias"), absl::string_view::npos) << s;
}

TEST(CheckpointTest, DetectsCorruptionAndTruncationInAnyBlock) {
  ParamSet a = Make({}, 0, /*rows=*/1 << 19);  // 24 MiB of payload: 6 blocks
  FillAdam(&a);
  const std::string dir = Dir("c");
  ASSERT_TRUE(SaveModuleCheckpoint(a, "encoder", dir).ok());
  const std::string part = dir + "/" + ModulePartName("encoder", 0);
  const std::string bytes = Slurp(part);
  auto load = [&] {
    ParamSet b = Make({}, 0, 1 << 19);
    return LoadModuleCheckpoint(dir, "encoder", &b);
  };
  ASSERT_TRUE(load().ok());
  for (size_t at : {size_t{20}, bytes.size() / 2, bytes.size() - 200, bytes.size() - 3}) {
    std::string flipped = bytes;
    flipped[at] ^= 0x40;
    Spit(part, flipped);
    EXPECT_EQ(load().code(), absl::StatusCode::kDataLoss) << "byte " << at << " flipped";
  }
  for (size_t keep : {bytes.size() / 3, size_t{30}, size_t{0}}) {
    Spit(part, bytes.substr(0, keep));
    EXPECT_EQ(load().code(), absl::StatusCode::kDataLoss) << keep << " bytes kept";
  }
  Spit(part, bytes + "x");
  EXPECT_EQ(load().code(), absl::StatusCode::kDataLoss) << "a trailing byte";
  Spit(part, bytes);
  const std::string manifest = Slurp(dir + "/encoder.ckpt");
  Spit(dir + "/encoder.ckpt", manifest.substr(0, manifest.size() / 2));
  EXPECT_EQ(load().code(), absl::StatusCode::kDataLoss) << "a torn manifest";
  Spit(dir + "/encoder.ckpt", manifest);
  ASSERT_TRUE(load().ok());
  std::remove(part.c_str());
  EXPECT_EQ(load().code(), absl::StatusCode::kNotFound);
  // A checkpoint of the earlier format is named as such.
  Spit(dir + "/encoder.ckpt", std::string("LOOMCKPT\1\0\0\0", 12));
  absl::Status s = load();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("version 1"), absl::string_view::npos) << s;
}

// Lowers the soft RLIMIT_NOFILE for its lifetime (a process at the usual
// 1,024 with more parts than that is the case it stands for).
class OpenFileLimit {
 public:
  explicit OpenFileLimit(rlim_t soft) {
    EXPECT_EQ(getrlimit(RLIMIT_NOFILE, &saved_), 0);
    rlimit low = saved_;
    low.rlim_cur = soft;
    EXPECT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  }
  ~OpenFileLimit() { EXPECT_EQ(setrlimit(RLIMIT_NOFILE, &saved_), 0); }

 private:
  rlimit saved_{};
};

// The layouts a saved module loads into: TP degree, rank, and the layers of
// a pipeline stage ([first, last) of Make's 3).
struct Layout {
  int tp, rank, first, last;
};

std::vector<Layout> Layouts() {
  std::vector<Layout> out;
  for (int tp : {1, 2}) {
    for (auto [first, last] : {std::pair{0, 3}, std::pair{0, 1}, std::pair{1, 3}}) {
      for (int r = 0; r < tp; ++r) out.push_back({tp, r, first, last});
    }
  }
  return out;
}

constexpr int64_t kManyRows = 1024;  // embed: 4,096 elements, about 2 per part
constexpr int kManyParts = 2048;

// `a` saved as `count` parts cut as the ranks cut them, with a manifest
// naming them.
std::vector<std::string> SaveAsParts(const ParamSet& a, const std::string& dir, int count) {
  std::vector<std::string> names;
  for (int k = 0; k < count; ++k) {
    const auto [begin, end] = PartRange(a.size(), k, count);
    names.push_back(ModulePartName("llm", k));
    absl::Status s = CheckpointPart::View(a, begin, end).Write("llm", dir + "/" + names.back());
    EXPECT_TRUE(s.ok()) << s;
  }
  return names;
}

// 2,048 parts load into every layout while the process may hold only 64
// files open, and equal what a load without the limit reads: from a
// manifest naming the parts only (every header read, one at a time), and
// from the same manifest once DescribeModuleParts (run under the limit too)
// has added what each part holds.
TEST(CheckpointTest, ThousandsOfPartsLoadUnderALowOpenFileLimit) {
  ParamSet a = Make({}, 0, kManyRows);
  FillAdam(&a);
  a.step() = 9;
  const std::string dir = Dir("many");
  const std::vector<std::string> names = SaveAsParts(a, dir, kManyParts);
  ASSERT_TRUE(WriteModuleManifest(dir, "llm", 9, names).ok());
  for (bool described : {false, true}) {
    if (described) {
      OpenFileLimit limit(64);
      absl::Status s = DescribeModuleParts(dir, "llm");
      ASSERT_TRUE(s.ok()) << s;
    }
    for (const Layout& l : Layouts()) {
      const bool whole = l.first == 0 && l.last == 3;
      ParamSet free = Make({l.rank, l.tp}, 0, kManyRows, l.first, l.last);
      absl::Status s = LoadModuleCheckpoint(dir, "llm", &free, whole);
      ASSERT_TRUE(s.ok()) << s;
      ParamSet want = Make({l.rank, l.tp}, 0, kManyRows, l.first, l.last);
      want.SliceFromMaster(a);
      ParamSet got = Make({l.rank, l.tp}, 0, kManyRows, l.first, l.last);
      {
        OpenFileLimit limit(64);
        s = LoadModuleCheckpoint(dir, "llm", &got, whole);
      }
      ASSERT_TRUE(s.ok()) << s << " described " << described << " tp " << l.tp << " rank " << l.rank
                          << " layers " << l.first << ".." << l.last;
      EXPECT_EQ(got.data(), want.data());
      EXPECT_EQ(got.data(), free.data());
      EXPECT_EQ(got.adam_m(), free.adam_m());
      EXPECT_EQ(got.adam_v(), free.adam_v());
      EXPECT_EQ(got.step(), 9);
    }
  }
}

// The parts of `count` cut from `master` that hold some of the slices of
// `slice` (a TP shard of some of master's tensors).
std::set<int> PartsHolding(const ParamSet& master, const ParamSet& slice, int count) {
  std::set<int> out;
  for (const ParamSpec& s : slice.specs()) {
    const int64_t base = master.specs()[master.Find(s.name)].offset;
    for (const SliceRun& r : SliceRuns(s, slice.shard())) {
      const int64_t lo = base + r.master_offset, hi = lo + r.length;
      for (int k = 0; k < count; ++k) {
        const auto [begin, end] = PartRange(master.size(), k, count);
        if (begin < hi && lo < end) out.insert(k);
      }
    }
  }
  return out;
}

// A load opens only the parts that hold the rank's slices: with every other
// part moved out of the folder, it still loads. A manifest naming the parts
// only cannot (it reads every header), which shows the others are missing.
TEST(CheckpointTest, ALoadOpensOnlyThePartsHoldingTheRanksSlices) {
  constexpr int kParts = 64;
  ParamSet a = Make({}, 0, kManyRows);
  FillAdam(&a);
  a.step() = 4;
  const std::string dir = Dir("few"), aside = Dir("few-aside");
  std::vector<std::string> names;
  std::vector<std::vector<CheckpointPart::Entry>> contents;
  for (int k = 0; k < kParts; ++k) {
    const auto [begin, end] = PartRange(a.size(), k, kParts);
    const CheckpointPart part = CheckpointPart::Snapshot(a, begin, end);
    names.push_back(ModulePartName("llm", k));
    contents.push_back(part.entries());
    ASSERT_TRUE(part.Write("llm", dir + "/" + names.back()).ok());
  }
  for (const Layout& l : Layouts()) {
    const bool whole = l.first == 0 && l.last == 3;
    ParamSet got = Make({l.rank, l.tp}, 0, kManyRows, l.first, l.last);
    const std::set<int> held = PartsHolding(a, got, kParts);
    ASSERT_FALSE(held.empty());
    if (l.first == 1) {
      EXPECT_LT(held.size(), kParts / 4) << "a stage after the embedding";
    }
    for (int k = 0; k < kParts; ++k) {
      if (held.count(k) == 0) {
        ASSERT_EQ(std::rename((dir + "/" + names[k]).c_str(), (aside + "/" + names[k]).c_str()), 0);
      }
    }
    ASSERT_TRUE(WriteModuleManifest(dir, "llm", 4, names, contents).ok());
    absl::Status s = LoadModuleCheckpoint(dir, "llm", &got, whole);
    EXPECT_TRUE(s.ok()) << s << " tp " << l.tp << " rank " << l.rank << " layers " << l.first
                        << ".." << l.last << ": " << held.size() << " parts of " << kParts;
    ParamSet want = Make({l.rank, l.tp}, 0, kManyRows, l.first, l.last);
    want.SliceFromMaster(a);
    EXPECT_EQ(got.data(), want.data());
    if (held.size() < kParts) {
      ASSERT_TRUE(WriteModuleManifest(dir, "llm", 4, names).ok());
      ParamSet other = Make({l.rank, l.tp}, 0, kManyRows, l.first, l.last);
      EXPECT_EQ(LoadModuleCheckpoint(dir, "llm", &other, whole).code(),
                absl::StatusCode::kNotFound);
    }
    for (int k = 0; k < kParts; ++k) {
      if (held.count(k) == 0) {
        ASSERT_EQ(std::rename((aside + "/" + names[k]).c_str(), (dir + "/" + names[k]).c_str()), 0);
      }
    }
  }
}

// A manifest as this format's writers made it before it had contents (the
// part names only) still loads, under any layout; DescribeModuleParts adds
// the contents. A part whose header disagrees with the contents is named.
TEST(CheckpointTest, AManifestNamingItsPartsOnlyStillLoads) {
  ParamSet a = Make();
  FillAdam(&a);
  a.step() = 6;
  const std::string dir = Dir("names-only");
  const std::vector<std::string> names = SaveAsParts(a, dir, 3);
  // Byte for byte what WriteModuleManifest wrote before "contents".
  Spit(dir + "/llm.ckpt",
       "{\n \"format\": \"loom-checkpoint\",\n \"module\": \"llm\",\n \"parts\": [\n"
       "  \"llm.part-0\",\n  \"llm.part-1\",\n  \"llm.part-2\"\n ],\n \"step\": 6,\n"
       " \"version\": 2\n}\n");
  auto load_all = [&] {
    for (const Layout& l : Layouts()) {
      ParamSet want = Make({l.rank, l.tp}, 0, 8, l.first, l.last);
      want.SliceFromMaster(a);
      ParamSet got = Make({l.rank, l.tp}, 0, 8, l.first, l.last);
      absl::Status s = LoadModuleCheckpoint(dir, "llm", &got, l.first == 0 && l.last == 3);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(got.data(), want.data());
      EXPECT_EQ(got.adam_m(), want.adam_m());
      EXPECT_EQ(got.adam_v(), want.adam_v());
      EXPECT_EQ(got.step(), 6);
    }
  };
  load_all();
  const std::string old = Slurp(dir + "/llm.ckpt");
  ASSERT_TRUE(DescribeModuleParts(dir, "llm").ok());
  const std::string described = Slurp(dir + "/llm.ckpt");
  EXPECT_NE(described.find("\"contents\""), std::string::npos) << described;
  load_all();
  ASSERT_TRUE(DescribeModuleParts(dir, "llm").ok());  // described already: unchanged
  EXPECT_EQ(Slurp(dir + "/llm.ckpt"), described);
  // Part 1 replaced by another cut of the module: its header no longer is
  // what the manifest says.
  const auto [begin, end] = PartRange(a.size(), 0, 2);
  ASSERT_TRUE(CheckpointPart::View(a, begin, end).Write("llm", dir + "/" + names[1]).ok());
  ParamSet b = Make();
  absl::Status s = LoadModuleCheckpoint(dir, "llm", &b);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(names[1]), absl::string_view::npos) << s;
  Spit(dir + "/llm.ckpt", old);  // from the headers: the cut no longer covers the module
  s = LoadModuleCheckpoint(dir, "llm", &b);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

TEST(CheckpointTest, AFrozenSetSavesZeroAdamStateAndLoadsTheWeightsOnly) {
  ParamSet a = Make();
  a.step() = 2;
  a.Freeze();
  const std::string dir = Dir("frozen");
  ASSERT_TRUE(SaveModuleCheckpoint(a, "encoder", dir).ok());
  ParamSet b = Make();
  b.Initialize(7);
  FillAdam(&b);
  ASSERT_TRUE(LoadModuleCheckpoint(dir, "encoder", &b).ok());
  EXPECT_EQ(b.data(), a.data());
  EXPECT_EQ(b.adam_m(), std::vector<float>(b.size(), 0.0f));
  EXPECT_EQ(b.adam_v(), std::vector<float>(b.size(), 0.0f));
  ParamSet c = Make();
  c.Initialize(7);
  c.Freeze();
  ASSERT_TRUE(LoadModuleCheckpoint(dir, "encoder", &c).ok());
  EXPECT_EQ(c.data(), a.data());
}

}  // namespace
}  // namespace loom
