#include "runtime/data/loader.h"

#include <cmath>
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

// The caption shards as two sources: shards 0-1 (keys 0-19) and 2-3 (20-39).
LoaderOptions MixtureOptions(int threads, double weight_a, double weight_b) {
  LoaderOptions o = Options(threads);
  o.decode_pixels = false;
  const std::vector<std::string>& all = CaptionShards();
  o.sources = {{{all[0], all[1]}, weight_a, "a"}, {{all[2], all[3]}, weight_b, "b"}};
  o.shards.clear();
  return o;
}

int KeyNumber(const std::string& key) { return std::stoi(key.substr(key.rfind('-') + 1)); }

// Binomial noise: |count - n p| within 4 standard deviations.
void ExpectWithinNoise(int64_t count, int64_t n, double p, const std::string& what) {
  const double sd = std::sqrt(static_cast<double>(n) * p * (1 - p));
  EXPECT_LE(std::abs(static_cast<double>(count) - n * p), 4 * sd)
      << what << ": " << count << " of " << n << " draws, expected " << n * p << " +- " << sd;
}

TEST(LoaderTest, MixtureWeightsHoldAndEachSourceCyclesThroughItsOwnEpochs) {
  auto loader = *DataLoader::Open(MixtureOptions(2, 3, 1), &testing::TestTokenizer());
  ASSERT_EQ(loader->num_sources(), 2);
  EXPECT_EQ(loader->dataset_samples(), 40);  // a mixture's epoch: every source's samples
  // One epoch of the mixture, then nine more.
  std::vector<std::string> keys = Keys(*loader, 40);
  std::vector<int64_t> drawn = loader->drawn();
  ASSERT_EQ(drawn.size(), 2u);
  EXPECT_EQ(drawn[0] + drawn[1], 40);
  ExpectWithinNoise(drawn[0], 40, 0.75, "source a over one epoch");
  for (const std::string& k : Keys(*loader, 360)) keys.push_back(k);
  drawn = loader->drawn();
  ExpectWithinNoise(drawn[0], 400, 0.75, "source a over ten epochs");
  // Where each key came from agrees with the counts, and a source's draws
  // go through its own samples once per its own epoch.
  std::vector<std::string> a, b;
  for (const std::string& k : keys) (KeyNumber(k) < 20 ? a : b).push_back(k);
  EXPECT_EQ(static_cast<int64_t>(a.size()), drawn[0]);
  EXPECT_EQ(static_cast<int64_t>(b.size()), drawn[1]);
  for (const std::vector<std::string>* source : {&a, &b}) {
    for (size_t start = 0; start + 20 <= source->size(); start += 20) {
      std::set<std::string> epoch(source->begin() + start, source->begin() + start + 20);
      EXPECT_EQ(epoch.size(), 20u) << "a source's epoch repeats a sample";
    }
  }
  // Other weights, other shares; the same weights and seed, the same order.
  auto even = *DataLoader::Open(MixtureOptions(1, 1, 1), &testing::TestTokenizer());
  Keys(*even, 400);
  ExpectWithinNoise(even->drawn()[0], 400, 0.5, "source a at weight 1:1");
  auto again = *DataLoader::Open(MixtureOptions(1, 3, 1), &testing::TestTokenizer());
  EXPECT_EQ(Keys(*again, 400), keys);
}

TEST(LoaderTest, OneSourceIsExactlyTheShards) {
  auto shards = *DataLoader::Open(Options(2), &testing::TestTokenizer());
  LoaderOptions o = Options(2);
  o.sources = {{o.shards, 5.0, "all"}};
  o.shards.clear();
  auto source = *DataLoader::Open(o, &testing::TestTokenizer());
  EXPECT_EQ(Keys(*source, 90), Keys(*shards, 90));
  EXPECT_EQ(source->Cursor().sources_size(), 0);  // a checkpoint of either resumes the other
}

TEST(LoaderTest, CursorRestoreUnderAMixtureNeitherLosesNorRepeats) {
  auto reference = *DataLoader::Open(MixtureOptions(2, 2, 1), &testing::TestTokenizer());
  const std::vector<std::string> all = Keys(*reference, 150);

  for (int cut : {1, 57, 121}) {
    auto first = *DataLoader::Open(MixtureOptions(2, 2, 1), &testing::TestTokenizer());
    std::vector<std::string> got = Keys(*first, cut);
    const data::v1::DataCursor cursor = first->Cursor();
    ASSERT_EQ(cursor.sources_size(), 2);
    EXPECT_EQ(cursor.sources(0).drawn() + cursor.sources(1).drawn(), cut);
    EXPECT_EQ(cursor.epoch() * 40 + cursor.position(), cut);
    first.reset();  // prefetched samples are lost with it

    auto second = *DataLoader::Open(MixtureOptions(1, 2, 1), &testing::TestTokenizer());
    ASSERT_TRUE(second->Restore(cursor).ok());
    for (const std::string& k : Keys(*second, 150 - cut)) got.push_back(k);
    EXPECT_EQ(got, all) << "resumed after " << cut;

    // A cursor of other data is refused, naming what differs.
    data::v1::DataCursor wrong = cursor;
    wrong.mutable_sources(0)->set_drawn(cursor.sources(0).drawn() + 1);
    absl::Status s = second->Restore(wrong);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("draws in all"), std::string::npos) << s;
    wrong = cursor;
    wrong.mutable_sources(1)->set_samples(21);
    EXPECT_EQ(second->Restore(wrong).code(), absl::StatusCode::kInvalidArgument);
    wrong = cursor;
    wrong.clear_sources();
    EXPECT_EQ(second->Restore(wrong).code(), absl::StatusCode::kInvalidArgument);
    auto single = *DataLoader::Open(Options(1), &testing::TestTokenizer());
    EXPECT_EQ(single->Restore(cursor).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(LoaderTest, ShardSpecsParseGlobsAndWeights) {
  const std::string dir = CaptionShards()[0].substr(0, CaptionShards()[0].rfind('/'));
  absl::StatusOr<std::vector<DataSource>> one = ParseShardSources(dir + "/*.tar");
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].shards, CaptionShards());
  EXPECT_EQ((*one)[0].weight, 1.0);
  absl::StatusOr<std::vector<DataSource>> two =
      ParseShardSources(CaptionShards()[0] + "=2.5," + CaptionShards()[1]);
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_EQ(two->size(), 2u);
  EXPECT_EQ((*two)[0].shards, std::vector<std::string>{CaptionShards()[0]});
  EXPECT_EQ((*two)[0].weight, 2.5);
  EXPECT_EQ((*two)[1].weight, 1.0);
  for (const char* bad : {"=0", "=-1", "=nan", "=inf"}) {
    EXPECT_EQ(ParseShardSources(CaptionShards()[0] + bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  EXPECT_EQ(ParseShardSources(CaptionShards()[0] + ",,").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseShardSources(dir + "/nothing-*.tar=2").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(LoaderTest, EpochsBecomeWholeBatches) {
  EXPECT_EQ(*StepsForEpochs(2, 40, 16), 5);  // 80 draws: 5 full batches, 0 left
  EXPECT_EQ(*StepsForEpochs(1, 40, 16), 2);  // the 8 left over are dropped
  EXPECT_EQ(*StepsForEpochs(0.5, 1000, 10), 50);
  EXPECT_EQ(StepsForEpochs(0.1, 40, 16).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StepsForEpochs(0, 40, 16).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StepsForEpochs(std::nan(""), 40, 16).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StepsForEpochs(1e12, 40, 1).status().code(), absl::StatusCode::kInvalidArgument);
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
