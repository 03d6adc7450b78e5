#include "runtime/data/loader.h"

#include <set>

#include "gtest/gtest.h"
#include "runtime/base/file.h"
#include "runtime/base/test_paths.h"
#include "runtime/data/data_testing.h"
#include "runtime/data/datagen.h"

namespace loom::data {
namespace {

// 40 caption samples in 4 shards, written once per test binary.
const std::vector<std::string>& CaptionShards() {
  static const auto* shards = [] {
    DatagenOptions o;
    o.preset = "caption";
    o.samples = 40;
    o.seed = 3;
    o.out_dir = loom::testing::TempPath("caption");
    o.samples_per_shard = 10;
    return new std::vector<std::string>(*WriteDataset(o));
  }();
  return *shards;
}

LoaderOptions Options(int threads) {
  LoaderOptions o;
  o.shards = CaptionShards();
  o.seed = 11;
  o.threads = threads;
  o.prefetch = 8;
  o.preprocess = PreprocessOptionsFor(*ModelConfigByName("tiny"));
  return o;
}

std::vector<std::string> Keys(DataLoader& loader, int n) {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<ProcessedSample> s = loader.Next();
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) break;
    keys.push_back(s->key);
  }
  return keys;
}

TEST(LoaderTest, OrderDependsOnSeedAndEpochOnlyNotOnThreads) {
  auto one = *DataLoader::Open(Options(1), &testing::TestTokenizer());
  auto three = *DataLoader::Open(Options(3), &testing::TestTokenizer());
  const std::vector<std::string> a = Keys(*one, 90), b = Keys(*three, 90);
  EXPECT_EQ(a, b);
  // Each epoch is a permutation of all 40 samples, and epochs differ.
  std::set<std::string> epoch0(a.begin(), a.begin() + 40), epoch1(a.begin() + 40, a.begin() + 80);
  EXPECT_EQ(epoch0.size(), 40u);
  EXPECT_EQ(epoch0, epoch1);
  EXPECT_NE(std::vector<std::string>(a.begin(), a.begin() + 40),
            std::vector<std::string>(a.begin() + 40, a.begin() + 80));
  LoaderOptions other = Options(2);
  other.seed = 12;
  auto c = *DataLoader::Open(other, &testing::TestTokenizer());
  EXPECT_NE(Keys(*c, 40), std::vector<std::string>(a.begin(), a.begin() + 40));
}

TEST(LoaderTest, CursorRestoreNeitherLosesNorRepeats) {
  auto reference = *DataLoader::Open(Options(2), &testing::TestTokenizer());
  const std::vector<std::string> all = Keys(*reference, 70);

  auto first = *DataLoader::Open(Options(2), &testing::TestTokenizer());
  std::vector<std::string> got = Keys(*first, 33);  // into the middle of epoch 0
  const data::v1::DataCursor cursor = first->Cursor();
  EXPECT_EQ(cursor.epoch(), 0);
  EXPECT_EQ(cursor.position(), 33);
  first.reset();  // the "crash": prefetched samples are lost with it

  auto second = *DataLoader::Open(Options(1), &testing::TestTokenizer());
  ASSERT_TRUE(second->Restore(cursor).ok());
  for (const std::string& k : Keys(*second, 37)) got.push_back(k);
  EXPECT_EQ(got, all);

  data::v1::DataCursor wrong = cursor;
  wrong.set_seed(99);
  EXPECT_EQ(second->Restore(wrong).code(), absl::StatusCode::kInvalidArgument);
  wrong = cursor;
  wrong.set_dataset_samples(41);
  EXPECT_EQ(second->Restore(wrong).code(), absl::StatusCode::kInvalidArgument);
}

TEST(LoaderTest, UnshuffledSingleEpochReadsShardOrderThenEnds) {
  LoaderOptions o = Options(2);
  o.shuffle = false;
  o.epochs = 1;
  auto loader = *DataLoader::Open(o, &testing::TestTokenizer());
  std::vector<std::string> keys = Keys(*loader, 40);
  EXPECT_EQ(keys.front(), "caption-00000000");
  EXPECT_EQ(keys.back(), "caption-00000039");
  EXPECT_EQ(loader->Next().status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(loader->kept(), 40);
}

// One shard holding each bad input between valid samples, cut off at the
// end: every valid sample still comes through, every bad one is counted.
TEST(LoaderTest, BadSamplesAreSkippedAndValidOnesInTheSameShardSurvive) {
  using testing::SampleMembers;
  std::vector<TarMember> m;
  auto add = [&](std::vector<TarMember> s) {
    for (TarMember& t : s) m.push_back(std::move(t));
  };
  auto good = [&](int i) {
    add(SampleMembers("good" + std::to_string(i), "<image> one red square.",
                      {{"0.png", testing::TestPng(48, 32)}}));
  };
  const std::string jpg = testing::TestJpeg(64, 64);
  good(0);
  add(SampleMembers("bad_corrupt", "<image> x", {{"0.jpg", jpg.substr(0, jpg.size() / 2)}}));
  good(1);
  add(SampleMembers("bad_empty_image", "<image> x", {{"0.png", ""}}));
  good(2);
  add(SampleMembers("bad_huge", "<image> x", {{"0.png", testing::PngClaiming(100000, 100000)}}));
  good(3);
  add({{"bad_missing.json", testing::SampleJson("<image> x", {"0.png"})}});
  good(4);
  add({{"bad_utf8.json", "{\"text\": \"\xff\xfe\"}"}});
  good(5);
  add(SampleMembers("bad_empty_text", "", {}));
  good(6);
  std::string long_text;
  for (int i = 0; i < 2000; ++i) long_text += "the shapes do not touch each other. ";
  add(SampleMembers("bad_long", long_text, {}));
  good(7);
  add(SampleMembers("bad_truncated", "<image> x", {{"0.png", std::string(4000, 'z')}}));
  std::string tar = *TarToMemory(m);
  tar.resize(tar.size() - 1024 - 2000);  // cut inside the last sample
  const std::string path = loom::testing::TempPath("bad.tar");
  ASSERT_TRUE(loom::WriteFileAtomically(path, tar).ok());

  LoaderOptions o = Options(2);
  o.shards = {path};
  o.shuffle = false;
  o.epochs = 1;
  o.preprocess.truncate = false;  // the long text is refused, not cut
  std::vector<SkippedSample> skips;
  o.on_skip = [&](const SkippedSample& s) { skips.push_back(s); };
  auto loader = *DataLoader::Open(o, &testing::TestTokenizer());
  std::vector<std::string> keys;
  for (;;) {
    absl::StatusOr<ProcessedSample> s = loader->Next();
    if (!s.ok()) {
      EXPECT_EQ(s.status().code(), absl::StatusCode::kOutOfRange) << s.status();
      break;
    }
    keys.push_back(s->key);
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"good0", "good1", "good2", "good3", "good4", "good5",
                                            "good6", "good7"}));
  const std::map<std::string, int64_t> expected = {
      {"corrupt_image", 1}, {"empty_image", 1}, {"image_too_large", 1}, {"missing_image", 1},
      {"invalid_utf8", 1},  {"empty_text", 1},  {"text_too_long", 1},   {"truncated_tar", 1}};
  EXPECT_EQ(loader->skipped(), expected);
  EXPECT_EQ(skips.size(), 8u);
}

TEST(LoaderTest, NoUsableSampleIsAnErrorNotAHang) {
  std::vector<TarMember> m = testing::SampleMembers("only", "", {});
  const std::string path = loom::testing::TempPath("useless.tar");
  ASSERT_TRUE(WriteTar(path, m).ok());
  LoaderOptions o = Options(2);
  o.shards = {path};
  auto loader = *DataLoader::Open(o, &testing::TestTokenizer());
  EXPECT_EQ(loader->Next().status().code(), absl::StatusCode::kFailedPrecondition);
  o.shards = {loom::testing::TempPath("nothing-here.tar")};
  EXPECT_EQ(DataLoader::Open(o, &testing::TestTokenizer()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ExpandShardGlob(loom::testing::TempPath("none-*.tar")).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace loom::data
